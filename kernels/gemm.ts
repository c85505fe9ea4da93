// The prefill GEMM: y[m, n] (+)= sum_k f(x)[m, k] * W[n, k] for many rows m (a prompt's tokens), W as the
// checkpoint stores it ([out, in]) in any of the engine's formats (f32, f16, q8, q4; kernels/quant.ts).
// Register-blocked tiles, the classic SIMT SGEMM layout:
//   - a workgroup computes a BM x BN tile of y; each thread a (4 RM) x (4 RN) block of it, held in
//     RM * 4 * RN vec4<f32> registers, so each k step is RM + RN vec4 reads of workgroup memory for
//     16 RM RN FMAs (GemmTile's ci lays the slices out so those reads need no bounds clamp each; its wh
//     stages W as f16; docs/KERNELS.md has the arithmetic of each);
//   - each step stages a BK-wide slice of x (BM rows) and of W (BN rows) in workgroup memory, k-major
//     (xs[k][m], ws[k][n]) so a thread's fragments are vec4 reads; f16 / q8 / q4 weights are decoded to
//     f32 as they are staged. The transposing stores are written out with constant component indices (as a
//     WGSL loop over a vec4's components they cost the H200 40% of the kernel), or with GemmTile's `v` are
//     4 x 4 blocks transposed in registers and stored as vec4s;
//   - the next slice's global loads are issued before the current slice is multiplied (register
//     prefetch), and decoded only when stored, so their latency hides behind the FMAs.
// A thread's rows are m = 4 (i TY + ty) + 0..3 (i < RM) and its columns n = 4 (j TX + tx) + 0..3, strided
// so that the fragment reads of a warp are broadcasts or consecutive vec4s (no bank conflicts).
// Accumulation is f32 throughout: the tiles are FP32-FMA-bound (no cooperative matrices reach WGSL through
// Deno: docs/KERNELS.md), and f16 sums over K = 8192 would lose the fixtures' 1e-4.
// Input transforms (the decode GEMV's, where they save a pass): "silu_mul" reads silu(gate) * up from a
// fused [M, 2K] gate/up row as it stages x. RMSNorm stays its own kernel before the GEMM (it costs one
// [M, K] pass, under 1% of the GEMM).
import {
  ceilDiv,
  type Gpu,
  type KernelCall,
  kernelCall,
  type KernelTuning,
  memoSource,
  pipeline,
  storageBuffer,
  uniformBuffer,
  type WeightType,
} from "./gpu.ts";
import { matmulCall } from "./matmul.ts";
import { gemmInt8Calls, gemmInt8Tile, int8TileFits } from "./matmul_int8.ts";
import { isQuant, QUANT_GROUP, quantFits, quantScaleWord, type QuantType } from "./quant.ts";
import { QUANT_CODES_WGSL } from "./wgsl.ts";

export interface GemmTile {
  /** Rows (tokens) of y per workgroup. */
  bm: number;
  /** Columns (output features) of y per workgroup. */
  bn: number;
  /** k per staged slice (a multiple of 4). */
  bk: number;
  /** vec4 fragments of rows per thread (a thread computes 4 rm rows). */
  rm: number;
  /** vec4 fragments of columns per thread. */
  rn: number;
  /**
   * Multiply in f16 (packed half2 FMAs, twice the FP32 rate on NVIDIA), summing each slice's bk products in
   * f16 and adding those partial sums into the f32 accumulators. Needs shader-f16. Default false.
   */
  f16?: boolean;
  /** Two staging buffers (one barrier a slice instead of two). Default false. */
  db?: boolean;
  /**
   * Stage W in workgroup memory as f16 and multiply in f32 (each b fragment converted as it is read): half
   * the W bytes of workgroup memory and of its reads, f32 sums. Exact for f16 weights and for q4 (a 4-bit
   * code times a bf16 scale has at most 11 significant bits) while the values are in f16's normal range;
   * needs shader-f16; not for f32 or q8 weights (they would round). Default false.
   */
  wh?: boolean;
  /**
   * Constant-index fragment reads: stage x as xs[buffer][ty][k rm + i] and W as ws[buffer][tx][k rn + j]
   * (the thread's grid position outermost), so every fragment read of the unrolled k loop has a constant
   * inner index. WGSL bounds-checks each dynamic array index (wgpu's Restrict policy: a min() per index),
   * which in the k-major layout (xs[k][i TY + ty]) is one clamp and address add per fragment read; here the
   * clamp of ty (tx) is one per thread and each read is a register base plus an immediate offset. Default
   * false.
   */
  ci?: boolean;
  /**
   * Vector stores: each thread's loads of a slice are whole groups of 4 rows at one k quad (4 rows x 4 k),
   * transposed in registers and stored as 4 vec4s (k-major, one vec4 a k) instead of 16 scalars into
   * components of 4 k rows' vec4s. Needs bm / 4 and bn / 4 multiples of 8, bk / 4 a multiple of 4 and the slice's vec4
   * loads a multiple of 4 per thread (e.g. 128x128k32r22, 64x64k64r11). Default false.
   */
  v?: boolean;
}

/**
 * A tile's short name, as the benchmarks print it and take it: 128x128k8r22, then h (f16), d (db), w (wh),
 * c (ci), v (vector stores).
 */
