// The prefill path of a mixture-of-experts layer: tokens grouped by expert, so each chosen expert's matrix
// is read once per 16 of its tokens instead of once per (token, slot) as moe_gemv.ts does.
//   moeGroupCall          from ids [T, k]: `order` (the T * k slot indices t * k + j, grouped by expert,
//                         experts ascending) and `tiles` (vec4<u32> per tile: expert, first and end index
//                         into `order`, 0), one tile per 16 slots of an expert; unused tiles have expert
//                         0xffffffff. One workgroup; a slot's place inside its expert's run is taken with an
//                         atomic, so `order` within an expert is not deterministic, but every output is
//                         (it depends only on its own slot's row, summed in a fixed order).
//   moeGroupedMatmulCall  per tile, a register-blocked matmul of the tile's 16 slots' input rows with 64 (or
//                         128) rows of the tile's expert: y [T, k, N], the same inputs, transforms and storage
//                         types as moe_gemv.ts, weights decoded as staged; or, q8 / q4 where the adapter has
//                         packed dot products, on the int8 copy of the inputs (matmul_int8.ts's tile kernel)
//   moeCombineCall        y[t] (+)= sum_j routeWeights[t, j] * out[t, j, :]: the weighted sum of the slots
// A grouped MoE layer is: logits -> router -> group -> gate_up (grouped) -> down (grouped, silu_mul) ->
// combine: 6 dispatches (8 on int8 inputs: an input pass before each matmul), each expert's weights read
// ceil(tokens / 16) times.
import {
  ceilDiv,
  type Gpu,
  type KernelCall,
  kernelCall,
  memoSource,
  pipeline,
  uniformBuffer,
  type WeightType,
} from "./gpu.ts";
import { moeGemvFits } from "./moe_gemv.ts";
import { MOE_MAX_EXPERTS } from "./moe_router.ts";
import { isQuant, QUANT_GROUP, quantScaleWord, type QuantType } from "./quant.ts";
import { range } from "./wgsl.ts";
import { elementIndexWgsl, type Int8Tile, int8TileFits, int8TileSources } from "./matmul_int8.ts";

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

/** Rows of y a workgroup of the grouped matmul computes: one tile of the grouping's slots. */
const GM = 16;
/**
 * k a staged slice holds: one quantisation group of each weight row. Two groups a slice were slower (H100,
 * q4, 512 tokens: Qwen3-30B-A3B 300.7 against 188.2 ms, DeepSeek-V2-Lite 242.5 against 150.4).
 */
const GK = QUANT_GROUP;
/**
 * Output features a workgroup computes by default (as many threads, each a 4 x 4 block of the tile). H100,
 * q4, GPU ms of a prompt's grouped matmuls (32 / 128 / 512 tokens), 64 against 128 wide: Qwen3-30B-A3B 25.6 /
 * 58.5 / 188.1 against 26.2 / 59.9 / 191.2, DeepSeek-V2-Lite 38.6 / 54.0 / 150.4 against 38.4 / 55.4 / 152.6
 * (docs/BENCHMARKS.md, the forty-sixth session).
 */
export const MOE_GROUPED_WIDTH = 64;

/**
 * WGSL staging one slice in workgroup memory, k-major (`ws[k * GN / 4 + r / 4][r % 4]`,
 * `xs[k * GM / 4 + m / 4][m % 4]`), unrolled: a thread stages weight row r of the tile (whole words decoded at
 * once for q8 / q4, a slice being one group with one scale, and for f16 rows of an even K; element by element
 * for other floats, whose rows need not start on a word) and XP inputs of slot m, transformed as they are
 * loaded.
 */
