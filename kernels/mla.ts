// Multi-head latent attention (MLA: DeepSeek-V2/V3, Kimi K2) with a compressed KV cache: per token and
// layer the cache keeps the normalised latent c [kv_lora_rank] and the shared roped key [qk_rope_head_dim],
// and the key / value up-projections (kv_b_proj) are absorbed into the query and output sides instead of
// expanding K and V per head. One token, nH heads, R = kv_lora_rank, dn / dr = qk_nope / qk_rope_head_dim,
// dv = v_head_dim (the engine's GEMVs marked "engine"):
//   q        = q_proj(xn)  or  q_b_proj(rmsnorm(q_a_proj(xn)))        [nH, dn + dr]    engine
//   kv       = kv_a_proj_with_mqa(xn)                                 [R + dr]         engine
//   mlaRopeCacheCall:  q[h, dn:] = rope(q[h, dn:], pos)                                in place
//                      cache[pos] = [rmsnorm(kv[:R]) * kv_a_layernorm, rope(kv[R:], pos)]   [R + dr]
//   mlaAbsorbCall:     qLatent[h] = W_UK_h^T q[h, :dn]                 [nH, R]
//   mlaAttentionCalls: ctx[h] = sum_s softmax_s(scale (qLatent[h] . c_s + q[h, dn:] . kRope_s)) c_s
//                                                                      [nH, R]          (mla_attention.ts)
//   mlaValueCall:      out[h] = W_UV_h ctx[h]                          [nH * dv]
//   x       += o_proj(out)                                                              engine
// since q_nope . (W_UK_h c_s) = (W_UK_h^T q_nope) . c_s and sum_s p_s (W_UV_h c_s) = W_UV_h sum_s p_s c_s,
// with W_UK_h / W_UV_h head h's dn / dv rows of kv_b_proj.weight [nH (dn + dv), R] (mlaSplitKvB).
// RoPE: transformers' DeepSeek-V3 rotates interleaved pairs (x0, x1), (x2, x3), ... by default
// (`rope_interleave`, true by default), else rotate-half pairs (x_i, x_{i + dr/2}); here each pair is rotated
// where it lies, for q and k alike, so their dot products are transformers' (which also permutes both).
// The cos/sin table carries yarn's attention factor (ropeTable's attentionFactor).
import {
  ceilDiv,
  type Gpu,
  type KernelCall,
  kernelCall,
  pipeline,
  releaseCalls,
  uniformBuffer,
  type WeightType,
} from "./gpu.ts";
import { type KvType, kvWgsl } from "./kv.ts";
import { type RopeScaling, yarnGetMscale } from "./rope.ts";
import { STEP_WGSL } from "./step.ts";
import { range } from "./wgsl.ts";

/** An MLA layer's shape, named as DeepseekV3Config names it. */
export interface MlaDims {
  /** num_attention_heads. */
  heads: number;
  /** kv_lora_rank: width of the latent c. */
  kvLoraRank: number;
  /** qk_nope_head_dim: the part of each q / k head without RoPE. */
  qkNopeHeadDim: number;
  /** qk_rope_head_dim: the roped part (even); one shared key part for all heads. */
  qkRopeHeadDim: number;
  /** v_head_dim. */
  vHeadDim: number;
  /** Capacity of the latent cache in positions. */
  maxSeq: number;
  /** Tokens dispatched (the step's T must not exceed it). */
  T: number;
  /**
   * Floats between token rows of q (default heads * (dn + dr)): wider when q is the front of a fused
   * projection's output whose rows also hold kv (q_lora_rank null: [q | kv] from one GEMV).
   */
  qStride?: number;
  /**
   * Element type of the latent cache (default f32). f16: rows are written rounded to f16 (the step's own
   * row too, so this step attends to it as later steps read it back) and widened to f32 as they are read.
   */
  kv?: KvType;
  /**
   * The most keys the program's steps attend to, where its builder knows (a decode program chosen by the
   * cache's length: mlaLengthBucket's bound): decode with many heads keeps one head a workgroup up to
   * MLA_SHORT_KEYS (kernels/mla_attention.ts). Unknown: cut for long caches.
   */
  keys?: number;
}