export function gemmTileTag(t: GemmTile): string {
  return `${t.bm}x${t.bn}k${t.bk}r${t.rm}${t.rn}${t.f16 ? "h" : ""}${t.db ? "d" : ""}${t.wh ? "w" : ""}${
    t.ci ? "c" : ""
  }${t.v ? "v" : ""}`;
}

/** The tile a tag names (gemmTileTag's form; rm and rn one digit each). */
export function parseGemmTile(tag: string): GemmTile {
  const m = /^(\d+)x(\d+)k(\d+)r(\d)(\d)(h?)(d?)(w?)(c?)(v?)$/.exec(tag);
  if (!m) {
    throw new TypeError(`GEMM tile tag "${tag}": want e.g. 128x128k8r22 (+ h, d, w, c, v flags in order)`);
  }
  const t: GemmTile = { bm: +m[1], bn: +m[2], bk: +m[3], rm: +m[4], rn: +m[5] };
  if (m[6]) t.f16 = true;
  if (m[7]) t.db = true;
  if (m[8]) t.wh = true;
  if (m[9]) t.ci = true;
  if (m[10]) t.v = true;
  return t;
}

export type GemmTransform = "none" | "silu_mul";

export interface GemmDims {
  /** Input features (for silu_mul: the width of the gate half; x's rows are 2K wide). */
  K: number;
  /** Output features (rows of W). */
  N: number;
  /** Rows of x (tokens). */
  T: number;
  /** Add into y instead of overwriting it. Default false. */
  accumulate?: boolean;
  /** First row of x to read. Default 0. */
  xRow0?: number;
  weights: WeightType | QuantType;
  /**
   * x is stored as f16 (rows of K halves, 4 a vec2<u32>): half the bytes and load registers of f32 rows;
   * staged and multiplied as the tile says. Default false (f32 rows).
   */
  xHalf?: boolean;
  /** Write y as f16 (rows of N halves; needs shader-f16): the input of a GEMM reading xHalf. Default false. */
  yHalf?: boolean;
  /**
   * false: the default tiles multiply in f32 even where gemmF16Math would have them multiply in f16 (a model
   * whose MoE routing turns f16's roundings into other experts: BlockContext.gemmF16). Default true.
   */
  f16Math?: boolean;
  transform?: GemmTransform;
  /** Tile shape; default gemmDefaultTile(gpu, T, N, K). */
  tile?: GemmTile;
  /** Workgroups along K, their sums added by a second dispatch; default gemmDefaultSplit. */
  splitK?: number;
}

/** Whether the GEMM takes this shape (x is read as vec4s; quantised rows are whole groups). */
export function gemmFits(K: number, weights: WeightType | QuantType): boolean {
  return isQuant(weights) ? quantFits(K) : K > 0 && K % 4 === 0;
}

/** Threads of a workgroup for a tile. */
export function gemmThreads(t: GemmTile): number {
  return (t.bm / (4 * t.rm)) * (t.bn / (4 * t.rn));
}

/** Throws a RangeError naming what is wrong with a tile. */
export function checkGemmTile(t: GemmTile, maxStorage = 49152): void {
  const { bm, bn, bk, rm, rn } = t;
  const whole = [bm, bn, bk, rm, rn].every((v) => Number.isInteger(v) && v >= 1);
  if (!whole || bk % 4 !== 0 || bm % (4 * rm) !== 0 || bn % (4 * rn) !== 0) {
    throw new RangeError(`GEMM tile ${JSON.stringify(t)}: bk % 4, bm % 4rm and bn % 4rn must be 0`);
  }
  const th = gemmThreads(t);
  if (th > 256 || th < 32) throw new RangeError(`GEMM tile ${JSON.stringify(t)} has ${th} threads (32..256)`);
  if (((bm * bk) / 4) % th !== 0 || ((bn * bk) / 4) % th !== 0) {
    throw new RangeError(
      `GEMM tile ${JSON.stringify(t)}: a slice's vec4 loads must split evenly over ${th} threads`,
    );
  }
  if (t.v && !vectorStoresFit(t)) {
    throw new RangeError(
      `GEMM tile ${
        JSON.stringify(t)
      }: vector stores need bm / 4 and bn / 4 multiples of 8, bk / 4 a multiple ` +
        `of 4 and a multiple of 4 vec4 loads a thread a slice`,
    );
  }
  if (tileBytes(t) > maxStorage) {
    throw new RangeError(`GEMM tile ${JSON.stringify(t)} needs ${tileBytes(t)} bytes of workgroup memory`);
  }
}

/** Whether a tile's slices split into whole 4-row groups a thread (the `v` flag's condition). */
export function vectorStoresFit(t: GemmTile): boolean {
  const th = gemmThreads(t), kq = t.bk / 4;
  return (t.bm / 4) % 8 === 0 && (t.bn / 4) % 8 === 0 && kq % 4 === 0 &&
    ((t.bm * kq) / th) % 4 === 0 && ((t.bn * kq) / th) % 4 === 0;
}

function tileBytes(t: GemmTile): number {
  const { x, w } = stagedVec4s(t);
  return (x * (t.f16 ? 8 : 16) + w * (t.f16 || t.wh ? 8 : 16)) * (t.db ? 2 : 1);
}

