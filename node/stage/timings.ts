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

/** The prefill of one request: every chunk's trip through the chain, averaged per stage and per hop. */
export interface PrefillTimings {
  /** Chunks the prompt was cut into. */
  chunks: number;
  /** Mean compute per chunk, per stage, ms. */
  computeMs: number[];
  /** Mean time a chunk waited at each stage, after it arrived, behind the previous one, ms. */
  waitMs: number[];
  /** Mean wire time per chunk, per hop (stage k -> k + 1), ms. */
  wireMs: number[];
  /** Mean bytes per chunk, per hop. */
  bytes: number[];
}

/** Per-stage and per-hop means over the prefill chunks' traces (the last chunk's is the first token's). */
export function prefillTimings(chunks: HopTrace[][]): PrefillTimings {
  const mean = (xs: number[]) => round(xs.reduce((a, b) => a + b, 0) / Math.max(1, xs.length));
  const stages = Math.max(0, ...chunks.map((t) => t.length));
  const col = (f: (t: HopTrace[], k: number) => number | undefined, n: number) =>
    Array.from(
      { length: Math.max(0, n) },
      (_, k) => mean(chunks.map((t) => f(t, k)).filter((x): x is number => x !== undefined)),
    );
  return {
    chunks: chunks.length,
    computeMs: col((t, k) => t[k]?.c, stages),
    waitMs: col((t, k) => (t[k] ? t[k].w ?? 0 : undefined), stages),
    wireMs: col((t, k) => (t[k + 1] ? t[k + 1].in - t[k].out : undefined), stages - 1),
    bytes: col((t, k) => (t[k + 1] ? t[k].b : undefined), stages - 1),
  };
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