/** Bytes per token per layer: the latent cache's [c, kRope], and expanded K and V as transformers keeps them. */
export function mlaKvBytesPerToken(
  d: Pick<MlaDims, "heads" | "kvLoraRank" | "qkNopeHeadDim" | "qkRopeHeadDim" | "vHeadDim">,
  bytesPerValue = 4,
): { latent: number; expanded: number } {
  return {
    latent: (d.kvLoraRank + d.qkRopeHeadDim) * bytesPerValue,
    expanded: d.heads * (d.qkNopeHeadDim + d.qkRopeHeadDim + d.vHeadDim) * bytesPerValue,
  };
}

/**
 * DeepseekV3Attention's softmax scale: qk_head_dim^-0.5 (qk_head_dim = qk_nope + qk_rope), times
 * yarnGetMscale(factor, mscale_all_dim)^2 when the rope scaling has a non-zero mscale_all_dim (transformers'
 * `yarn_apply_mscale`).
 */
export function mlaSoftmaxScale(
  qkHeadDim: number,
  scaling: RopeScaling | null,
): number {
  const base = qkHeadDim ** -0.5;
  if (scaling?.type !== "yarn" || !scaling.mscaleAllDim) return base;
  const m = yarnGetMscale(scaling.factor, scaling.mscaleAllDim);
  return base * m * m;
}

/**
 * kv_b_proj.weight [heads * (dn + dv), R] (as the checkpoint stores it, head h's rows being its dn key rows
 * then its dv value rows) cut into the kernels' layouts: wUK [heads, R, dn] (each head's key block
 * transposed, for mlaAbsorbCall) and wUV [heads, dv, R] (the value blocks as stored, for mlaValueCall).
 */
export function mlaSplitKvB(
  kvB: Float32Array,
  d: Pick<MlaDims, "heads" | "kvLoraRank" | "qkNopeHeadDim" | "vHeadDim">,
): { wUK: Float32Array; wUV: Float32Array } {
  const { heads: NH, kvLoraRank: R, qkNopeHeadDim: DN, vHeadDim: DV } = d;
  if (kvB.length !== NH * (DN + DV) * R) {
    throw new RangeError(`kv_b_proj has ${kvB.length} values, expected ${NH * (DN + DV)} x ${R}`);
  }
  const wUK = new Float32Array(NH * R * DN);
  const wUV = new Float32Array(NH * DV * R);
  for (let h = 0; h < NH; h++) {
    const rows = h * (DN + DV);
    for (let j = 0; j < DN; j++) {
      for (let r = 0; r < R; r++) wUK[(h * R + r) * DN + j] = kvB[(rows + j) * R + r];
    }
    wUV.set(kvB.subarray((rows + DN) * R, (rows + DN + DV) * R), h * DV * R);
  }
  return { wUK, wUV };
}

function checkDims(d: MlaDims, what: string): void {
  for (
    const k of ["heads", "kvLoraRank", "qkNopeHeadDim", "qkRopeHeadDim", "vHeadDim", "maxSeq", "T"] as const
  ) {
    if (!Number.isInteger(d[k]) || d[k] < 1) {
      throw new RangeError(`${what}: ${k} must be a positive integer, got ${d[k]}`);
    }
  }
  if (d.qkRopeHeadDim % 2 !== 0) {
    throw new RangeError(`${what}: qkRopeHeadDim must be even, got ${d.qkRopeHeadDim}`);
  }
  const qRow = d.heads * (d.qkNopeHeadDim + d.qkRopeHeadDim);
  if (d.qStride !== undefined && !(Number.isInteger(d.qStride) && d.qStride >= qRow)) {
    throw new RangeError(
      `${what}: qStride must be an integer >= heads * (dn + dr) = ${qRow}, got ${d.qStride}`,
    );
  }
}

// ---- RoPE of q and of the new keys, latent cache write ----

