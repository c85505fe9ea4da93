// Prefill GEMM microbenchmark (kernels/gemm.ts) at the prompt's shapes (Llama 3.2 1B): TFLOP/s of
// y[M, N] = x[M, K] @ W[N, K]^T for M = 512 (one chunk; --m for others) over the layer's (K, N),
// for a grid of tiles and tile flags (GemmTile: f16 math, db, wh, ci, v; tags as gemmTileTag writes them) for
// every weight format asked, against the FP32 FMA ceiling the caller gives (--ceiling, TFLOP/s), on random
// operands (scripts/bench/random_data.ts). Timed with GPU timestamps over back-to-back dispatches after a
// warm-up, the best of three. --probe first prints what the adapter offers
// (features, limits, WGSL language features) and whether a cooperative-matrix feature can be requested.
// One JSON line per case, then one `best` line per (weights, shape): the fastest case and the default's.
// --tiles: all (the grid below), default (the defaults only) or a comma list of tags (e.g. 128x128k8r22c).
//   deno run -A scripts/bench/gemm.ts [--probe] [--quick] [--ceiling 67] [--weights f16,q4]
//     [--tiles all|default|TAG,...] [--m 512,2048] [--x f32,f16]
// --x: how x is stored (f16: GemmDims.xHalf, 4 halves a vec2<u32>), a case each.
import { parseArgs } from "node:util";
import { scriptArgs } from "../args.ts";
import {
  checkGemmTile,
  gemmCalls,
  gemmDefaultSplit,
  gemmDefaultTile,
  type GemmTile,
  gemmTileTag as tag,
  gemmWhFits,
  getGpu,
  parseGemmTile,
  storageBuffer,
} from "../../kernels/mod.ts";
import { settledGpuMs } from "../../kernels/timer.ts";
import { randomF32, randomWeightBytes } from "./random_data.ts";

const { values } = scriptArgs(import.meta.url, (args) =>
  parseArgs({
    args,
    options: {
      probe: { type: "boolean", default: false },
      quick: { type: "boolean", default: false },
      ceiling: { type: "string", default: "67" },
      weights: { type: "string", default: "f16,q8,q4" },
      tiles: { type: "string", default: "all" },
      m: { type: "string", default: "512" },
      x: { type: "string", default: "f32" },
    },
  }));

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
// Per k step a thread reads rm + rn vec4s of workgroup memory (wh: the rn W vec4s are 8 bytes) for 16 rm rn
// FMAs; ci drops the bounds clamp and address add of each read; docs/KERNELS.md has the arithmetic.
const GRID: GemmTile[] = [
  "128x128k8r22", // the defaults
  "64x64k16r11",
  "128x128k8r22c", // constant-index fragment reads
  "64x64k16r11c",
  "128x128k16r22c",
  "128x128k32r22c",
  "64x64k32r11c",
  "128x128k16r22dc",
  "64x64k16r11dc",
  "128x128k8r22w", // W staged as f16, f32 math
  "128x128k8r22wc",
  "64x64k16r11wc",
  "128x128k8r22d",
  "128x128k16r22d",
  "64x64k16r11d",
  "128x256k16r24", // 8 x 16 a thread: 6 reads for 128 FMAs
  "128x256k16r24c",
  "128x256k8r24c",
  "256x128k8r42c",
  "128x256k16r24wc",
  "64x128k16r22c", // 8 x 8 a thread in 128 threads: more tiles where M x N is small
  "64x128k8r22c",
  "128x64k16r22c",
  "64x128k16r22wc",
  "64x64k16r22c", // 64 threads
  "128x128k32r22cv", // vector stores: 4-row groups a thread, transposed in registers (the default large tile)
  "128x128k32r22wcv",
  "128x256k32r24wcv",
  "64x64k64r11cv",
  "64x128k32r22cv",
  "128x128k16r22h", // f16 multiplies (rounds: gpu.tuning.gemmMath f16 only)
  "128x256k16r24h",
  "128x128k16r22hc",
  "64x64k16r11hc",
].map(parseGemmTile);

