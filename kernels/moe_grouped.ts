// The prefill path of a mixture-of-experts layer: tokens grouped by expert, so each chosen expert's matrix
// is read once per 16 of its tokens instead of once per (token, slot) as moe_gemv.ts does.
//   moeGroupCall          from ids [T, k]: `order` (the T * k slot indices t * k + j, grouped by expert,
//                         experts ascending) and `tiles` (vec4<u32> per tile: expert, first and end index
//                         into `order`, 0), one tile per 16 slots of an expert; unused tiles have expert
//                         0xffffffff. One workgroup; a slot's place inside its expert's run is taken with an
//                         atomic, so `order` within an expert is not deterministic, but every output is
//                         (it depends only on its own slot's row, summed in a fixed order).
//   moeGroupedMatmulCall  per tile, a 16 x 16 tiled matmul (matmul.ts's tiling) of the tile's slots' input
//                         rows with 16 rows of the tile's expert: y [T, k, N], the same inputs, transforms
//                         and storage types as moe_gemv.ts (weights decoded one at a time, as matmul_quant.ts's
//                         tiled kernel does)
//   moeCombineCall        y[t] (+)= sum_j routeWeights[t, j] * out[t, j, :]: the weighted sum of the slots
// A grouped MoE layer is: logits -> router -> group -> gate_up (grouped) -> down (grouped, silu_mul) ->
// combine: 6 dispatches, each expert's weights read ceil(tokens / 16) times.
import {
  ceilDiv,
  type Gpu,
  type KernelCall,
  kernelCall,
  pipeline,
  uniformBuffer,
  type WeightType,
} from "./gpu.ts";
import { moeGemvFits } from "./moe_gemv.ts";
import { MOE_MAX_EXPERTS } from "./moe_router.ts";
import { isQuant, QUANT_GROUP, quantElementWgsl, quantScaleWord, type QuantType } from "./quant.ts";

/** Most slots (T * topK) one grouping handles. */
export const MOE_GROUP_MAX_SLOTS = 4096;

/** Tiles the grouping may produce: a partial tile per expert at most, full tiles for the rest. */
export function moeMaxTiles(T: number, topK: number, experts: number): number {
  return ceilDiv(T * topK, 16) + Math.min(experts, T * topK);
}

const GROUP = `
struct P { S: u32, E: u32, tiles: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> ids: array<u32>;
@group(0) @binding(2) var<storage, read_write> order: array<u32>;
@group(0) @binding(3) var<storage, read_write> tiles: array<vec4<u32>>;
var<workgroup> cnt: array<atomic<u32>, ${MOE_MAX_EXPERTS}>;
var<workgroup> off: array<u32, ${MOE_MAX_EXPERTS}>;
@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) tid: u32) {
  for (var i = tid; i < p.S; i += 256u) {
    let e = ids[i];
    if (e < p.E) { atomicAdd(&cnt[e], 1u); }
  }
  workgroupBarrier();
  if (tid == 0u) {
    var at = 0u;
    var n = 0u;
    for (var e = 0u; e < p.E; e++) {
      let c = atomicLoad(&cnt[e]);
      off[e] = at;
      for (var b = 0u; b < c; b += 16u) {
        tiles[n] = vec4<u32>(e, at + b, at + c, 0u);
        n++;
      }
      at += c;
    }
    for (; n < p.tiles; n++) { tiles[n] = vec4<u32>(0xffffffffu, 0u, 0u, 0u); }
  }
  workgroupBarrier();
  for (var e = tid; e < p.E; e += 256u) { atomicStore(&cnt[e], 0u); }
  workgroupBarrier();
  for (var i = tid; i < p.S; i += 256u) {
    let e = ids[i];
    if (e < p.E) { order[off[e] + atomicAdd(&cnt[e], 1u)] = i; }
  }
}`;

/** Groups the T * topK slots of `ids` by expert into `order` (u32 [T * topK]) and `tiles` (see above). */
export function moeGroupCall(
  gpu: Gpu,
  bufs: { ids: GPUBuffer; order: GPUBuffer; tiles: GPUBuffer },
  d: { T: number; topK: number; experts: number },
): KernelCall {
  const S = d.T * d.topK;
  if (!(Number.isInteger(S) && S >= 1 && S <= MOE_GROUP_MAX_SLOTS)) {
    throw new RangeError(`grouping takes 1..${MOE_GROUP_MAX_SLOTS} slots (T * topK), got ${d.T} * ${d.topK}`);
  }
  if (!(Number.isInteger(d.experts) && d.experts >= 1 && d.experts <= MOE_MAX_EXPERTS)) {
    throw new RangeError(`experts must be 1..${MOE_MAX_EXPERTS}, got ${d.experts}`);
  }
  const params = uniformBuffer(gpu, [S, d.experts, moeMaxTiles(d.T, d.topK, d.experts)]);
  return kernelCall(gpu, pipeline(gpu, GROUP), [params, bufs.ids, bufs.order, bufs.tiles], [1], "moe_group");
}

