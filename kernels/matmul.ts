// y[t, n] (+)= sum_k x[t, k] * W[n, k]: every linear layer (W as the checkpoint stores it, [out, in]).
// Two kernels: a GEMV for few rows (decode), reading each weight once per token with vec4 loads when
// K % 4 == 0, and a 16x16 tiled matmul for prefill. `accumulate` adds into y (residual connections).
// q8 / q4 weights go to the quantised GEMV (gemv_fused.ts) or tiled matmul (matmul_quant.ts).
import {
  ceilDiv,
  type Gpu,
  type KernelCall,
  kernelCall,
  pipeline,
  uniformBuffer,
  type WeightType,
  weightType,
} from "./gpu.ts";
import { gemvFusedCall } from "./gemv_fused.ts";
import { tiledQuantSource } from "./matmul_quant.ts";
import { isQuant, quantFits, quantScaleWord, type QuantType } from "./quant.ts";

const GEMV_THREADS = 128;
const GEMV_ROWS = 4;
/** Up to this many rows (tokens) the GEMV kernel is used; above it the tiled one. */
export const GEMV_MAX_T = 4;

const PARAMS = `struct P { K: u32, N: u32, T: u32, acc: u32, x_row0: u32 }`;

/**
 * GEMV: a workgroup of 128 threads is split into teams of `tpr` threads; each team computes GEMV_ROWS
 * rows, its threads striding over K (coalesced), then a tree reduction inside the team. Wide rows use
 * one team of 128; narrow rows (small K) use many small teams, so few threads idle and barriers stay few.
 */
function gemvSource(wt: WeightType, vec4: boolean, tpr: number): string {
  const w = weightType(wt);
  const xs = vec4 ? "vec4<f32>" : "f32";
  const ws = vec4 ? `vec4<${w.type}>` : w.type;
  const kdim = vec4 ? "p.K / 4u" : "p.K";
  const mul = vec4 ? `dot(vec4<f32>(W[row * kk + k]), xv)` : `f32(W[row * kk + k]) * xv`;
  return `${w.enable}
${PARAMS}
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> x: array<${xs}>;
@group(0) @binding(2) var<storage, read> W: array<${ws}>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
const TH = ${GEMV_THREADS}u;
const TPR = ${tpr}u;
const R = ${GEMV_ROWS}u;
var<workgroup> part: array<f32, ${GEMV_THREADS * GEMV_ROWS}>;
@compute @workgroup_size(${GEMV_THREADS})
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  let tid = lid.x;
  let team = tid / TPR;
  let lane = tid % TPR;
  let n0 = (wg.x * (TH / TPR) + team) * R;
  let t = wg.y;
  let kk = ${kdim};
  var acc: array<f32, ${GEMV_ROWS}>;
  for (var k = lane; k < kk; k += TPR) {
    let xv = x[(p.x_row0 + t) * kk + k];
    for (var r = 0u; r < R; r++) {
      let row = min(n0 + r, p.N - 1u);
      acc[r] += ${mul};
    }
  }
  for (var r = 0u; r < R; r++) { part[r * TH + tid] = acc[r]; }
  workgroupBarrier();
  for (var stride = TPR / 2u; stride > 0u; stride >>= 1u) {
    if (lane < stride) {
      for (var r = 0u; r < R; r++) { part[r * TH + tid] += part[r * TH + tid + stride]; }
    }
    workgroupBarrier();
  }
  if (lane < R && n0 + lane < p.N && t < p.T) {
    let o = t * p.N + n0 + lane;
    let prev = select(0.0, y[o], p.acc != 0u);
    y[o] = prev + part[lane * TH + team * TPR];
  }
}`;
}

/** Threads per row for the GEMV: about 4 loads per thread, a power of two in [4, 128]. */
function gemvTeam(K: number, vec4: boolean): number {
  const loads = vec4 ? K / 4 : K;
  let tpr = 4;
  while (tpr < GEMV_THREADS && tpr * 4 < loads) tpr *= 2;
  return tpr;
}