function stageWgsl(wt: WeightType | QuantType, GN: number, XP: number, K: number): string {
  const put = (k: string, v: string) => `ws[(${k}) * ${GN / 4}u + r / 4u][r % 4u] = ${v};`;
  const lines = range(XP).map((j) =>
    `xs[(kq + ${j}u) * ${GM / 4}u + m / 4u][m % 4u] = ` +
    `select(0.0, x_at(slot, min(k0 + kq + ${j}u, p.K - 1u)), has && k0 + kq + ${j}u < p.K);`
  );
  if (wt === "f16" && K % 2 === 0) {
    // Rows start on a word: a slice is GK / 2 words of two halves each (past K: weight 0).
    lines.push("let e0 = w_index(row, k0);");
    for (let j = 0; j < GK / 2; j++) lines.push(`let h${j} = unpack2x16float(W[e0 / 2u + ${j}u]);`);
    for (let j = 0; j < GK / 2; j++) {
      for (const [c, o] of [["x", 0], ["y", 1]] as const) {
        lines.push(put(`${2 * j + o}u`, `select(0.0, h${j}.${c}, live && k0 + ${2 * j + o}u < p.K)`));
      }
    }
    return lines.join("\n    ");
  }
  if (!isQuant(wt)) {
    lines.push(`for (var j = 0u; j < ${GK}u; j++) {
      ${put("j", "select(0.0, w_at(w_index(row, min(k0 + j, p.K - 1u))), live && k0 + j < p.K)")}
    }`);
    return lines.join("\n    ");
  }
  // Each code spelled out as the scalar store it feeds, not QUANT_CODES_WGSL's q4s / q8v four at a time:
  // those were ~1% slower here (H100, Qwen3-30B-A3B q4: 25.5 -> 25.8 ms at 32 tokens, 188.3 -> 189.7 at 512).
  const per = wt === "q4" ? 8 : 4; // codes a word
  const code = wt === "q4"
    ? (w: string, b: number) => `f32((${w} >> ${4 * b}u) & 15u) - 8.0`
    : (w: string, b: number) => `f32(bitcast<i32>(${w} << ${24 - 8 * b}u) >> 24u)`;
  lines.push(
    "let e0 = w_index(row, k0);",
    "let g = e0 / GK;",
    "let sw = W[p.soff + g / 2u];",
    "let sc = select(0.0, bitcast<f32>(select(sw << 16u, sw & 0xffff0000u, (g & 1u) == 1u)), live);",
  );
  for (let j = 0; j < GK / per; j++) lines.push(`let w${j} = W[e0 / ${per}u + ${j}u];`);
  for (let j = 0; j < GK / per; j++) {
    for (let b = 0; b < per; b++) lines.push(put(`${j * per + b}u`, `(${code(`w${j}`, b)}) * sc`));
  }
  return lines.join("\n    ");
}

function elementWgsl(wt: WeightType | QuantType): string {
  if (isQuant(wt)) return "";
  return wt === "f16"
    ? "fn w_at(e: u32) -> f32 { return unpack2x16float(W[e / 2u])[e % 2u]; }"
    : "fn w_at(e: u32) -> f32 { return bitcast<f32>(W[e]); }";
}

/**
 * The grouped matmul's WGSL: a workgroup of GN threads computes GM slots (one tile of the grouping) x GN
 * output features of the tile's expert, each thread a 4 x 4 block held in four vec4 registers. Per slice of
 * GK k it stages the slots' inputs (transformed) and the weights (decoded) in workgroup memory, k-major, so a
 * k step is two vec4 reads for 16 FMAs (the 16 x 16 tile it replaces read two scalars for one FMA and
 * decoded every weight element with two loads of its own: 4% of the FP32 rate, 90% of a MoE model's
 * prefill). Loading the next slice into registers before multiplying this one was slower (H100: 266 against
 * 222 ms for Qwen3-30B-A3B's 512-token prompt at 64 wide; docs/BENCHMARKS.md).
 */
