// Can one dispatch do a whole MLP block? A chain of Llama-3.2-1B-shaped q4 MLP blocks (x += down(silu(gate
// n(x)) * up n(x)), n the RMSNorm; hidden 2048, intermediate 8192; int8 dp4 against the q4 weights as
// gemv_sg.ts does) run three ways in one process:
//   engine: the engine's own kernels (gemvFusedCalls as models/blocks/mlp.ts calls them at one token): the
//        paired gate/up GEMV and down in the int8 direct mode, each reading the int8 copy of its input that
//        the kernel before wrote, down writing the next block's normed copy; one weight buffer a layer;
//   two: this file's pair of dispatches: gate/up (workgroup j computes rows [jC, (j+1)C) of h and writes
//        them as whole int8 blocks) and down (a warp a row, reading h's blocks, adding the residual);
//   fused: one dispatch a block. Workgroup j computes its C rows of h as above, keeps them in workgroup
//        memory and multiplies them by the C columns of down that they meet (down repacked at load so those
//        are contiguous, `--down packed`; `rows` reads the row-major matrix): a partial sum for every
//        output, added into the next block's residual by an integer atomicAdd in fixed point (2^-bits; sums
//        of integers are exact and the same in any order, so the result is deterministic). The next block
//        reads x = base + acc 2^-bits. Nothing is handed between workgroups inside a dispatch: only
//        atomics, whose results the next dispatch reads. `--variant late` (default) issues down's weight
//        loads after the gate/up sums (fewer live registers), `early` with gate/up's, `noatomic` as early
//        with the atomicAdd replaced by a store that never happens (what the atomics cost).
// Prints one JSON line a case: GPU ms of each chain, us a block, and each way's relative error against the
// chain on the CPU (f64, activations unquantised). Findings (H200, 2026-12-03, docs/BENCHMARKS.md): engine
// 16.7 us a block, two 18.8, fused 14.9 (late; 16.7 early, 17.3 with row-major down), the atomics free; the
// fused block cannot write the next block's int8 input, which the engine's down does and which saves about
// as much (thirteenth session): not a lever for dense decode.
//   deno run -A scripts/bench/fused_mlp.ts [--layers 16] [--wg 512,1024] [--rows 64,32] [--bits 16]
//     [--hidden 2048] [--inter 8192] [--variant late|early|noatomic] [--down packed|rows] [--check-only]
import { parseArgs } from "node:util";
import { scriptArgs } from "../args.ts";
import {
  encodeCalls,
  gemvFusedCalls,
  type GemvFusedDims,
  getGpu,
  type InputCopyOut,
  int8CopyFor,
  int8CopyOutFits,
  type KernelCall,
  kernelCall,
  normCopyFor,
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
      wg: { type: "string", default: "512,1024" },
      rows: { type: "string", default: "64,32" },
      bits: { type: "string", default: "16" },
      hidden: { type: "string", default: "2048" },
      inter: { type: "string", default: "8192" },
      variant: { type: "string", default: "late" },
      down: { type: "string", default: "packed" },
      "check-only": { type: "boolean", default: false },
    },
  }));
const L = Number(values.layers), BITS = Number(values.bits);
const H = Number(values.hidden), I = Number(values.inter);
const list = (s: string) => s.split(",").map(Number);
if (!(Number.isInteger(L) && L >= 1 && H % 128 === 0 && I % 32 === 0 && BITS >= 1 && BITS <= 24)) {
  console.error("fused_mlp.ts: --layers >= 1, --hidden a multiple of 128, --inter of 32, --bits 1..24");
  Deno.exit(2);
}
if (!["late", "early", "noatomic"].includes(values.variant!) || !["packed", "rows"].includes(values.down!)) {
  console.error("fused_mlp.ts: --variant late|early|noatomic, --down packed|rows");
  Deno.exit(2);
}
const gpu = await getGpu();
const S = gpu.subgroupSize ?? 32;
const NBH = H / 32, NBI = I / 32;
if (NBH % S !== 0 || NBI % S !== 0) {
  console.error(
    `fused_mlp.ts: --hidden and --inter must be multiples of ${32 * S} (32 x this GPU's ${S} lanes)`,
  );
  Deno.exit(2);
}
const EPS = 1e-5;

