import assert from "node:assert/strict";
import { chromeTrace } from "../../node/stage/trace_events.ts";
import { tracePicture } from "../../scripts/trace_picture.ts";

Deno.test("trace_picture: a row per node thread with events in the tokens asked for, spans to scale", () => {
  const steps = [0, 1, 2].map((k) => ({
    token: 10 + k,
    trace: [
      { s: 0, in: 1000 + 100 * k, c: 10, out: 1010 + 100 * k, b: 64, ...(k ? { r: 20 } : {}) },
      {
        s: 1,
        in: 1030 + 100 * k,
        c: 40,
        out: 1070 + 100 * k,
        b: 8,
        x: { "1": { far: [200, 20, [3], 1040 + 100 * k, 10] as [number, number, number[], number, number] } },
      },
    ],
  }));
  const { traceEvents } = chromeTrace(steps, [{ index: 0, node: "a" }, { index: 1, node: "b" }], {
    names: new Map([["a", "ew-4090"], ["far", "ew-3060"]]),
  });
  const svg = tracePicture(traceEvents, { from: 1, to: 2, width: 1000 });
  // Rows: a's compute and wire out, b's compute, wire out and fan-out -> ew-3060, far's expert host.
  const rows = [...svg.matchAll(/text-anchor="end" fill="#333">([^<]*)</g)].map((m) => m[1]);
  assert.deepEqual(rows, [
    "compute",
    "wire out",
    "compute",
    "wire out",
    "fan-out -&gt; ew-3060",
    "expert host",
  ]);
  assert.match(svg, /ew-4090 \(a\): stage 0/);
  const spans = [...svg.matchAll(/<rect x="([\d.]+)" y="\d+" width="([\d.]+)"[^>]*><title>([^<]*)</g)];
  assert.ok(spans.every((m) => !m[3].startsWith("prefill")), "token 0 is outside 1..2");
  const width = (name: string) => Number(spans.find((m) => m[3] === name)![2]);
  // token 1's stage-1 compute (40 ms) is 4 times stage 0's (10 ms).
  const computes = spans.filter((m) => m[3] === "token 1").map((m) => Number(m[2]));
  assert.equal(computes.length, 2);
  assert.ok(Math.abs(computes[1] / computes[0] - 4) < 0.01, `${computes}`);
  assert.ok(width("token 1: layer 1 experts [3] for stage 1") > 0);
  assert.throws(() => tracePicture(traceEvents, { from: 7, to: 9 }), RangeError);
});
