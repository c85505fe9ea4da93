import assert from "node:assert/strict";
import { addTraceNote, chromeTrace } from "../../node/stage/trace_events.ts";
import type { HopTrace } from "../../node/stage/messages.ts";
import { breakdown, breakdownMarkdown } from "../../scripts/trace_breakdown.ts";

// A 2-stage chain, epoch ms. Stage 1 runs MoE layer 1 with two remote hosts (4 and 6 ms: the slowest counts)
// and layer 2 with one (3 ms).
function steps(): { token: number; trace: HopTrace[] }[] {
  return [
    {
      token: 5,
      trace: [
        { s: 0, in: 1000, c: 20, out: 1020, b: 500 },
        { s: 1, in: 1030, c: 30, out: 1060, b: 8 },
      ],
    },
    {
      token: 6,
      trace: [
        { s: 0, in: 1100, c: 2, out: 1102, b: 128, r: 15 },
        {
          s: 1,
          in: 1112,
          c: 13,
          out: 1125,
          b: 8,
          x: {
            "1": { a: [300, 4, [0], 1113, 3], b: [300, 6, [5], 1113, 2] },
            "2": { a: [300, 3, [1], 1120, 1] },
          },
        },
      ],
    },
  ];
}

Deno.test("trace_breakdown: per token, the stages' own compute, the fan-outs, the wire and the bytes", () => {
  const s = steps();
  addTraceNote(s[1].trace[1], { name: "recovered", cat: "recovery", at: 1126, ms: 5 });
  const { traceEvents } = chromeTrace(s, [{ index: 0, node: "n0" }, { index: 1, node: "n1" }]);
  const b = breakdown(traceEvents);
  assert.deepEqual(b.kinds, ["recovery"]);
  const [prefill, t1] = b.tokens;
  assert.deepEqual(
    [prefill.token, prefill.totalMs, prefill.computeMs, prefill.fanoutMs, prefill.wireMs, prefill.hopBytes],
    [0, 60, 50, 0, 10, 500],
  );
  // compute 2 + 13 = 15, of which fan-out max(4, 6) + 3 = 9; wire 10 (hop) + 15 (token back) = 25.
  assert.equal(t1.token, 1);
  assert.equal(t1.totalMs, 40);
  assert.equal(t1.computeMs, 6);
  assert.equal(t1.fanoutMs, 9);
  assert.equal(t1.hostMs, 3, "the slowest destination's host compute per layer: 2 + 1");
  assert.equal(t1.wireMs, 25);
  assert.equal(t1.hopBytes, 128 + 8);
  assert.equal(t1.fanoutBytes, 900);
  assert.deepEqual(t1.other, { recovery: 5 });
  assert.deepEqual(b.stages.map((x) => [x.stage, x.computeMs, x.fanoutMs, x.hopMs]), [[0, 2, 0, 10], [
    1,
    4,
    9,
    15,
  ]]);
  const md = breakdownMarkdown(b);
  assert.match(
    md,
    /\| \*\*decode mean\*\* \| 40\.0 \| 6\.0 \| 9\.0 \| 3\.0 \| 25\.0 \| 136 \| 900 \| 5\.0 \|/,
  );
  assert.match(md, /\| share \| 100% \| 15% \| 23% \| 8% \| 63% \|/);
});