/** CPU reference of the grouping: slots by expert, ascending within (the GPU's order within may differ). */
export function moeGroupRef(ids: Uint32Array, experts: number): { order: Uint32Array; tiles: number[][] } {
  const slots = Array.from(ids.keys()).filter((i) => ids[i] < experts);
  slots.sort((a, b) => ids[a] - ids[b] || a - b);
  const tiles: number[][] = [];
  for (let i = 0; i < slots.length;) {
    const e = ids[slots[i]];
    let end = i;
    while (end < slots.length && ids[slots[end]] === e) end++;
    for (let b = i; b < end; b += 16) tiles.push([e, b, end]);
    i = end;
  }
  return { order: Uint32Array.from(slots), tiles };
}

export interface MoeGroupedDims {
  /** Input features (for silu_mul, the width of the gate half). */
  K: number;
  /** Output features (rows of each expert matrix). */
  N: number;
  T: number;
  topK: number;
  /** Experts in the weight buffer ([experts, N, K]); `firstExpert` as in moe_gemv.ts. */
  experts: number;
  firstExpert?: number;
  /** All experts of the layer (the grouping's); tiles of experts outside the buffer are skipped. Default: experts. */
  layerExperts?: number;
  weights: WeightType | QuantType;
  input?: "token" | "slot";
  transform?: "none" | "silu_mul";
  /** Add into y. Default false. */
  accumulate?: boolean;
  /**
   * The stack is stored in column blocks of this many columns (convert.ts packColumnBlocksCall: row n of
   * matrix e, columns [cC, cC + C), at row (e (K / C) + c) N + n of a [E (K / C) N, C] matrix). Default: none.
   */
  columnBlock?: number;
}

function elementWgsl(wt: WeightType | QuantType): string {
  if (isQuant(wt)) return `${quantElementWgsl(wt, "W")}\nfn w_at(e: u32) -> f32 { return W_at(e, p.soff); }`;
  return wt === "f16"
    ? "fn w_at(e: u32) -> f32 { return unpack2x16float(W[e / 2u])[e % 2u]; }"
    : "fn w_at(e: u32) -> f32 { return bitcast<f32>(W[e]); }";
}

/** Element (row, k) of the stack, row = e N + n: row-major, or in column blocks of C (MoeGroupedDims). */
function elementIndexWgsl(C: number | undefined): string {
  return C === undefined
    ? "fn w_index(row: u32, k: u32) -> u32 { return row * p.K + k; }"
    : `fn w_index(row: u32, k: u32) -> u32 {
  return (((row / p.N) * (p.K / ${C}u) + k / ${C}u) * p.N + row % p.N) * ${C}u + k % ${C}u;
}`;
}

function groupedSource(wt: WeightType | QuantType, slotInput: boolean, silu: boolean, C?: number): string {
  // Input element k of slot `slot`'s row, transformed.
  const row = slotInput ? "slot" : "slot / p.topk";
  const xAt = silu
    ? `let g = x[${row} * 2u * p.K + k]; return g / (1.0 + exp(-g)) * x[${row} * 2u * p.K + p.K + k];`
    : `return x[${row} * p.K + k];`;
  return `
struct P { K: u32, N: u32, topk: u32, acc: u32, soff: u32, e0: u32, ne: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> W: array<u32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<storage, read> order: array<u32>;
@group(0) @binding(5) var<storage, read> tiles: array<vec4<u32>>;
var<workgroup> xs: array<array<f32, 17>, 16>;
var<workgroup> ws: array<array<f32, 17>, 16>;
var<workgroup> tile: vec4<u32>;
${elementWgsl(wt)}
${elementIndexWgsl(C)}
fn x_at(slot: u32, k: u32) -> f32 { ${xAt} }
@compute @workgroup_size(16, 16)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  if (lid.x == 0u && lid.y == 0u) { tile = tiles[wg.y]; }
  let tl = workgroupUniformLoad(&tile);
  if (tl.x == 0xffffffffu || tl.x < p.e0 || tl.x - p.e0 >= p.ne) { return; }
  let base = (tl.x - p.e0) * p.N;
  // This thread loads slot row lid.y of the tile and weight row wn; it sums output (slot of lid.y, n).
  let idx = tl.y + lid.y;
  let has = idx < tl.z;
  let slot = order[min(idx, tl.z - 1u)];
  let n = wg.x * 16u + lid.x;
  let wn = wg.x * 16u + lid.y;
  var acc = 0.0;
  for (var k0 = 0u; k0 < p.K; k0 += 16u) {
    let k = k0 + lid.x;
    xs[lid.y][lid.x] = select(0.0, x_at(slot, min(k, p.K - 1u)), has && k < p.K);
    ws[lid.y][lid.x] = select(0.0, w_at(w_index(base + min(wn, p.N - 1u), min(k, p.K - 1u))), wn < p.N && k < p.K);
    workgroupBarrier();
    for (var j = 0u; j < 16u; j++) { acc += xs[lid.y][j] * ws[lid.x][j]; }
    workgroupBarrier();
  }
  if (has && n < p.N) {
    let o = slot * p.N + n;
    y[o] = select(0.0, y[o], p.acc != 0u) + acc;
  }
}`;
}