/** A q4 unit's value: its bf16 scale (from word `sw`, group `g`) times (xs.x dp4Dot - 8 xs.y), as gemv_sg.ts. */
function q4Unit(w: string, sw: string, g: string, x: [string, string], xs: string): string {
  const scale = `bitcast<f32>(select(${sw} << 16u, ${sw} & 0xffff0000u, ((${g}) & 1u) == 1u))`;
  return `${scale} * (${xs}.x * f32(${dp4Dot("q4", w, x)}) - 8.0 * ${xs}.y)`;
}

/** The norm, int8 staging of x and this workgroup's C rows of h (f32, in hv), shared by both ways. */
function front(T: number, C: number, fused: boolean): [string, string] {
  const WARPS = T / S, PW = C / WARPS, UPR = NBH / S;
  const sOff = 2 * I * H / 2 / 16; // vec4 offset of the scales in a layer's gate/up
  const xin = (i: number) =>
    fused
      ? `xb[l * ${H}u + 4u * tid + ${i}u] + f32(atomicLoad(&acc[l * ${H}u + 4u * tid + ${i}u])) * INV`
      : `xb[l * ${H}u + 4u * tid + ${i}u]`;
  const loads: string[] = [];
  const dots: string[] = [];
  for (let pr = 0; pr < PW; pr++) {
    for (let half = 0; half < 2; half++) {
      const r = 2 * pr + half;
      loads.push(`let row${r} = ${half ? `${I}u + ` : ""}wg.x * ${C}u + warp * ${PW}u + ${pr}u;`);
      for (let c = 0; c < UPR; c++) {
        loads.push(`let w${r}_${c} = Wgu[lw + row${r} * ${NBH}u + lane + ${S * c}u];`);
        loads.push(
          `let sw${r}_${c} = Wgu[lw + ${sOff}u + (row${r} * ${NBH}u + lane + ${
            S * c
          }u) / 8u][((row${r} * ${NBH}u + lane + ${S * c}u) / 2u) % 4u];`,
        );
      }
    }
  }
  for (let pr = 0; pr < PW; pr++) {
    for (let half = 0; half < 2; half++) {
      const r = 2 * pr + half;
      dots.push(`var a${r} = 0.0;`);
      for (let c = 0; c < UPR; c++) {
        const u = `lane + ${S * c}u`;
        const x: [string, string] = [`xq[${u}]`, `xq[${NBH}u + ${u}]`];
        dots.push(
          `a${r} += ${q4Unit(`w${r}_${c}`, `sw${r}_${c}`, `row${r} * ${NBH}u + ${u}`, x, `xqs[${u}]`)};`,
        );
      }
      dots.push(`let s${r} = subgroupAdd(a${r});`);
    }
    dots.push(
      `if (lane == 0u) { let g = s${
        2 * pr
      }; let k = warp * ${PW}u + ${pr}u; hv[k / 4u][k % 4u] = g / (1.0 + exp(-g)) * s${2 * pr + 1}; }`,
    );
  }
  return [
    `
  let warp = tid / ${S}u;
  let lane = tid % ${S}u;
  let lw = l * ${quantBytes(2 * I, H, "q4") / 16}u;
  ${loads.join("\n  ")}`,
    `
  var ss = 0.0;
  var xv = vec4<f32>(0.0);
  if (tid < ${H / 4}u) {
    xv = vec4<f32>(${[0, 1, 2, 3].map(xin).join(", ")});
    ss = dot(xv, xv);
    ${
      fused
        ? `if (wg.x == 0u) { xb[(l + 1u) * ${H}u + 4u * tid] = xv.x; xb[(l + 1u) * ${H}u + 4u * tid + 1u] = xv.y; xb[(l + 1u) * ${H}u + 4u * tid + 2u] = xv.z; xb[(l + 1u) * ${H}u + 4u * tid + 3u] = xv.w; }`
        : ""
    }
  }
  let sw = subgroupAdd(ss);
  if (lane == 0u) { red[warp] = sw; }
  workgroupBarrier();
  var tot = 0.0;
  for (var i = 0u; i < ${WARPS}u; i++) { tot += red[i]; }
  let rinv = inverseSqrt(tot / ${H}.0 + ${EPS});
  if (tid < ${H / 4}u) {
    xn[tid] = xv * rinv * vec4<f32>(nw[l * ${H}u + 4u * tid], nw[l * ${H}u + 4u * tid + 1u], nw[l * ${H}u + 4u * tid + 2u], nw[l * ${H}u + 4u * tid + 3u]);
  }
  workgroupBarrier();
  ${int8BlocksWgsl("q4", (k) => `xn[${k}]`, `${NBH}u`, `${T}u`, `${NBH}u`)}
  workgroupBarrier();
  ${dots.join("\n  ")}
  workgroupBarrier();`,
  ];
}

