// The q4 GEMV of a k-token step two ways on one random matrix and one int8 input: the engine's (gemv_multi.ts
// int8 direct mode, lanes across K, as gemvFusedCalls picks it) and an interleaved-rows kernel defined here
// (measured, not used: docs/KERNELS.md), for each T. In the interleaved layout unit j (32 weights, 16 bytes)
// of rows 32g..32g+31 lies in 512 consecutive bytes, so lane l of a team of 32 threads reads row 32g + l's
// unit: the team's weight loads stay coalesced, every lane reads the same x unit (one broadcast) and keeps
// its own row's T sums (no reduction across lanes; `splitK` teams share a row group's units and meet in
// workgroup memory). The engine's kernel reads T x 40 bytes of x a lane for every R x 16 bytes of weights;
// this one reads x once per 32 rows. GPU us a call (the
// matrix rotates over enough copies to keep it out of the 50 MB L2), GB/s of weights, and the largest
// difference between the two outputs over the largest output. One JSON line per (shape, T, variant).
//   deno run -A scripts/bench/rows.ts [--shape head|gate_up|qkv|down] [--t 1,2,4,8,16]
//     [--variants '[{"splitK":1,"unroll":2},...]']
import { parseArgs } from "node:util";
import { scriptArgs } from "../args.ts";
import {
  gemvFusedCalls,
  type GemvFusedDims,
  getGpu,
  type Gpu,
  type KernelCall,
  kernelCall,
  pipeline,
  QUANT_GROUP,
  quantBytes,
  quantScaleWord,
  storageBuffer,
  uniformBuffer,
} from "../../kernels/mod.ts";
import { gpuMs } from "../../kernels/timer.ts";
import { dp4Dot, QUANT_DECODE_WGSL } from "../../kernels/wgsl.ts";
import { readBack } from "../../kernels/gpu.ts";

/** Rows a group of the interleaved layout (a warp's lanes). */
const ROWS_GROUP = 32;
const range = (n: number) => Array.from({ length: n }, (_, i) => i);

const { values } = scriptArgs(import.meta.url, (args) =>
  parseArgs({
    args,
    options: {
      shape: { type: "string", default: "head" },
      t: { type: "string", default: "1,8" },
      variants: { type: "string" },
      copies: { type: "string" },
    },
  }));
const gpu = await getGpu();
// Llama-3.2-1B's shapes (rows x K); a software adapter gets a small one.
const shapes: Record<string, [number, number]> = {
  head: [128256, 2048],
  gate_up: [16384, 2048],
  qkv: [3072, 2048],
  down: [2048, 8192],
  tiny: [256, 256],
};
const Ts = values.t!.split(",").map(Number);
let variants: Partial<RowsDims>[] = [];
try {
  variants = values.variants
    ? JSON.parse(values.variants)
    : [{ splitK: 1, unroll: 2 }, { splitK: 2, unroll: 2 }, { splitK: 1, unroll: 4 }, {
      splitK: 4,
      unroll: 1,
    }];
} catch {
  variants = [];
}
if (
  !(values.shape! in shapes) || !Ts.every((t) => Number.isInteger(t) && t >= 1 && t <= 16) ||
  !Array.isArray(variants) || variants.length === 0
) {
  console.error(
    `rows.ts: --shape ${
      Object.keys(shapes).join("|")
    }, --t of 1..16, --variants a JSON list of {splitK, unroll, wg}`,
  );
  Deno.exit(2);
}
const [N, K] = gpu.isSoftware ? shapes.tiny : shapes[values.shape!];
const bytes = quantBytes(N, K, "q4");
const copies = Number(values.copies ?? (gpu.isSoftware ? 1 : Math.max(1, Math.ceil(256e6 / bytes))));

// Random q4 weights: codes uniform, scales bf16 of 0.01-0.02 (positive, so outputs do not cancel).
const raw = new Uint8Array(bytes);
for (let i = 0; i < raw.length; i += 65536) {
  crypto.getRandomValues(raw.subarray(i, Math.min(raw.length, i + 65536)));
}
const sc = new Uint16Array(raw.buffer, (N * K) / 2, (N * K) / 32);
for (let i = 0; i < sc.length; i++) {
  const f = new Float32Array([0.01 + 0.01 * ((i * 2654435761) % 1000) / 1000]);
  sc[i] = new Uint32Array(f.buffer)[0] >>> 16;
}
const inter = interleaveQ4(raw, N, K);
const upload = (data: Uint8Array<ArrayBuffer>) => {
  const b = storageBuffer(gpu, data.length, "rows bench weights");
  gpu.device.queue.writeBuffer(b, 0, data);
  return b;
};
const Wrow = Array.from({ length: copies }, () => upload(raw));
const Wint = Array.from({ length: copies }, () => upload(inter));
const nw = storageBuffer(gpu, K * 4, "norm weights");
gpu.device.queue.writeBuffer(nw, 0, new Float32Array(K).fill(1));