/**
 * The grouped expert matmul: y [T, topK, N] for the slots whose expert is in the buffer, reading x as
 * moe_gemv.ts does; order and tiles from moeGroupCall over the same ids.
 */
export function moeGroupedMatmulCall(
  gpu: Gpu,
  bufs: { x: GPUBuffer; w: GPUBuffer; y: GPUBuffer; order: GPUBuffer; tiles: GPUBuffer },
  d: MoeGroupedDims,
): KernelCall {
  const wt = d.weights;
  for (
    const [name, v] of [["K", d.K], ["N", d.N], ["T", d.T], ["topK", d.topK], ["experts", d.experts]] as const
  ) {
    if (!(Number.isInteger(v) && v >= 1)) {
      throw new RangeError(`grouped matmul ${name} must be a positive integer, got ${v}`);
    }
  }
  if (!moeGemvFits(d.K, wt)) {
    throw new RangeError(`${wt} expert weights need K % ${QUANT_GROUP} == 0, got K = ${d.K}`);
  }
  const soff = isQuant(wt) ? quantScaleWord(d.experts * d.N, d.K, wt) : 0;
  const params = uniformBuffer(gpu, [
    d.K,
    d.N,
    d.topK,
    d.accumulate ? 1 : 0,
    soff,
    d.firstExpert ?? 0,
    d.experts,
  ]);
  const C = d.columnBlock;
  if (C !== undefined && !(Number.isInteger(C) && C > 0 && C % QUANT_GROUP === 0 && d.K % C === 0)) {
    throw new RangeError(`column blocks of ${C} need a multiple of ${QUANT_GROUP} dividing K = ${d.K}`);
  }
  const code = groupedSource(wt, d.input === "slot", d.transform === "silu_mul", C);
  const tiles = moeMaxTiles(d.T, d.topK, d.layerExperts ?? d.experts);
  return kernelCall(gpu, pipeline(gpu, code), [params, bufs.x, bufs.w, bufs.y, bufs.order, bufs.tiles], [
    ceilDiv(d.N, 16),
    tiles,
  ], "moe_grouped_matmul");
}

const COMBINE = `
struct P { N: u32, topk: u32, acc: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> src: array<f32>;
@group(0) @binding(2) var<storage, read> rw: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
  let n = g.x;
  let t = g.y;
  if (n >= p.N) { return; }
  var s = 0.0;
  for (var j = 0u; j < p.topk; j++) { s += rw[t * p.topk + j] * src[(t * p.topk + j) * p.N + n]; }
  let o = t * p.N + n;
  y[o] = select(0.0, y[o], p.acc != 0u) + s;
}`;

/** y [T, N] (+)= sum_j routeWeights[t, j] * src[t, j, :] (src [T, topK, N]). */
export function moeCombineCall(
  gpu: Gpu,
  bufs: { src: GPUBuffer; routeWeights: GPUBuffer; y: GPUBuffer },
  d: { N: number; T: number; topK: number; accumulate?: boolean },
): KernelCall {
  const params = uniformBuffer(gpu, [d.N, d.topK, d.accumulate ? 1 : 0]);
  return kernelCall(gpu, pipeline(gpu, COMBINE), [params, bufs.src, bufs.routeWeights, bufs.y], [
    ceilDiv(d.N, 256),
    d.T,
  ], "moe_combine");
}

/** CPU reference of moeCombineCall; `y0` is y's prior content when accumulating. */
export function moeCombineRef(
  a: { src: Float32Array; routeWeights: Float32Array; y0?: Float32Array },
  d: { N: number; T: number; topK: number; accumulate?: boolean },
): Float32Array {
  const { N, T, topK } = d;
  const y = new Float32Array(T * N);
  for (let t = 0; t < T; t++) {
    for (let n = 0; n < N; n++) {
      let s = d.accumulate && a.y0 ? a.y0[t * N + n] : 0;
      for (let j = 0; j < topK; j++) s += a.routeWeights[t * topK + j] * a.src[(t * topK + j) * N + n];
      y[t * N + n] = s;
    }
  }
  return y;
}