function groupedSource(
  wt: WeightType | QuantType,
  slotInput: boolean,
  silu: boolean,
  C: number | undefined,
  GN: number,
  K: number,
): string {
  // Input element k of slot `slot`'s row, transformed.
  const row = slotInput ? "slot" : "slot / p.topk";
  const xAt = silu
    ? `let g = x[${row} * 2u * p.K + k]; return g / (1.0 + exp(-g)) * x[${row} * 2u * p.K + p.K + k];`
    : `return x[${row} * p.K + k];`;
  const XP = (GM * GK) / GN; // inputs a thread stages a slice
  return `
struct P { K: u32, N: u32, topk: u32, acc: u32, soff: u32, e0: u32, ne: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> W: array<u32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<storage, read> order: array<u32>;
@group(0) @binding(5) var<storage, read> tiles: array<vec4<u32>>;
const GK = ${GK}u;
var<workgroup> xs: array<vec4<f32>, ${(GK * GM) / 4}>;
var<workgroup> ws: array<vec4<f32>, ${(GK * GN) / 4}>;
var<workgroup> tile: vec4<u32>;
${elementWgsl(wt)}
${elementIndexWgsl(C)}
fn x_at(slot: u32, k: u32) -> f32 { ${xAt} }
@compute @workgroup_size(${GN})
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
  if (tid == 0u) { tile = tiles[wg.y]; }
  let tl = workgroupUniformLoad(&tile);
  if (tl.x == 0xffffffffu || tl.x < p.e0 || tl.x - p.e0 >= p.ne) { return; }
  let n0 = wg.x * ${GN}u;
  // Staging: this thread's weight row r, and slot m's inputs kq .. kq + XP of each slice.
  let r = tid;
  let live = n0 + r < p.N;
  let row = (tl.x - p.e0) * p.N + min(n0 + r, p.N - 1u);
  let m = tid / ${GK / XP}u;
  let kq = (tid % ${GK / XP}u) * ${XP}u;
  let has = tl.y + m < tl.z;
  let slot = order[min(tl.y + m, tl.z - 1u)];
  // Compute: slots 4 ty .. 4 ty + 3 of the tile, features n0 + 4 tx .. n0 + 4 tx + 3.
  let tx = tid % ${GN / 4}u;
  let ty = tid / ${GN / 4}u;
  var a0 = vec4<f32>(0.0);
  var a1 = vec4<f32>(0.0);
  var a2 = vec4<f32>(0.0);
  var a3 = vec4<f32>(0.0);
  // A thread whose four slots are all past the tile's end (an expert's last, partial tile: most tiles of a
  // short prompt, whose experts get a few slots each) stages but skips the products.
  let busy = tl.y + 4u * ty < tl.z;
  for (var k0 = 0u; k0 < p.K; k0 += GK) {
    ${stageWgsl(wt, GN, XP, K)}
    workgroupBarrier();
    if (busy) {
      for (var k = 0u; k < GK; k++) {
        let xv = xs[k * ${GM / 4}u + ty];
        let wv = ws[k * ${GN / 4}u + tx];
        a0 += xv.x * wv;
        a1 += xv.y * wv;
        a2 += xv.z * wv;
        a3 += xv.w * wv;
      }
    }
    workgroupBarrier();
  }
  let n = n0 + 4u * tx;
  let acc = array<vec4<f32>, 4>(a0, a1, a2, a3);
  for (var i = 0u; i < 4u; i++) {
    let at = tl.y + 4u * ty + i;
    if (at >= tl.z) { break; }
    let o = order[at] * p.N + n;
    for (var c = 0u; c < 4u; c++) {
      if (n + c < p.N) { y[o + c] = select(0.0, y[o + c], p.acc != 0u) + acc[i][c]; }
    }
  }
}`;
}

const groupedSources = memoSource(groupedSource);

/**
 * The int8 grouped matmul's tile but for its rows (a grouping tile's 16): gpu.tuning.moe's groupedWidth,
 * groupedBlocks and groupedPrefetch override it (docs/BENCHMARKS.md, the forty-eighth session).
 */
export const MOE_GROUPED_INT8_TILE: Int8Tile = { rows: GM, features: 128, blocks: 2, prefetch: true };