function ropeCacheSource(d: MlaDims, interleaved: boolean, normWeights: WeightType, kvInQ: boolean): string {
  const HALF = d.qkRopeHeadDim / 2;
  const pair = interleaved ? ["2u * i", "2u * i + 1u"] : ["i", `i + ${HALF}u`];
  const nw = normWeights === "f16" ? "unpack2x16float(nw[i >> 1u])[i & 1u]" : "nw[i]";
  const w = kvWgsl(d.kv);
  const src = `${w.enable}${STEP_WGSL}
struct P { kv_stride: u32, kv_off: u32, eps: f32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> step: Step;
@group(0) @binding(2) var<storage, read> cs: array<vec2<f32>>;
@group(0) @binding(3) var<storage, read_write> q: array<f32>;
${kvInQ ? "" : "@group(0) @binding(4) var<storage, read> kv: array<f32>;"}
@group(0) @binding(${kvInQ ? 4 : 5}) var<storage, read> nw: array<${normWeights === "f16" ? "u32" : "f32"}>;
@group(0) @binding(${kvInQ ? 5 : 6}) var<storage, read_write> cache: array<${w.vec(1)}>;
const NH = ${d.heads}u;
const DN = ${d.qkNopeHeadDim}u;
const DR = ${d.qkRopeHeadDim}u;
const HALF = ${HALF}u;
const R = ${d.kvLoraRank}u;
const CW = ${d.kvLoraRank + d.qkRopeHeadDim}u;
var<workgroup> red: array<f32, 64>;
var<workgroup> live: u32;
@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  let h = wg.x;
  let t = wg.y;
  let j = lid.x;
  if (j == 0u) { live = select(0u, 1u, t < step.T); }
  if (workgroupUniformLoad(&live) == 0u) { return; }
  let pos = step.pos0 + t;
  if (h < NH) {
    // Workgroup h < heads: q head h's rope part, in place.
    let b = t * ${d.qStride ?? d.heads * (d.qkNopeHeadDim + d.qkRopeHeadDim)}u + h * (DN + DR) + DN;
    for (var i = j; i < HALF; i += 64u) {
      let c = cs[pos * HALF + i];
      let a0 = q[b + ${pair[0]}];
      let a1 = q[b + ${pair[1]}];
      q[b + ${pair[0]}] = a0 * c.x - a1 * c.y;
      q[b + ${pair[1]}] = a1 * c.x + a0 * c.y;
    }
    return;
  }
  // The last workgroup: cache[pos] = [rmsnorm(c) * w, rope(k)].
  let kb = t * p.kv_stride + p.kv_off;
  var s = 0.0;
  for (var i = j; i < R; i += 64u) { let v = kv[kb + i]; s += v * v; }
  red[j] = s;
  workgroupBarrier();
  for (var stride = 32u; stride > 0u; stride >>= 1u) {
    if (j < stride) { red[j] += red[j + stride]; }
    workgroupBarrier();
  }
  let inv = inverseSqrt(red[0] / f32(R) + p.eps);
  let cb = pos * CW;
  for (var i = j; i < R; i += 64u) { cache[cb + i] = ${w.store(1, `kv[kb + i] * inv * f32(${nw})`)}; }
  for (var i = j; i < HALF; i += 64u) {
    let c = cs[pos * HALF + i];
    let a0 = kv[kb + R + ${pair[0]}];
    let a1 = kv[kb + R + ${pair[1]}];
    cache[cb + R + ${pair[0]}] = ${w.store(1, "a0 * c.x - a1 * c.y")};
    cache[cb + R + ${pair[1]}] = ${w.store(1, "a1 * c.x + a0 * c.y")};
  }
}`;
  // kv read from the q binding (one buffer holds both: a binding may not be read-only and writable at once).
  return kvInQ ? src.replaceAll("kv[", "q[") : src;
}

/** What the rope + cache write reads and writes (mlaRopeCacheCall's list); the fused decode takes them too. */
export interface MlaRopeBuffers {
  step: GPUBuffer;
  table: GPUBuffer;
  q: GPUBuffer;
  kv: GPUBuffer;
  kvNorm: GPUBuffer;
  cache: GPUBuffer;
}

/**
 * For each of the step's tokens t (position pos = step.pos0 + t): rotates the rope part of every q head in
 * place, and writes the latent cache row pos = [rmsnorm(kv[t, :R]) * kvNorm, rope(kv[t, R:])].
 *   table  ropeTable(ropeInvFreq(qkRopeHeadDim, theta, scaling), maxSeq, { attentionFactor })
 *   q      [T, heads * (dn + dr)] f32, the q projection's output; head h's [nope, rope] at h (dn + dr)
 *   kv     kv_a_proj_with_mqa's output: row t [c (R), k_rope (dr)] at t * kvStride + kvOffset (f32)
 *   kvNorm kv_a_layernorm.weight [R] (f32, or f16 with normWeights "f16")
 *   cache  [maxSeq, R + dr] of d.kv (default f32), this layer's latent cache
 * Options: eps (transformers' kv_a_layernorm keeps its default 1e-6, not rms_norm_eps), interleaved
 * (config.rope_interleave; transformers' default is true), kvStride (default R + dr), kvOffset (default 0:
 * set both when kv is a slice of a wider fused output), normWeights (default "f32").
 */
