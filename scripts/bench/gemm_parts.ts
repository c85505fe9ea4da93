// Where the prefill GEMM's time goes (kernels/gemm.ts): a tile's kernel (default: the default large tile)
// timed whole and with parts of its k loop left out, on random data (scripts/bench/random_data.ts), so the
// differences say what the staging costs against the multiply-adds alone (docs/KERNELS.md has a table).
// The variants compute wrong sums: only their time means anything.
//   whole      the kernel as the engine runs it
//   no-fetch   the next slice's global loads left out (the first slice's registers are stored every slice)
//   no-stage   the slice staged once before the loop; each slice then loads (as usual) and multiplies
//   fma-only   the slice staged once; each slice only multiplies (no loads, no stores, no barriers)
//   loads-early whole with the next slice's loads before the first barrier
//   fetch-unused no-fetch plus the next slice's loads into other registers (kept alive, never staged)
//   w-fetch-only, x-fetch-only  whole with only W's / x's next-slice loads
//   no-barrier whole without the loop's barriers; fma+barriers, fma+stores: fma-only with those added
//   deno run -A scripts/bench/gemm_parts.ts [--weights f16] [--tile 128x128k32r22cv] [--shape 2048,2048,16384]
//     [--ceiling 67] [--x-pad V]
// --x-pad: x's rows V vec4s longer than K (the GEMM's ldx), e.g. to see whether x's power-of-two row stride
// costs.
import { parseArgs } from "node:util";
import { scriptArgs } from "../args.ts";
import {
  gemmSource,
  getGpu,
  kernelCall,
  parseGemmTile,
  pipeline,
  quantScaleWord,
  storageBuffer,
  uniformBuffer,
} from "../../kernels/mod.ts";
import { settledGpuMs } from "../../kernels/timer.ts";
import { randomF32, randomWeightBytes } from "./random_data.ts";

const { values } = scriptArgs(import.meta.url, (args) =>
  parseArgs({
    args,
    options: {
      weights: { type: "string", default: "f16" },
      tile: { type: "string", default: "128x128k32r22cv" },
      shape: { type: "string", default: "2048,2048,16384" },
      ceiling: { type: "string", default: "67" },
      "x-pad": { type: "string", default: "0" },
    },
  }));

const gpu = await getGpu();
const wt = values.weights as "f32" | "f16" | "q8" | "q4";
const tile = parseGemmTile(values.tile!);
const [M, K, N] = values.shape!.split(",").map(Number);
if (tile.db) throw new RangeError("gemm_parts takes single-buffered tiles (no d flag)");

/** The k loop of the generated source, split into its parts (gemmSource's `loop` layout). */
function parts(
  src: string,
): { before: string; stores: string; loads: string; multiply: string; after: string } {
  const start = src.indexOf("  loop {\n");
  const barrier1 = src.indexOf("    workgroupBarrier();\n    k0 +=", start);
  const ifLoads = src.indexOf("    if (k0 < kend) {\n", barrier1);
  const multiply = src.indexOf("\n    {\n      let a0", ifLoads);
  const barrier2 = src.indexOf("    workgroupBarrier();\n    if (k0 >= kend) { break; }\n  }", multiply);
  const end = src.indexOf("  }\n", barrier2) + 4;
  if ([start, barrier1, ifLoads, multiply, barrier2].some((i) => i < 0)) {
    throw new Error("gemm_parts: the generated GEMM no longer has the loop layout this script cuts");
  }
  return {
    before: src.slice(0, start),
    stores: src.slice(start + "  loop {\n".length, barrier1),
    loads: src.slice(ifLoads, multiply),
    multiply: src.slice(multiply, barrier2),
    after: src.slice(end),
  };
}

const base = gemmSource(wt, "none", tile);
const p = parts(base);

/** whole with only the loads (top-level blocks of the loads' `if`) that assign `reg`. */
function onlyLoads(reg: string): string {
  const open = p.loads.indexOf("{") + 1;
  const close = p.loads.lastIndexOf("}");
  const blocks: string[] = [];
  let depth = 0, from = -1;
  for (let i = open; i < close; i++) {
    if (p.loads[i] === "{") {
      if (depth++ === 0) from = i;
    } else if (p.loads[i] === "}" && --depth === 0) blocks.push(p.loads.slice(from, i + 1));
  }
  const kept = blocks.filter((b) => b.includes(`${reg}`)).join("\n      ");
  const loads = `    if (k0 < kend) {\n      ${kept}\n    }\n`;
  return `${p.before}  loop {\n${p.stores}    workgroupBarrier();\n${step}${loads}${p.multiply}\n` +
    `    workgroupBarrier();\n${loopEnd}${p.after}`;
}