/**
 * The grouped expert matmul: y [T, topK, N] for the slots whose expert is in the buffer, reading x as
 * moe_gemv.ts does; order and tiles from moeGroupCall over the same ids. With `int8` (q8 / q4 weights, where
 * int8TileFits) it reads instead the int8 copy of the transformed input rows (gemv_multi.ts
 * gemvInt8InputCall for the weights' type: T rows for input "token", T * topK for "slot") and multiplies with
 * packed dot products; `x` and `transform` are then the input pass's business.
 */
export function moeGroupedMatmulCall(
  gpu: Gpu,
  bufs: {
    x: GPUBuffer;
    w: GPUBuffer;
    y: GPUBuffer;
    order: GPUBuffer;
    tiles: GPUBuffer;
    int8?: { xq: GPUBuffer; xqs: GPUBuffer };
  },
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
    d.T * d.topK,
    d.K,
  ]);
  const C = d.columnBlock;
  if (C !== undefined && !(Number.isInteger(C) && C > 0 && C % QUANT_GROUP === 0 && d.K % C === 0)) {
    throw new RangeError(`column blocks of ${C} need a multiple of ${QUANT_GROUP} dividing K = ${d.K}`);
  }
  const tiles = moeMaxTiles(d.T, d.topK, d.layerExperts ?? d.experts);
  if (bufs.int8) {
    if (!int8TileFits(gpu, wt)) {
      throw new RangeError(
        `the int8 grouped matmul needs q8 / q4 weights, packed dot products and subgroups`,
      );
    }
    const m = gpu.tuning.moe;
    const tile: Int8Tile = {
      rows: GM,
      features: m?.groupedWidth ?? MOE_GROUPED_INT8_TILE.features,
      blocks: m?.groupedBlocks ?? MOE_GROUPED_INT8_TILE.blocks,
      prefetch: m?.groupedPrefetch ?? MOE_GROUPED_INT8_TILE.prefetch,
    };
    const rows = { kind: "grouped", slotInput: d.input === "slot", columnBlock: C } as const;
    const code = int8TileSources(wt, rows, tile, d.K);
    const { xq, xqs } = bufs.int8;
    return kernelCall(
      gpu,
      pipeline(gpu, code),
      [params, xq, bufs.w, bufs.y, bufs.order, bufs.tiles, xqs],
      [ceilDiv(d.N, tile.features), tiles],
      "moe_grouped_matmul",
    );
  }
  const GN = gpu.tuning.moe?.groupedWidth ?? MOE_GROUPED_WIDTH;
  if (GN !== 64 && GN !== 128) {
    throw new RangeError(`the grouped matmul is 64 or 128 features wide, not ${GN}`);
  }
  const code = groupedSources(wt, d.input === "slot", d.transform === "silu_mul", C, GN, d.K);
  return kernelCall(
    gpu,
    pipeline(gpu, code),
    [params, bufs.x, bufs.w, bufs.y, bufs.order, bufs.tiles],
    [ceilDiv(d.N, GN), tiles],
    "moe_grouped_matmul",
  );
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
  for (var j = 0u; j < p.topk; j++) {
    let w = rw[t * p.topk + j];
    if (w != 0.0) { s += w * src[(t * p.topk + j) * p.N + n]; }
  }
  let o = t * p.N + n;
  y[o] = select(0.0, y[o], p.acc != 0u) + s;
}`;

/**
 * y [T, N] (+)= sum_j routeWeights[t, j] * src[t, j, :] (src [T, topK, N]). A slot of weight 0 adds nothing,
 * not even its row's NaN: an expert host gives the slots of experts held elsewhere weight 0 and never writes
 * their rows (models/experts.ts).
 */
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
      for (let j = 0; j < topK; j++) {
        const w = a.routeWeights[t * topK + j];
        if (w !== 0) s += w * a.src[(t * topK + j) * N + n];
      }
      y[t * N + n] = s;
    }
  }
  return y;
}
