// Does a persistent kernel with a grid barrier beat a dispatch a GEMV? A chain of q4 GEMVs shaped as
// Llama-3.2-1B's decode layers (o 2048 x 2048, gate/up paired 2 x 8192 x 2048 -> silu(g) u, down 2048 x 8192,
// qkv 3072 x 2048; each reads the one before's output, int8 dp4 against the q4 weights as gemv_sg.ts does)
// run two ways by the same WGSL: one dispatch a GEMV (the engine's way today), or every GEMV of every layer in
// one dispatch whose workgroups meet at a grid barrier between GEMVs (an atomic count in storage that the first
// thread of each workgroup spins on). WebGPU promises no forward progress across workgroups, so the grid
// barrier is only sound when every workgroup is resident at once (a grid no larger than the GPU holds); the
// spin gives up after a bound and raises a flag instead of hanging (read from the count after the spin:
// lavapipe ends any loop after 65,535 iterations and runs one or two workgroups of a grid at a time, so there
// a grid of more than one workgroup gives up, and its outputs say nothing about the barrier; the 2026-12-05
// "exact on lavapipe at 4 and 8 workgroups" predates this check). The engine form built from it (a composed
// one-token step) was slower and not exact on an H100 and was dropped: docs/KERNELS.md, "A persistent step".
// --prefetch: 0 each GEMV loads its first weights when it starts; 1 each warp loads its first rows of the next
// GEMV's weights before the barrier; 2 between arriving at the barrier and waiting at it (weights do not
// depend on the activations; on the H200 only 2 gained, likely because the arrival's device-scope fence
// waits for the loads issued before it, so 1 pays their latency before arriving and 2 while waiting).
// --act: how the activations pass between workgroups. `plain`: plain loads and stores into two halves used in
// turn, so a workgroup reads an address it read two GEMVs before: WRONG on the H200 (likely the SM's L1
// still holding the old line: naga declares no buffer Coherent); `fresh`: plain loads and stores, every GEMV
// writing a region of its own, so no workgroup reads an address twice in a dispatch: exact on the H200 and
// lavapipe; `atomic`: atomicLoad / atomicStore, exact but scalar and slow.
// --barrier count: the spinners read the arrival count itself; flag: the last to arrive raises a flag in a
// line of its own, which they read.
// --work none: the barrier alone (each GEMV replaced by one store a workgroup), what a boundary costs;
// nostage: the GEMVs without staging their input (x read as zeros; outputs meaningless, the weights' part).
// Prints one JSON line a case: GPU ms of the whole chain, us a GEMV, whether the persistent outputs equal the
// dispatch-per-GEMV run's bit for bit, and the dispatch run's relative error against the chain on the CPU
// (f64, activations unquantised; meaningful for a few layers: the random chain's values collapse by 16).
// --groups: workgroups of the grid, all of which must be resident at once (the H200 has 132 SMs; a run at 264
// of 512 threads there hit its timeout, likely spinning to the bound). Findings (H200, docs/BENCHMARKS.md):
// 2026-12-03, plain 7.6 -> 5.7 us a GEMV but wrong, atomic exact but 12.8 us; 2026-12-05, fresh exact and
// 7.6-7.8 -> 6.3 us a GEMV with --prefetch 2 (132 x 512 or 264 x 256 threads): a fifth less.
//   deno run -A scripts/bench/gridsync.ts [--layers 16] [--groups 132] [--wg 256,512] [--prefetch 0,1,2]
//     [--act plain|fresh|atomic] [--work gemv|nostage|none] [--barrier count|flag]
//     [--check-only] (the outputs, not the times; tests/scripts/bench/)
import { parseArgs } from "node:util";
import { scriptArgs } from "../args.ts";
import {
  encodeCalls,
  getGpu,
  type KernelCall,
  kernelCall,
  pipeline,
  readBack,
  storageBuffer,
  uniformBuffer,
  uploadBuffer,
} from "../../kernels/mod.ts";
import { settledGpuMs } from "../../kernels/timer.ts";
import { dequantize, quantBytes, quantize } from "../../kernels/quant.ts";
import { dp4Dot, int8BlocksWgsl } from "../../kernels/wgsl.ts";

const { values } = scriptArgs(import.meta.url, (args) =>
  parseArgs({
    args,
    options: {
      layers: { type: "string", default: "16" },
      groups: { type: "string", default: "132" },
      wg: { type: "string", default: "256,512" },
      prefetch: { type: "string", default: "0,1,2" },
      act: { type: "string", default: "fresh" },
      work: { type: "string", default: "gemv" },
      barrier: { type: "string", default: "count" },
      "check-only": { type: "boolean", default: false },
    },
  }));