for (const T of Ts) {
  const x = storageBuffer(gpu, T * K * 4, "x");
  const xs = new Float32Array(T * K).map((_, i) => Math.sin(i * 0.37) + 0.1 * Math.cos(i * 1.3));
  gpu.device.queue.writeBuffer(x, 0, xs);
  const yA = storageBuffer(gpu, T * N * 4, "y engine"), yB = storageBuffer(gpu, T * N * 4, "y rows");
  const dims: GemvFusedDims = {
    K,
    N,
    T,
    weights: "q4",
    transform: "rmsnorm",
    normWeights: "f32",
    eps: 1e-5,
    int8One: true,
  };
  // The engine's calls: the int8 input pass, then the GEMV (one per weight copy).
  const engine = Wrow.map((w) => gemvFusedCalls(gpu, { x, w, y: yA, normWeight: nw }, dims));
  if (engine[0].length !== 2) {
    throw new Error(`expected an input pass and a GEMV, got ${engine[0].length} calls`);
  }
  const xq = engine[0][1].buffers[1], xqs = engine[0][1].buffers[4];
  // Every copy's input pass, once: each copy's GEMV reads its own (the timings below run the GEMVs alone).
  await gpuMs(gpu, engine.map((c) => c[0]), 1);
  // The H200 idles at 345 MHz and ramps up under load: ~0.5 s of work before the first timing.
  for (let spent = 0; spent < 500 && !gpu.isSoftware && T === Ts[0];) {
    spent += await gpuMs(gpu, engine.map((c) => c[1]), 20) * 20;
  }
  const engineUs = await timeUs(engine.map((c) => c[1]));
  const ref = new Float32Array(await readBack(gpu, yA, T * N * 4));
  console.log(JSON.stringify({
    bench: "gemv-rows",
    adapter: gpu.adapterName,
    shape: values.shape,
    N,
    K,
    T,
    variant: "engine",
    us: round(engineUs),
    gb_s: round(bytes / engineUs / 1e3),
  }));
  for (const v of variants) {
    let calls;
    try {
      calls = Wint.map((w) => gemvRowsCall(gpu, { xq, xqs, w, y: yB }, { K, N, T, ...v }));
    } catch (e) {
      console.log(JSON.stringify({ bench: "gemv-rows", T, variant: v, error: (e as Error).message }));
      continue;
    }
    const us = await timeUs(calls);
    const out = new Float32Array(await readBack(gpu, yB, T * N * 4));
    let err = 0, max = 0, bad = 0;
    for (let i = 0; i < out.length; i++) {
      if (!Number.isFinite(out[i]) || !Number.isFinite(ref[i])) bad++;
      err = Math.max(err, Math.abs(out[i] - ref[i]));
      max = Math.max(max, Math.abs(ref[i]));
    }
    console.log(JSON.stringify({
      bench: "gemv-rows",
      adapter: gpu.adapterName,
      shape: values.shape,
      N,
      K,
      T,
      variant: v,
      us: round(us),
      gb_s: round(bytes / us / 1e3),
      vs_engine: round(engineUs / us),
      err_over_max: Number((err / max).toExponential(2)),
      ref_max: Number(max.toPrecision(4)),
      not_finite: bad,
    }));
  }
  x.destroy();
  yA.destroy();
  yB.destroy();
}

async function timeUs(calls: ReturnType<typeof gemvRowsCall>[]): Promise<number> {
  await gpuMs(gpu, calls, 3);
  let best = Infinity;
  for (let r = 0; r < 3; r++) best = Math.min(best, await gpuMs(gpu, calls, 5));
  return (best * 1000) / calls.length;
}

function round(v: number): number {
  return Number(v.toFixed(2));
}

/** Bytes of an interleaved q4 matrix of N rows (padded to whole groups) of K. */
function interleavedQ4Bytes(N: number, K: number): number {
  const NP = Math.ceil(N / ROWS_GROUP) * ROWS_GROUP;
  return NP * K / 2 + NP * (K / QUANT_GROUP) * 2;
}

