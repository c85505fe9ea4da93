// The tiled matmul of q8 / q4 weights with int8 inputs, for prefill: the input rows come as the int8 copy
// that gemv_multi.ts's input pass makes of f(x) once (int8BlocksWgsl's layout for the weights' type: blocks
// of 32, scale amax / 127, with (scale, scale * sum q)), and each 16-byte weight unit is multiplied with them
// by packed dot products (dp4Dot's pairing: q4's low nibbles with a block's even values, its high ones with
// the odd), so a quantisation group of 32 k costs a row and feature 8 dot4I8Packed and one scaling instead
// of 32 decoded weights and 32 multiply-adds.
//   int8TileSource   the kernel, over rows of x in order (`dense`: a linear layer) or over the slots of
//                    moe_grouped.ts's tiles (an expert's tokens)
//   gemmInt8Calls    a linear layer: the input pass, then the kernel (gemm.ts sends q4 layers here)
// A workgroup of GN threads x GM / 4 computes GM rows x GN features, a thread 4 rows x 4 features (features
// tx, tx + GN / 4, ...: consecutive lanes read consecutive staged weight rows), staging B groups of k a
// slice: a weight row's units split into nibbles once (q4) and each row's int8 words as they are.
import {
  ceilDiv,
  type Gpu,
  type KernelCall,
  kernelCall,
  memoSource,
  pipeline,
  storageBuffer,
  uniformBuffer,
} from "./gpu.ts";
import { gemvInt8InputCall } from "./gemv_multi.ts";
import { isQuant, QUANT_GROUP, quantScaleWord, type QuantType } from "./quant.ts";
import { range } from "./wgsl.ts";

export interface Int8Tile {
  /** Rows a workgroup: 16 (moe_grouped.ts's tiles), 32 or 64 (threads: features / 4 x rows / 4). */
  rows: number;
  /** Output features a workgroup: 64 or 128. */
  features: number;
  /** Quantisation groups of k a staged slice: 1, 2 or 4 (1 where K's groups do not divide by it). */
  blocks: number;
  /** Load the next slice's weights into registers while this one is multiplied. */
  prefetch: boolean;
}

/** Where a tile's rows come from. */
export type Int8TileRows =
  | { kind: "dense" }
  | {
    kind: "grouped";
    /** Each slot reads its own input row (T * topK of them) instead of its token's (T). */
    slotInput: boolean;
    /** The stack's column blocks (moe_grouped.ts MoeGroupedDims.columnBlock). */
    columnBlock?: number;
  };

/**
 * Whether the int8 tile kernel can multiply `wt` weights here: q8 / q4, WGSL's packed dot products, and the
 * subgroups its input pass needs. (K must also be whole quantisation groups, as q8 / q4 rows are.)
 */
export function int8TileFits(gpu: Gpu, wt: string): wt is QuantType {
  return isQuant(wt) && gpu.hasDp4 && !!gpu.subgroupSize;
}

export function checkInt8Tile(t: Int8Tile): void {
  if (!(t.rows === 16 || t.rows === 32 || t.rows === 64)) {
    throw new RangeError(`an int8 tile takes 16, 32 or 64 rows, not ${t.rows}`);
  }
  if (t.features !== 64 && t.features !== 128) {
    throw new RangeError(`an int8 tile is 64 or 128 features wide, not ${t.features}`);
  }
  if (!(t.blocks === 1 || t.blocks === 2 || t.blocks === 4)) {
    throw new RangeError(`an int8 tile stages 1, 2 or 4 groups a slice, not ${t.blocks}`);
  }
}

/** Element (row, k) of the stack, row = e N + n: row-major, or in column blocks of C. */
export function elementIndexWgsl(C: number | undefined): string {
  return C === undefined
    ? "fn w_index(row: u32, k: u32) -> u32 { return row * p.K + k; }"
    : `fn w_index(row: u32, k: u32) -> u32 {
  return (((row / p.N) * (p.K / ${C}u) + k / ${C}u) * p.N + row % p.N) * ${C}u + k % ${C}u;
}`;
}

/**
 * The kernel's WGSL. Bindings: params (K, N, topk, acc, soff, e0, ne, T, kc), the int8 words xq, the
 * weights W, y, then (grouped) order and tiles, then the scale pairs xqs. Dense: workgroup (x, y, z) computes
 * rows GM y .. of x's T rows over k in [z kc, (z + 1) kc), y [T, N] (split K: [splits, T, N] of partial
 * sums, acc 0). Grouped: workgroup y takes tile y of the grouping (expert, first and end index into
 * `order`), y [T * topK, N] by slot (T: the slots' count then, kc = K), the stack's experts e0 .. e0 + ne - 1.
 */