const L = Number(values.layers);
const list = (s: string) => s.split(",").map(Number);
if (
  !(Number.isInteger(L) && L >= 1) || !["plain", "atomic", "fresh"].includes(values.act!) ||
  !["gemv", "nostage", "none"].includes(values.work!) || !["count", "flag"].includes(values.barrier!) ||
  !list(values.prefetch!).every((p) => [0, 1, 2].includes(p))
) {
  console.error(
    "gridsync.ts: --layers is a whole number >= 1, --prefetch a list of 0, 1, 2, --act plain, fresh or " +
      "atomic, --work gemv, nostage or none, --barrier count or flag",
  );
  Deno.exit(2);
}

interface Kind {
  name: string;
  /** Outputs. */
  N: number;
  K: number;
  /** Rows (pairs for gate/up) a warp takes a pass. */
  R: number;
  pair: boolean;
}
const KINDS: Kind[] = [
  { name: "o", N: 2048, K: 2048, R: 2, pair: false },
  { name: "gate_up", N: 8192, K: 2048, R: 1, pair: true },
  { name: "down", N: 2048, K: 8192, R: 1, pair: false },
  { name: "qkv", N: 3072, K: 2048, R: 2, pair: false },
];
const HALF = 16384; // activation ping-pong halves
const KMAX = 8192;
const rowsOf = (k: Kind) => (k.pair ? 2 : 1) * k.N;
const matBytes = (k: Kind) => quantBytes(rowsOf(k), k.K, "q4");
const UMAX = Math.max(...KINDS.map((k) => (k.pair ? 2 : 1) * k.R * k.K / 1024)); // at 32 lanes