/**
 * Reorders a q4 matrix (row-major 16-byte units, then the bf16 scales of every unit in the same order)
 * into the interleaved layout: unit j of row n at ((n / 32) UNITS + j) 32 + n % 32, values then scales in
 * that order; rows past N (up to a whole group) are zero.
 */
function interleaveQ4(data: Uint8Array, N: number, K: number): Uint8Array<ArrayBuffer> {
  const U = K / QUANT_GROUP, G = Math.ceil(N / ROWS_GROUP);
  const out = new Uint8Array(interleavedQ4Bytes(N, K));
  const vb = (N * K) / 2, ob = G * ROWS_GROUP * K / 2;
  for (let n = 0; n < N; n++) {
    const g = Math.floor(n / ROWS_GROUP), l = n % ROWS_GROUP;
    for (let j = 0; j < U; j++) {
      const dst = (g * U + j) * ROWS_GROUP + l;
      out.set(data.subarray((n * U + j) * 16, (n * U + j) * 16 + 16), dst * 16);
      out[ob + 2 * dst] = data[vb + 2 * (n * U + j)];
      out[ob + 2 * dst + 1] = data[vb + 2 * (n * U + j) + 1];
    }
  }
  return out;
}

interface RowsDims {
  K: number;
  N: number;
  T: number;
  /** Warps a row group's units are split over (a divisor of the workgroup's warps). Default 1. */
  splitK?: number;
  /** Units a lane has in flight (the next ones loaded while these are multiplied). Default 2. */
  unroll?: number;
  /** Workgroup size. Default 256. */
  wg?: number;
  /** The copy's block sums of squares are bound (binding 5): the sums are scaled by 1 / rms. */
  rmsIn?: boolean;
  /** Add into y instead of writing it. */
  accumulate?: boolean;
}