/** vec4s of one staging buffer of x and of W, padding included (one vec4 a k row, or a thread row with ci). */
function stagedVec4s(t: GemmTile): { x: number; w: number } {
  if (t.ci) {
    return { x: (t.bm / (4 * t.rm)) * (t.bk * t.rm + 1), w: (t.bn / (4 * t.rn)) * (t.bk * t.rn + 1) };
  }
  return { x: t.bk * (t.bm / 4 + 1), w: t.bk * (t.bn / 4 + 1) };
}

/**
 * Workgroups that make a wave on the H200 (132 SMs x 2, rounded down to a power of two: 256 tiles, e.g. a
 * 2048 x 2048 output in 128 x 128 tiles, count as one): below it, smaller tiles or split K fill the GPU
 * better. gpu.tuning.gemmWave replaces it (A/B runs).
 */
const WAVE = 256;

/** The default large tile: 8 x 8 a thread, k slices of 32, vector stores (KERNELS.md has the H200 sweep). */
const LARGE: GemmTile = { bm: 128, bn: 128, bk: 32, rm: 2, rn: 2, ci: true, v: true };
/** The default small tile: 4 x 4 a thread in 256 threads. */
const SMALL: GemmTile = { bm: 64, bn: 64, bk: 16, rm: 1, rn: 1, ci: true };
/** Where a device's workgroup memory is short of a default tile's (lavapipe's 32 KiB): the tile before. */
const LARGE_FALLBACK: GemmTile = { bm: 128, bn: 128, bk: 8, rm: 2, rn: 2, ci: true };

/**
 * The tile for a shape, from scripts/bench/gemm.ts and the prefill on the H200 (docs/KERNELS.md): the large
 * tile where its workgroups (tiles x its default split K) make a wave, else the small one, which split K
 * then fills further. A default that needs more workgroup memory than the device has falls back.
 */
export function gemmDefaultTile(gpu: Gpu, T: number, N: number, K: number): GemmTile {
  const { tuning } = gpu;
  const wave = tuning.gemmWave ?? WAVE;
  let large = tuning.gemmLarge ?? LARGE;
  if (tuning.gemmLarge === undefined && tileBytes(large) > gpu.maxWorkgroupStorage) large = LARGE_FALLBACK;
  const tiles = ceilDiv(T, large.bm) * ceilDiv(N, large.bn);
  if (tiles * gemmDefaultSplit(T, N, K, large, tuning) >= wave) return large;
  return tuning.gemmSmall ?? SMALL;
}

/**
 * Whether the default tiles multiply in f16 (x and the decoded weights rounded to f16 as they are staged,
 * each slice's products summed in f16, then in f32: docs/KERNELS.md "Arithmetic"): the default for f16 / q8 /
 * q4 weights on an adapter with shader-f16 (H200 prefill +8%; those weights round at least as much);
 * f32 weights (the exact path) always multiply in f32. gpu.tuning.gemmMath "f32" keeps f32 multiplies for every
 * weight type (read when a call is built, so a benchmark can compare both in one process).
 */
export function gemmF16Math(gpu: Gpu, wt: WeightType | QuantType): boolean {
  const math = gpu.tuning.gemmMath;
  if (math !== undefined && math !== "f16" && math !== "f32" && math !== "int8") {
    throw new TypeError(`gpu.tuning.gemmMath must be f16, f32 or int8, got ${JSON.stringify(math)}`);
  }
  return gpu.hasF16 && wt !== "f32" && math !== "f32";
}

/**
 * Whether a prefill layer of these weights and shape multiplies int8 inputs (matmul_int8.ts gemmInt8Calls):
 * with gpu.tuning.gemmMath "int8" every q8 / q4 layer, with "f16" or "f32" none; by default every q4 layer
 * (H100, the forty-ninth session: Llama-1B q4 prompts of 20-64 tokens 3.2-4.6 ms of GPU against 7.2-7.7 on
 * the float GEMM, Qwen3-30B-A3B 16.2-21.5 against 21.6-26.0; 512 tokens and more since the forty-eighth).
 * Needs packed dot products, subgroups (the input pass) and K of whole quantisation groups. q4's rounding
 * dwarfs the int8 inputs' (as in the decode GEMVs, which multiply int8 inputs too); q8 keeps float inputs by
 * default, which keep the fixtures' reference tokens.
 */
export function gemmInt8Math(
  gpu: Gpu,
  d: { K: number },
  wt: WeightType | QuantType,
): wt is QuantType {
  if (!(int8TileFits(gpu, wt) && d.K % QUANT_GROUP === 0)) return false;
  const math = gpu.tuning.gemmMath;
  if (math === "int8") return true;
  return math === undefined && wt === "q4";
}

/**
 * Whether a prefill GEMM of this shape and weight type reads its input as f16 (GemmDims.xHalf), so the kernel
 * before it (the RMSNorm) writes f16: where it multiplies in f16, which rounds x to f16 as it stages it
 * anyway, so the f16 input costs no accuracy and halves x's loads (H200: the GEMM +6-11%); not where it
 * takes int8 inputs (gemmInt8Math), whose pass reads f32.
 */
export function gemmHalfInput(
  gpu: Gpu,
  d: { K: number },
  wt: WeightType | QuantType,
  f16Math = true,
): boolean {
  return f16Math && gemmFits(d.K, wt) && gemmF16Math(gpu, wt) && !gemmInt8Math(gpu, d, wt);
}

