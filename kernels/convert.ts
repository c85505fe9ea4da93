// Weight conversion on the GPU at load time: a checkpoint's raw tensor bytes (bf16, f16, f32, or fp8 codes
// with their block scales), uploaded as they are, become the engine's storage (f32, f16, or q8 / q4 as
// kernels/quant.ts lays them out) in one dispatch, bit-identical to the CPU conversions (models/dtype.ts,
// models/fp8.ts, kernels/quant.ts): rounding is done with integer operations, and the quantiser's divisions
// are corrected with exact products (docs/KERNELS.md).
// The same kernel can make its input instead of reading it: deterministic random bf16 weights, for
// benchmarks at sizes no disk holds (models/random_weights.ts).
//
// One thread per output unit: an f32 value, an f16 pair (one u32), or a pair of quantisation groups (64
// weights and one u32 of two bf16 scales). Each thread reads its inputs in order, so a group's
// largest-magnitude value is chosen exactly as the CPU quantiser chooses it (the first of equal ones).
import { type Gpu, type KernelCall, kernelCall, pipeline, uniformBuffer } from "./gpu.ts";
import { QUANT_GROUP, quantScaleWord, type QuantType } from "./quant.ts";

/**
 * What a checkpoint's tensor bytes are: the float dtypes safetensors files hold, and block-scaled fp8
 * (E4M3 codes with an f32 scale a block, models/fp8.ts: its `Fp8Blocks` give the layout).
 */
export type RawType = "BF16" | "F16" | "F32" | "F8_E4M3";

/**
 * An fp8 source's layout: rows of K codes, one scale a block of bn x bk, SK = ceil(K / bk) scales a row of
 * blocks, in `scales` (f32). Stacked matrices share a layout when every one but the last has a multiple of
 * bn rows (their scale rows then follow each other).
 */
export interface Fp8Blocks {
  K: number;
  bn: number;
  bk: number;
  scales: GPUBuffer;
}
/** What the conversion writes. */
export type ConvertTarget = "f32" | "f16" | QuantType;

/** Deterministic random input instead of a source buffer: uniform in [-scale, scale), rounded to bf16. */
export interface RandomFill {
  seed: number;
  /** A per-tensor stream id (e.g. a hash of its name). */
  stream: number;
  /** Half-width; 0 gives the constant `offset`. */
  scale: number;
  offset?: number;
}

const WG = 256;
/** Workgroups per grid row (a dispatch's x dimension stays below WebGPU's 65535). */
const ROW = 32768;

/** Threads (output units) a conversion of `count` values to `to` runs. */
function units(count: number, to: ConvertTarget): number {
  if (to === "f32") return count;
  if (to === "f16") return Math.ceil(count / 2);
  return Math.ceil(count / QUANT_GROUP / 2);
}