function gemvRowsSource(d: RowsDims): string {
  const { K, N, T } = d;
  const S = ROWS_GROUP;
  const SK = d.splitK ?? 1, U = d.unroll ?? 2, WG = d.wg ?? 256;
  const WARPS = WG / S;
  const UNITS = K / QUANT_GROUP, NB = UNITS;
  if (K % QUANT_GROUP !== 0 || WARPS % SK !== 0 || UNITS % (SK * U) !== 0 || T < 1 || T > 16) {
    throw new RangeError(`interleaved GEMV: K ${K}, T ${T}, splitK ${SK}, unroll ${U}, ${WARPS} warps`);
  }
  const STEPS = UNITS / (SK * U);
  const G = Math.ceil(N / ROWS_GROUP);
  const dp = (a: string, b: string) => dp4Dot("q8", a, b);
  // Unit (step i, u) of this warp: j = (i U + u) SK + ks.
  const unitAt = (i: string, u: number) => `((${i} * ${U}u + ${u}u) * ${SK}u + ks)`;
  const load = (v: string, i: string) =>
    range(U).flatMap((u) => [
      `${v}w${u} = W[(gb + ${unitAt(i, u)}) * 32u + lane];`,
      `${v}s${u} = group_scale((gb + ${unitAt(i, u)}) * 32u + lane);`,
    ]);
  const products = range(U).flatMap((u) => {
    const j = `j${u}`;
    const out = [
      `let ${j} = ${unitAt("i", u)};`,
      `let we${u} = cw${u} & vec4<u32>(0x0F0F0F0Fu);`,
      `let wo${u} = (cw${u} >> vec4<u32>(4u)) & vec4<u32>(0x0F0F0F0Fu);`,
    ];
    for (let t = 0; t < T; t++) {
      out.push(
        `{ let xc = xqs[${t * NB}u + ${j}]; let xe = xq[${2 * t * NB}u + ${j}]; let xo = xq[${
          (2 * t + 1) * NB
        }u + ${j}];`,
        `  a${t} += cs${u} * (xc.x * f32(${dp(`we${u}`, "xe")} + ${dp(`wo${u}`, "xo")}) - 8.0 * xc.y); }`,
      );
    }
    return out;
  });
  // 1 / rms of each token from the copy's NB block sums of squares, summed by every thread (L1 broadcasts).
  const v4 = NB % 4 === 0;
  const rms = d.rmsIn
    ? range(T).map((t) =>
      `var q${t} = 0.0;
  for (var b = 0u; b < ${v4 ? NB / 4 : NB}u; b++) { q${t} += ${
        v4 ? `dot(issq[${t * NB / 4}u + b], vec4<f32>(1.0))` : `issq[${t * NB}u + b]`
      }; }
  let inv${t} = inverseSqrt(q${t} / f32(K) + p.eps);`
    )
    : [];
  const scaled = (t: number) => d.rmsIn ? `a${t} * inv${t}` : `a${t}`;
  // p.acc (the uniform is always bound): add into y instead of writing it.
  const write = (t: number, v: string) =>
    `y[${t}u * N + n] = select(0.0, y[${t}u * N + n], p.acc != 0u) + ${v};`;
  return `struct P { K: u32, N: u32, T: u32, acc: u32, x_row0: u32, eps: f32, soff: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> xq: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> W: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<storage, read> xqs: array<vec2<f32>>;
${d.rmsIn ? `@group(0) @binding(5) var<storage, read> issq: array<${v4 ? "vec4<f32>" : "f32"}>;` : ""}
const K = ${K}u;
const N = ${N}u;
${QUANT_DECODE_WGSL}
${SK > 1 ? `var<workgroup> red: array<f32, ${WARPS * T * S}>;` : ""}
@compute @workgroup_size(${WG})
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
  let warp = tid / 32u;
  let lane = tid % 32u;
  let ks = warp % ${SK}u;
  let grp = min(wg.x * ${WARPS / SK}u + warp / ${SK}u, ${G - 1}u);
  let gb = grp * ${UNITS}u;
  let n = grp * 32u + lane;
  ${range(T).map((t) => `var a${t} = 0.0;`).join(" ")}
  ${range(U).map((u) => `var cw${u}: vec4<u32>; var cs${u}: f32;`).join(" ")}
  ${range(U).map((u) => `var nw${u}: vec4<u32>; var ns${u}: f32;`).join(" ")}
  ${load("c", "0u").join("\n  ")}
  for (var i = 0u; i < ${STEPS}u; i++) {
    let inext = min(i + 1u, ${STEPS - 1}u);
    ${load("n", "inext").join("\n    ")}
    ${products.join("\n    ")}
    ${range(U).map((u) => `cw${u} = nw${u}; cs${u} = ns${u};`).join(" ")}
  }
  ${rms.join("\n  ")}
  ${
    SK > 1
      ? `${range(T).map((t) => `red[(warp * ${T}u + ${t}u) * 32u + lane] = ${scaled(t)};`).join("\n  ")}
  workgroupBarrier();
  if (ks == 0u && n < N && wg.x * ${WARPS / SK}u + warp / ${SK}u < ${G}u) {
    ${
        range(T).map((t) =>
          write(t, range(SK).map((k) => `red[((warp + ${k}u) * ${T}u + ${t}u) * 32u + lane]`).join(" + "))
        ).join("\n    ")
      }
  }`
      : `if (n < N && wg.x * ${WARPS}u + warp < ${G}u) {
    ${range(T).map((t) => write(t, scaled(t))).join("\n    ")}
  }`
  }
}`;
}

/** Workgroups of the interleaved GEMV. */
function rowsGroups(d: RowsDims): number {
  const WARPS = (d.wg ?? 256) / ROWS_GROUP;
  return Math.ceil(Math.ceil(d.N / ROWS_GROUP) * (d.splitK ?? 1) / WARPS);
}

/** The interleaved GEMV's call: y [T, N] from the int8 copy (xq, xqs[, issq]) and interleaved weights w. */
function gemvRowsCall(
  gpu: Gpu,
  bufs: { xq: GPUBuffer; xqs: GPUBuffer; w: GPUBuffer; y: GPUBuffer; issq?: GPUBuffer },
  d: RowsDims & { eps?: number },
): KernelCall {
  if ((bufs.issq !== undefined) !== (d.rmsIn === true)) throw new TypeError("rmsIn needs issq, and only it");
  // The scales follow the values of every row group (interleavedQ4Bytes): their first word is p.soff.
  const soff = quantScaleWord(Math.ceil(d.N / ROWS_GROUP) * ROWS_GROUP, d.K, "q4");
  const params = uniformBuffer(gpu, [d.K, d.N, d.T, d.accumulate ? 1 : 0, 0, d.eps ?? 0, soff], [5]);
  const buffers = [params, bufs.xq, bufs.w, bufs.y, bufs.xqs, ...(bufs.issq ? [bufs.issq] : [])];
  return kernelCall(gpu, pipeline(gpu, gemvRowsSource(d)), buffers, [rowsGroups(d)], "gemv_rows");
}
