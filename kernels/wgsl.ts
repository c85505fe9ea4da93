// WGSL snippets the GEMV family shares, in one place: the team reduction and store, the RMSNorm prologue of
// the team kernels, the quantised formats' decoding, and the input transforms of one vec4 of x (a staged
// tile's loader: RMSNorm's weight, SiLU(gate) * up), and the 16x16 tiled matmul whose W tile loader is the
// one thing the float and quantised versions change.
import type { WeightType } from "./gpu.ts";
import type { QuantType } from "./quant.ts";

/** 0 .. n - 1: the indices a kernel generator unrolls over. */
export const range = (n: number): number[] => Array.from({ length: n }, (_, i) => i);

/**
 * WGSL shared by the team GEMVs (gemv_fused.ts's, matmul_quant.ts's, moe_gemv.ts's): each team reduces its per-row partial
 * sums `acc` in workgroup memory `part`, and its first R lanes write (or add into) rows n0.. of y.
 */
export const TEAM_REDUCE_STORE = `
  for (var r = 0u; r < R; r++) { part[r * TH + tid] = acc[r]; }
  workgroupBarrier();
  for (var s = TEAM / 2u; s > 0u; s >>= 1u) {
    if (lane < s) {
      for (var r = 0u; r < R; r++) { part[r * TH + tid] += part[r * TH + tid + s]; }
    }
    workgroupBarrier();
  }
  if (lane < R && n0 + lane < p.N && t < p.T) {
    let o = t * p.N + n0 + lane;
    let prev = select(0.0, y[o], p.acc != 0u);
    y[o] = prev + part[lane * TH + team * TEAM];
  }
  workgroupBarrier();`;

/** WGSL shared by the team GEMVs with the RMSNorm transform: `inv` = 1 / rms of the input row. */
export const RMS_PROLOGUE = `
  var ss = 0.0;
  for (var k = tid; k < k4; k += TH) { let v = x[xrow + k]; ss += dot(v, v); }
  part[tid] = ss;
  workgroupBarrier();
  for (var s = TH / 2u; s > 0u; s >>= 1u) {
    if (tid < s) { part[tid] += part[tid + s]; }
    workgroupBarrier();
  }
  let inv = inverseSqrt(part[0] / f32(p.K) + p.eps);
  workgroupBarrier();`;

/**
 * Quantised codes as f32, one definition for every kernel that converts them one by one (the GEMVs without
 * dp4, the multi-token GEMV, the tiled GEMM's staging, the MoE kernels): q8v(w) the 4 signed bytes of a
 * word, q4v(w, sh) 4 of its nibbles from bit sh (codes 0..15), q4s(w, sh) the same less 8 (the signed value).
 * (An exact conversion without I2F, the code OR'd into the mantissa of 2^23 and 2^23 subtracted, changed no
 * k-step on the H200, 2026-12-01: the conversions are not what bounds those kernels.)
 */
export const QUANT_CODES_WGSL = `
fn q8v(w: u32) -> vec4<f32> {
  let s = bitcast<i32>(w);
  return vec4<f32>(vec4<i32>(s << 24u, s << 16u, s << 8u, s) >> vec4<u32>(24u));
}
fn q4v(w: u32, sh: u32) -> vec4<f32> {
  return vec4<f32>((vec4<u32>(w) >> vec4<u32>(sh, sh + 4u, sh + 8u, sh + 12u)) & vec4<u32>(15u));
}
fn q4s(w: u32, sh: u32) -> vec4<f32> {
  return q4v(w, sh) - vec4<f32>(8.0);
}`;

/**
 * WGSL shared by the quantised GEMVs (gemv_sg.ts, gemv_multi.ts, matmul_quant.ts, moe_gemv.ts), which both bind the matrix as
 * `W: array<vec4<u32>>` and its scales' word offset as `p.soff`: decoding 4 weights of a word
 * (QUANT_CODES_WGSL), and group g's bf16 scale.
 */
export const QUANT_DECODE_WGSL = `
fn group_scale(g: u32) -> f32 {
  let sw = W[p.soff / 4u + g / 8u][(g / 2u) % 4u];
  return bitcast<f32>(select(sw << 16u, sw & 0xffff0000u, (g & 1u) == 1u));
}
${QUANT_CODES_WGSL}`;

