// The decode loop's batch sizes (models/pacing.ts): they grow as fast as the host's encode keeps ahead of the
// GPU, from per-step times measured only where they can be.
import assert from "node:assert/strict";
import { BLOCKED_MS, DecodePace, grow } from "../../models/pacing.ts";

Deno.test("grow: doubles where the ratio is unknown, at least 2 or under 1; else by the ratio, at least one step", () => {
  assert.deepEqual([1, 2, 4, 8].map((s) => grow(s, 0)), [2, 4, 8, 16]);
  assert.deepEqual([1, 3].map((s) => grow(s, 2.5)), [2, 6]);
  assert.deepEqual([1, 3].map((s) => grow(s, 0.6)), [2, 6]);
  // A step's encode at 0.7 of its GPU time: the sizes an engine's loop takes from one step.
  const sizes = [1];
  while (sizes.at(-1)! < 16) sizes.push(Math.min(16, grow(sizes.at(-1)!, 1 / 0.7)));
  assert.deepEqual(sizes, [1, 2, 3, 4, 5, 7, 10, 14, 16]);
  assert.deepEqual(grow(1, 1), 2);
  assert.deepEqual(grow(10, 1), 11);
});

Deno.test("DecodePace measures the GPU only from map calls that waited, and caps at the maximum", () => {
  const pace = new DecodePace();
  assert.deepEqual(pace.next(4, 16), 8);
  pace.noteHost(2, 0.7); // 0.35 ms a step
  pace.noteRun(2, 100, 100.5, 100.5 + BLOCKED_MS / 2); // found the GPU idle: no GPU time learnt
  assert.deepEqual(pace.gpuMs, 0);
  assert.deepEqual(pace.next(4, 16), 8);
  pace.noteRun(2, 100, 100.7, 101); // waited: 0.5 ms a step
  assert.deepEqual(pace.gpuMs, 0.5);
  assert.deepEqual(pace.next(4, 16), 5);
  assert.deepEqual(pace.next(14, 16), 16);
  pace.noteRun(0, 100, 100, 110); // the prefill's batch: no steps
  assert.deepEqual(pace.gpuMs, 0.5);
});