export function mlaRopeCacheCall(
  gpu: Gpu,
  bufs: MlaRopeBuffers,
  d: MlaDims & {
    eps: number;
    interleaved: boolean;
    kvStride?: number;
    kvOffset?: number;
    normWeights?: WeightType;
  },
): KernelCall {
  checkDims(d, "MLA rope + cache");
  if (d.kv === "f16" && !gpu.hasF16) throw new RangeError("MLA rope + cache: an f16 cache needs shader-f16");
  const kvStride = d.kvStride ?? d.kvLoraRank + d.qkRopeHeadDim;
  const kvOffset = d.kvOffset ?? 0;
  if (
    kvStride < d.kvLoraRank + d.qkRopeHeadDim || kvOffset < 0 ||
    kvOffset + d.kvLoraRank + d.qkRopeHeadDim > kvStride
  ) {
    throw new RangeError(
      `MLA rope + cache: kv rows of ${
        d.kvLoraRank + d.qkRopeHeadDim
      } at offset ${kvOffset} do not fit a stride of ${kvStride}`,
    );
  }
  const params = uniformBuffer(gpu, [kvStride, kvOffset, d.eps], [2]);
  const kvInQ = bufs.kv === bufs.q;
  const qRow = d.heads * (d.qkNopeHeadDim + d.qkRopeHeadDim);
  if (kvInQ && (d.qStride ?? qRow) < qRow + d.kvLoraRank + d.qkRopeHeadDim) {
    throw new RangeError(`MLA rope + cache: q and kv in one buffer need a q stride of at least both rows`);
  }
  const src = ropeCacheSource(d, d.interleaved, d.normWeights ?? "f32", kvInQ);
  const buffers = [params, bufs.step, bufs.table, bufs.q, bufs.kv, bufs.kvNorm, bufs.cache];
  return kernelCall(
    gpu,
    pipeline(gpu, src),
    kvInQ ? buffers.filter((_, i) => i !== 4) : buffers,
    [d.heads + 1, d.T],
    "mla_rope_cache",
  );
}

/**
 * mlaRopeCacheCall and mlaAbsorbCall as one dispatch: they are independent (the rope rotates q's rope parts,
 * the absorption reads its nope parts), so the absorption's workgroups simply follow the rope's
 * (heads + 1 of them) in the grid, saving a dependent dispatch (a barrier: several microseconds on the H200).
 */
export function mlaRopeAbsorbCall(
  gpu: Gpu,
  bufs: MlaRopeBuffers & { wUK: GPUBuffer; qLatent: GPUBuffer },
  d: MlaDims & {
    eps: number;
    interleaved: boolean;
    kvStride?: number;
    kvOffset?: number;
    normWeights?: WeightType;
    weights: WeightType;
  },
): KernelCall {
  const rope = mlaRopeCacheCall(gpu, bufs, d);
  const absorb = mlaAbsorbCall(gpu, bufs, d);
  releaseCalls([absorb]);
  const kvInQ = bufs.kv === bufs.q;
  const ropeSrc = ropeCacheSource(d, d.interleaved, d.normWeights ?? "f32", kvInQ);
  const { heads, kvLoraRank: R, qkNopeHeadDim: DN, qkRopeHeadDim: DR } = d;
  const { code: absorbSrc, rowsPerGroup } = headGemvSource({
    heads,
    N: R,
    K: DN,
    T: d.T,
    xRow: d.qStride ?? heads * (DN + DR),
    xHead: DN + DR,
    yRow: heads * R,
    yHead: R,
    weights: d.weights,
  });
  const blocks = ceilDiv(R, rowsPerGroup);
  const first = kvInQ ? 6 : 7; // the absorption's bindings follow the rope's
  const head =
    "@compute @workgroup_size(64)\nfn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>)";
  if (!ropeSrc.includes(head) || !absorbSrc.includes(head)) {
    throw new Error("MLA kernel sources changed shape");
  }
  const absorbPart = absorbSrc
    .replace("@group(0) @binding(0) var<storage, read> x: array<f32>;\n", "")
    .replace(
      "@group(0) @binding(1) var<storage, read> W:",
      `@group(0) @binding(${first}) var<storage, read> W:`,
    )
    .replace(
      "@group(0) @binding(2) var<storage, read_write> y:",
      `@group(0) @binding(${first + 1}) var<storage, read_write> y:`,
    )
    .replaceAll("x[", "q[")
    .replaceAll("red", "red_a")
    .replace(head, "fn absorb_main(wg: vec3<u32>, lid: vec3<u32>)");
  const code = `${ropeSrc.replace(head, "fn rope_main(wg: vec3<u32>, lid: vec3<u32>)")}
${absorbPart}
${head} {
  if (wg.x <= NH) {
    rope_main(wg, lid);
  } else {
    let b = wg.x - NH - 1u;
    absorb_main(vec3<u32>(b % ${blocks}u, b / ${blocks}u, wg.y), lid);
  }
}`;
  return kernelCall(
    gpu,
    pipeline(gpu, code),
    [...rope.buffers, bufs.wUK, bufs.qLatent],
    [heads + 1 + blocks * heads, d.T],
    "mla_rope_absorb",
  );
}