/** Whether W may be staged as f16 with f32 math (the `wh` tile flag): exact for f16 and q4 weights. */
export function gemmWhFits(gpu: Gpu, wt: WeightType | QuantType): boolean {
  return gpu.hasF16 && (wt === "f16" || wt === "q4");
}

/** How one slice's vec4 of weights is fetched (raw, kept in registers) and decoded (when staged). */
function weightCode(
  wt: WeightType | QuantType,
): { decl: string; raw: string; load: string; decode: (r: string) => string } {
  switch (wt) {
    case "f32":
      return {
        decl: "array<vec4<f32>>",
        raw: "vec4<f32>",
        load: "W[e / 4u]",
        decode: (r) => r,
      };
    case "f16":
      return {
        decl: "array<vec2<u32>>",
        raw: "vec2<u32>",
        load: "W[e / 4u]",
        decode: (r) => `vec4<f32>(unpack2x16float(${r}.x), unpack2x16float(${r}.y))`,
      };
    case "q8":
      // r.x: four int8 codes; r.y: the word holding the group's bf16 scale; r.z: which half.
      return {
        decl: "array<u32>",
        raw: "vec3<u32>",
        load: `vec3<u32>(W[e / 4u], W[p.soff + e / ${2 * QUANT_GROUP}u], (e / ${QUANT_GROUP}u) & 1u)`,
        decode: (r) => `q8v(${r}.x) * bf16_at(${r}.y, ${r}.z)`,
      };
    case "q4":
      // r.x: the word of 8 codes; its half (e % 8 is 0 or 4) is picked when decoding.
      return {
        decl: "array<u32>",
        raw: "vec4<u32>",
        load: `vec4<u32>(W[e / 8u], W[p.soff + e / ${
          2 * QUANT_GROUP
        }u], (e / ${QUANT_GROUP}u) & 1u, 4u * (e % 8u))`,
        decode: (r) => `q4s(${r}.x, ${r}.w) * bf16_at(${r}.y, ${r}.z)`,
      };
  }
}

const QUANT_WGSL = `
fn bf16_at(w: u32, hi: u32) -> f32 {
  return bitcast<f32>(select(w << 16u, w & 0xffff0000u, hi == 1u));
}
${QUANT_CODES_WGSL}`;

/**
 * Where thread tid sits in the TX x TY grid of thread blocks. Where the grid allows, a warp (32 lanes) is an
 * 8 x 4 patch of it, so a k step's fragment reads are 4 distinct x vec4s (64 bytes) and 8 distinct W vec4s
 * (128 bytes): one workgroup-memory wavefront each, where a 16 x 2 row of threads needs three in all and
 * makes the FMAs wait on workgroup memory.
 */
function threadPlace(TX: number, TY: number): string {
  if (TX % 8 !== 0 || TY % 4 !== 0) return `let tx = tid % ${TX}u;\n  let ty = tid / ${TX}u;`;
  const WX = TX / 8; // warps across
  return `let warp = tid / 32u;
  let lane = tid % 32u;
  let tx = (warp % ${WX}u) * 8u + lane % 8u;
  let ty = (warp / ${WX}u) * 4u + lane / 8u;`;
}

const range4 = [0, 1, 2, 3];

/** gemmSource, generated once per (weights, transform, tile). */
const gemmSources = memoSource(gemmSource);

