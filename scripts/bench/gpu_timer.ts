// GPU time of a compute pass, from timestamp queries (no readback floor in the number).
import { encodeCalls, type Gpu, type KernelCall, readBack } from "../../kernels/mod.ts";

/** Encodes `calls` `repeat` times in one pass between two timestamps; returns GPU ms per repeat. */
export async function gpuMs(gpu: Gpu, calls: readonly KernelCall[], repeat: number): Promise<number> {
  if (!gpu.hasTimestamps) throw new Error(`${gpu.adapterName} has no timestamp-query`);
  const dev = gpu.device;
  const qs = dev.createQuerySet({ type: "timestamp", count: 2 });
  const resolve = dev.createBuffer({
    size: 16,
    usage: GPUBufferUsage.QUERY_RESOLVE | GPUBufferUsage.COPY_SRC,
  });
  const enc = dev.createCommandEncoder();
  const pass = enc.beginComputePass({
    timestampWrites: { querySet: qs, beginningOfPassWriteIndex: 0, endOfPassWriteIndex: 1 },
  });
  for (let i = 0; i < repeat; i++) encodeCalls(pass, calls);
  pass.end();
  enc.resolveQuerySet(qs, 0, 2, resolve, 0);
  dev.queue.submit([enc.finish()]);
  const t = new BigInt64Array(await readBack(gpu, resolve, 16));
  qs.destroy();
  resolve.destroy();
  return Number(t[1] - t[0]) / 1e6 / repeat;
}

/**
 * GPU ms of each call inside the real sequence: `calls` run `repeat` times in order, each dispatch in its
 * own pass between two timestamps, so every call sees the caches and clocks the sequence leaves it (a
 * call timed alone and repeated would find its weights in L2). Returns the mean ms of each call.
 */
export async function gpuMsPerCall(
  gpu: Gpu,
  calls: readonly KernelCall[],
  repeat: number,
): Promise<number[]> {
  if (!gpu.hasTimestamps) throw new Error(`${gpu.adapterName} has no timestamp-query`);
  const dev = gpu.device;
  const n = calls.length * repeat * 2;
  if (n > 4096) throw new RangeError(`${n} timestamps exceed a query set's 4096`);
  const qs = dev.createQuerySet({ type: "timestamp", count: n });
  const resolve = dev.createBuffer({
    size: n * 8,
    usage: GPUBufferUsage.QUERY_RESOLVE | GPUBufferUsage.COPY_SRC,
  });
  const enc = dev.createCommandEncoder();
  let q = 0;
  for (let r = 0; r < repeat; r++) {
    for (const c of calls) {
      const pass = enc.beginComputePass({
        timestampWrites: { querySet: qs, beginningOfPassWriteIndex: q, endOfPassWriteIndex: q + 1 },
      });
      encodeCalls(pass, [c]);
      pass.end();
      q += 2;
    }
  }
  enc.resolveQuerySet(qs, 0, n, resolve, 0);
  dev.queue.submit([enc.finish()]);
  const t = new BigInt64Array(await readBack(gpu, resolve, n * 8));
  qs.destroy();
  resolve.destroy();
  const out = new Array<number>(calls.length).fill(0);
  for (let r = 0; r < repeat; r++) {
    for (let i = 0; i < calls.length; i++) {
      const k = (r * calls.length + i) * 2;
      out[i] += Number(t[k + 1] - t[k]) / 1e6 / repeat;
    }
  }
  return out;
}