/** Rotates one vector's pairs in place, where they lie (interleaved (2i, 2i+1), else (i, i + half)). */
export function mlaRopeRef(
  v: Float32Array,
  table: Float32Array,
  o: { pos: number; interleaved: boolean },
): void {
  const { pos, interleaved } = o;
  const half = v.length / 2;
  for (let i = 0; i < half; i++) {
    const c = table[(pos * half + i) * 2], s = table[(pos * half + i) * 2 + 1];
    const i0 = interleaved ? 2 * i : i, i1 = interleaved ? 2 * i + 1 : i + half;
    const a0 = v[i0], a1 = v[i1];
    v[i0] = a0 * c - a1 * s;
    v[i1] = a1 * c + a0 * s;
  }
}

// ---- per-head GEMVs: the absorption of q_nope and the value up-projection ----

/** y[t, h, n] = sum_k W[h, n, k] x[t * xRow + h * xHead + k] into y[t * yRow + h * yHead + n]. */
interface HeadGemv {
  heads: number;
  N: number;
  K: number;
  T: number;
  xRow: number;
  xHead: number;
  yRow: number;
  yHead: number;
  weights: WeightType;
}

function headGemvSource(g: HeadGemv): { code: string; rowsPerGroup: number } {
  const f16 = g.weights === "f16";
  // Weights per load: 4 (a vec4 of f32, or 4 halves in a vec2<u32>) when K % 4 == 0, else 2 halves in a
  // u32 (f16, K even), else one.
  const VW = g.K % 4 === 0 ? 4 : f16 && g.K % 2 === 0 ? 2 : 1;
  const NU = g.K / VW;
  let TL = 1; // lanes per row, a power of two, about 4 loads each
  while (TL < 64 && TL * 4 < NU) TL *= 2;
  const decl = VW === 4 ? (f16 ? "vec2<u32>" : "vec4<f32>") : f16 ? "u32" : "f32";
  const xs = (n: number) => range(n).map((i) => `x[xb + ${n}u * u + ${i}u]`).join(", ");
  let body: string;
  if (VW === 4) {
    const w = f16
      ? "let wv = W[wrow / 4u + u];\n      let w = vec4<f32>(unpack2x16float(wv.x), unpack2x16float(wv.y));"
      : "let w = W[wrow / 4u + u];";
    body = `${w}\n      a += dot(w, vec4<f32>(${xs(4)}));`;
  } else if (VW === 2) {
    body = `a += dot(unpack2x16float(W[wrow / 2u + u]), vec2<f32>(${xs(2)}));`;
  } else {
    body = f16
      ? "let e = wrow + u;\n      a += unpack2x16float(W[e >> 1u])[e & 1u] * x[xb + u];"
      : "a += W[wrow + u] * x[xb + u];";
  }
  const code = `
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> W: array<${decl}>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
const N = ${g.N}u;
const K = ${g.K}u;
const NU = ${NU}u;
const TL = ${TL}u;
var<workgroup> red: array<f32, 64>;
@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  let tid = lid.x;
  let lane = tid % TL;
  let n = wg.x * ${64 / TL}u + tid / TL;
  let h = wg.y;
  let t = wg.z;
  let xb = t * ${g.xRow}u + h * ${g.xHead}u;
  let wrow = (h * N + min(n, N - 1u)) * K;
  var a = 0.0;
  for (var u = lane; u < NU; u += TL) {
      ${body}
  }
  red[tid] = a;
  workgroupBarrier();
  for (var s = TL / 2u; s > 0u; s >>= 1u) {
    if (lane < s) { red[tid] += red[tid + s]; }
    workgroupBarrier();
  }
  if (lane == 0u && n < N) { y[t * ${g.yRow}u + h * ${g.yHead}u + n] = red[tid]; }
}`;
  return { code, rowsPerGroup: 64 / TL };
}