export function int8TileSource(wt: QuantType, rows: Int8TileRows, t: Int8Tile, K: number): string {
  checkInt8Tile(t);
  const { rows: GM, features: GN, prefetch } = t;
  const NB = K / QUANT_GROUP;
  const B = int8TileStep(t, K) / QUANT_GROUP;
  const F = GN / 4; // stride between a thread's features
  const WG = F * (GM / 4);
  const grouped = rows.kind === "grouped";
  // The input row of tile row m (at: its index in the tile's range), and its output row.
  const inputRow = !grouped ? "at" : rows.slotInput ? "order[at]" : "order[at] / p.topk";
  const outRow = grouped ? "order[at]" : "at";
  // Staged word vec4 h (0, 1) of group b of row m / weight row r.
  const xsAt = (b: number, h: number, m: string) => `xs[${(2 * b + h) * GM}u + ${m}]`;
  const wsAt = (b: number, h: number, r: string) => `ws[${(2 * b + h) * GN}u + ${r}]`;
  // Global vec4 of the int8 copy: group `g` of row `xr`, half h (q4: even values, then odd; q8: in order).
  const xqAt = (g: string, h: string) =>
    wt === "q4" ? `xq[xr * ${2 * NB}u + ${h} * ${NB}u + ${g}]` : `xq[xr * ${2 * NB}u + 2u * (${g}) + ${h}]`;
  // A weight row's B groups: loaded into registers (its units and scale word), then stored split.
  const held = range(B).map((b) =>
    `var sw${b} = 0u; var odd${b} = false; var ua${b} = vec4<u32>(0u);${
      wt === "q8" ? ` var ub${b} = vec4<u32>(0u);` : ""
    }`
  );
  const loadW = (k: string) =>
    range(B).map((b) =>
      `{
      let e0 = w_index(row, ${k} + ${b * QUANT_GROUP}u);
      let g = e0 / ${QUANT_GROUP}u;
      sw${b} = W[p.soff / 4u + g / 8u][(g / 2u) % 4u];
      odd${b} = (g & 1u) == 1u;
      ${wt === "q4" ? `ua${b} = W[e0 / 32u];` : `ua${b} = W[e0 / 16u];\n      ub${b} = W[e0 / 16u + 1u];`}
    }`
    ).join("\n    ");
  const storeW = (r: string) =>
    range(B).map((b) =>
      [
        `wsc[${
          b * GN
        }u + ${r}] = select(0.0, bitcast<f32>(select(sw${b} << 16u, sw${b} & 0xffff0000u, odd${b})), live);`,
        ...(wt === "q4"
          ? [
            `${wsAt(b, 0, r)} = ua${b} & vec4<u32>(0x0F0F0F0Fu);`,
            `${wsAt(b, 1, r)} = (ua${b} >> vec4<u32>(4u)) & vec4<u32>(0x0F0F0F0Fu);`,
          ]
          : [`${wsAt(b, 0, r)} = ua${b};`, `${wsAt(b, 1, r)} = ub${b};`]),
      ].join("\n    ")
    ).join("\n    ");
  const STEP = B * QUANT_GROUP;
  // The rows' words: GM x 2 x B vec4s and GM x B scale pairs, shared out over the workgroup.
  const XV = GM * 2 * B;
  const stageX = `
    for (var i = tid; i < ${XV + GM * B}u; i += ${WG}u) {
      let j = select(i - ${XV}u, i, i < ${XV}u);
      let m = j % ${GM}u;
      let at = min(tl.y + m, tl.z - 1u);
      let xr = ${inputRow};
      let live_row = tl.y + m < tl.z;
      if (i < ${XV}u) {
        let h = (j / ${GM}u) % 2u;
        let b = j / ${2 * GM}u;
        xs[i] = select(vec4<u32>(0u), ${xqAt("k0 / 32u + b", "h")}, live_row);
      } else {
        xss[j] = select(vec2<f32>(0.0), xqs[xr * ${NB}u + k0 / 32u + j / ${GM}u], live_row);
      }
    }`;
  const products: string[] = [];
  for (let b = 0; b < B; b++) {
    products.push(`{ // group ${b} of the slice`);
    for (let i = 0; i < 4; i++) {
      products.push(
        `let xe${i} = ${xsAt(b, 0, `4u * ty + ${i}u`)};`,
        `let xo${i} = ${xsAt(b, 1, `4u * ty + ${i}u`)};`,
        `let xc${i} = xss[${b * GM}u + 4u * ty + ${i}u];`,
      );
    }
    for (let c = 0; c < 4; c++) {
      products.push(
        `{`,
        `  let we = ${wsAt(b, 0, `tx + ${c * F}u`)};`,
        `  let wo = ${wsAt(b, 1, `tx + ${c * F}u`)};`,
        `  let sc = wsc[${b * GN}u + tx + ${c * F}u];`,
      );
      for (let i = 0; i < 4; i++) {
        const dot = ["x", "y", "z", "w"].map((k) =>
          `dot4I8Packed(we.${k}, xe${i}.${k}) + dot4I8Packed(wo.${k}, xo${i}.${k})`
        ).join(" + ");
        const scaled = wt === "q4" ? `xc${i}.x * f32(${dot}) - 8.0 * xc${i}.y` : `xc${i}.x * f32(${dot})`;
        products.push(`  a${i}${c} += sc * (${scaled});`);
      }
      products.push(`}`);
    }
    products.push(`}`);
  }
  const acc = range(4).flatMap((i) => range(4).map((c) => `a${i}${c}`));
  const tile = grouped
    ? `if (tid == 0u) { tile = tiles[wg.y]; }
  let tl = workgroupUniformLoad(&tile);
  if (tl.x == 0xffffffffu || tl.x < p.e0 || tl.x - p.e0 >= p.ne) { return; }
  let e = tl.x - p.e0;`
    : `let tl = vec4<u32>(0u, wg.y * ${GM}u, min(wg.y * ${GM}u + ${GM}u, p.T), 0u);
  let e = 0u;`;
  return `
struct P { K: u32, N: u32, topk: u32, acc: u32, soff: u32, e0: u32, ne: u32, T: u32, kc: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> xq: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> W: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
${
    grouped
      ? `@group(0) @binding(4) var<storage, read> order: array<u32>;
@group(0) @binding(5) var<storage, read> tiles: array<vec4<u32>>;
@group(0) @binding(6) var<storage, read> xqs: array<vec2<f32>>;
var<workgroup> tile: vec4<u32>;`
      : `@group(0) @binding(4) var<storage, read> xqs: array<vec2<f32>>;`
  }
var<workgroup> xs: array<vec4<u32>, ${XV}>;
var<workgroup> xss: array<vec2<f32>, ${GM * B}>;
var<workgroup> ws: array<vec4<u32>, ${2 * B * GN}>;
var<workgroup> wsc: array<f32, ${B * GN}>;
${elementIndexWgsl(grouped ? rows.columnBlock : undefined)}
@compute @workgroup_size(${WG})
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
  ${tile}
  let n0 = wg.x * ${GN}u;
  let tx = tid % ${F}u;
  let ty = tid / ${F}u;
  ${acc.map((a) => `var ${a} = 0.0;`).join(" ")}
  // A thread whose four rows are all past the tile's end (an expert's last, partial tile: most tiles of a
  // short prompt) stages but skips the products.
  let busy = tl.y + 4u * ty < tl.z;
  ${held.join("\n  ")}
  // Threads 0 .. GN - 1 stage weight row tid of the tile.
  let r = tid % ${GN}u;
  let stager = tid < ${GN}u;
  let live = n0 + r < p.N;
  let row = e * p.N + min(n0 + r, p.N - 1u);
  // This workgroup's range of k (split K: wg.z's kc of it; its partial sums go to plane wg.z of y).
  let kb = wg.z * p.kc;
  let ke = min(p.K, kb + p.kc);
  ${prefetch ? `if (stager) {\n    ${loadW("kb")}\n  }` : ""}
  for (var k0 = kb; k0 < ke; k0 += ${STEP}u) {
    ${prefetch ? "" : `if (stager) {\n    ${loadW("k0")}\n    }`}
    if (stager) {
    ${storeW("r")}
    }
    ${stageX}
    workgroupBarrier();
    ${prefetch ? `if (stager && k0 + ${STEP}u < ke) {\n    ${loadW(`k0 + ${STEP}u`)}\n    }` : ""}
    if (busy) {
      ${products.join("\n      ")}
    }
    workgroupBarrier();
  }
  for (var i = 0u; i < 4u; i++) {
    let at = tl.y + 4u * ty + i;
    if (at >= tl.z) { break; }
    let o = (wg.z * p.T + ${outRow}) * p.N + n0 + tx;
    ${
    range(4).map((c) =>
      `if (n0 + tx + ${c * F}u < p.N) {
      let v = select(select(select(a3${c}, a2${c}, i == 2u), a1${c}, i == 1u), a0${c}, i == 0u);
      y[o + ${c * F}u] = select(0.0, y[o + ${c * F}u], p.acc != 0u) + v;
    }`
    ).join("\n    ")
  }
  }
}`;
}