function source(WG: number, S: number, pf: number, plain: boolean, fresh: boolean): string {
  const prefetch = pf > 0;
  const WARPS = WG / S;
  const store = (i: string, v: string) =>
    plain ? `act[(${i}) / 4u][(${i}) % 4u] = ${v};` : `atomicStore(&act[${i}], bitcast<u32>(${v}));`;
  const vin = (k: string) =>
    plain
      ? `act[ib / 4u + (${k})]`
      : `vec4<f32>(bitcast<f32>(atomicLoad(&act[ib + 4u * (${k})])), bitcast<f32>(atomicLoad(&act[ib + 4u * (${k}) + 1u])), bitcast<f32>(atomicLoad(&act[ib + 4u * (${k}) + 2u])), bitcast<f32>(atomicLoad(&act[ib + 4u * (${k}) + 3u])))`;
  const prefetchOf = (k: Kind, ki: number) => {
    const RR = (k.pair ? 2 : 1) * k.R, UPR = k.K / 32 / S, NB = k.K / 32;
    const lines = [`let wb = layer * ${matBytes(k) / 16}u;`, `let n0 = gw * ${k.R}u;`, `if (n0 < ${k.N}u) {`];
    for (let r = 0; r < RR; r++) {
      const row = k.pair ? `${r % 2 === 0 ? "" : `${k.N}u + `}n0 + ${r >> 1}u` : `n0 + ${r}u`;
      for (let c = 0; c < UPR; c++) {
        lines.push(`  wr[${r * UPR + c}] = W${ki}[wb + (${row}) * ${NB}u + lane + ${S * c}u];`);
      }
    }
    lines.push("}");
    return lines.join("\n      ");
  };
  const computeOf = (k: Kind, ki: number) => {
    const RR = (k.pair ? 2 : 1) * k.R, UPR = k.K / 32 / S, NB = k.K / 32, rows = rowsOf(k);
    const sOff = rows * k.K / 2 / 4; // scale words after the values
    const pass = (first: boolean) => {
      const l: string[] = [];
      for (let r = 0; r < RR; r++) {
        const row = k.pair ? `${r % 2 === 0 ? "" : `${k.N}u + `}n0 + ${r >> 1}u` : `n0 + ${r}u`;
        l.push(`let row${r} = ${row};`, `var a${r} = 0.0;`);
      }
      for (let c = 0; c < UPR; c++) {
        l.push(
          `let u${c} = lane + ${S * c}u;`,
          `let xe${c} = xq[u${c}];`,
          `let xo${c} = xq[${NB}u + u${c}];`,
          `let xs${c} = xqs[u${c}];`,
        );
        for (let r = 0; r < RR; r++) {
          const w = first ? `wr[${r * UPR + c}]` : `W${ki}[wb + row${r} * ${NB}u + u${c}]`;
          l.push(`let w${r}_${c} = ${w};`);
        }
      }
      for (let c = 0; c < UPR; c++) {
        for (let r = 0; r < RR; r++) {
          const d = dp4Dot("q4", `w${r}_${c}`, [`xe${c}`, `xo${c}`]);
          l.push(
            `{ let g = row${r} * ${NB}u + u${c}; let sw = W${ki}[sb + g / 8u][(g / 2u) % 4u];`,
            `  let sc = bitcast<f32>(select(sw << 16u, sw & 0xffff0000u, (g & 1u) == 1u));`,
            `  a${r} += sc * (xs${c}.x * f32(${d}) - 8.0 * xs${c}.y); }`,
          );
        }
      }
      for (let r = 0; r < RR; r++) l.push(`let s${r} = subgroupAdd(a${r});`);
      if (k.pair) {
        for (let r = 0; r < k.R; r++) {
          l.push(
            `if (lane == ${r}u) { let g = s${2 * r}; ${
              store(`ob + n0 + ${r}u`, `g / (1.0 + exp(-g)) * s${2 * r + 1}`)
            } }`,
          );
        }
      } else {
        for (let r = 0; r < k.R; r++) {
          l.push(`if (lane == ${r}u) { ${store(`ob + n0 + ${r}u`, `s${r}`)} }`);
        }
      }
      return l.join("\n        ");
    };
    return `
      let wb = layer * ${matBytes(k) / 16}u;
      let sb = wb + ${sOff / 4}u;
      ${
      values.work === "nostage"
        ? ""
        : `${
          int8BlocksWgsl("q4", (kk) => vin(kk), `${k.K / 32}u`, "WG", `${NB}u`)
        }\n      workgroupBarrier();`
    }
      {
        let n0 = gw * ${k.R}u;
        if (n0 < ${k.N}u) {
        ${pass(true)}
        }
      }
      for (var j = 1u; (gw + j * GW) * ${k.R}u < ${k.N}u; j++) {
        let n0 = (gw + j * GW) * ${k.R}u;
        ${pass(false)}
      }
      workgroupBarrier();`;
  };
  const cases = (f: (k: Kind, ki: number) => string) =>
    KINDS.map((k, ki) => `case ${ki}u: {\n      ${f(k, ki)}\n    }`).join("\n    ");
  return `
struct Params { ph0: u32, ph1: u32 }
@group(0) @binding(0) var<uniform> p: Params;
${
    KINDS.map((_, ki) => `@group(0) @binding(${ki + 1}) var<storage, read> W${ki}: array<vec4<u32>>;`).join(
      "\n",
    )
  }
@group(0) @binding(5) var<storage, read_write> act: ${plain ? "array<vec4<f32>>" : "array<atomic<u32>>"};
@group(0) @binding(6) var<storage, read_write> bar: array<atomic<u32>>;
const WG = ${WG}u;
const WARPS = ${WARPS}u;
var<workgroup> xq: array<vec4<u32>, ${KMAX / 16}>;
var<workgroup> xqs: array<vec2<f32>, ${KMAX / 32}>;

// Every workgroup of the grid at the n-th barrier of this dispatch: the first thread counts its workgroup
// in and spins until all have (bounded: a grid larger than the GPU holds at once raises bar[1]).
// Split in two so that work (mode 2's weight loads) can be issued between the arrival and the wait.
fn grid_arrive(tid: u32, n: u32, groups: u32) {
  storageBarrier();
  if (tid == 0u) {
    ${
    values.barrier === "flag"
      ? "if (atomicAdd(&bar[0], 1u) == n * groups - 1u) { atomicStore(&bar[32], n); }"
      : "atomicAdd(&bar[0], 1u);"
  }
  }
}
fn grid_wait(tid: u32, n: u32, groups: u32) {
  if (tid == 0u) {
    var spins = 0u;
    loop {
      if (${
    values.barrier === "flag" ? "atomicLoad(&bar[32]) >= n" : "atomicLoad(&bar[0]) >= n * groups"
  }) { break; }
      spins++;
      if (spins > ${1 << 20}u) { atomicStore(&bar[1], 1u); break; }
    }
    // Whatever ended the spin (lavapipe ends any loop after 65,535 iterations), a barrier not passed is flagged.
    if (!(${values.barrier === "flag" ? "atomicLoad(&bar[32]) >= n" : "atomicLoad(&bar[0]) >= n * groups"})) {
      atomicStore(&bar[1], 1u);
    }
  }
  storageBarrier();
}
fn grid_sync(tid: u32, n: u32, groups: u32) {
  grid_arrive(tid, n, groups);
  grid_wait(tid, n, groups);
}

@compute @workgroup_size(${WG})
fn main(
  @builtin(workgroup_id) wg: vec3<u32>,
  @builtin(local_invocation_index) tid: u32,
  @builtin(num_workgroups) ng: vec3<u32>,
) {
  let warp = tid / ${S}u;
  let lane = tid % ${S}u;
  let gw = wg.x * WARPS + warp;
  let GW = ng.x * WARPS;
  var wr: array<vec4<u32>, ${UMAX * 32 / S}>;
  ${
    prefetch
      ? `{ let ph = p.ph0; let layer = ph / 4u; switch (ph % 4u) {\n    ${
        cases(prefetchOf)
      }\n    default: {} } }`
      : ""
  }
  for (var ph = p.ph0; ph < p.ph1; ph++) {
    let layer = ph / 4u;
    if (ph > p.ph0) {
      ${
    pf === 2
      ? `grid_arrive(tid, ph - p.ph0, ng.x);\n      switch (ph % 4u) {\n    ${
        cases(prefetchOf)
      }\n    default: {} }\n      grid_wait(tid, ph - p.ph0, ng.x);`
      : "grid_sync(tid, ph - p.ph0, ng.x);"
  }
    }
    ${prefetch ? "" : `switch (ph % 4u) {\n    ${cases(prefetchOf)}\n    default: {} }`}
    let ib = ${fresh ? "ph" : "(ph % 2u)"} * ${HALF}u;
    let ob = ${fresh ? "(ph + 1u)" : "((ph + 1u) % 2u)"} * ${HALF}u;
    switch (ph % 4u) {
    ${
    values.work === "none"
      ? cases(() => `if (tid == 0u) { ${store("ob + wg.x", "f32(ph)")} }`)
      : cases(computeOf)
  }
    default: {}
    }
    ${
    pf === 1
      ? `if (ph + 1u < p.ph1) { let layer = (ph + 1u) / 4u; switch ((ph + 1u) % 4u) {\n    ${
        cases(prefetchOf)
      }\n    default: {} } }`
      : ""
  }
  }
  // The last workgroup out resets the counters for the next dispatch.
  if (p.ph1 - p.ph0 > 1u) {
    storageBarrier();
    if (tid == 0u && atomicAdd(&bar[2], 1u) == ng.x - 1u) {
      atomicStore(&bar[0], 0u);
      atomicStore(&bar[2], 0u);
      atomicStore(&bar[32], 0u);
    }
  }
}`;
}