function headGemvCall(
  gpu: Gpu,
  bufs: { x: GPUBuffer; w: GPUBuffer; y: GPUBuffer },
  g: HeadGemv,
  label: string,
): KernelCall {
  if (g.weights !== "f32" && g.weights !== "f16") {
    throw new RangeError(`${label}: weights must be f32 or f16, got ${g.weights}`);
  }
  const { code, rowsPerGroup } = headGemvSource(g);
  return kernelCall(gpu, pipeline(gpu, code), [bufs.x, bufs.w, bufs.y], [
    ceilDiv(g.N, rowsPerGroup),
    g.heads,
    g.T,
  ], label);
}

/**
 * qLatent[t, h] = W_UK_h^T q_nope[t, h]: q [T, heads * (dn + dr)] (the nope parts are read), wUK
 * [heads, R, dn] (mlaSplitKvB; f32, or f16 bits with weights "f16"), qLatent [T, heads, R] f32.
 */
export function mlaAbsorbCall(
  gpu: Gpu,
  bufs: { q: GPUBuffer; wUK: GPUBuffer; qLatent: GPUBuffer },
  d: MlaDims & { weights: WeightType },
): KernelCall {
  checkDims(d, "MLA absorb");
  const { heads, kvLoraRank: R, qkNopeHeadDim: DN, qkRopeHeadDim: DR, T } = d;
  return headGemvCall(gpu, { x: bufs.q, w: bufs.wUK, y: bufs.qLatent }, {
    heads,
    N: R,
    K: DN,
    T,
    xRow: d.qStride ?? heads * (DN + DR),
    xHead: DN + DR,
    yRow: heads * R,
    yHead: R,
    weights: d.weights,
  }, "mla_absorb");
}

/**
 * out[t, h] = W_UV_h ctx[t, h]: ctx [T, heads, R] (mlaAttentionCalls), wUV [heads, dv, R] (mlaSplitKvB; f32,
 * or f16 bits with weights "f16"), out [T, heads * dv] f32: o_proj's input.
 */
export function mlaValueCall(
  gpu: Gpu,
  bufs: { ctx: GPUBuffer; wUV: GPUBuffer; out: GPUBuffer },
  d: MlaDims & { weights: WeightType },
): KernelCall {
  checkDims(d, "MLA value");
  const { heads, kvLoraRank: R, vHeadDim: DV, T } = d;
  return headGemvCall(gpu, { x: bufs.ctx, w: bufs.wUV, y: bufs.out }, {
    heads,
    N: DV,
    K: R,
    T,
    xRow: heads * R,
    xHead: R,
    yRow: heads * DV,
    yHead: DV,
    weights: d.weights,
  }, "mla_value");
}

/** Reference of mlaAbsorbCall: qLatent [T, heads, R]. */
export function mlaAbsorbRef(q: Float32Array, wUK: Float32Array, d: MlaDims): Float32Array {
  const { heads: NH, kvLoraRank: R, qkNopeHeadDim: DN, qkRopeHeadDim: DR, T } = d;
  const out = new Float32Array(T * NH * R);
  for (let t = 0; t < T; t++) {
    for (let h = 0; h < NH; h++) {
      for (let r = 0; r < R; r++) {
        let a = 0;
        for (let j = 0; j < DN; j++) a += wUK[(h * R + r) * DN + j] * q[(t * NH + h) * (DN + DR) + j];
        out[(t * NH + h) * R + r] = a;
      }
    }
  }
  return out;
}

/** Reference of mlaValueCall: out [T, heads * dv]. */
export function mlaValueRef(ctx: Float32Array, wUV: Float32Array, d: MlaDims): Float32Array {
  const { heads: NH, kvLoraRank: R, vHeadDim: DV, T } = d;
  const out = new Float32Array(T * NH * DV);
  for (let t = 0; t < T; t++) {
    for (let h = 0; h < NH; h++) {
      for (let j = 0; j < DV; j++) {
        let a = 0;
        for (let r = 0; r < R; r++) a += wUV[(h * DV + j) * R + r] * ctx[(t * NH + h) * R + r];
        out[(t * NH + h) * DV + j] = a;
      }
    }
  }
  return out;
}

