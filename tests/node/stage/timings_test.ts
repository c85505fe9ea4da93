// Wire times from hop traces: a hop ends when the next stage receives the message (in); the time the step
// then waits there behind the request's earlier steps (w) is not wire time. The prefill's chunks are
// averaged per stage and per hop.
import assert from "node:assert/strict";
import { prefillTimings, tokenTimings } from "../../../node/stage/timings.ts";
import type { HopTrace } from "../../../node/stage/messages.ts";

/** Stage s receives at `at`, waits w, computes c, and sends b bytes on. */
const hop = (s: number, at: number, c: number, b: number, w?: number): HopTrace =>
  w === undefined ? { s, in: at, c, out: at + c, b } : { s, in: at, c, out: at + w + c, b, w };

Deno.test("timings: the wait at a busy stage is not counted as wire time", () => {
  // stage 0 sends at 10; stage 1 receives it at 11 but computes only from 15 (w = 4)
  const t = tokenTimings([hop(0, 0, 10, 100), hop(1, 11, 5, 0, 4)]);
  assert.deepEqual(t.wireMs, [1, null]);
  assert.deepEqual(t.computeMs, [10, 5]);
});

Deno.test("timings: prefill chunks are averaged per stage and per hop", () => {
  const p = prefillTimings([
    [hop(0, 0, 10, 1000), hop(1, 11, 20, 2000), hop(2, 33, 5, 0)],
    [hop(0, 10, 10, 3000), hop(1, 21, 20, 4000, 10), hop(2, 53, 5, 0)],
  ]);
  assert.deepEqual(p, {
    chunks: 2,
    computeMs: [10, 20, 5],
    waitMs: [0, 5, 0],
    wireMs: [1, 2],
    bytes: [2000, 3000],
  });
});