/** no-fetch, but each slice also loads the next (into xq / wq, not the staged registers) and sums them. */
function fetchUnused(): string {
  const xs = [...base.matchAll(/var xr(\d+): vec4<f32>;/g)].map((m) => m[1]);
  const ws = [...base.matchAll(/var wr(\d+): ([^;]+);/g)].map((m) => [m[1], m[2]]);
  const loads = p.loads.replaceAll(/\bxr(\d)/g, "xq$1").replaceAll(/\bwr(\d)/g, "wq$1")
    .replaceAll(/\bwok(\d)/g, "wqok$1");
  const decl = [
    "  var dummy = 0.0;",
    ...xs.map((i) => `  var xq${i} = vec4<f32>(0.0);`),
    ...ws.map(([i, t]) => `  var wq${i} = ${t}();\n  var wqok${i} = false;`),
  ].join("\n");
  const use = [
    ...xs.map((i) => `    dummy += xq${i}.x;`),
    ...ws.map(([i]) => `    dummy += select(0.0, f32(wq${i}.x & 1u), wqok${i});`),
  ].join("\n");
  return `${p.before}${decl}\n  loop {\n${p.stores}    workgroupBarrier();\n${step}${loads}${p.multiply}\n${use}\n` +
    `    workgroupBarrier();\n${loopEnd}  if (dummy == 1.5e-30) { y[0] = dummy; }\n${p.after}`;
}
const step = `    k0 += ${tile.bk}u;\n`;
const loopEnd = "    if (k0 >= kend) { break; }\n  }\n";
const variants: Record<string, string> = {
  whole: base,
  "no-fetch": `${p.before}  loop {\n${p.stores}    workgroupBarrier();\n${step}${p.multiply}\n` +
    `    workgroupBarrier();\n${loopEnd}${p.after}`,
  "no-stage": `${p.before}${p.stores}  workgroupBarrier();\n  loop {\n${step}${p.loads}${p.multiply}\n` +
    `    workgroupBarrier();\n${loopEnd}${p.after}`,
  "fma-only":
    `${p.before}${p.stores}  workgroupBarrier();\n  loop {\n${step}${p.multiply}\n${loopEnd}${p.after}`,
  // whole without the loop's two barriers (a race: the time of the rest)
  "no-barrier": `${p.before}  loop {\n${p.stores}${step}${p.loads}${p.multiply}\n${loopEnd}${p.after}`,
  // fma-only plus the loop's two barriers
  "fma+barriers": `${p.before}${p.stores}  workgroupBarrier();\n  loop {\n    workgroupBarrier();\n${step}` +
    `${p.multiply}\n    workgroupBarrier();\n${loopEnd}${p.after}`,
  // whole with the next slice's loads issued before the first barrier (right after the stores)
  "loads-early": `${p.before}  loop {\n${p.stores}${step}${p.loads}    workgroupBarrier();\n${p.multiply}\n` +
    `    workgroupBarrier();\n${loopEnd}${p.after}`,
  // no-fetch plus the loads into registers of their own, summed into a value written only if it is absurd
  "fetch-unused": fetchUnused(),
  // whole with only W's (x's) next-slice loads: x (W) stages the first slice's registers every slice
  "w-fetch-only": onlyLoads("wr"),
  "x-fetch-only": onlyLoads("xr"),
  // fma-only plus the stores of the first slice's registers every slice (no loads, no barriers)
  "fma+stores": `${p.before}  loop {\n${p.stores}${step}${p.multiply}\n${loopEnd}${p.after}`,
};

const ldx = K / 4 + Number(values["x-pad"]);
const x = storageBuffer(gpu, M * ldx * 16, "x");
gpu.device.queue.writeBuffer(x, 0, randomF32(M * ldx * 4));
const wb = randomWeightBytes(wt, N, K);
const w = storageBuffer(gpu, wb.length, "w");
gpu.device.queue.writeBuffer(w, 0, wb);
const y = storageBuffer(gpu, M * N * 4, "y");
const soff = wt === "q4" || wt === "q8" ? quantScaleWord(N, K, wt) : 0;
const params = uniformBuffer(gpu, [K, N, M, 0, 0, soff, ldx, K]);
const flop = 2 * M * N * K;
const rows: string[] = [];
for (const [name, code] of Object.entries(variants)) {
  const call = kernelCall(gpu, pipeline(gpu, code), [params, x, w, y], [N / tile.bn, M / tile.bm, 1], name);
  const best = await settledGpuMs(gpu, [call], 50);
  const tflops = flop / (best / 1e3) / 1e12;
  console.log(JSON.stringify({
    bench: "swactor-gemm-parts",
    adapter: gpu.adapterName,
    weights: wt,
    tile: values.tile,
    xPad: Number(values["x-pad"]),
    M,
    K,
    N,
    variant: name,
    us: +(best * 1e3).toFixed(1),
    tflops: +tflops.toFixed(2),
    ofCeiling: +(tflops / Number(values.ceiling)).toFixed(3),
  }));
  rows.push(
    `${name.padEnd(12)} ${(best * 1e3).toFixed(1).padStart(9)} us ${tflops.toFixed(2).padStart(7)} TFLOP/s`,
  );
}
console.log(rows.join("\n"));