/** The WGSL of one GEMM variant. */
export function gemmSource(
  wt: WeightType | QuantType,
  f: GemmTransform,
  t: GemmTile,
  xh = false,
  yh = false,
): string {
  const { bm, bn, bk, rm, rn } = t;
  const h = t.f16 === true;
  const db = t.db === true;
  const ci = t.ci === true;
  const vs = t.v === true;
  const nb = db ? 2 : 1;
  const S = h ? "f16" : "f32"; // x staged and multiplied as
  const SW_T = h || t.wh ? "f16" : "f32"; // W staged as
  const TX = bn / (4 * rn), TY = bm / (4 * rm);
  const TH = TX * TY;
  const KQ = bk / 4; // vec4s of k per row of a slice
  const LA = (bm * KQ) / TH; // x vec4 loads per thread per slice
  const LW = (bn * KQ) / TH; // W vec4 loads per thread per slice
  const w = weightCode(wt);
  // x as stored: vec4<f32>, or (xh) 4 halves in a vec2<u32>, held raw until staged (silu_mul: decoded at once).
  const xVec = (e: string) => (xh ? weightCode("f16").decode(e) : e);
  const XR = xh && f !== "silu_mul" ? "vec2<u32>" : "vec4<f32>";
  const xValue = (i: number) => (XR === "vec4<f32>" ? `xr${i}` : xVec(`xr${i}`));
  // Padding of the k-major slices by one vec4 per k row spreads the transposed stores over the banks.
  const SA = bm / 4 + 1, SW = bn / 4 + 1;
  const lines: string[] = [];
  const L = (s: string) => lines.push(s);
  // Which row (m of x, n of W) and k quad a thread's i-th vec4 load of a slice reads. Plain: vec4 u = tid +
  // i TH of the slice, KQ a row. Vector stores (v): loads 4g..4g+3 are rows 4q..4q+3 of group G = tid + g TH
  // at k quad kq, a warp's lanes 8 row groups x 4 quads (each row's 64 bytes contiguous; the 8 lanes of a
  // quarter warp store 8 row groups at one k, in distinct banks).
  const group = (g: number) =>
    `let G = tid + ${g * TH}u;
      let q = G % 8u + 8u * (G / ${8 * KQ}u);
      let kb = 4u * ((G / 8u) % ${KQ}u);`;
  const place = (i: number, row: string) =>
    vs
      ? `${group(i >> 2)}
      let ${row} = 4u * q + ${i & 3}u;
      let k = k0 + kb;`
      : `let ${row} = (tid + ${i * TH}u) / ${KQ}u;
      let k = k0 + 4u * ((tid + ${i * TH}u) % ${KQ}u);`;
  // x load: row m (clamped), k vec4 kq; values past T or K read as 0.
  const xLoad = (i: number) => {
    return `{
      ${place(i, "m")}
      let ok = m0 + m < p.T && k < p.K;
      let row = p.x_row0 + min(m0 + m, p.T - 1u);
      let kk = min(k, p.K - 4u) / 4u;
      ${
      f === "silu_mul"
        ? `let g = ${xVec("x[row * p.ldx + kk]")};
      let up = ${xVec("x[row * p.ldx + p.K / 4u + kk]")};
      xr${i} = select(vec4<f32>(0.0), g / (vec4<f32>(1.0) + exp(-g)) * up, ok);`
        : `xr${i} = select(${XR}(${xh ? "0u" : "0.0"}), x[row * p.ldx + kk], ok);`
    }
    }`;
  };
  const wLoad = (i: number) => {
    return `{
      ${place(i, "n")}
      wok${i} = n0 + n < p.N && k < p.K;
      let e = min(n0 + n, p.N - 1u) * p.K + min(k, p.K - 4u);
      wr${i} = ${w.load};
    }`;
  };
  const stores: string[] = [];
  const xAt = (k: string, q: string) =>
    ci
      ? `xs[${db ? "sb" : "0u"}][(${q}) % ${TY}u][(${k}) * ${rm}u + (${q}) / ${TY}u]`
      : `xs[${db ? `sb * ${bk * SA}u + ` : ""}(${k}) * ${SA}u + ${q}]`;
  const wAt = (k: string, q: string) =>
    ci
      ? `ws[${db ? "sb" : "0u"}][(${q}) % ${TX}u][(${k}) * ${rn}u + (${q}) / ${TX}u]`
      : `ws[${db ? `sb * ${bk * SW}u + ` : ""}(${k}) * ${SW}u + ${q}]`;
  const decoded = (i: number) => `select(vec4<f32>(0.0), ${w.decode(`wr${i}`)}, wok${i})`;
  const vec = (T: string, e: string) => (T === "f32" ? e : `vec4<${T}>(${e})`);
  if (vs) {
    // Each group of 4 rows x 4 k: transposed in registers, one vec4 store a k.
    const groupStores = (n: number, at: typeof xAt, T: string, value: (i: number) => string) => {
      for (let g = 0; g < n / 4; g++) {
        const v = range4.map((r) => `let v${r} = ${value(4 * g + r)};`).join("\n      ");
        const st = range4.map((c) =>
          `${at(`kb + ${c}u`, "q")} = ${vec(T, `vec4<f32>(v0[${c}], v1[${c}], v2[${c}], v3[${c}])`)};`
        ).join("\n      ");
        stores.push(`{\n      ${group(g)}\n      ${v}\n      ${st}\n    }`);
      }
    };
    groupStores(LA, xAt, S, xValue);
    groupStores(LW, wAt, SW_T, decoded);
  } else {
    // One vec4 of 4 k for one row: 4 scalar stores, one a k row, the component indices written out.
    const rowStores = (n: number, row: string, at: typeof xAt, T: string, value: (i: number) => string) => {
      for (let i = 0; i < n; i++) {
        const st = range4.map((c) => `${at(`kb + ${c}u`, `${row} / 4u`)}[${row} % 4u] = ${T}(v[${c}]);`)
          .join("\n      ");
        stores.push(`{
      let u = tid + ${i * TH}u;
      let ${row} = u / ${KQ}u;
      let kb = 4u * (u % ${KQ}u);
      let v = ${value(i)};
      ${st}
    }`);
      }
    };
    rowStores(LA, "m", xAt, S, xValue);
    rowStores(LW, "n", wAt, SW_T, decoded);
  }
  const fma: string[] = [];
  for (let i = 0; i < rm; i++) {
    fma.push(
      ci
        ? `let a${i} = xs[${db ? "rb" : "0u"}][ty][kr * ${rm}u + ${i}u];`
        : `let a${i} = xs[${db ? `rb * ${bk * SA}u + ` : ""}kr * ${SA}u + ${i * TY}u + ty];`,
    );
  }
  for (let j = 0; j < rn; j++) {
    const b = ci
      ? `ws[${db ? "rb" : "0u"}][tx][kr * ${rn}u + ${j}u]`
      : `ws[${db ? `rb * ${bk * SW}u + ` : ""}kr * ${SW}u + ${j * TX}u + tx]`;
    fma.push(`let b${j} = ${SW_T === S ? b : `vec4<${S}>(${b})`};`);
  }
  for (let i = 0; i < rm; i++) {
    for (let r = 0; r < 4; r++) {
      for (let j = 0; j < rn; j++) {
        // fma() for one FFMA (HFMA2) per pair of lanes: naga emits `c += a * b` as a multiply and an add.
        const c = `${h ? "h" : "c"}${i}_${r}_${j}`;
        fma.push(`${c} = fma(vec4<${S}>(a${i}[${r}]), b${j}, ${c});`);
      }
    }
  }
  const accDecl: string[] = [];
  const flush: string[] = [];
  const out: string[] = [];
  for (let i = 0; i < rm; i++) {
    for (let r = 0; r < 4; r++) {
      for (let j = 0; j < rn; j++) {
        accDecl.push(`var c${i}_${r}_${j} = vec4<f32>(0.0);`);
        if (h) accDecl.push(`var h${i}_${r}_${j} = vec4<f16>(0.0);`);
        flush.push(`c${i}_${r}_${j} += vec4<f32>(h${i}_${r}_${j});\n    h${i}_${r}_${j} = vec4<f16>(0.0);`);
        out.push(
          `store(m0 + ${4 * i * TY}u + 4u * ty + ${r}u, n0 + ${
            4 * j * TX
          }u + 4u * tx, ybase, c${i}_${r}_${j});`,
        );
      }
    }
  }
  const loads = (ind: string) =>
    [...Array.from({ length: LA }, (_, i) => xLoad(i)), ...Array.from({ length: LW }, (_, i) => wLoad(i))]
      .join(
        `\n${ind}`,
      );
  const multiply = Array.from(
    { length: bk },
    (_, kr) => `{\n      ${fma.join("\n      ").replaceAll("kr *", `${kr}u *`)}\n    }`,
  ).join("\n    ");
  const loop = `loop {
    ${stores.join("\n    ")}
    workgroupBarrier();
    k0 += ${bk}u;
    if (k0 < kend) {
      ${loads("      ")}
    }
    ${multiply}
    ${h ? flush.join("\n    ") : ""}
    workgroupBarrier();
    if (k0 >= kend) { break; }
  }`;
  // Double-buffered: the next slice is stored into the other buffer while this one is read; the buffer
  // written was last read before the previous barrier.
  const dbLoop = `var rb = 0u;
  var sb = 0u;
  ${stores.join("\n  ")}
  workgroupBarrier();
  loop {
    k0 += ${bk}u;
    let more = k0 < kend;
    if (more) {
      ${loads("      ")}
    }
    ${multiply}
    ${h ? flush.join("\n    ") : ""}
    if (more) {
      sb = 1u - rb;
      ${stores.join("\n      ")}
    }
    workgroupBarrier();
    rb = 1u - rb;
    if (!more) { break; }
  }`;
  L(`${h || t.wh || yh ? "enable f16;" : ""}
struct P { K: u32, N: u32, T: u32, acc: u32, x_row0: u32, soff: u32, ldx: u32, kc: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> x: array<${xh ? "vec2<u32>" : "vec4<f32>"}>;
@group(0) @binding(2) var<storage, read> W: ${w.decl};
@group(0) @binding(3) var<storage, read_write> y: array<${yh ? "f16" : "f32"}>;
${
    ci
      ? `var<workgroup> xs: array<array<array<vec4<${S}>, ${bk * rm + 1}>, ${TY}>, ${nb}>;
var<workgroup> ws: array<array<array<vec4<${SW_T}>, ${bk * rn + 1}>, ${TX}>, ${nb}>;`
      : `var<workgroup> xs: array<vec4<${S}>, ${nb * bk * SA}>;
var<workgroup> ws: array<vec4<${SW_T}>, ${nb * bk * SW}>;`
  }
${isQuant(wt) ? QUANT_WGSL : ""}
fn store(m: u32, n: u32, ybase: u32, v: vec4<f32>) {
  if (m >= p.T) { return; }
  for (var c = 0u; c < 4u; c++) {
    if (n + c < p.N) {
      let o = ybase + m * p.N + n + c;
      var prev = 0.0;
      if (p.acc != 0u) { prev = f32(y[o]); }
      y[o] = ${yh ? "f16" : ""}(prev + v[c]);
    }
  }
}
@compute @workgroup_size(${TH})
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
  ${threadPlace(TX, TY)}
  let n0 = wg.x * ${bn}u;
  let m0 = wg.y * ${bm}u;
  ${accDecl.join("\n  ")}
  ${Array.from({ length: LA }, (_, i) => `var xr${i}: ${XR};`).join("\n  ")}
  ${Array.from({ length: LW }, (_, i) => `var wr${i}: ${w.raw};\n  var wok${i}: bool;`).join("\n  ")}
  // Split K: workgroup z sums k in [z kc, (z + 1) kc) into its own slice of y (a reduce adds them).
  var k0 = wg.z * p.kc;
  let kend = min(p.K, k0 + p.kc);
  let ybase = wg.z * p.T * p.N;
  ${Array.from({ length: LA }, (_, i) => xLoad(i)).join("\n  ")}
  ${Array.from({ length: LW }, (_, i) => wLoad(i)).join("\n  ")}
  ${db ? dbLoop : loop}
  ${out.join("\n  ")}
}`);
  return lines.join("\n");
}