function header(T: number, C: number): string {
  return `
const INV = ${2 ** -BITS};
var<workgroup> xn: array<vec4<f32>, ${H / 4}>;
var<workgroup> xq: array<vec4<u32>, ${H / 16}>;
var<workgroup> xqs: array<vec2<f32>, ${NBH}>;
var<workgroup> red: array<f32, ${T / S}>;
var<workgroup> hv: array<vec4<f32>, ${C / 4}>;`;
}

function fusedSource(T: number, C: number, rowMajor: boolean): string {
  const CB = C / 32, RT = H / T;
  const dOff = quantBytes((I / C) * H, C, "q4") / 16;
  const sOff = (I / C) * H * C / 2 / 16;
  const loads: string[] = [], dots: string[] = [];
  for (let i = 0; i < RT; i++) {
    loads.push(
      rowMajor
        ? `let rr${i} = (tid + ${T * i}u) * ${NBI}u + wg.x * ${CB}u;`
        : `let rr${i} = (wg.x * ${H}u + tid + ${T * i}u) * ${CB}u;`,
    );
    for (let b = 0; b < CB; b++) {
      loads.push(`let d${i}_${b} = Wd[ld + rr${i} + ${b}u];`);
      loads.push(
        `let ds${i}_${b} = Wd[ld + ${sOff}u + (rr${i} + ${b}u) / 8u][((rr${i} + ${b}u) / 2u) % 4u];`,
      );
    }
  }
  for (let i = 0; i < RT; i++) {
    dots.push(`var e${i} = 0.0;`);
    for (let b = 0; b < CB; b++) {
      const x: [string, string] = [`hq[${b}u]`, `hq[${CB + b}u]`];
      dots.push(`e${i} += ${q4Unit(`d${i}_${b}`, `ds${i}_${b}`, `rr${i} + ${b}u`, x, `hqs[${b}u]`)};`);
    }
    dots.push(
      values.variant === "noatomic"
        ? `if (e${i} == 12345.0) { atomicStore(&acc[(l + 1u) * ${H}u + tid + ${T * i}u], 1); }`
        : `atomicAdd(&acc[(l + 1u) * ${H}u + tid + ${T * i}u], i32(round(e${i} * ${2 ** BITS}.0)));`,
    );
  }
  const [fl, fr] = front(T, C, true);
  return `
struct Params { l: u32 }
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> Wgu: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> Wd: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> nw: array<f32>;
@group(0) @binding(4) var<storage, read_write> xb: array<f32>;
@group(0) @binding(5) var<storage, read_write> acc: array<atomic<i32>>;
${header(T, C)}
var<workgroup> hq: array<vec4<u32>, ${C / 16}>;
var<workgroup> hqs: array<vec2<f32>, ${CB}>;
@compute @workgroup_size(${T})
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
  let l = p.l;
  let ld = l * ${dOff}u;
  ${fl}
  ${values.variant === "late" ? "" : loads.join("\n  ")}
  ${fr}
  ${values.variant === "late" ? loads.join("\n  ") : ""}
  ${
    int8BlocksWgsl("q4", (k) => `hv[${k}]`, `${CB}u`, `${T}u`, `${CB}u`, {
      q: (i) => `hq[${i}]`,
      s: (b) => `hqs[${b}]`,
    })
  }
  workgroupBarrier();
  ${dots.join("\n  ")}
}`;
}

function gateUpSource(T: number, C: number): string {
  const CB = C / 32;
  return `
struct Params { l: u32 }
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> Wgu: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> nw: array<f32>;
@group(0) @binding(3) var<storage, read> xb: array<f32>;
@group(0) @binding(4) var<storage, read_write> hq: array<vec4<u32>>;
@group(0) @binding(5) var<storage, read_write> hqs: array<vec2<f32>>;
${header(T, C)}
@compute @workgroup_size(${T})
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
  let l = p.l;
  ${front(T, C, false).join("")}
  ${
    int8BlocksWgsl("q4", (k) => `hv[${k}]`, `${CB}u`, `${T}u`, `${NBI}u`, {
      q: (i) => `hq[wg.x * ${CB}u + ${i}]`,
      s: (b) => `hqs[wg.x * ${CB}u + ${b}]`,
    })
  }
}`;
}

