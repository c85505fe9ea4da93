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
