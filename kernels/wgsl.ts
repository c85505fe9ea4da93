// WGSL snippets the GEMV family shares, in one place: the team reduction and store, the RMSNorm prologue of
// the team kernels, the quantised formats' decoding, and the input transforms of one vec4 of x (a staged
// tile's loader: RMSNorm's weight, SiLU(gate) * up), and the 16x16 tiled matmul whose W tile loader is the
// one thing the float and quantised versions change.
import type { WeightType } from "./gpu.ts";

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
 * WGSL shared by the quantised GEMVs (gemv_sg.ts, gemv_multi.ts, matmul_quant.ts, moe_gemv.ts), which both bind the matrix as
 * `W: array<vec4<u32>>` and its scales' word offset as `p.soff`: decoding 4 weights of a word, and group g's
 * bf16 scale.
 */
export const QUANT_DECODE_WGSL = `
fn group_scale(g: u32) -> f32 {
  let sw = W[p.soff / 4u + g / 8u][(g / 2u) % 4u];
  return bitcast<f32>(select(sw << 16u, sw & 0xffff0000u, (g & 1u) == 1u));
}
fn q8v(w: u32) -> vec4<f32> {
  let s = bitcast<i32>(w);
  return vec4<f32>(vec4<i32>(s << 24u, s << 16u, s << 8u, s) >> vec4<u32>(24u));
}
fn q4v(w: u32, sh: u32) -> vec4<f32> {
  return vec4<f32>((vec4<u32>(w) >> vec4<u32>(sh, sh + 4u, sh + 8u, sh + 12u)) & vec4<u32>(15u));
}`;

/** The 4 norm weights at vec4 index `i` of `nw` (bound as vec2<u32> for f16, vec4<f32> for f32). */
export function normWeightVec4(nwt: WeightType, i: string): string {
  return nwt === "f16" ? `vec4<f32>(unpack2x16float(nw[${i}].x), unpack2x16float(nw[${i}].y))` : `nw[${i}]`;
}

/** SiLU(g) * u for vec4 expressions g (evaluated once: pass a name) and u. */
export function siluMulVec4(g: string, u: string): string {
  return `${g} / (vec4<f32>(1.0) + exp(-${g})) * ${u}`;
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
