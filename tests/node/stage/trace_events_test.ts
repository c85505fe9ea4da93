import assert from "node:assert/strict";
import {
  addTraceNote,
  chromeTrace,
  recoveryNotes,
  type TraceEvent,
} from "../../../node/stage/trace_events.ts";
import type { HopTrace } from "../../../node/stage/messages.ts";

// Two steps on a 3-stage chain, times in epoch ms.
function steps(): { token: number; trace: HopTrace[] }[] {
  return [
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
        {
          s: 1,
          in: 1061,
          c: 10,
          out: 1071,
          b: 128,
          // layer 3's fan-out: 300 B to node h (experts 4, 5) from 1063 for 4 ms, and the stage's own node
          x: {
            "3": { "hhhhhhhhhhhhhhhh": [300, 4, [4, 5], 1063, 1], "node1-abcdefgh": [0, 0.5, [1], 1063] },
          },
        },
        { s: 2, in: 1072, c: 15, out: 1087, b: 40 },
      ],
    },
  ];
}
const stages = [0, 1, 2].map((index) => ({ index, node: `node${index}-abcdefgh` }));
const spans = (t: TraceEvent[], cat: string) => t.filter((e) => e.ph !== "M" && e.cat === cat);

Deno.test("chromeTrace: a track per node, a compute span per stage and step, a hop span per hop", () => {
  const { traceEvents } = chromeTrace(steps(), stages, { names: new Map([["node0-abcdefgh", "ew-4090"]]) });
  const compute = spans(traceEvents, "compute");
  assert.equal(compute.length, 6);
  assert.deepEqual(compute.slice(0, 3).map((e) => [e.pid, e.ts, e.dur, e.name]), [
    [1, 0, 12000, "prefill"],
    [2, 14000, 11000, "prefill"],
    [3, 27000, 20000, "prefill"],
  ]);
  assert.deepEqual(compute.map((e) => e.args!.token), [0, 0, 0, 1, 1, 1]);
  // 2 hops per step, plus the way back on the decode step (ending where stage 0 starts it).
  const hops = spans(traceEvents, "hop");
  assert.equal(hops.length, 5);
  assert.deepEqual(hops[0], {
    name: "prefill: stage 0 -> 1",
    cat: "hop",
    ph: "X",
    pid: 1,
    tid: 1,
    ts: 12500,
    dur: 1500,
    args: { token: 0, from: 0, to: 1, bytes: 256, wire_ms: 1.5 },
  });
  const back = hops.find((e) => e.name.includes("back"))!;
  assert.equal(back.pid, 3, "the token's way back leaves the last stage's node");
  assert.equal(back.ts! + back.dur!, 50000);
  const procs = traceEvents.filter((e) => e.name === "process_name").map((e) => e.args!.name);
  assert.deepEqual(procs.slice(0, 3), [
    "ew-4090 (node0-abcd): stage 0",
    "(node1-abcd): stage 1",
    "(node2-abcd): stage 2",
  ]);
});

Deno.test("chromeTrace: a MoE layer's fan-out per destination, on the stage's track and the host's", () => {
  const { traceEvents } = chromeTrace(steps(), stages);
  const fanout = spans(traceEvents, "fanout");
  assert.equal(fanout.length, 2, "one span per destination node of the layer");
  const remote = fanout.find((e) => e.args!.bytes === 300)!;
  assert.equal(remote.pid, 2, "on the stage's node");
  assert.equal(remote.ts, 63000);
  assert.equal(remote.dur, 4000);
  assert.deepEqual(remote.args, { token: 1, layer: 3, stage: 1, bytes: 300, experts: [4, 5], host_ms: 1 });
  const host = spans(traceEvents, "expert");
  assert.equal(host.length, 1, "the stage's own experts are not a host's call");
  assert.equal(host[0].pid, 4, "the host gets a track of its own after the stages");
  // The host computed 1 ms of the 4: drawn in the middle of the call.
  assert.deepEqual([host[0].ts, host[0].dur], [64500, 1000]);
  const procs = traceEvents.filter((e) => e.name === "process_name").map((e) => e.args!.name);
  assert.equal(procs[3], "(hhhhhhhhhh): experts");
  // Destinations overlap in time: each gets a thread of its own on the stage's track.
  assert.notEqual(fanout[0].tid, fanout[1].tid);
});

Deno.test("chromeTrace: notes (recoveries, speculation) land on their node's events thread", () => {
  const s = steps();
  addTraceNote(s[1].trace[2], { name: "draft accepted 3/4", cat: "speculation", at: 1080, ms: 2 });
  const { traceEvents } = chromeTrace(s, stages, {
    notes: [{ name: "stage 1 replaced", cat: "recovery", at: 1049, node: "node1-abcdefgh" }],
  });
  const spec = spans(traceEvents, "speculation");
  assert.deepEqual(spec.map((e) => [e.pid, e.tid, e.ts, e.dur, e.args!.token]), [[3, 3, 80000, 2000, 1]]);
  const rec = spans(traceEvents, "recovery");
  assert.deepEqual(rec.map((e) => [e.pid, e.ph, e.ts]), [[2, "i", 49000]]);
  const threads = traceEvents.filter((e) => e.name === "thread_name" && e.args!.name === "events");
  assert.equal(threads.length, 2);
});

Deno.test("chromeTrace: each recovery is a span on the lost node's track, from the last message to the resumed token", () => {
  const steps = [
    {
      token: 7,
      trace: [{ s: 0, in: 1000, c: 10, out: 1010, b: 64 }, { s: 1, in: 1011, c: 9, out: 1020, b: 4 }],
    },
  ];
  const stages = [0, 1].map((index) => ({ index, node: `node${index}-abcdefgh` }));
  const r = { stage: 1, node: "node9-gone", reason: "died", ms: 1500, gap_ms: 5000, at: 7000 };
  const { traceEvents } = chromeTrace(steps, stages, { notes: recoveryNotes([r], stages[0].node) });
  const rec = spans(traceEvents, "recovery");
  assert.deepEqual(
    rec.map((e) => [e.name, e.pid, e.ts, e.dur]),
    [["recovery: stage 1 (node9-gone) died", 3, 1_000_000, 5_000_000]],
  );
  assert.equal(spans(chromeTrace(steps, stages).traceEvents, "recovery").length, 0);
});

Deno.test("chromeTrace: a speculative step's drafting is a span on stage 0's node", () => {
  const s = [{ ...steps()[0], label: "verify 1: 2/3 drafts kept", draft: { at: 1001, ms: 0.5 } }];
  const d = spans(chromeTrace(s, stages).traceEvents, "draft");
  assert.deepEqual(d.map((e) => [e.name, e.pid, e.ts, e.dur]), [[
    "draft: verify 1: 2/3 drafts kept",
    1,
    1000,
    500,
  ]]);
});
