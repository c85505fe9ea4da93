// Readback (kernels/readback.ts): every read returns exactly what the GPU buffer holds at that point in
// the queue, whether it is read early (as the map call returns, on the pinned Deno) or by awaiting the
// promise; reads of many sizes and many at once; and, where the early path is on, primed staging
// buffers are read early.
import assert from "node:assert/strict";
import {
  checkEarlyRead,
  FAST_READBACK,
  readBack,
  readbackStats,
  reserveStaging,
  storageBuffer,
  writeBytes,
} from "../../kernels/mod.ts";
import { gpuOrSkip } from "./harness.ts";

const gpu = await gpuOrSkip();
const ignore = gpu === null;

Deno.test(
  { name: "readBack returns the buffer's bytes at that point in the queue, read after read", ignore },
  async () => {
    const g = gpu!;
    const buf = storageBuffer(g, 4096);
    await reserveStaging(g, 4096, 2);
    const early0 = readbackStats.early;
    for (let i = 0; i < 12; i++) {
      const want = Uint32Array.from({ length: 1024 }, (_, k) => (i * 7919 + k * 31) >>> 0);
      writeBytes(g, buf, 0, want);
      const got = new Uint32Array(await readBack(g, buf, 4096));
      assert.deepEqual(got, want, `read ${i}`);
      // A sub-range at an offset.
      const part = new Uint32Array(await readBack(g, buf, 12, 40));
      assert.deepEqual(part, want.slice(10, 13));
    }
    if (FAST_READBACK) {
      assert.ok(
        readbackStats.early - early0 >= 12,
        `early reads: ${readbackStats.early - early0}`,
      );
    } else console.log("early readback is off here (not Deno 2.9, or SWACTOR_FAST_READBACK=0)");
    buf.destroy();
  },
);

Deno.test({ name: "readBack: many reads at once and of many sizes are all exact", ignore }, async () => {
  const g = gpu!;
  const sizes = [4, 12, 256, 260, 5000, 1 << 20];
  const bufs = sizes.map((n, i) => {
    const b = storageBuffer(g, n);
    writeBytes(g, b, 0, Uint8Array.from({ length: n }, (_, k) => (k * 13 + i) & 255));
    return b;
  });
  for (let round = 0; round < 3; round++) {
    const got = await Promise.all(bufs.map((b, i) => readBack(g, b, sizes[i])));
    got.forEach((ab, i) => {
      const want = Uint8Array.from({ length: sizes[i] }, (_, k) => (k * 13 + i) & 255);
      assert.deepEqual(new Uint8Array(ab), want, `size ${sizes[i]}, round ${round}`);
    });
  }
  for (const b of bufs) b.destroy();
});

Deno.test({
  name: "readBack reads what the queue holds when it is called, not what is written after",
  ignore,
}, async () => {
  const g = gpu!;
  const buf = storageBuffer(g, 16);
  writeBytes(g, buf, 0, new Uint32Array([1, 2, 3, 4]));
  const first = readBack(g, buf, 16);
  writeBytes(g, buf, 0, new Uint32Array([5, 6, 7, 8])); // before the first read has settled
  assert.deepEqual(new Uint32Array(await first), new Uint32Array([1, 2, 3, 4]));
  assert.deepEqual(new Uint32Array(await readBack(g, buf, 16)), new Uint32Array([5, 6, 7, 8]));
  // The early path's self-check passed on this device wherever the early path is on.
  assert.equal(await checkEarlyRead(g), FAST_READBACK);
  buf.destroy();
});

Deno.test({
  name:
    "reserveStaging makes its primes' map calls before it returns (a prefill submitted after waits on none)",
  ignore: ignore || !FAST_READBACK,
}, async () => {
  const g = gpu!;
  await checkEarlyRead(g);
  // A size class of its own, so the pool is empty: every one of the 2 x 3 buffers is primed.
  const primed0 = readbackStats.primed;
  const reserved = reserveStaging(g, 3 << 20, 3);
  // No await yet: the map calls were made in the call (a map call then waits for the GPU's queued work,
  // which is the caller's prefill when they come after its submit; kernels/readback.ts).
  assert.equal(readbackStats.primed - primed0, 6);
  await reserved;
  // The pool now holds them: asking again primes none.
  await reserveStaging(g, 3 << 20, 3);
  assert.equal(readbackStats.primed - primed0, 6);
});