function source(from: RawType | "random", to: ConvertTarget): string {
  const input = from === "random"
    ? `
fn hash(x0: u32) -> u32 {
  var x = x0;
  x ^= x >> 16u; x *= 0x7feb352du; x ^= x >> 15u; x *= 0x846ca68bu; x ^= x >> 16u;
  return x;
}
fn bf16_rne(x: u32) -> u32 {
  if ((x & 0x7fffffffu) > 0x7f800000u) { return ((x >> 16u) | 0x40u) << 16u; }
  return ((x + 0x7fffu + ((x >> 16u) & 1u)) >> 16u) << 16u;
}
// Element i as f32 bits: u in [1, 2) from 23 hash bits, (u - 1.5) * 2 in [-1, 1), times scale, rounded to bf16.
fn load(i: u32) -> u32 {
  let h = hash(hash(i ^ p.seed) ^ p.stream);
  let u = bitcast<f32>(0x3f800000u | (h >> 9u));
  let v = (u - 1.5) * 2.0 * p.scale + p.offset;
  return bf16_rne(bitcast<u32>(v));
}`
    : from === "F8_E4M3"
    ? `
@group(0) @binding(4) var<storage, read> scales: array<f32>;
// An E4M3 code as f32 bits (models/fp8.ts's table: bias 7, subnormals m 2^-9, S.1111.111 NaN).
fn e4m3(b: u32) -> u32 {
  let sign = (b & 0x80u) << 24u;
  let e = (b >> 3u) & 0xfu;
  let m = b & 7u;
  if (e == 15u && m == 7u) { return sign | 0x7fc00000u; }
  if (e != 0u) { return sign | ((e + 120u) << 23u) | (m << 20u); }
  if (m == 0u) { return sign; }
  let top = 31u - countLeadingZeros(m);
  return sign | ((top + 118u) << 23u) | ((m << (23u - top)) & 0x7fffffu);
}
// Code i times its block's scale: one correctly rounded f32 product, as the CPU's dequantFp8.
fn load(i: u32) -> u32 {
  let code = (src[i / 4u] >> (8u * (i & 3u))) & 0xffu;
  let n = i / p.k;
  let k = i - n * p.k;
  return bitcast<u32>(bitcast<f32>(e4m3(code)) * scales[(n / p.bn) * p.sk + k / p.bk]);
}`
    : from === "BF16"
    ? `fn load(i: u32) -> u32 { return ((src[i / 2u] >> (16u * (i & 1u))) & 0xffffu) << 16u; }`
    : from === "F16"
    ? `
fn half(i: u32) -> u32 { return (src[i / 2u] >> (16u * (i & 1u))) & 0xffffu; }
fn load(i: u32) -> u32 {
  let h = half(i);
  let sign = (h & 0x8000u) << 16u;
  let e = (h >> 10u) & 0x1fu;
  let m = h & 0x3ffu;
  if (e == 0x1fu) { return sign | 0x7f800000u | (m << 13u); }
  if (e != 0u) { return sign | ((e + 112u) << 23u) | (m << 13u); }
  if (m == 0u) { return sign; }
  let top = 31u - countLeadingZeros(m); // m = 1.f * 2^top: value 2^(top - 24) * 1.f
  return sign | ((top + 103u) << 23u) | ((m << (23u - top)) & 0x7fffffu);
}`
    : `fn load(i: u32) -> u32 { return src[i]; }`;
  const body = to === "f32"
    ? `
  if (u >= p.count) { return; }
  out[u] = load(u);`
    : to === "f16"
    ? `
  if (u >= (p.count + 1u) / 2u) { return; }
  let lo = to_f16(load(2u * u));
  var hi = 0u;
  if (2u * u + 1u < p.count) { hi = to_f16(load(2u * u + 1u)); }
  out[u] = lo | (hi << 16u);`
    : `
  let groups = p.count / ${QUANT_GROUP}u;
  if (2u * u >= groups) { return; }
  let s0 = quant_group(2u * u);
  var s1 = 0u;
  if (2u * u + 1u < groups) { s1 = quant_group(2u * u + 1u); }
  out[p.soff + u] = s0 | (s1 << 16u);`;
  const f16 = `
// models/dtype.ts's f32BitsToF16: round to nearest even, subnormals, overflow to inf, nan kept.
fn to_f16(x: u32) -> u32 {
  let sign = (x >> 16u) & 0x8000u;
  let exp = (x >> 23u) & 0xffu;
  let mant = x & 0x7fffffu;
  if (exp == 0xffu) {
    if (mant != 0u) { return sign | 0x7e00u | (mant >> 13u); }
    return sign | 0x7c00u;
  }
  let e = i32(exp) - 127 + 15;
  if (e >= 0x1f) { return sign | 0x7c00u; }
  if (e <= 0) {
    let shift = u32(14 - e);
    if (shift > 24u) { return sign; }
    let m = mant | 0x800000u;
    var h = m >> shift;
    let rem = m & ((1u << shift) - 1u);
    let half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (h & 1u) == 1u)) { h += 1u; }
    return sign | h;
  }
  var h = (u32(e) << 10u) | (mant >> 13u);
  let rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u) == 1u)) { h += 1u; }
  return sign | h;
}`;
  const quant = isQuantTarget(to)
    ? `
fn bf16_up(v: f32) -> u32 {
  var x = bitcast<u32>(v);
  if ((x & 0xffffu) != 0u) { x = (x & 0xffff0000u) + 0x10000u; }
  return x >> 16u;
}
// Whether round_f32(a / 127) <= b for a positive bf16 b: a - 127 b is exact (Sterbenz: b is within a
// bf16 step of a / 127), and so is 127 * ulp(b) / 2.
fn q8_fits(a: f32, bb: u32) -> bool {
  let b = bitcast<f32>(bb << 16u);
  let ulp_half = bitcast<f32>((((bb >> 7u) & 0xffu) - 24u) << 23u);
  return a - 127.0 * b <= 127.0 * ulp_half;
}
// The CPU quantiser's scale: q8 |m| / 127 rounded to f32 then up to bf16; q4 -m / 8 (exact) up to bf16.
fn scale_bits(m: f32) -> u32 {
  if (m == 0.0) { return 0u; }
  ${
      to === "q4" ? "return bf16_up(-m * 0.125);" : `let a = abs(m);
  let c = bf16_up(a / 127.0);
  if (q8_fits(a, c - 1u)) { return c - 1u; }
  if (q8_fits(a, c)) { return c; }
  return c + 1u;`
    }
}
// round half away from zero of w / s, exactly: n with (n - 1/2) |s| <= |w| < (n + 1/2) |s|. The products
// are exact (n has at most 8 bits, s 8 significant bits).
fn round_div(w: f32, s: f32) -> i32 {
  let wa = abs(w);
  let sa = abs(s);
  var n = floor(wa / sa + 0.5);
  if ((n + 0.5) * sa <= wa) { n += 1.0; } else if (n > 0.0 && (n - 0.5) * sa > wa) { n -= 1.0; }
  let q = i32(n);
  if ((w < 0.0) != (s < 0.0)) { return -q; }
  return q;
}
fn quant_group(g: u32) -> u32 {
  let base = g * ${QUANT_GROUP}u;
  var v: array<u32, ${QUANT_GROUP}>;
  var mb = 0u;
  for (var i = 0u; i < ${QUANT_GROUP}u; i++) {
    let x = load(base + i);
    v[i] = x;
    if ((x & 0x7fffffffu) >= 0x7f800000u) { atomicMax(&bad[0], 0xffffffffu - (base + i)); }
    if ((x & 0x7fffffffu) > (mb & 0x7fffffffu)) { mb = x; }
  }
  let sb = scale_bits(bitcast<f32>(mb));
  let s = bitcast<f32>(sb << 16u);
  ${
      to === "q8"
        ? `for (var w = 0u; w < 8u; w++) {
    var word = 0u;
    for (var j = 0u; j < 4u; j++) {
      var q = 0;
      if (s != 0.0) { q = clamp(round_div(bitcast<f32>(v[4u * w + j]), s), -127, 127); }
      word |= (u32(q) & 0xffu) << (8u * j);
    }
    out[g * 8u + w] = word;
  }`
        : `for (var w = 0u; w < 4u; w++) {
    var word = 0u;
    for (var j = 0u; j < 8u; j++) {
      var q = 0;
      if (s != 0.0) { q = round_div(bitcast<f32>(v[8u * w + j]), s); }
      word |= u32(clamp(q + 8, 0, 15)) << (4u * j);
    }
    out[g * 4u + w] = word;
  }`
    }
  return sb;
}`
    : "";
  return `
struct P { count: u32, soff: u32, seed: u32, stream: u32, scale: f32, offset: f32, k: u32, bn: u32, bk: u32, sk: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> src: array<u32>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;
@group(0) @binding(3) var<storage, read_write> bad: array<atomic<u32>>;
${input}
${to === "f16" ? f16 : ""}
${quant}
@compute @workgroup_size(${WG})
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
  let u = (wg.y * ${ROW}u + wg.x) * ${WG}u + li;
  ${from === "random" ? "_ = &src;" : ""}${to === "f32" || to === "f16" ? "_ = &bad;" : ""}${body}
}`;
}