export const int8TileSources = memoSource(int8TileSource);

/** The dense tile unless gpu.tuning.gemmInt8 says otherwise (docs/BENCHMARKS.md, the forty-eighth session). */
export const GEMM_INT8_TILE: Int8Tile = { rows: 32, features: 64, blocks: 2, prefetch: false };

/** The dense tile here: GEMM_INT8_TILE with gpu.tuning.gemmInt8's fields (checked). */
export function gemmInt8Tile(gpu: Gpu): Int8Tile {
  const tile = { ...GEMM_INT8_TILE, ...gpu.tuning.gemmInt8 };
  checkInt8Tile(tile);
  return tile;
}

/**
 * The int8 copy of a linear layer's input, one per device, grown as needed and shared by every call (as
 * gemm.ts's split-K scratch: dispatches run in submission order, and a layer's pass and matmul are never
 * submitted apart).
 */
const copies = new WeakMap<Gpu, { xq: GPUBuffer; xqs: GPUBuffer }>();
function copyScratch(gpu: Gpu, values: number): { xq: GPUBuffer; xqs: GPUBuffer } {
  const have = copies.get(gpu);
  if (have && have.xq.size >= values) return have;
  const made = {
    xq: storageBuffer(gpu, values, "gemm int8 x"),
    xqs: storageBuffer(gpu, (values / QUANT_GROUP) * 8, "gemm int8 x scales"),
  };
  copies.set(gpu, made);
  return made;
}

