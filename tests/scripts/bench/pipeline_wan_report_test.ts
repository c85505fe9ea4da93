// The bound and the tables of the WAN pipeline bench (scripts/bench/pipeline_wan_report.ts).
import assert from "node:assert/strict";
import {
  boundMs,
  pooled,
  READBACK_FLOOR_MS,
  type Result,
  runsTable,
  specTable,
  WIRE_FLOOR_MS,
} from "../../../scripts/bench/pipeline_wan_report.ts";

const timing = (wire: number) => ({
  computeMs: [10, 20, 30],
  wireMs: [wire, wire, wire],
  bytes: [128, 128, 500],
});

function result(tokens: number[], tokS: number, wire: number): Result {
  return {
    tokens,
    stopReason: "max_tokens",
    tokS,
    firstTokenMs: 100,
    mean: timing(wire),
    perToken: tokens.slice(1).map(() => timing(wire)),
  };
}

Deno.test("bound: compute of every stage plus delay and iroh's floor on every hop", () => {
  assert.equal(boundMs(timing(99), 0), 60 + 3 * WIRE_FLOOR_MS);
  assert.equal(boundMs(timing(99), 25), 60 + 3 * (25 + WIRE_FLOOR_MS));
  assert.equal(READBACK_FLOOR_MS, 11);
});

Deno.test("pooled tok/s weighs requests by their time, not the mean of their rates", () => {
  // 4 decode tokens at 10 tok/s (400 ms) and 4 at 40 tok/s (100 ms): 8 tokens in 500 ms.
  const run = {
    delayMs: 0,
    hops: 3,
    results: [result([1, 2, 3, 4, 5], 10, 1), result([1, 2, 3, 4, 5], 40, 3)],
  };
  const p = pooled(run);
  assert.ok(Math.abs(p.meanTokS - 16) < 1e-9);
  assert.deepEqual(p.timings.wireMs, [2, 2, 2]);
});

Deno.test("runsTable flags a run whose tokens differ from the single node's or the reference", () => {
  const good = { delayMs: 0, hops: 3, results: [result([7, 8, 9], 5, 1)] };
  const bad = { delayMs: 10, hops: 3, results: [result([7, 8, 6], 5, 11)] };
  const ok = runsTable([good], { single: [7, 8, 9], expected: [7, 8] });
  assert.equal(ok.correct, true);
  assert.match(ok.markdown, /\| 0 \| 5\.00 \| 200\.0 \| \[10\.0, 20\.0, 30\.0\] \| 60\.0 \|/);
  const wrong = runsTable([good, bad], { single: [7, 8, 9], expected: [7, 8] });
  assert.equal(wrong.correct, false);
  assert.match(wrong.markdown, /\| NO \|/);
  // The 0 ms prediction at 10 ms: 200 ms + 3 hops x 10 ms = 230 ms, 4.35 tok/s.
  assert.match(wrong.markdown, /\| 10 \| 5\.00 \| [\d.]+ \| \d+% \| 4\.35 \|/);
});

Deno.test("prediction table: predicted and measured ms/token per delay, their ratio, per stage and hop", () => {
  const withPrediction = (r: Result, predictedMs: number, msPerToken: number): Result => ({
    ...r,
    predictedMs,
    msPerToken,
    predictedStages: [{ computeMs: 9, hopMs: 1 }, { computeMs: 19, hopMs: 1 }, { computeMs: 29, hopMs: 2 }],
  });
  const runs = [{
    delayMs: 0,
    hops: 3,
    results: [
      withPrediction(result([1, 2, 3], 10, 1), 60, 66),
      withPrediction(result([1, 2, 3], 10, 1), 62, 64),
    ],
  }];
  const md = runsTable(runs, { single: [1, 2, 3], expected: [1, 2] }).markdown;
  assert.match(md, /\| 0 \| 61\.0 \| 65\.0 \| 1\.07 \| \[9\.0, 19\.0, 29\.0\] \| \[10\.0, 20\.0, 30\.0\] \|/);
  // Without predictions (an older leader), no such table.
  const plain = runsTable([{ delayMs: 0, hops: 3, results: [result([1, 2, 3], 10, 1)] }], {
    single: [1, 2, 3],
    expected: [1, 2],
  }).markdown;
  assert.doesNotMatch(plain, /predicted ms\/token/);
});

Deno.test("speculative table: each run against plain decoding of its prompt at its delay; tokens must match", () => {
  const plain = {
    delayMs: 25,
    hops: 5,
    name: "plain",
    plain: "plain",
    results: [result([1, 2, 3, 4, 5], 7, 26)],
  };
  const spec = (tokens: number[]) => ({
    delayMs: 25,
    hops: 5,
    name: "target as draft",
    plain: "plain",
    results: [{ ...result(tokens, 28, 26), trips: 2, acceptance: 1 }],
  });
  const ok = specTable([plain, spec([1, 2, 3, 4, 5])]);
  assert.ok(ok.correct);
  const row = ok.markdown.split("\n").find((l) => l.includes("target as draft"))!;
  // 4x plain; bound 1000 / (5 x 25) = 8 tok/s; 5 tokens in 2 trips.
  assert.equal(row, "| 25 | target as draft | 28.00 | 28.00 | 4.00 | 8.0 | 2.0 | 2.50 | 1.00 | yes |");
  const bad = specTable([plain, spec([1, 2, 3, 9, 5])]);
  assert.ok(!bad.correct);
  assert.match(bad.markdown, /\| NO \|$/m);
});
