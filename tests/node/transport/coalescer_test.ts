import assert from "node:assert/strict";
import { Coalescer, MAX_WRITE } from "../../../node/transport/coalescer.ts";

function bytes(n: number, seed: number): Uint8Array {
  return Uint8Array.from({ length: n }, (_, i) => (i * 31 + seed) & 0xff);
}

Deno.test("small frames queued in one tick go out as one write, in order", async () => {
  const writes: number[][] = [];
  const c = new Coalescer((b) => {
    writes.push(Array.from(b));
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
    writes.push(Array.from(b));
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

Deno.test("a TLS-style coalescer writes a large frame as views of it, up to maxWriteBytes, without timers", async () => {
  const writes: Uint8Array[] = [];
  const c = new Coalescer(
    (b) => {
      writes.push(b);
      return Promise.resolve();
    },
    () => {},
    { maxWriteBytes: 1 << 20, yieldBetweenWrites: false },
  );
  const big = bytes(2.5 * (1 << 20), 5);
  await c.enqueue(big);
  await new Promise((r) => setTimeout(r, 0));
  assert.deepEqual(writes.map((w) => w.length), [1 << 20, 1 << 20, 1 << 19]);
  assert.ok(writes.every((w) => w.buffer === big.buffer), "large frames are handed over without a copy");
});

Deno.test("a window of 100,000 tiny frames is coalesced in order, in linear time", async () => {
  const writes: Uint8Array[] = [];
  const c = new Coalescer(
    (b) => {
      writes.push(b.slice());
      return Promise.resolve();
    },
    () => {},
    { flushBytes: 4096 },
  );
  const t0 = performance.now();
  const frames = Array.from({ length: 100000 }, (_, i) => Uint8Array.of(i & 255, (i >> 8) & 255));
  await Promise.all(frames.map((f) => c.enqueue(f)));
  while (writes.reduce((n, w) => n + w.length, 0) < 200000) await new Promise((r) => setTimeout(r, 1));
  const all = new Uint8Array(200000);
  let o = 0;
  for (const w of writes) {
    all.set(w, o);
    o += w.length;
  }
  for (let i = 0; i < 100000; i++) assert.deepEqual([all[2 * i], all[2 * i + 1]], [i & 255, (i >> 8) & 255]);
  assert.ok(performance.now() - t0 < 1000, `took ${performance.now() - t0} ms`);
});