/**
 * A linear layer of T > 16 rows with q8 / q4 weights on int8 inputs (gemm.ts gemmCalls sends it here): the
 * input pass quantises f(x)'s rows from xRow0 (silu_mul: of [gate | up] rows 2K wide) once into a shared
 * copy, then the tile kernel makes y [T, N] (+)= f(x) W^T, or with `splits` > 1 each split's partial sums
 * into `y` as [splits, T, N] (the caller adds them). Needs packed dot products and subgroups.
 */
export function gemmInt8Calls(
  gpu: Gpu,
  bufs: { x: GPUBuffer; w: GPUBuffer; y: GPUBuffer },
  d: {
    K: number;
    N: number;
    T: number;
    weights: QuantType;
    transform?: "none" | "silu_mul";
    accumulate?: boolean;
    xRow0?: number;
    tile: Int8Tile;
    splits: number;
  },
): KernelCall[] {
  if (d.K % QUANT_GROUP !== 0) throw new RangeError(`int8 rows need K % ${QUANT_GROUP} == 0, got ${d.K}`);
  const { tile } = d;
  checkInt8Tile(tile);
  const out = copyScratch(gpu, d.T * d.K);
  const pass = gemvInt8InputCall(gpu, { x: bufs.x, out }, {
    K: d.K,
    T: d.T,
    wt: d.weights,
    transform: d.transform ?? "none",
    normWeights: "f32",
    xRow0: d.xRow0,
  });
  // Each split's k range, whole slices of the kernel's groups.
  const step = int8TileStep(tile, d.K);
  const kc = ceilDiv(ceilDiv(d.K, d.splits), step) * step;
  const soff = quantScaleWord(d.N, d.K, d.weights);
  const acc = d.accumulate && d.splits === 1 ? 1 : 0;
  const params = uniformBuffer(gpu, [d.K, d.N, 1, acc, soff, 0, 1, d.T, kc]);
  const code = int8TileSources(d.weights, { kind: "dense" }, tile, d.K);
  return [
    pass.call,
    kernelCall(gpu, pipeline(gpu, code), [params, out.xq, bufs.w, bufs.y, out.xqs], [
      ceilDiv(d.N, tile.features),
      ceilDiv(d.T, tile.rows),
      ceilDiv(d.K, kc),
    ], "gemm_int8"),
  ];
}

/** k a slice of the tile kernel covers at this K (its groups a slice, or one where they do not divide K's). */
export function int8TileStep(t: Int8Tile, K: number): number {
  return ((K / QUANT_GROUP) % t.blocks === 0 ? t.blocks : 1) * QUANT_GROUP;
}
