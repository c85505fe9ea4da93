// The tables of scripts/bench/pipeline_wan.ts: measured tok/s per delay next to the bound. Pure.
//
// The decode loop is serial (one token in flight per request: the last stage's token starts stage 0's next
// step), so a token takes the sum of every stage's compute and every hop's wire time; H = S hops, the
// token's way back being one. At one-way delay d per hop:
//   bound ms/token = sum of compute per stage (its GPU work plus its readback, each >= the ~11 ms readback
//                    floor of FACTS.md) + H x (d + WIRE_FLOOR_MS), iroh's own one-way cost through a relay
//   0 ms prediction = ms/token measured at 0 ms + H x d
//   floor bound     = S x READBACK_FLOOR_MS + H x d: any GPU, one readback per stage, on that network.
import { meanTimings, type TokenTimings } from "../../node/stage/mod.ts";

/** Per-stage readback floor on this adapter, ms (FACTS.md). */
export const READBACK_FLOOR_MS = 11;
/** iroh's one-way time through a 0 ms relay between two namespaces: half the 1.6 ms p50 round trip (docs/WAN.md). */
export const WIRE_FLOOR_MS = 0.8;

/** One generation as the bench leader reports it. */
export interface Result {
  tokens: number[];
  stopReason: string;
  tokS: number;
  firstTokenMs: number;
  mean: TokenTimings;
  /** Decode tokens only (the first token's timings include the prompt). */
  perToken: TokenTimings[];
  /** ms per token after the first decode step (cli/prediction.ts), when reported. */
  msPerToken?: number;
  /** The cost model's ms per token for this request from the live descriptors, when reported. */
  predictedMs?: number;
  /** Its per-stage compute (with fixed costs) and hop ms. */
  predictedStages?: { computeMs: number; hopMs: number }[];
  /** Speculative decoding: passes through the chain that decided tokens (the prefill's included). */
  trips?: number;
  /** Speculative decoding: drafts kept over drafts judged. */
  acceptance?: number | null;
}

/** Speculative decoding's requests at one delay (pipeline_wan.ts --speculate), plain ones included. */
export interface SpecRun extends Run {
  /** "plain", "plain, repetitive prompt", or the drafter's. */
  name: string;
  /** The plain run of the same prompt, which its tokens and tok/s are compared with. */
  plain: string;
}

/** The measured requests at one delay. */
export interface Run {
  delayMs: number;
  hops: number;
  results: Result[];
}

const sum = (xs: (number | null)[]) => xs.reduce<number>((a, b) => a + (b ?? 0), 0);
const f = (x: number, digits = 1) => x.toFixed(digits);
const list = (xs: (number | null)[]) => `[${xs.map((x) => (x === null ? "-" : f(x))).join(", ")}]`;

/** Decode timings of every request pooled; tok/s over all their decode time (each request weighed by its tokens). */
export function pooled(run: Run): { timings: TokenTimings; tokS: number[]; meanTokS: number } {
  const timings = meanTimings(run.results.flatMap((r) => r.perToken));
  const tokS = run.results.map((r) => r.tokS);
  const tokens = sum(run.results.map((r) => r.tokens.length - 1));
  const ms = sum(run.results.map((r) => (r.tokens.length - 1) * 1000 / r.tokS));
  return { timings, tokS, meanTokS: ms > 0 ? tokens * 1000 / ms : 0 };
}

/** The bound at `delayMs` for a chain with these decode timings (see the top of the file). */
export function boundMs(t: TokenTimings, delayMs: number): number {
  return sum(t.computeMs) + t.wireMs.length * (delayMs + WIRE_FLOOR_MS);
}

const matches = (tokens: number[], want: number[]) => want.every((x, i) => tokens[i] === x);

/** Markdown tables of the runs (breakdown, then bounds), and whether every run's tokens were right. */
export function runsTable(
  runs: Run[],
  check: { single: number[]; expected: number[] },
): { markdown: string; correct: boolean } {
  const base = runs.find((r) => r.delayMs === 0);
  const baseMs = base ? 1000 / pooled(base).meanTokS : undefined;
  const breakdown: string[] = [
    "| one-way delay per hop, ms | tok/s (each request) | ms/token | compute ms per stage | sum | " +
    "wire ms per hop (k -> k+1, last -> 0) | sum | untraced ms | tokens = single node |",
    "|---|---|---|---|---|---|---|---|---|",
  ];
  const bounds: string[] = [
    "| one-way delay per hop, ms | measured tok/s | bound tok/s | measured / bound | 0 ms prediction tok/s | " +
    "floor bound tok/s |",
    "|---|---|---|---|---|---|",
  ];
  let correct = true;
  for (const run of runs) {
    const p = pooled(run);
    const t = p.timings;
    const msPerToken = 1000 / p.meanTokS;
    const ok = run.results.every((r) =>
      r.tokens.length === check.single.length && matches(r.tokens, check.single) &&
      matches(r.tokens, check.expected)
    );
    correct &&= ok;
    breakdown.push(
      `| ${run.delayMs} | ${p.tokS.map((x) => f(x, 2)).join(", ")} | ${f(msPerToken)} | ${
        list(t.computeMs)
      } | ` +
        `${f(sum(t.computeMs))} | ${list(t.wireMs)} | ${f(sum(t.wireMs))} | ` +
        `${f(msPerToken - sum(t.computeMs) - sum(t.wireMs))} | ${ok ? "yes" : "NO"} |`,
    );
    const bound = 1000 / boundMs(t, run.delayMs);
    const predicted = baseMs === undefined ? "-" : f(1000 / (baseMs + run.hops * run.delayMs), 2);
    const floor = 1000 / (t.computeMs.length * READBACK_FLOOR_MS + run.hops * run.delayMs);
    bounds.push(
      `| ${run.delayMs} | ${f(p.meanTokS, 2)} | ${f(bound, 2)} | ${f(p.meanTokS / bound * 100, 0)}% | ` +
        `${predicted} | ${f(floor, 2)} |`,
    );
  }
  const predicted = predictionTable(runs);
  return {
    markdown: breakdown.join("\n") + "\n\n" + bounds.join("\n") + (predicted ? "\n\n" + predicted : ""),
    correct,
  };
}

