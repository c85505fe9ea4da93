import assert from "node:assert/strict";
import { chromeTrace, RECOVERY_PID, WIRE_PID } from "../../../node/stage/trace_events.ts";

Deno.test("chromeTrace: a span per stage and step, a span per hop, and the token's way back", () => {
  // Two steps on a 3-stage chain, times in epoch ms.
  const steps = [
    {
      token: 7,
      trace: [
        { s: 0, in: 1000, c: 12, out: 1012.5, b: 256 },
        { s: 1, in: 1014, c: 11, out: 1025.5, b: 256 },
        { s: 2, in: 1027, c: 20, out: 1047.5, b: 40 },
      ],
    },
    {
      token: 9,
      trace: [
        { s: 0, in: 1050, c: 10, out: 1060, b: 128, r: 2.5 },
        { s: 1, in: 1061, c: 10, out: 1071, b: 128 },
        { s: 2, in: 1072, c: 15, out: 1087, b: 40 },
      ],
    },
  ];
  const stages = [0, 1, 2].map((index) => ({ index, node: `node${index}-abcdefgh` }));
  const { traceEvents } = chromeTrace(steps, stages);
  const spans = traceEvents.filter((e) => e.ph === "X");
  const compute = spans.filter((e) => e.pid !== WIRE_PID);
  const wire = spans.filter((e) => e.pid === WIRE_PID);
  assert.equal(compute.length, 6);
  assert.deepEqual(compute.map((e) => [e.pid, e.ts, e.dur]).slice(0, 3), [[0, 0, 12000], [1, 14000, 11000], [
    2,
    27000,
    20000,
  ]]);
  assert.deepEqual(compute.map((e) => e.name), [
    "prefill",
    "prefill",
    "prefill",
    "token 1",
    "token 1",
    "token 1",
  ]);
  // 2 hops per step, plus the way back on the decode step (ending where stage 0 starts it).
  assert.equal(wire.length, 5);
  assert.deepEqual(wire[0], {
    name: "prefill: stage 0 -> 1",
    ph: "X",
    pid: WIRE_PID,
    tid: 0,
    ts: 12500,
    dur: 1500,
    args: { bytes: 256 },
  });
  const back = wire.find((e) => e.name.includes("back"))!;
  assert.equal(back.ts! + back.dur!, 50000);
  // Every stage and the wire get a named track.
  assert.equal(traceEvents.filter((e) => e.ph === "M").length, 4);
});

Deno.test("chromeTrace: each recovery is a span on its own track, from the last message to the resumed token", () => {
  const steps = [
    {
      token: 7,
      trace: [{ s: 0, in: 1000, c: 10, out: 1010, b: 64 }, { s: 1, in: 1011, c: 9, out: 1020, b: 4 }],
    },
  ];
  const stages = [0, 1].map((index) => ({ index, node: `node${index}-abcdefgh` }));
  const r = { stage: 1, node: "node1-abcdefgh", reason: "died", ms: 1500, gap_ms: 5000, at: 7000 };
  const { traceEvents } = chromeTrace(steps, stages, [r]);
  const track = traceEvents.filter((e) => e.pid === RECOVERY_PID);
  assert.deepEqual(track.map((e) => e.ph), ["M", "X"]);
  assert.deepEqual(
    [track[1].name, track[1].ts, track[1].dur],
    ["recovery: stage 1 (node1-abcd) died", 1_000_000, 5_000_000],
  );
  assert.equal(chromeTrace(steps, stages).traceEvents.some((e) => e.pid === RECOVERY_PID), false);
});