/**
 * The int8 copy of an input row that the dp4 GEMVs (gemv_sg.ts, moe_sg.ts) multiply with dot4I8Packed, as
 * llama.cpp's Q8_1 activations: per block b of 32 values (scale amax / 127), the packed words xq[2b],
 * xq[2b + 1] (workgroup `array<vec4<u32>>`) and xqs[b] = (scale, scale * sum of the block's q). q4 puts the
 * even values of each 8 in the first vec4 and the odd ones in the second, matching the nibbles that
 * (w & 0x0F0F0F0F) and ((w >> 4) & 0x0F0F0F0F) pick out of a weight word (dp4Dot); q8 keeps their order.
 * `vin(k, i)` is vec4 k of the (transformed) input, k an expression of the block b and i (0..7) the vec4's
 * place in its block (for inputs a caller already holds in registers); the blocks are shared out
 * from `tid` in steps of `step`. The caller adds the barrier. `split` (q4): the two vec4s of block b go to
 * xq[b] and xq[split + b] instead (split = the number of blocks), so a warp whose lanes read one block each
 * reads consecutive vec4s (interleaved, they stride 32 bytes: 2-way bank conflicts). `out` writes
 * elsewhere: the first block (default `tid`) and the word / scale element for an index (default xq[i],
 * xqs[b]), e.g. a storage buffer's row (moe_sg.ts's router GEMV writes the copy once for every workgroup)
 * or one token's rows of a tile holding several (gemv_multi.ts).
 */
export function int8BlocksWgsl(
  wt: QuantType,
  vin: (k: string, i: number) => string,
  blocks: string,
  step: string,
  split?: string,
  out: {
    first?: string;
    q?: (i: string) => string;
    s?: (b: string) => string;
    /** WGSL at the top of the loop body (names the caller's own indices of block b). */
    prelude?: string;
    /** The block's two vec4<u32> of words (0: the first, q4's even values) and its scale pair, instead of q / s. */
    words?: (half: 0 | 1) => string;
    scale?: string;
  } = {},
): string {
  const q = out.q ?? ((i: string) => `xq[${i}]`);
  const s = out.s ?? ((b: string) => `xqs[${b}]`);
  const [lo, hi] = split && wt === "q4" ? ["b", `${split} + b`] : ["2u * b", "2u * b + 1u"];
  const order = wt === "q4"
    ? "let e = vec4<f32>(v0.x, v0.z, v1.x, v1.z); let o = vec4<f32>(v0.y, v0.w, v1.y, v1.w);"
    : "let e = v0; let o = v1;";
  const put = wt === "q4"
    ? "words[k] = pack4xI8Clamp(qe); words[4u + k] = pack4xI8Clamp(qo);"
    : "words[2u * k] = pack4xI8Clamp(qe); words[2u * k + 1u] = pack4xI8Clamp(qo);";
  // The block's 8 vec4s of the input, read and transformed once, kept in registers.
  const xin = Array.from({ length: 8 }, (_, i) => `let xb${i} = ${vin(`8u * b + ${i}u`, i)};`);
  const quads = Array.from({ length: 4 }, (_, k) => `
    {
      let k = ${k}u;
      let v0 = xb${2 * k};
      let v1 = xb${2 * k + 1};
      ${order}
      let qe = vec4<i32>(round(e / sc));
      let qo = vec4<i32>(round(o / sc));
      qs += qe + qo;
      ${put}
    }`).join("");
  return `
  for (var b = ${out.first ?? "tid"}; b < ${blocks}; b += ${step}) {${
    out.prelude ? `\n    ${out.prelude}` : ""
  }
    ${xin.join("\n    ")}
    var m = ${Array.from({ length: 8 }, (_, i) => `abs(xb${i})`).reduce((a, c) => `max(${a}, ${c})`)};
    let amax = max(max(m.x, m.y), max(m.z, m.w));
    let sc = select(amax / 127.0, 1.0, amax == 0.0);
    var words: array<u32, 8>;
    var qs = vec4<i32>(0);${quads}
    ${out.words ? out.words(0) : q(lo)} = vec4<u32>(words[0], words[1], words[2], words[3]);
    ${out.words ? out.words(1) : q(hi)} = vec4<u32>(words[4], words[5], words[6], words[7]);
    ${out.scale ?? s("b")} = vec2<f32>(sc, sc * f32(qs.x + qs.y + qs.z + qs.w));
  }`;
}

/**
 * The int8 copy of its output that a producer kernel makes for the int8 direct multi-token GEMV reading it
 * next (instead of that GEMV's input pass, gemv_multi.ts gemvInt8InputCall: one dependent dispatch less): its
 * two storage bindings, `oq` (the words) and `oqs` (each block's (scale, scale x sum q)), from binding
 * `first`.
 */