function tiledSource(wt: WeightType): string {
  const w = weightType(wt);
  return `${w.enable}
${PARAMS}
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> W: array<${w.type}>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
var<workgroup> xs: array<array<f32, 17>, 16>;
var<workgroup> ws: array<array<f32, 17>, 16>;
@compute @workgroup_size(16, 16)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  let n = wg.x * 16u + lid.x;
  let t = wg.y * 16u + lid.y;
  let wn = wg.x * 16u + lid.y;
  var acc = 0.0;
  for (var k0 = 0u; k0 < p.K; k0 += 16u) {
    let k = k0 + lid.x;
    xs[lid.y][lid.x] = select(0.0, x[(p.x_row0 + min(t, p.T - 1u)) * p.K + min(k, p.K - 1u)], t < p.T && k < p.K);
    ws[lid.y][lid.x] = select(0.0, f32(W[min(wn, p.N - 1u) * p.K + min(k, p.K - 1u)]), wn < p.N && k < p.K);
    workgroupBarrier();
    for (var j = 0u; j < 16u; j++) { acc += xs[lid.y][j] * ws[lid.x][j]; }
    workgroupBarrier();
  }
  if (n < p.N && t < p.T) {
    let o = t * p.N + n;
    let prev = select(0.0, y[o], p.acc != 0u);
    y[o] = prev + acc;
  }
}`;
}

export interface MatmulDims {
  /** Input features (columns of W). */
  K: number;
  /** Output features (rows of W). */
  N: number;
  /** Rows of x to multiply (tokens). */
  T: number;
  /** Add into y instead of overwriting it. Default false. */
  accumulate?: boolean;
  /** First row of x to read (e.g. the last token of a chunk). Default 0. */
  xRow0?: number;
  /** Weight storage; q8 / q4 need K % 32 == 0. */
  weights: WeightType | QuantType;
}

export function matmulCall(
  gpu: Gpu,
  bufs: { x: GPUBuffer; w: GPUBuffer; y: GPUBuffer },
  d: MatmulDims,
): KernelCall {
  const wt = d.weights;
  if (isQuant(wt)) return quantMatmulCall(gpu, bufs, { ...d, weights: wt });
  const params = uniformBuffer(gpu, [d.K, d.N, d.T, d.accumulate ? 1 : 0, d.xRow0 ?? 0]);
  if (d.T <= GEMV_MAX_T) {
    const vec4 = d.K % 4 === 0;
    const tpr = gemvTeam(d.K, vec4);
    const pipe = pipeline(gpu, gemvSource(wt, vec4, tpr));
    const rowsPerGroup = (GEMV_THREADS / tpr) * GEMV_ROWS;
    return kernelCall(gpu, pipe, [params, bufs.x, bufs.w, bufs.y], [ceilDiv(d.N, rowsPerGroup), d.T], "gemv");
  }
  const pipe = pipeline(gpu, tiledSource(wt));
  return kernelCall(
    gpu,
    pipe,
    [params, bufs.x, bufs.w, bufs.y],
    [ceilDiv(d.N, 16), ceilDiv(d.T, 16)],
    "matmul",
  );
}

function quantMatmulCall(
  gpu: Gpu,
  bufs: { x: GPUBuffer; w: GPUBuffer; y: GPUBuffer },
  d: MatmulDims & { weights: QuantType },
): KernelCall {
  if (!quantFits(d.K)) throw new RangeError(`${d.weights} weights need K % 32 == 0, got K = ${d.K}`);
  if (d.T <= GEMV_MAX_T) return gemvFusedCall(gpu, bufs, d);
  const soff = quantScaleWord(d.N, d.K, d.weights);
  const params = uniformBuffer(gpu, [d.K, d.N, d.T, d.accumulate ? 1 : 0, d.xRow0 ?? 0, soff]);
  return kernelCall(
    gpu,
    pipeline(gpu, tiledQuantSource(d.weights)),
    [params, bufs.x, bufs.w, bufs.y],
    [ceilDiv(d.N, 16), ceilDiv(d.T, 16)],
    "matmul",
  );
}

/** CPU reference in f64 accumulation; `y0` is the prior content of y when accumulating. */
export function matmulRef(x: Float32Array, w: Float32Array, d: MatmulDims, y0?: Float32Array): Float32Array {
  const y = new Float32Array(d.T * d.N);
  const r0 = d.xRow0 ?? 0;
  for (let t = 0; t < d.T; t++) {
    for (let n = 0; n < d.N; n++) {
      let s = d.accumulate && y0 ? y0[t * d.N + n] : 0;
      for (let k = 0; k < d.K; k++) s += x[(r0 + t) * d.K + k] * w[n * d.K + k];
      y[t * d.N + n] = s;
    }
  }
  return y;
}
