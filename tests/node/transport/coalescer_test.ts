import assert from "node:assert/strict";
import { Coalescer, MAX_WRITE } from "../../../node/transport/coalescer.ts";

function bytes(n: number, seed: number): Uint8Array {
  return Uint8Array.from({ length: n }, (_, i) => (i * 31 + seed) & 0xff);
}

Deno.test("small frames queued in one tick go out as one write, in order", async () => {
  const writes: number[][] = [];
  const c = new Coalescer((b) => {
    writes.push(b);
    return Promise.resolve();
  }, () => {});
  const frames = [bytes(10, 1), bytes(20, 2), bytes(5, 3)];
  for (const f of frames) void c.enqueue(f);
  await new Promise((r) => setTimeout(r, 10));
  assert.equal(writes.length, 1);
  assert.deepEqual(writes[0], frames.flatMap((f) => Array.from(f)));
});

Deno.test("a large message is written in pieces of at most MAX_WRITE, and timers run between them", async () => {
  const writes: number[][] = [];
  let timerRanAt = -1;
  const c = new Coalescer((b) => {
    writes.push(b);
    return Promise.resolve();
  }, () => {});
  const big = bytes(3 * MAX_WRITE + 123, 7);
  const small = bytes(100, 9);
  setTimeout(() => (timerRanAt = writes.length), 0);
  await c.enqueue(big);
  await c.enqueue(small);
  while (writes.reduce((s, w) => s + w.length, 0) < big.length + small.length) {
    await new Promise((r) => setTimeout(r, 1));
  }
  assert.ok(writes.every((w) => w.length <= MAX_WRITE));
  assert.ok(writes.length >= 4);
  assert.deepEqual(writes.flat(), [...Array.from(big), ...Array.from(small)]);
  assert.ok(
    timerRanAt >= 1 && timerRanAt < writes.length,
    `timer ran after write ${timerRanAt} of ${writes.length}`,
  );
});