/**
 * The GEMM's dispatches: y[T, N] (+)= f(x)[T, K] @ W[N, K]^T, one dispatch, or with `splitK` > 1 a
 * dispatch whose workgroups also split K (each writing its slice of a shared scratch) and a reduce that
 * adds the slices into y. Split K fills the GPU when T x N makes few tiles and K is long (a 512-row
 * prompt chunk through down_proj: 64 tiles of 128 x 128 for 132 SMs).
 */
export function gemmCalls(
  gpu: Gpu,
  bufs: { x: GPUBuffer; w: GPUBuffer; y: GPUBuffer },
  d: GemmDims,
): KernelCall[] {
  const wt = d.weights;
  if (!gemmFits(d.K, wt)) {
    throw new RangeError(
      `the GEMM needs K % ${isQuant(wt) ? QUANT_GROUP : 4} == 0 for ${wt} weights, got K = ${d.K}`,
    );
  }
  if (!(Number.isInteger(d.T) && d.T >= 1 && Number.isInteger(d.N) && d.N >= 1)) {
    throw new RangeError(`GEMM of T = ${d.T} rows and N = ${d.N} columns`);
  }
  // q4 (or, asked, q8) layers on int8 inputs, unless a call asks for a float tile or f16 input / output;
  // split K as the float tiles are, the splits' sums added by the same reduce.
  if (d.tile === undefined && !d.xHalf && !d.yHalf && gemmInt8Math(gpu, d, wt)) {
    const tile = gemmInt8Tile(gpu);
    const splits = d.splitK ??
      gemmDefaultSplit(d.T, d.N, d.K, { bm: tile.rows, bn: tile.features }, gpu.tuning, true);
    if (!(Number.isInteger(splits) && splits >= 1)) {
      throw new RangeError(`splitK must be an integer >= 1, got ${splits}`);
    }
    if (splits === 1) return gemmInt8Calls(gpu, bufs, { ...d, weights: wt, tile, splits });
    const out = splitScratch(gpu, splits * d.T * d.N * 4);
    return [
      ...gemmInt8Calls(gpu, { ...bufs, y: out }, { ...d, weights: wt, tile, splits }),
      splitReduceCall(gpu, out, bufs.y, d.T * d.N, splits, d.accumulate === true, false),
    ];
  }
  const def = gemmDefaultTile(gpu, d.T, d.N, d.K);
  // A tuned default's f16 / wh flags apply where they keep the default exact enough (as gpu.tuning.gemmMath).
  const tile = d.tile ?? {
    ...def,
    f16: d.f16Math !== false && (gemmF16Math(gpu, wt) || (def.f16 === true && gpu.hasF16 && wt !== "f32")),
    wh: def.wh === true && gemmWhFits(gpu, wt),
  };
  checkGemmTile(tile, gpu.maxWorkgroupStorage);
  if ((tile.f16 || tile.wh) && !gpu.hasF16) {
    throw new RangeError(`f16 GEMM tiles need shader-f16 (${gpu.adapterName})`);
  }
  if (tile.wh && !tile.f16 && !gemmWhFits(gpu, wt)) {
    throw new RangeError(
      `GEMM tiles staging W as f16 (wh) take f16 or q4 weights, not ${wt}: it would round`,
    );
  }
  const splits = d.splitK ?? gemmDefaultSplit(d.T, d.N, d.K, tile, gpu.tuning);
  if (!(Number.isInteger(splits) && splits >= 1)) {
    throw new RangeError(`splitK must be an integer >= 1, got ${splits}`);
  }
  const kc = ceilDiv(ceilDiv(d.K, splits), tile.bk) * tile.bk;
  const f = d.transform ?? "none";
  const soff = isQuant(wt) ? quantScaleWord(d.N, d.K, wt) : 0;
  const ldx = (f === "silu_mul" ? 2 * d.K : d.K) / 4;
  const split = splits > 1;
  const yh = d.yHalf === true;
  if (yh && !gpu.hasF16) throw new RangeError(`an f16 GEMM output needs shader-f16 (${gpu.adapterName})`);
  const acc = d.accumulate && !split ? 1 : 0;
  const params = uniformBuffer(gpu, [d.K, d.N, d.T, acc, d.xRow0 ?? 0, soff, ldx, kc]);
  const out = split ? splitScratch(gpu, splits * d.T * d.N * 4) : bufs.y;
  const gemm = kernelCall(gpu, pipeline(gpu, gemmSources(wt, f, tile, d.xHalf === true, yh && !split)), [
    params,
    bufs.x,
    bufs.w,
    out,
  ], [
    ceilDiv(d.N, tile.bn),
    ceilDiv(d.T, tile.bm),
    ceilDiv(d.K, kc),
  ], `gemm_${f}`);
  if (!split) return [gemm];
  return [gemm, splitReduceCall(gpu, out, bufs.y, d.T * d.N, ceilDiv(d.K, kc), d.accumulate === true, yh)];
}