function downSource(T: number): string {
  const WARPS = T / S, UPR = NBI / S;
  const sOff = H * I / 2 / 16;
  const l: string[] = [`let n = wg.x * ${WARPS}u + warp;`, `var a = 0.0;`];
  for (let c = 0; c < UPR; c++) {
    l.push(`let w${c} = Wd[lw + n * ${NBI}u + lane + ${S * c}u];`);
    l.push(
      `let sw${c} = Wd[lw + ${sOff}u + (n * ${NBI}u + lane + ${S * c}u) / 8u][((n * ${NBI}u + lane + ${
        S * c
      }u) / 2u) % 4u];`,
    );
  }
  for (let c = 0; c < UPR; c++) {
    const u = `lane + ${S * c}u`;
    l.push(`let xe${c} = hq[${u}]; let xo${c} = hq[${NBI}u + ${u}]; let xs${c} = hqs[${u}];`);
  }
  for (let c = 0; c < UPR; c++) {
    const g = `n * ${NBI}u + lane + ${S * c}u`;
    l.push(`a += ${q4Unit(`w${c}`, `sw${c}`, g, [`xe${c}`, `xo${c}`], `xs${c}`)};`);
  }
  l.push(
    `let s = subgroupAdd(a);`,
    `if (lane == 0u) { xb[(p.l + 1u) * ${H}u + n] = xb[p.l * ${H}u + n] + s; }`,
  );
  return `
struct Params { l: u32 }
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> Wd: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> hq: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> hqs: array<vec2<f32>>;
@group(0) @binding(4) var<storage, read_write> xb: array<f32>;
@compute @workgroup_size(${T})
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
  let warp = tid / ${S}u;
  let lane = tid % ${S}u;
  let lw = p.l * ${quantBytes(H, I, "q4") / 16}u;
  ${l.join("\n  ")}
}`;
}

const zeroSource = `
@group(0) @binding(0) var<storage, read_write> acc: array<i32>;
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) g: vec3<u32>) { if (g.x < arrayLength(&acc)) { acc[g.x] = 0; } }`;

console.error(`fused_mlp.ts: ${gpu.adapterName}, ${L} layers, hidden ${H}, intermediate ${I}`);

function rand(n: number, seed: number, scale: number): Float32Array {
  const out = new Float32Array(n);
  let s = seed >>> 0;
  for (let i = 0; i < n; i++) {
    s = (s * 1664525 + 1013904223) >>> 0;
    out[i] = ((s >>> 8) / 16777216 - 0.5) * 2 * scale;
  }
  return out;
}
// One layer's weights, repeated for every layer (the chain's cost does not depend on the values).
const gu = rand(2 * I * H, 7, 2.4 / Math.sqrt(H));
const dn = rand(H * I, 11, 1.2 / Math.sqrt(I));
const guQ = quantize(gu, { N: 2 * I, K: H }, "q4");
const dnQ = quantize(dn, { N: H, K: I }, "q4");
const guD = dequantize(guQ, { N: 2 * I, K: H }, "q4");
const dnD = dequantize(dnQ, { N: H, K: I }, "q4");
const nwv = Float32Array.from({ length: H }, (_, i) => 1 + 0.3 * Math.sin(i * 0.11));
function repeat(a: Uint8Array | Float32Array): Uint8Array {
  const b = new Uint8Array(a.buffer, a.byteOffset, a.byteLength);
  const all = new Uint8Array(b.byteLength * L);
  for (let l = 0; l < L; l++) all.set(b, l * b.byteLength);
  return all;
}
/** down's columns [jC, (j+1)C) of every row together: row j H + n of an (I / C) H x C matrix. */
function repackDown(C: number): Uint8Array {
  const r = new Float32Array(H * I);
  for (let j = 0; j < I / C; j++) {
    for (let n = 0; n < H; n++) r.set(dnD.subarray(n * I + j * C, n * I + j * C + C), (j * H + n) * C);
  }
  return quantize(r, { N: (I / C) * H, K: C }, "q4");
}
const Wgu = uploadBuffer(gpu, repeat(guQ), "W_gate_up");
const WdRow = uploadBuffer(gpu, repeat(dnQ), "W_down");
const nwB = uploadBuffer(gpu, repeat(nwv), "norm");
const xb = storageBuffer(gpu, (L + 1) * H * 4, "x");
const acc = storageBuffer(gpu, (L + 1) * H * 4, "acc");
const hq = storageBuffer(gpu, I, "h int8");
const hqs = storageBuffer(gpu, NBI * 8, "h scales");
const x0 = Float32Array.from({ length: H }, (_, i) => Math.sin(i * 0.37) + 0.2 * Math.cos(i * 1.3));