/**
 * Predicted (the cost model on the live descriptors) against measured ms per token, per delay: means over
 * the requests, and per stage and hop; undefined when the leader reported no predictions.
 */
export function predictionTable(runs: Run[]): string | undefined {
  const withPrediction = runs.filter((r) => r.results.some((x) => x.predictedMs !== undefined));
  if (withPrediction.length === 0) return undefined;
  const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;
  const lines = [
    "| one-way delay per hop, ms | predicted ms/token | measured ms/token | measured / predicted | " +
    "predicted compute ms per stage | measured | predicted hop ms | measured |",
    "|---|---|---|---|---|---|---|---|",
  ];
  for (const run of withPrediction) {
    const rs = run.results.filter((x) => x.predictedMs !== undefined && x.msPerToken !== undefined);
    if (rs.length === 0) continue;
    const p = mean(rs.map((x) => x.predictedMs!)), m = mean(rs.map((x) => x.msPerToken!));
    const stages = rs[0].predictedStages ?? [];
    const col = (k: "computeMs" | "hopMs") =>
      stages.map((_, i) => mean(rs.map((x) => x.predictedStages![i][k])));
    const t = pooled(run).timings;
    lines.push(
      `| ${run.delayMs} | ${f(p)} | ${f(m)} | ${f(m / p, 2)} | ${list(col("computeMs"))} | ${
        list(t.computeMs)
      } | ` +
        `${list(col("hopMs"))} | ${list(t.wireMs)} |`,
    );
  }
  return lines.join("\n");
}

/** Tokens-weighted tok/s of requests (decode tokens over decode time, as `pooled`). */
function meanTokS(results: Result[]): number {
  const tokens = sum(results.map((r) => r.tokens.length - 1));
  const ms = sum(results.map((r) => (r.tokens.length - 1) * 1000 / r.tokS));
  return ms > 0 ? tokens * 1000 / ms : 0;
}

/**
 * The speculative decoding table: each run next to plain decoding of the same prompt at the same delay, and
 * the plain bound 1000 / (hops x delay) (one token per trip, compute free). Correct when every request's
 * tokens equal its plain run's (greedy: speculation must not change them).
 */
export function specTable(runs: SpecRun[]): { markdown: string; correct: boolean } {
  const lines = [
    "| one-way delay per hop, ms | run | tok/s (each request) | tok/s | x plain | plain bound tok/s | " +
    "trips | tokens/trip | acceptance | tokens = plain |",
    "|---|---|---|---|---|---|---|---|---|---|",
  ];
  let correct = true;
  for (const run of runs) {
    const plain = runs.find((r) => r.delayMs === run.delayMs && r.name === run.plain);
    const want = plain?.results[0]?.tokens;
    const ok = want !== undefined &&
      run.results.every((r) => r.tokens.length === want.length && matches(r.tokens, want));
    correct &&= ok;
    const tokS = meanTokS(run.results);
    const bound = run.delayMs > 0 ? f(1000 / (run.hops * run.delayMs)) : "-";
    const spec = run.results.every((r) => r.trips !== undefined);
    const trips = spec ? sum(run.results.map((r) => r.trips!)) / run.results.length : undefined;
    const judged = run.results.map((r) => r.acceptance).filter((a): a is number => typeof a === "number");
    lines.push(
      `| ${run.delayMs} | ${run.name} | ${run.results.map((r) => f(r.tokS, 2)).join(", ")} | ${
        f(tokS, 2)
      } | ` +
        `${plain ? f(tokS / meanTokS(plain.results), 2) : "-"} | ${bound} | ` +
        `${trips === undefined ? "" : f(trips)} | ` +
        `${
          trips === undefined
            ? "1"
            : f(sum(run.results.map((r) => r.tokens.length)) / run.results.length / trips, 2)
        } | ` +
        `${judged.length ? f(sum(judged) / judged.length, 2) : ""} | ${ok ? "yes" : "NO"} |`,
    );
  }
  return { markdown: lines.join("\n"), correct };
}