/** y (+)= the sum of the `splits` planes of n partial sums in `part` (y f32, or f16 with `yh`). */
function splitReduceCall(
  gpu: Gpu,
  part: GPUBuffer,
  y: GPUBuffer,
  n: number,
  splits: number,
  accumulate: boolean,
  yh: boolean,
): KernelCall {
  const rp = uniformBuffer(gpu, [n, splits, accumulate ? 1 : 0]);
  return kernelCall(gpu, pipeline(gpu, reduceSource(yh)), [rp, part, y], [
    Math.min(ceilDiv(n, 256), 65535),
    ceilDiv(n, 256 * 65535),
  ], "gemm_reduce");
}

/** One GEMM dispatch (no split K): tests and callers that want exactly one call. */
export function gemmCall(
  gpu: Gpu,
  bufs: { x: GPUBuffer; w: GPUBuffer; y: GPUBuffer },
  d: GemmDims,
): KernelCall {
  return gemmCalls(gpu, bufs, { ...d, splitK: 1 })[0];
}

/**
 * Split K where the tiles are under a wave and K is long: splits (a power of two) until they make a wave,
 * each split keeping >= 1024 of K, at most 8; deeper (>= 256 of K, at most 16) for the int8 tiles (`int8`)
 * and for an output of at most 4 tiles (a MoE router's at short prompts). H100, the forty-ninth session: the
 * int8 GEMMs of Qwen3-30B-A3B's 20-64-token prompts 3.9-4.6 -> 3.0-4.6 ms, its f32 router 3.0 -> 1.1 ms (48
 * layers), while the float tiles lost with it (qkv and o_proj ~+1.9 ms). gpu.tuning.gemmWave and gemmSplit
 * replace these.
 */