function reference(layers: number): Float32Array {
  const x = Float64Array.from(x0);
  for (let l = 0; l < layers; l++) {
    let ss = 0;
    for (const v of x) ss += v * v;
    const r = 1 / Math.sqrt(ss / H + EPS);
    const xn = x.map((v, i) => v * r * nwv[i]);
    const h = new Float64Array(I);
    for (let n = 0; n < I; n++) {
      let g = 0, u = 0;
      for (let k = 0; k < H; k++) {
        g += guD[n * H + k] * xn[k];
        u += guD[(I + n) * H + k] * xn[k];
      }
      h[n] = g / (1 + Math.exp(-g)) * u;
    }
    for (let n = 0; n < H; n++) {
      let a = 0;
      for (let k = 0; k < I; k++) a += dnD[n * I + k] * h[k];
      x[n] += a;
    }
  }
  return Float32Array.from(x);
}
function relErr(got: Float32Array, want: Float32Array): number {
  let num = 0, den = 0;
  for (let i = 0; i < want.length; i++) {
    num += (got[i] - want[i]) ** 2;
    den += want[i] ** 2;
  }
  return Math.sqrt(num / den);
}

async function run(calls: KernelCall[], layers: number, fused: boolean): Promise<Float32Array> {
  const init = new Float32Array((L + 1) * H);
  init.set(x0);
  gpu.device.queue.writeBuffer(xb, 0, init);
  gpu.device.queue.writeBuffer(acc, 0, new Int32Array((L + 1) * H));
  const enc = gpu.device.createCommandEncoder();
  const pass = enc.beginComputePass();
  encodeCalls(pass, calls);
  pass.end();
  gpu.device.queue.submit([enc.finish()]);
  const x = new Float32Array(await readBack(gpu, xb, (L + 1) * H * 4)).slice(layers * H, (layers + 1) * H);
  if (!fused) return x;
  const a = new Int32Array(await readBack(gpu, acc, (L + 1) * H * 4)).slice(layers * H, (layers + 1) * H);
  return x.map((v, i) => v + a[i] * 2 ** -BITS);
}

// The engine's own decode MLP (models/blocks/mlp.ts at one token, q4): the paired gate/up GEMV and down, in
// the int8 direct mode, each reading the int8 copy of its input that the kernel before wrote (down writing the
// next block's normed input), one weight buffer a layer as the engine has (no layer's weights in L2).
const engineW = Array.from({ length: L }, () => ({
  gu: uploadBuffer(gpu, guQ, "engine gate_up"),
  dn: uploadBuffer(gpu, dnQ, "engine down"),
  nw: uploadBuffer(gpu, nwv, "engine norm"),
}));
const xe = storageBuffer(gpu, H * 4, "engine x");
const ae = storageBuffer(gpu, I * 4, "engine a");
function engineChain(n: number): KernelCall[] {
  const gateUp: GemvFusedDims = {
    K: H,
    N: I,
    T: 1,
    weights: "q4",
    normWeights: "f32",
    transform: "rmsnorm",
    eps: EPS,
    pairs: true,
    int8One: true,
  };
  const down: GemvFusedDims = { K: I, N: H, T: 1, accumulate: true, weights: "q4", int8One: true };
  const calls: KernelCall[] = [];
  let copyIn: InputCopyOut | undefined;
  for (let l = 0; l < n; l++) {
    const w = engineW[l];
    const copy = int8CopyOutFits(gpu, gateUp) ? int8CopyFor(gpu, down) : undefined;
    const after = l + 1 < n ? normCopyFor(gpu, down, gateUp, engineW[l + 1].nw) : undefined;
    calls.push(
      ...gemvFusedCalls(gpu, { x: xe, w: w.gu, y: ae, normWeight: w.nw, copyIn, copyOut: copy }, gateUp),
      ...gemvFusedCalls(gpu, { x: ae, w: w.dn, y: xe, copyIn: copy, copyOut: after }, down),
    );
    copyIn = after;
  }
  return calls;
}
async function runEngine(n: number): Promise<Float32Array> {
  gpu.device.queue.writeBuffer(xe, 0, x0);
  const enc = gpu.device.createCommandEncoder();
  const pass = enc.beginComputePass();
  encodeCalls(pass, engineChain(n));
  pass.end();
  gpu.device.queue.submit([enc.finish()]);
  return new Float32Array(await readBack(gpu, xe, H * 4));
}