// ---- the un-absorbed reference ----

/**
 * DeepseekV3Attention's math as transformers runs it (f64), before o_proj: K and V expanded per head from
 * kv_b_proj, RoPE as transformers applies it (interleaved: the even and odd elements rotated and laid out as
 * two halves), causal softmax. Inputs: q [T, heads * (dn + dr)] unrotated (tokens at positions pos0..),
 * kv [pos0 + T, R + dr] kv_a_proj_with_mqa's rows for every position, kvNorm [R], kvB [heads * (dn + dv), R],
 * table as for mlaRopeCacheCall. Returns [T, heads * dv].
 */
export function mlaReference(
  x: { q: Float32Array; kv: Float32Array; kvNorm: Float32Array; kvB: Float32Array; table: Float32Array },
  d: Omit<MlaDims, "maxSeq"> & { pos0: number; eps: number; interleaved: boolean; scale: number },
): Float32Array {
  const { heads: NH, kvLoraRank: R, qkNopeHeadDim: DN, qkRopeHeadDim: DR, vHeadDim: DV, T, pos0 } = d;
  const n = pos0 + T;
  const half = DR / 2;
  // transformers' rotation of one rope vector at position pos (apply_rotary_pos_emb[_interleave]).
  const rope = (v: ArrayLike<number>, pos: number): Float64Array => {
    const x1 = new Float64Array(half), x2 = new Float64Array(half);
    for (let i = 0; i < half; i++) {
      x1[i] = d.interleaved ? v[2 * i] : v[i];
      x2[i] = d.interleaved ? v[2 * i + 1] : v[i + half];
    }
    const out = new Float64Array(DR);
    for (let i = 0; i < half; i++) {
      const c = x.table[(pos * half + i) * 2], s = x.table[(pos * half + i) * 2 + 1];
      out[i] = x1[i] * c - x2[i] * s;
      out[i + half] = x2[i] * c + x1[i] * s;
    }
    return out;
  };
  // Per position: the normalised latent, the roped shared key, and every head's k_nope and v.
  const kNope = new Float64Array(n * NH * DN), v = new Float64Array(n * NH * DV);
  const kRope: Float64Array[] = [];
  for (let s = 0; s < n; s++) {
    const row = x.kv.subarray(s * (R + DR), (s + 1) * (R + DR));
    let ss = 0;
    for (let i = 0; i < R; i++) ss += row[i] * row[i];
    const inv = 1 / Math.sqrt(ss / R + d.eps);
    const c = Float64Array.from({ length: R }, (_, i) => row[i] * inv * x.kvNorm[i]);
    kRope.push(rope(row.subarray(R), s));
    for (let h = 0; h < NH; h++) {
      for (let j = 0; j < DN + DV; j++) {
        let a = 0;
        for (let i = 0; i < R; i++) a += x.kvB[(h * (DN + DV) + j) * R + i] * c[i];
        if (j < DN) kNope[(s * NH + h) * DN + j] = a;
        else v[(s * NH + h) * DV + j - DN] = a;
      }
    }
  }
  const out = new Float32Array(T * NH * DV);
  for (let t = 0; t < T; t++) {
    const keys = pos0 + t + 1;
    for (let h = 0; h < NH; h++) {
      const qb = (t * NH + h) * (DN + DR);
      const qRope = rope(x.q.subarray(qb + DN, qb + DN + DR), pos0 + t);
      const sc = new Float64Array(keys);
      for (let s = 0; s < keys; s++) {
        let a = 0;
        for (let j = 0; j < DN; j++) a += x.q[qb + j] * kNope[(s * NH + h) * DN + j];
        for (let j = 0; j < DR; j++) a += qRope[j] * kRope[s][j];
        sc[s] = a * d.scale;
      }
      const m = Math.max(...sc);
      let z = 0;
      for (let s = 0; s < keys; s++) z += sc[s] = Math.exp(sc[s] - m);
      for (let j = 0; j < DV; j++) {
        let a = 0;
        for (let s = 0; s < keys; s++) a += sc[s] * v[(s * NH + h) * DV + j];
        out[(t * NH + h) * DV + j] = a / z;
      }
    }
  }
  return out;
}
