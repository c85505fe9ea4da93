// GEMV microbenchmark at Llama 3.2 1B's shapes: GB/s of weight reads for the plain kernel (matmul.ts)
// and the fused kernel (gemv_fused.ts) at several tunings, timed with GPU timestamps, rotating over
// weight copies so the 50 MB L2 does not flatter small shapes. torch's number comes from
// scripts/bench/torch_gemv.py in the same device run.
//   deno run -A scripts/bench/gemv.ts [--quick]
import { gemvFusedCall, getGpu, matmulCall, storageBuffer, type WeightType } from "../../kernels/mod.ts";
import { gpuMs } from "./gpu_timer.ts";

const gpu = await getGpu();
const quick = Deno.args.includes("--quick");
const shapes: [number, number][] = quick
  ? [[64, 64]]
  : [[2048, 2048], [3072, 2048], [2048, 8192], [16384, 2048], [8192, 2048], [128256, 2048]];
const tunings = quick
  ? [{ team: 8, rows: 2 }]
  : [8, 16, 32, 64, 128].flatMap((team) => [1, 2, 4].map((rows) => ({ team, rows })));
const wt: WeightType = "f16";
for (const [N, K] of shapes) {
  const bytes = N * K * 2;
  const copies = Math.max(1, Math.min(8, Math.ceil(256e6 / bytes)));
  const ws = Array.from({ length: copies }, () => storageBuffer(gpu, bytes));
  // Random-ish contents: zeros can run faster than real data (device METHOD.md).
  for (const w of ws) {
    gpu.device.queue.writeBuffer(
      w,
      0,
      new Uint16Array(bytes / 2).map((_, i) => 0x3000 + (i * 2654435761 >>> 22)),
    );
  }
  const x = storageBuffer(gpu, K * 4), y = storageBuffer(gpu, N * 4);
  const rows: Record<string, number> = {};
  const time = async (name: string, make: (w: GPUBuffer) => ReturnType<typeof matmulCall>) => {
    const calls = ws.map(make);
    await gpuMs(gpu, calls, 2);
    const ms = await gpuMs(gpu, calls, quick ? 1 : Math.max(2, Math.round(2000 / copies)) / 10);
    rows[name] = Number((bytes / (ms / copies) / 1e6).toFixed(0));
  };
  if (gpu.hasF16) await time("plain", (w) => matmulCall(gpu, { x, w, y }, { K, N, T: 1, weights: wt }));
  for (const t of tunings) {
    await time(
      `fused t${t.team}r${t.rows}`,
      (w) => gemvFusedCall(gpu, { x, w, y }, { K, N, T: 1, weights: wt, tuning: t }),
    );
  }
  const best = Object.entries(rows).reduce((a, b) => (b[1] > a[1] ? b : a));
  console.log(
    JSON.stringify({
      bench: "gemv",
      adapter: gpu.adapterName,
      N,
      K,
      gb_s: rows,
      best: best[0],
      best_gb_s: best[1],
    }),
  );
  for (const w of ws) w.destroy();
}
