// Prefill GEMM microbenchmark (kernels/gemm.ts) at the prompt's shapes (Llama 3.2 1B): TFLOP/s of
// y[M, N] = x[M, K] @ W[N, K]^T for M = 512 (one chunk; --m for others) over the layer's (K, N),
// for a grid of tiles (f16) and, at the default tile, every weight format; against the FP32 FMA ceiling
// the caller gives (--ceiling, TFLOP/s). Timed with GPU timestamps over back-to-back dispatches after a
// warm-up. --probe first prints what the adapter offers (features, limits, WGSL language features) and
// whether a cooperative-matrix feature can be requested. One JSON line per case.
//   deno run -A scripts/bench/gemm.ts [--probe] [--quick] [--ceiling 67] [--weights f16] [--tiles all|default]
//     [--m 512,2048]
import { parseArgs } from "node:util";
import {
  checkGemmTile,
  gemmCalls,
  gemmDefaultSplit,
  gemmDefaultTile,
  type GemmTile,
  getGpu,
  quantBytes,
  storageBuffer,
} from "../../kernels/mod.ts";
import { gpuMs } from "../../kernels/timer.ts";

const { values } = parseArgs({
  args: Deno.args,
  options: {
    probe: { type: "boolean", default: false },
    quick: { type: "boolean", default: false },
    ceiling: { type: "string", default: "67" },
    weights: { type: "string", default: "f16,q8,q4" },
    tiles: { type: "string", default: "all" },
    m: { type: "string", default: "512" },
  },
});

if (values.probe) {
  const adapter = await navigator.gpu.requestAdapter({ powerPreference: "high-performance" });
  if (!adapter) throw new Error("no adapter");
  const limits: Record<string, number> = {};
  for (const k in adapter.limits) limits[k] = (adapter.limits as unknown as Record<string, number>)[k];
  console.log(JSON.stringify({
    info: adapter.info,
    features: [...adapter.features].sort(),
    wgsl: [...((navigator.gpu as GPU & { wgslLanguageFeatures?: Set<string> }).wgslLanguageFeatures ?? [])],
    limits,
  }));
  for (
    const name of [
      "subgroups",
      "experimental-cooperative-matrix",
      "cooperative-matrix",
      "chromium-experimental-subgroup-matrix",
      "subgroup-matrix",
      "shader-f16",
    ]
  ) {
    let result = "ok";
    try {
      const d = await adapter.requestDevice({ requiredFeatures: [name as GPUFeatureName] });
      d.destroy();
    } catch (e) {
      result = (e as Error).message.slice(0, 160);
    }
    console.log(JSON.stringify({ requestFeature: name, result }));
  }
}

const gpu = await getGpu();
const ceiling = Number(values.ceiling);
// The prompt's GEMMs at one chunk (M rows): qkv, o_proj, gate_up (with the SiLU gate in down_proj), down_proj.
const shapes = values.quick
  ? [{ M: 64, K: 256, N: 96 }]
  : values.m!.split(",").map(Number).flatMap((M) =>
    [[2048, 3072], [2048, 2048], [2048, 16384], [8192, 2048]].map(([K, N]) => ({ M, K, N }))
  );
const GRID: GemmTile[] = [
  { bm: 128, bn: 128, bk: 8, rm: 2, rn: 2 },
  { bm: 128, bn: 128, bk: 8, rm: 2, rn: 2, db: true },
  { bm: 128, bn: 128, bk: 16, rm: 2, rn: 2, db: true },
  { bm: 64, bn: 64, bk: 16, rm: 1, rn: 1, db: true },
  { bm: 128, bn: 256, bk: 16, rm: 2, rn: 4 },
  { bm: 64, bn: 64, bk: 16, rm: 1, rn: 1 },
  { bm: 128, bn: 128, bk: 8, rm: 2, rn: 2, f16: true },
  { bm: 128, bn: 128, bk: 16, rm: 2, rn: 2, f16: true },
  { bm: 128, bn: 256, bk: 16, rm: 2, rn: 4, f16: true },
  { bm: 128, bn: 128, bk: 32, rm: 2, rn: 2, f16: true },
  { bm: 64, bn: 64, bk: 16, rm: 1, rn: 1, f16: true },
];

function bytes(N: number, K: number, wt: string): number {
  if (wt === "f32") return N * K * 4;
  if (wt === "f16") return N * K * 2;
  return quantBytes(N, K, wt as "q8" | "q4");
}

const tag = (t: GemmTile) => `${t.bm}x${t.bn}k${t.bk}r${t.rm}${t.rn}${t.f16 ? "h" : ""}${t.db ? "d" : ""}`;
for (const wt of values.weights!.split(",")) {
  if (wt === "f16" && !gpu.hasF16) continue;
  for (const { M, K, N } of shapes) {
    const x = storageBuffer(gpu, M * K * 4, "x");
    const w = storageBuffer(gpu, bytes(N, K, wt), "w");
    const y = storageBuffer(gpu, M * N * 4, "y");
    const def = gemmDefaultTile(M, N);
    const tiles = values.tiles === "all" && wt === "f16"
      ? [def, ...GRID.filter((t) => tag(t) !== tag(def))]
      : [def];
    for (const tile of tiles) {
      try {
        checkGemmTile(tile, gpu.maxWorkgroupStorage);
      } catch {
        continue;
      }
      // Split K: the default, and no split (for the default tile also 2 and 4) where the default splits.
      const auto = gemmDefaultSplit(M, N, K, tile);
      const isDef = tag(tile) === tag(def);
      const splits = [
        ...new Set([auto, ...(auto > 1 || isDef ? [1] : []), ...(isDef && wt === "f16" ? [2, 4] : [])]),
      ];
      for (const splitK of splits) {
        const calls = gemmCalls(gpu, { x, w, y }, { K, N, T: M, weights: wt as "f16", tile, splitK });
        const flop = 2 * M * N * K;
        await gpuMs(gpu, calls, 3); // compile + warm-up
        const est = await gpuMs(gpu, calls, 3);
        const repeat = Math.max(3, Math.min(200, Math.round(25 / Math.max(est, 0.01))));
        const ms = await gpuMs(gpu, calls, repeat);
        const tflops = flop / (ms / 1e3) / 1e12;
        console.log(JSON.stringify({
          wt,
          M,
          K,
          N,
          tile: tag(tile),
          split: splitK,
          default: isDef && splitK === auto,
          us: +(ms * 1e3).toFixed(1),
          tflops: +tflops.toFixed(2),
          ofCeiling: +(tflops / ceiling).toFixed(3),
        }));
      }
    }
    for (const b of [x, w, y]) b.destroy();
  }
}