const gpu = await getGpu();
console.error(`gridsync.ts: ${gpu.adapterName}, ${L} layers`);
// Random q4 weights, small enough that the chain's activations stay finite.
function randomQ4(k: Kind, seed: number): Uint8Array {
  const rows = rowsOf(k);
  const one = new Float32Array(rows * k.K);
  let s = seed >>> 0;
  for (let i = 0; i < one.length; i++) {
    s = (s * 1664525 + 1013904223) >>> 0;
    one[i] = ((s >>> 8) / 16777216 - 0.5) * 2 / Math.sqrt(k.K) * (k.pair ? 2.6 : k.K > 2048 ? 2.0 : 1.7);
  }
  const q = quantize(one, { N: rows, K: k.K }, "q4");
  const all = new Uint8Array(q.byteLength * L);
  for (let l = 0; l < L; l++) all.set(q, l * q.byteLength);
  return all;
}
const layerQ4: Uint8Array[] = [];
const weights = KINDS.map((k, i) => {
  const data = randomQ4(k, 17 + i);
  layerQ4.push(data.subarray(0, matBytes(k)));
  return uploadBuffer(gpu, data, `W_${k.name}`);
});
const PH = 4 * L;
const FRESH = values.act === "fresh";
// fresh: every GEMV writes a region of its own, so no workgroup reads an address twice in a dispatch.
const REGIONS = FRESH ? PH + 1 : 2;
const act = storageBuffer(gpu, REGIONS * HALF * 4, "act");
// [0] the arrivals, [1] the spin's give-up flag, [2] the workgroups out, [32] (its own 128-byte line) the
// barriers passed, for --barrier flag: the last to arrive raises it, so the spinners read a line that only
// it writes, not the count every arrival adds to.
const bar = storageBuffer(gpu, 256, "bar");
const x0 = new Float32Array(2 * HALF);
for (let i = 0; i < HALF; i++) x0[i] = Math.sin(i * 0.37);
const OUT = FRESH ? PH : PH % 2;

