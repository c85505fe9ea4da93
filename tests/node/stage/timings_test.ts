// Wire times from hop traces: a message's wait in a busy stage's mailbox (w) is not wire time; the
// prefill's chunks are averaged per stage and per hop.
import assert from "node:assert/strict";
import { prefillTimings, tokenTimings } from "../../../node/stage/timings.ts";
import type { HopTrace } from "../../../node/stage/messages.ts";

const hop = (s: number, at: number, c: number, b: number, w?: number): HopTrace =>
  w === undefined ? { s, in: at, c, out: at + c, b } : { s, in: at, c, out: at + c, b, w };

Deno.test("timings: the wait in a stage's mailbox is not counted as wire time", () => {
  // stage 0 sends at 10; stage 1's mailbox got it at 11 but was busy until 15 (w = 4)
  const t = tokenTimings([hop(0, 0, 10, 100), hop(1, 15, 5, 0, 4)]);
  assert.deepEqual(t.wireMs, [1, null]);
  assert.deepEqual(t.computeMs, [10, 5]);
});

Deno.test("timings: prefill chunks are averaged per stage and per hop", () => {
  const p = prefillTimings([
    [hop(0, 0, 10, 1000), hop(1, 11, 20, 2000), hop(2, 33, 5, 0)],
    [hop(0, 10, 10, 3000), hop(1, 31, 20, 4000, 10), hop(2, 53, 5, 0)],
  ]);
  assert.deepEqual(p, {
    chunks: 2,
    computeMs: [10, 20, 5],
    waitMs: [0, 5, 0],
    wireMs: [1, 2],
    bytes: [2000, 3000],
  });
});
