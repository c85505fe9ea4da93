// Percentiles of a latency sample, formatted for the tables in docs/WAN.md.

export interface Summary {
  p10: string;
  p50: string;
  p90: string;
  max: string;
  mean: string;
  p50Raw: number;
}

/** Nearest-rank percentiles of `xs` (ms), to 3 decimals. */
export function summarize(xs: number[]): Summary {
  if (xs.length === 0) throw new RangeError("summarize needs at least one sample");
  const s = [...xs].sort((a, b) => a - b);
  const q = (p: number) => s[Math.min(s.length - 1, Math.floor(p * s.length))];
  const f = (v: number) => v.toFixed(3);
  return {
    p10: f(q(0.1)),
    p50: f(q(0.5)),
    p90: f(q(0.9)),
    max: f(s[s.length - 1]),
    mean: f(s.reduce((a, b) => a + b, 0) / s.length),
    p50Raw: q(0.5),
  };
}
