// GEMV microbenchmark at Llama 3.2 1B's shapes: GB/s of weight reads for the plain kernel (matmul.ts)
// and the fused kernel (gemv_fused.ts) at several tunings, timed with GPU timestamps, rotating over
// weight copies so the 50 MB L2 does not flatter small shapes. torch's number comes from
// scripts/bench/torch_gemv.py in the same device run. The q8 / q4 rows (each tuning, and the default)
// count their own bytes (8.5 / 4.5 bits a weight), so their GB/s compare with f16's directly.
//   deno run -A scripts/bench/gemv.ts [--quick]
import {
  gemvFusedCall,
  getGpu,
  matmulCall,
  quantBytes,
  type QuantType,
  storageBuffer,
  type WeightType,
} from "../../kernels/mod.ts";
import { gpuMs } from "./gpu_timer.ts";

const gpu = await getGpu();
const quick = Deno.args.includes("--quick");
// [N, K, weight copies to rotate over (default: enough for 256 MB)]
const shapes: [number, number, number?][] = quick ? [[64, 64]] : [
  [2048, 2048],
  [3072, 2048],
  [2048, 8192],
  [16384, 2048],
  [16384, 2048, 1],
  [8192, 2048],
  [8192, 2048, 1],
  [
    128256,
    2048,
  ],
];
const sweep = Deno.args.includes("--sweep");
// --sweep: also try a grid of team shapes (how defaultTuning's table was made).
const tunings = quick
  ? [{ team: 8, rows: 2 }]
  : sweep
  ? [[16, 4], [32, 2], [64, 1], [128, 1]].map(([team, rows]) => ({ team, rows }))
  : [];
const wt: WeightType = "f16";
for (const [N, K, forceCopies] of shapes) {
  const bytes = N * K * 2;
  const copies = forceCopies ?? Math.max(1, Math.min(8, Math.ceil(256e6 / bytes)));
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
  // The H200 idles at 345 MHz and ramps up under load: keep it busy ~0.5 s before each shape's
  // timings, and time ~30 ms of work per variant, or the first variants measure the clock ramp.
  const warm = [matmulCall(gpu, { x, w: ws[0], y }, { K, N, T: 1, weights: "f32" })];
  for (let spent = 0; !quick && spent < 500;) spent += (await gpuMs(gpu, warm, 50)) * 50;
  const time = async (name: string, make: (w: GPUBuffer) => ReturnType<typeof matmulCall>, read = bytes) => {
    const calls = ws.map(make);
    const once = await gpuMs(gpu, calls, 2);
    const ms = await gpuMs(gpu, calls, quick ? 1 : Math.max(2, Math.round(30 / once)));
    rows[name] = Number((read / (ms / copies) / 1e6).toFixed(0));
  };
  if (gpu.hasF16) await time("plain", (w) => matmulCall(gpu, { x, w, y }, { K, N, T: 1, weights: wt }));
  // The RMSNorm-fused form (what qkv, gate/up and the head use) at the default tuning: its per-workgroup
  // norm prologue is the price of saving a dispatch.
  const nw = storageBuffer(gpu, K * 2);
  await time("default", (w) => gemvFusedCall(gpu, { x, w, y }, { K, N, T: 1, weights: wt }));
  await time(
    "default+rmsnorm",
    (w) =>
      gemvFusedCall(gpu, { x, w, y, normWeight: nw }, {
        K,
        N,
        T: 1,
        weights: wt,
        transform: "rmsnorm",
        eps: 1e-5,
      }),
  );
  for (const t of tunings) {
    await time(
      `t${t.team}r${t.rows}`,
      (w) => gemvFusedCall(gpu, { x, w, y }, { K, N, T: 1, weights: wt, tuning: t }),
    );
  }
  // The f16 buffers are big enough for the quantised layouts; their bytes decode to finite weights.
  for (const q of ["q8", "q4"] as QuantType[]) {
    for (const t of [undefined, ...tunings]) {
      await time(
        `${q}_${t ? `t${t.team}r${t.rows}` : "default"}`,
        (w) => gemvFusedCall(gpu, { x, w, y }, { K, N, T: 1, weights: q, tuning: t }),
        quantBytes(N, K, q),
      );
    }
  }
  const best = Object.entries(rows).filter(([k]) => !k.startsWith("q")).reduce((
    a,
    b,
  ) => (b[1] > a[1] ? b : a));
  console.log(
    JSON.stringify({
      bench: "gemv",
      adapter: gpu.adapterName,
      N,
      K,
      copies,
      gb_s: rows,
      best: best[0],
      best_gb_s: best[1],
    }),
  );
  for (const w of ws) w.destroy();
}