export function int8CopyBindingsWgsl(first: number): string {
  return `@group(0) @binding(${first}) var<storage, read_write> oq: array<vec4<u32>>;
@group(0) @binding(${first + 1}) var<storage, read_write> oqs: array<vec2<f32>>;`;
}

/**
 * WGSL quantising, into the copy's layout (int8BlocksWgsl's, for a consumer of K inputs a row), blocks of 32
 * f32 values this workgroup wrote to storage: `blocks` blocks from block `gb0` of each of `rows` rows from
 * row `row0`, all rows x blocks shared out over the workgroup's `WG` threads from `tid` (block `cb` of row
 * row0 + `cr` a thread),
 * vec4 i of a block at `vec4At(i)` (an expression of cr, cb). The caller puts a storageBarrier() before it,
 * so the writes are visible to the other threads of the workgroup.
 */
export function int8CopyTailWgsl(
  wt: QuantType,
  d: {
    K: number;
    row0: string;
    rows: string;
    blocks: string;
    gb0: string;
    vec4At: (i: number) => string;
    WG: string;
    /** WGSL run first for each block (after cr, cb and cg are named). */
    prelude?: string;
  },
): string {
  const NB = d.K / 32;
  // The block's words: q4 [row][even vec4s of its NB blocks | odd ones], q8 [row][block][2].
  const at = `(${d.row0} + cr) * ${2 * NB}u + ${wt === "q4" ? "cg" : "2u * cg"}`;
  return int8BlocksWgsl(wt, (_k, i) => d.vec4At(i), `(${d.rows}) * (${d.blocks})`, d.WG, undefined, {
    first: "tid",
    prelude: `let cr = b / (${d.blocks});\n    let cb = b % (${d.blocks});\n    let cg = ${d.gb0} + cb;${
      d.prelude ? `\n    ${d.prelude}` : ""
    }`,
    words: (half) => `oq[${at}${half === 0 ? "" : wt === "q4" ? ` + ${NB}u` : " + 1u"}]`,
    scale: `oqs[(${d.row0} + cr) * ${NB}u + cg]`,
  });
}

/**
 * The integer dot product (i32) of a 16-byte weight unit `w` (vec4<u32>) with its int8 input from
 * int8BlocksWgsl: q4 (32 codes c = q + 8) with the block's words `x` = [even vec4, odd vec4], q8 (16
 * values) with the unit's vec4 of words. A q4 unit's value is then scale * (xs.x * dot - 8 xs.y), a q8
 * unit's scale * xs.x * dot (xs = the block's xqs).
 */
export function dp4Dot(wt: QuantType, w: string, x: string | [string, string]): string {
  const c = ["x", "y", "z", "w"];
  if (wt === "q8") return c.map((k) => `dot4I8Packed(${w}.${k}, ${x}.${k})`).join(" + ");
  const [e, o] = x as [string, string];
  return c.map((k) =>
    `dot4I8Packed(${w}.${k} & 0x0F0F0F0Fu, ${e}.${k}) + dot4I8Packed((${w}.${k} >> 4u) & 0x0F0F0F0Fu, ${o}.${k})`
  ).join(" + ");
}

/** The 4 norm weights at vec4 index `i` of `nw` (bound as vec2<u32> for f16, vec4<f32> for f32), or of `name`. */
export function normWeightVec4(nwt: WeightType, i: string, name = "nw"): string {
  return normWeightOf(nwt, `${name}[${i}]`);
}

/** A norm-weight vec4 as f32 from its raw element `raw` (nw[i] loaded earlier, as normWeightVec4's bindings). */
export function normWeightOf(nwt: WeightType, raw: string): string {
  return nwt === "f16" ? `vec4<f32>(unpack2x16float(${raw}.x), unpack2x16float(${raw}.y))` : raw;
}

/** Norm weight `n` (a scalar index) from the same bindings as normWeightVec4. */
export function normWeightAt(nwt: WeightType, n: string, name = "nw"): string {
  return nwt === "f16"
    ? `unpack2x16float(${name}[(${n}) / 4u][((${n}) / 2u) % 2u])[(${n}) % 2u]`
    : `${name}[(${n}) / 4u][(${n}) % 4u]`;
}

/**
 * The GEMV family's uniform struct and bindings (gemv_fused.ts's call layout, shared by gemv_sg.ts and
 * gemv_multi.ts, staged and direct): params, x (vec4 rows), W (f32 vec4s, or 16-byte units as vec4<u32>), y,
 * and with RMSNorm its weights (f32 vec4s or f16 pairs). `int8` (the int8 direct multi-token GEMV): x is the
 * int8 copy of the transformed rows instead, `xq` words at binding 1 and `xqs` block scales at binding 4.
 */