function isQuantTarget(t: ConvertTarget): t is QuantType {
  return t === "q8" || t === "q4";
}

/**
 * Converts `count` values, read from `src` as `from` (or made as `random` says), into `out` as `to`. For q8
 * and q4, `count` = N * K of a matrix whose rows are a multiple of 32 (groups never cross rows), and the
 * scales go at the word kernels/quant.ts says. `bad` (a storage buffer of one u32, zero at first) is raised
 * if a value to be quantised is not finite: nonzero = 0xffffffff minus the first such index.
 */
export function convertCall(
  gpu: Gpu,
  bufs: { src: GPUBuffer; out: GPUBuffer; bad: GPUBuffer },
  d: {
    count: number;
    from: RawType | "random";
    to: ConvertTarget;
    N?: number;
    K?: number;
    random?: RandomFill;
    /** The layout of an F8_E4M3 source. */
    fp8?: Fp8Blocks;
  },
): KernelCall {
  const { count, from, to } = d;
  const f8 = d.fp8;
  if ((from === "F8_E4M3") !== (f8 !== undefined)) {
    throw new TypeError("an F8_E4M3 conversion needs its fp8 block layout, and only it takes one");
  }
  if (f8 && !([f8.K, f8.bn, f8.bk].every((v) => Number.isInteger(v) && v >= 1) && count % f8.K === 0)) {
    throw new RangeError(
      `fp8 blocks ${JSON.stringify({ ...f8, scales: undefined })} do not fit ${count} values`,
    );
  }
  if (!(Number.isInteger(count) && count >= 1 && count < 2 ** 32)) {
    throw new RangeError(`conversion of ${count} values: expected 1 .. 2^32 - 1`);
  }
  let soff = 0;
  if (isQuantTarget(to)) {
    const { N, K } = d;
    if (N === undefined || K === undefined || N * K !== count || K % QUANT_GROUP !== 0) {
      throw new RangeError(`${to} conversion needs N x K = count with K % ${QUANT_GROUP} == 0`);
    }
    soff = quantScaleWord(N, K, to);
  }
  if (from === "random" && !d.random) throw new TypeError("a random conversion needs its RandomFill");
  const r = d.random ?? { seed: 0, stream: 0, scale: 0, offset: 0 };
  const params = uniformBuffer(gpu, [
    count,
    soff,
    r.seed,
    r.stream,
    r.scale,
    r.offset ?? 0,
    f8?.K ?? 0,
    f8?.bn ?? 0,
    f8?.bk ?? 0,
    f8 ? Math.ceil(f8.K / f8.bk) : 0,
  ], [4, 5]);
  const wgs = Math.ceil(units(count, to) / WG);
  return kernelCall(
    gpu,
    pipeline(gpu, source(from, to)),
    [params, bufs.src, bufs.out, bufs.bad, ...(f8 ? [f8.scales] : [])],
    [Math.min(wgs, ROW), Math.ceil(wgs / ROW)],
    `convert_${from}_${to}`,
  );
}