const CHECK = Math.min(2, L);
const want = reference(CHECK);
const zero = pipeline(gpu, zeroSource);
const gotE = await runEngine(CHECK);
const engineCalls = engineChain(L);
const msE = !values["check-only"] && gpu.hasTimestamps ? await settledGpuMs(gpu, engineCalls) : NaN;
for (const T of list(values.wg!)) {
  for (const C of list(values.rows!)) {
    if (C % 32 !== 0 || C % (T / S) !== 0 || H % T !== 0 || T / S > C || H / 4 > T || I % C !== 0) {
      console.error(
        `skip wg ${T} rows ${C}: rows must divide the intermediate size and be a multiple of 32 and of the ` +
          `warps; the threads must divide the hidden size and be at least a quarter of it`,
      );
      continue;
    }
    const Wd = uploadBuffer(gpu, repeat(repackDown(C)), "W_down packed");
    const rowMajor = values.down === "rows";
    const fp = pipeline(gpu, fusedSource(T, C, rowMajor));
    const gp = pipeline(gpu, gateUpSource(T, C));
    const dp = pipeline(gpu, downSource(T));
    const ubs = Array.from({ length: L }, (_, l) => uniformBuffer(gpu, [l]));
    const fused = (n: number) => [
      kernelCall(gpu, zero, [acc], [Math.ceil((L + 1) * H / 256)]),
      ...ubs.slice(0, n).map((u) =>
        kernelCall(gpu, fp, [u, Wgu, rowMajor ? WdRow : Wd, nwB, xb, acc], [I / C])
      ),
    ];
    const two = (n: number) =>
      ubs.slice(0, n).flatMap((u) => [
        kernelCall(gpu, gp, [u, Wgu, nwB, xb, hq, hqs], [I / C]),
        kernelCall(gpu, dp, [u, WdRow, hq, hqs, xb], [H / (T / S)]),
      ]);
    const gotF = await run(fused(CHECK), CHECK, true);
    const gotT = await run(two(CHECK), CHECK, false);
    const timed = !values["check-only"] && gpu.hasTimestamps;
    const msT = timed ? await settledGpuMs(gpu, two(L)) : NaN;
    const msF = timed ? await settledGpuMs(gpu, fused(L)) : NaN;
    const msE2 = timed ? await settledGpuMs(gpu, engineCalls) : NaN;
    console.log(JSON.stringify({
      bench: "fused_mlp",
      adapter: gpu.adapterName,
      layers: L,
      wg: T,
      rows: C,
      bits: BITS,
      engine_ms: [+msE.toFixed(4), +msE2.toFixed(4)],
      engine_dispatches: engineCalls.length,
      engine_us_per_block: +(Math.min(msE, msE2) * 1000 / L).toFixed(2),
      two_ms: +msT.toFixed(4),
      fused_ms: +msF.toFixed(4),
      two_us_per_block: +(msT * 1000 / L).toFixed(2),
      fused_us_per_block: +(msF * 1000 / L).toFixed(2),
      ratio: +(msF / msT).toFixed(3),
      block_mb: +((quantBytes(2 * I, H, "q4") + quantBytes(H, I, "q4")) / 1e6).toFixed(2),
      fused_tb_s: +((quantBytes(2 * I, H, "q4") + quantBytes(H, I, "q4")) / (msF * 1e9 / L)).toFixed(2),
      rel_err_engine: relErr(gotE, want),
      rel_err_two: relErr(gotT, want),
      rel_err_fused: relErr(gotF, want),
      rel_err_between: relErr(gotF, gotT),
      ref_rms: Math.sqrt(want.reduce((a, v) => a + v * v, 0) / H),
    }));
    Wd.destroy();
  }
}