export function gemmDefaultSplit(
  T: number,
  N: number,
  K: number,
  tile: Pick<GemmTile, "bm" | "bn">,
  tuning: Pick<KernelTuning, "gemmWave" | "gemmSplit"> = {},
  int8 = false,
): number {
  const wave = tuning.gemmWave ?? WAVE;
  const tiles = ceilDiv(T, tile.bm) * ceilDiv(N, tile.bn);
  const deep = int8 || tiles <= 4;
  const minK = tuning.gemmSplit?.minK ?? (deep ? 256 : 1024);
  const most = tuning.gemmSplit?.max ?? (deep ? 16 : 8);
  let s = 1;
  while (tiles * s < wave && K / (2 * s) >= minK && s < most) s *= 2;
  return s;
}

/** The split-K reduce: y (+)= the splits' partial sums, y f32 or (yh) f16. */
function reduceSource(yh: boolean): string {
  return `${yh ? "enable f16;" : ""}
struct P { n: u32, splits: u32, acc: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> part: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<${yh ? "f16" : "f32"}>;
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
  let i = g.y * 65535u * 256u + g.x;
  if (i >= p.n) { return; }
  var s = select(0.0, f32(y[i]), p.acc != 0u);
  for (var z = 0u; z < p.splits; z++) { s += part[z * p.n + i]; }
  y[i] = ${yh ? "f16" : ""}(s);
}`;
}

/**
 * The split-K partial sums' scratch, one per device, grown as needed and shared by every call: dispatches
 * run in submission order, so no two GEMMs use it at once. (A grown-out buffer stays alive through the
 * bind groups that hold it.)
 */
const scratch = new WeakMap<Gpu, GPUBuffer>();
function splitScratch(gpu: Gpu, bytes: number): GPUBuffer {
  const have = scratch.get(gpu);
  if (have && have.size >= bytes) return have;
  const b = storageBuffer(gpu, bytes, "gemm split-K");
  scratch.set(gpu, b);
  return b;
}

/**
 * CPU reference (f64 sums): `x` holds rows of K (or 2K for silu_mul) from row xRow0, `w` the weights as
 * floats (dequantised for q8 / q4), `y0` the prior content of y when accumulating.
 */
export function gemmRef(
  x: Float32Array,
  w: Float32Array,
  d: Omit<GemmDims, "weights" | "tile" | "splitK">,
  y0?: Float32Array,
): Float32Array {
  const { K, N, T } = d;
  const f = d.transform ?? "none";
  const ld = f === "silu_mul" ? 2 * K : K;
  const r0 = d.xRow0 ?? 0;
  const y = new Float32Array(T * N);
  const row = new Float64Array(K);
  for (let t = 0; t < T; t++) {
    for (let k = 0; k < K; k++) {
      const g = x[(r0 + t) * ld + k];
      row[k] = f === "silu_mul" ? Math.fround(g / (1 + Math.exp(-g))) * x[(r0 + t) * ld + K + k] : g;
    }
    for (let n = 0; n < N; n++) {
      let s = d.accumulate && y0 ? y0[t * N + n] : 0;
      for (let k = 0; k < K; k++) s += row[k] * w[n * K + k];
      y[t * N + n] = s;
    }
  }
  return y;
}

/**
 * A prefill linear layer: the GEMM where it takes the shape, else matmul.ts's 16 x 16 tiled kernel (rows
 * whose length is not a multiple of 4). The blocks call this off the decode (GEMV) path.
 */
export function prefillLinearCalls(
  gpu: Gpu,
  bufs: { x: GPUBuffer; w: GPUBuffer; y: GPUBuffer },
  d: Omit<GemmDims, "tile" | "splitK">,
): KernelCall[] {
  if (gemmFits(d.K, d.weights)) return gemmCalls(gpu, bufs, d);
  if (d.xHalf || d.yHalf) {
    throw new RangeError(
      `f16 inputs and outputs take the GEMM, which does not take K = ${d.K} (${d.weights})`,
    );
  }
  return [matmulCall(gpu, bufs, d)];
}
