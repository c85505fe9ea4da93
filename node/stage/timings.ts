// Per-token timings from a step's trace (the first version of the timing harness): compute per stage,
// wire time per hop, bytes per hop. Pure. Wire times subtract timestamps taken on two nodes, so they are
// exact on one machine (--local) and include clock skew across machines.
import type { HopTrace } from "./messages.ts";

export interface TokenTimings {
  /** Compute per stage, ms (including each stage's readback). */
  computeMs: number[];
  /**
   * Wire time per hop, ms: hop k is stage k -> k+1; the last hop is the token's way back from the last
   * stage to stage 0 (null for the first token, which starts from the client's prompt instead).
   */
  wireMs: (number | null)[];
  /** Bytes per hop, same order as wireMs. */
  bytes: number[];
}

export function tokenTimings(trace: HopTrace[]): TokenTimings {
  const computeMs = trace.map((h) => round(h.c));
  const wireMs: (number | null)[] = [];
  const bytes: number[] = [];
  for (let k = 0; k + 1 < trace.length; k++) {
    wireMs.push(round(trace[k + 1].in - trace[k].out));
    bytes.push(trace[k].b);
  }
  const back = trace[0]?.r;
  wireMs.push(back === undefined ? null : round(back));
  bytes.push(trace.at(-1)?.b ?? 0);
  return { computeMs, wireMs, bytes };
}

/** Mean of each column over tokens (nulls skipped). */
export function meanTimings(all: TokenTimings[]): TokenTimings {
  const col = (pick: (t: TokenTimings) => (number | null)[]) => {
    const n = Math.max(0, ...all.map((t) => pick(t).length));
    return Array.from({ length: n }, (_, k) => {
      const v = all.map((t) => pick(t)[k]).filter((x): x is number => typeof x === "number");
      return v.length ? round(v.reduce((a, b) => a + b, 0) / v.length) : null;
    });
  };
  return {
    computeMs: col((t) => t.computeMs) as number[],
    wireMs: col((t) => t.wireMs),
    bytes: col((t) => t.bytes) as number[],
  };
}

function round(x: number): number {
  return Math.round(x * 1000) / 1000;
}