async function runOnce(calls: KernelCall[]): Promise<{ out: Float32Array; flag: number }> {
  gpu.device.queue.writeBuffer(act, 0, x0);
  gpu.device.queue.writeBuffer(bar, 0, new Uint32Array(64));
  const enc = gpu.device.createCommandEncoder();
  const pass = enc.beginComputePass();
  encodeCalls(pass, calls);
  pass.end();
  gpu.device.queue.submit([enc.finish()]);
  const out = new Float32Array(await readBack(gpu, act, REGIONS * HALF * 4));
  const flag = new Uint32Array(await readBack(gpu, bar, 16))[1];
  return { out: out.slice(OUT * HALF, OUT * HALF + 3072), flag };
}

// The chain on the CPU (f64, the activations unquantised): what the GPU's outputs are checked against.
function reference(): Float32Array {
  const w = KINDS.map((k, i) => dequantize(layerQ4[i], { N: rowsOf(k), K: k.K }, "q4"));
  let x = Float64Array.from(x0.subarray(0, HALF));
  for (let ph = 0; ph < PH; ph++) {
    const k = KINDS[ph % 4], W = w[ph % 4];
    const row = (n: number) => {
      let a = 0;
      for (let j = 0; j < k.K; j++) a += W[n * k.K + j] * x[j];
      return a;
    };
    const y = new Float64Array(HALF);
    for (let n = 0; n < k.N; n++) {
      if (k.pair) {
        const g = row(n);
        y[n] = g / (1 + Math.exp(-g)) * row(k.N + n);
      } else y[n] = row(n);
    }
    x = y;
  }
  return Float32Array.from(x.subarray(0, 3072));
}
const want = reference();
function relErr(got: Float32Array): number {
  let num = 0, den = 0;
  for (let i = 0; i < want.length; i++) {
    num += (got[i] - want[i]) ** 2;
    den += want[i] ** 2;
  }
  return Math.sqrt(num / den);
}

for (const WG of list(values.wg!)) {
  for (const pf of list(values.prefetch!)) {
    const plain = values.act !== "atomic";
    const pipe = pipeline(gpu, source(WG, gpu.subgroupSize ?? 32, pf, plain, FRESH));
    for (const P of list(values.groups!)) {
      const one = (ph0: number, ph1: number) =>
        kernelCall(gpu, pipe, [uniformBuffer(gpu, [ph0, ph1]), ...weights, act, bar], [P]);
      const perGemv = Array.from({ length: PH }, (_, ph) => one(ph, ph + 1));
      const persistent = [one(0, PH)];
      const ref = await runOnce(perGemv);
      const got = await runOnce(persistent);
      let same = ref.flag === 0 && got.flag === 0;
      let maxd = 0, bad = 0;
      for (let i = 0; i < ref.out.length; i++) {
        if (ref.out[i] !== got.out[i]) bad++;
        if (ref.out[i] !== got.out[i] && !(Number.isNaN(ref.out[i]) && Number.isNaN(got.out[i]))) {
          same = false;
        }
        maxd = Math.max(maxd, Math.abs(ref.out[i] - got.out[i]));
      }
      const timed = !values["check-only"] && gpu.hasTimestamps;
      const msD = timed ? await settledGpuMs(gpu, perGemv) : NaN;
      const msP = timed ? await settledGpuMs(gpu, persistent) : NaN;
      const flag = new Uint32Array(await readBack(gpu, bar, 16))[1];
      console.log(JSON.stringify({
        bench: "gridsync",
        adapter: gpu.adapterName,
        layers: L,
        gemvs: PH,
        groups: P,
        wg: WG,
        prefetch: ["none", "before the barrier", "between arrive and wait"][pf],
        act: values.act,
        work: values.work,
        barrier: values.barrier,
        dispatch_ms: +msD.toFixed(4),
        persistent_ms: +msP.toFixed(4),
        dispatch_us_per_gemv: +(msD * 1000 / PH).toFixed(2),
        persistent_us_per_gemv: +(msP * 1000 / PH).toFixed(2),
        ratio: +(msP / msD).toFixed(3),
        same_bits: same,
        max_abs_diff: maxd,
        spin_gave_up: flag !== 0 || got.flag !== 0,
        out_sample: Array.from(ref.out.slice(0, 3)),
        mismatched: bad,
        rel_err_vs_cpu: relErr(ref.out),
        ref_rms: Math.sqrt(want.reduce((a, v) => a + v * v, 0) / want.length),
        got_sample: Array.from(got.out.slice(0, 3)),
      }));
    }
  }
}