/** Bytes `count` values take as `to` (a quantised matrix: values + scales). */
export function convertedBytes(count: number, to: ConvertTarget): number {
  if (to === "f32") return count * 4;
  if (to === "f16") return count * 2;
  return count / QUANT_GROUP * (to === "q8" ? QUANT_GROUP : QUANT_GROUP / 2) + (count / QUANT_GROUP) * 2;
}

const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);

function hash(x0: number): number {
  let x = x0 >>> 0;
  x ^= x >>> 16;
  x = Math.imul(x, 0x7feb352d) >>> 0;
  x ^= x >>> 15;
  x = Math.imul(x, 0x846ca68b) >>> 0;
  x ^= x >>> 16;
  return x >>> 0;
}

/** The random kernel's values on the CPU (as bf16 bits): the same integer hash, the same f32 roundings. */
export function randomBf16(count: number, r: RandomFill): Uint16Array {
  const out = new Uint16Array(count);
  const scale = Math.fround(r.scale), offset = Math.fround(r.offset ?? 0);
  for (let i = 0; i < count; i++) {
    const h = hash(hash((i ^ r.seed) >>> 0) ^ r.stream);
    u32[0] = 0x3f800000 | (h >>> 9);
    const v = Math.fround(Math.fround(Math.fround((f32[0] - 1.5) * 2) * scale) + offset);
    f32[0] = v;
    const x = u32[0];
    out[i] = (x & 0x7fffffff) > 0x7f800000
      ? (x >>> 16) | 0x40
      : ((x + 0x7fff + ((x >>> 16) & 1)) >>> 16) & 0xffff;
  }
  return out;
}