export function gemvBindingsWgsl(wt: string, rmsnorm: boolean, nwt: string, int8 = false): string {
  return `struct P { K: u32, N: u32, T: u32, acc: u32, x_row0: u32, eps: f32, soff: u32 }
@group(0) @binding(0) var<uniform> p: P;
${
    int8
      ? "@group(0) @binding(1) var<storage, read> xq: array<vec4<u32>>;"
      : "@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;"
  }
@group(0) @binding(2) var<storage, read> W: ${wt === "f32" ? "array<vec4<f32>>" : "array<vec4<u32>>"};
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
${
    int8
      ? "@group(0) @binding(4) var<storage, read> xqs: array<vec2<f32>>;"
      : rmsnorm
      ? `@group(0) @binding(4) var<storage, read> nw: array<${nwt === "f16" ? "vec2<u32>" : "vec4<f32>"}>;`
      : ""
  }`;
}

/**
 * The float units of the GEMV kernels: a 16-byte weight unit `w` of f32 (one vec4) or f16 (8 halves)
 * weights dotted with its x vec4s (x1 unused for f32), or decoded into `let` vec4<f32>s `${name}_0`,
 * `${name}_1` (floatUnitWgsl) to be used with several inputs.
 */
export function floatUnitDot(wt: "f32" | "f16", w: string, x0: string, x1: string): string {
  return wt === "f32"
    ? `dot(${w}, ${x0})`
    : `dot(vec4<f32>(unpack2x16float(${w}.x), unpack2x16float(${w}.y)), ${x0}) + ` +
      `dot(vec4<f32>(unpack2x16float(${w}.z), unpack2x16float(${w}.w)), ${x1})`;
}

export function floatUnitWgsl(wt: "f32" | "f16", name: string, w: string): string[] {
  return wt === "f32" ? [`let ${name}_0 = ${w};`] : [
    `let ${name}_0 = vec4<f32>(unpack2x16float(${w}.x), unpack2x16float(${w}.y));`,
    `let ${name}_1 = vec4<f32>(unpack2x16float(${w}.z), unpack2x16float(${w}.w));`,
  ];
}

/** SiLU(g) * u for vec4 expressions g (evaluated once: pass a name) and u. */
export function siluMulVec4(g: string, u: string): string {
  return `${g} / (vec4<f32>(1.0) + exp(-${g})) * ${u}`;
}

/**
 * SiLU(g) * u for f32 expressions g (evaluated once: pass a name) and u: the paired gate/up GEMVs' output
 * (gemv_sg.ts, gemv_multi.ts, moe_sg.ts), the same formula as siluMulVec4.
 */
export function siluMul(g: string, u: string): string {
  return `${g} / (1.0 + exp(-${g})) * ${u}`;
}

/**
 * The 16x16 tiled matmul (y[t, n] (+)= sum_k x[t, k] W[n, k], any shape): x and W tiles staged in
 * workgroup memory, clamped reads past the edges counted as zero. `wAt(e)` reads weight e = n * K + k as
 * f32 (the tile loader's one difference between storage formats); `params` declares struct P with at
 * least K, N, T, acc, x_row0.
 */
export function tiledMatmulSource(o: {
  enable?: string;
  params: string;
  wDecl: string;
  helpers?: string;
  wAt: (e: string) => string;
}): string {
  return `${o.enable ?? ""}
${o.params}
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> W: ${o.wDecl};
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
var<workgroup> xs: array<array<f32, 17>, 16>;
var<workgroup> ws: array<array<f32, 17>, 16>;
${o.helpers ?? ""}
@compute @workgroup_size(16, 16)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  let n = wg.x * 16u + lid.x;
  let t = wg.y * 16u + lid.y;
  let wn = wg.x * 16u + lid.y;
  var acc = 0.0;
  for (var k0 = 0u; k0 < p.K; k0 += 16u) {
    let k = k0 + lid.x;
    xs[lid.y][lid.x] = select(0.0, x[(p.x_row0 + min(t, p.T - 1u)) * p.K + min(k, p.K - 1u)], t < p.T && k < p.K);
    ws[lid.y][lid.x] = select(0.0, ${
    o.wAt("min(wn, p.N - 1u) * p.K + min(k, p.K - 1u)")
  }, wn < p.N && k < p.K);
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