const xTypes = values.x!.split(",");
for (const t of xTypes) if (t !== "f32" && t !== "f16") throw new TypeError(`--x takes f32 or f16, got ${t}`);
if (xTypes.includes("f16") && !gpu.hasF16) throw new TypeError("--x f16 needs shader-f16");
const listed = values.tiles === "all" || values.tiles === "default"
  ? undefined
  : values.tiles!.split(",").map(parseGemmTile);
for (const wt of values.weights!.split(",")) {
  if (wt === "f16" && !gpu.hasF16) continue;
  for (const { M, K, N } of shapes) {
    // Random operands: on zero buffers some tiles ran 3x slower (scripts/bench/random_data.ts).
    const xs = new Map(xTypes.map((t) => {
      const b = storageBuffer(gpu, M * K * 4, `x ${t}`);
      gpu.device.queue.writeBuffer(b, 0, t === "f16" ? randomWeightBytes("f16", M, K) : randomF32(M * K));
      return [t, b];
    }));
    const wb = randomWeightBytes(wt as "f16", N, K);
    const w = storageBuffer(gpu, wb.length, "w");
    gpu.device.queue.writeBuffer(w, 0, wb);
    const y = storageBuffer(gpu, M * N * 4, "y");
    const def = gemmDefaultTile(gpu, M, N, K);
    const grid = listed ?? (values.tiles === "all" ? GRID : []);
    const tiles = [def, ...grid.filter((t) => tag(t) !== tag(def))];
    const cases: { tile: string; x: string; split: number; tflops: number; default: boolean }[] = [];
    for (const [xType, x] of xs) {
      for (const tile of tiles) {
        if ((tile.f16 || tile.wh) && !gpu.hasF16) continue;
        if (tile.wh && !tile.f16 && !gemmWhFits(gpu, wt as "f16")) continue; // it would round these weights
        try {
          checkGemmTile(tile, gpu.maxWorkgroupStorage);
        } catch {
          continue;
        }
        // Split K: the default, and no split (for the default tile also 2 and 4) where the default splits.
        const auto = gemmDefaultSplit(M, N, K, tile, gpu.tuning);
        const isDef = tag(tile) === tag(def);
        const splits = [
          ...new Set([auto, ...(auto > 1 || isDef ? [1] : []), ...(isDef && wt === "f16" ? [2, 4] : [])]),
        ];
        for (const splitK of splits) {
          const xHalf = xType === "f16";
          const calls = gemmCalls(gpu, { x, w, y }, {
            K,
            N,
            T: M,
            weights: wt as "f16",
            tile,
            splitK,
            xHalf,
          });
          const flop = 2 * M * N * K;
          // Warmed up (the H200 lowers its clocks while the host fills a shape's buffers), the best of three.
          const ms = await settledGpuMs(gpu, calls);
          const tflops = flop / (ms / 1e3) / 1e12;
          const isDefault = isDef && splitK === auto && xType === xTypes[0];
          cases.push({ tile: tag(tile), x: xType, split: splitK, tflops, default: isDefault });
          console.log(JSON.stringify({
            wt,
            x: xType,
            M,
            K,
            N,
            tile: tag(tile),
            split: splitK,
            default: isDefault,
            us: +(ms * 1e3).toFixed(1),
            tflops: +tflops.toFixed(2),
            ofCeiling: +(tflops / ceiling).toFixed(3),
          }));
        }
      }
    }
    const best = cases.reduce((a, b) => (b.tflops > a.tflops ? b : a));
    const d = cases.find((c) => c.default)!;
    console.log(JSON.stringify({
      best: true,
      wt,
      M,
      K,
      N,
      tile: best.tile,
      x: best.x,
      split: best.split,
      tflops: +best.tflops.toFixed(2),
      defaultTile: d.tile,
      defaultSplit: d.split,
      defaultTflops: +d.tflops.toFixed(2),
      gain: +(best.tflops / d.tflops).toFixed(3),
    }));
    for (const b of [...xs.values(), w, y]) b.destroy();
  }
}