/**
 * A stack of M quantised matrices [N, K] (kernels/quant.ts's layout over the [M N, K] whole) with each
 * matrix's columns regrouped into blocks of C (a multiple of 32 dividing K): the quantised layout of the
 * [M (K / C) N, C] matrix whose row (m (K / C) + c) N + n is row n of matrix m, columns [cC, cC + C). A
 * kernel reading C columns of every row of a matrix then reads one contiguous run (moe_fused.ts's down).
 * Groups of 32 stay whole, so this moves groups (codes and bf16 scales) and equals quantising the permuted
 * floats (packColumnBlocks). One thread a pair of output groups (one u32 of scales).
 */
export function packColumnBlocksCall(
  gpu: Gpu,
  bufs: { src: GPUBuffer; out: GPUBuffer },
  d: { matrices: number; N: number; K: number; C: number; type: QuantType },
): KernelCall {
  const { matrices: M, N, K, C } = d;
  if (
    ![M, N, K, C].every((v) => Number.isInteger(v) && v >= 1) || C % QUANT_GROUP !== 0 || K % C !== 0
  ) {
    throw new RangeError(`column blocks of ${C} need C % ${QUANT_GROUP} == 0 dividing K = ${K}`);
  }
  const G = (M * N * K) / QUANT_GROUP;
  if (G >= 2 ** 31) throw new RangeError(`a stack of ${G} groups is too large to pack`);
  const WPG = d.type === "q8" ? QUANT_GROUP / 4 : QUANT_GROUP / 8; // u32 words of codes a group
  const soff = quantScaleWord(M * N, K, d.type);
  const CB = C / QUANT_GROUP, GPR = K / QUANT_GROUP, CH = K / C;
  const code = `
@group(0) @binding(0) var<storage, read> src: array<u32>;
@group(0) @binding(1) var<storage, read_write> dst: array<u32>;
fn source(gd: u32) -> u32 {
  let b = gd % ${CB}u;
  let r = gd / ${CB}u;
  let n = r % ${N}u;
  let mc = r / ${N}u;
  return ((mc / ${CH}u) * ${N}u + n) * ${GPR}u + (mc % ${CH}u) * ${CB}u + b;
}
fn scale(g: u32) -> u32 { return (src[${soff}u + g / 2u] >> (16u * (g & 1u))) & 0xffffu; }
@compute @workgroup_size(${WG})
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let pair = gid.y * ${ROW * WG}u + gid.x;
  if (2u * pair >= ${G}u) { return; }
  var sc = 0u;
  for (var h = 0u; h < 2u; h++) {
    let gd = 2u * pair + h;
    if (gd < ${G}u) {
      let gs = source(gd);
      for (var w = 0u; w < ${WPG}u; w++) { dst[gd * ${WPG}u + w] = src[gs * ${WPG}u + w]; }
      sc |= scale(gs) << (16u * h);
    }
  }
  dst[${soff}u + pair] = sc;
}`;
  const wgs = Math.ceil(Math.ceil(G / 2) / WG);
  return kernelCall(
    gpu,
    pipeline(gpu, code),
    [bufs.src, bufs.out],
    [Math.min(wgs, ROW), Math.ceil(wgs / ROW)],
    "pack_column_blocks",
  );
}

/** CPU reference of packColumnBlocksCall on floats: M matrices [N, K] to the [M (K / C) N, C] order. */
export function packColumnBlocks(w: Float32Array, d: { matrices: number; N: number; K: number; C: number }) {
  const { matrices: M, N, K, C } = d;
  const out = new Float32Array(w.length);
  for (let m = 0; m < M; m++) {
    for (let c = 0; c < K / C; c++) {
      for (let n = 0; n < N; n++) {
        const from = (m * N + n) * K + c * C;
        out.set(w.subarray(from, from + C), ((m * (K / C) + c) * N + n) * C);
      }
    }
  }
  return out;
}
