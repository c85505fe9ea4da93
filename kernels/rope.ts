// Rotary position embedding (Llama's rotate-half layout) applied to the q and k parts of the fused qkv
// activations, writing rotated k and plain v into the layer's KV cache at their positions.
// cos/sin come from a table built on the CPU (ropeTable), so every scaling rule (none, llama3, yarn) lives in
// one place in plain TypeScript and the angles match transformers' f32 computation exactly.
import { type Gpu, type KernelCall, kernelCall, memoSource, pipeline, uniformBuffer } from "./gpu.ts";
import { type KvType, kvWgsl } from "./kv.ts";
import { STEP_WGSL } from "./step.ts";

/** The most head_dim a q8 cache's writer holds in workgroup memory. */
const Q8_MAX_HEAD_DIM = 512;

/**
 * The kernel for a cache of `kv` elements: a workgroup a (token, head), a thread a rotation pair (i, i + half)
 * and every 64th after it. An f16 cache rounds each value as it is written; a q8 cache's workgroup first finds
 * its rows' largest magnitudes, then writes the rows' words and scales (kernels/kv.ts).
 */
const source = memoSource((kv: KvType) => {
  const w = kvWgsl(kv, "p.n_kv * p.max_seq * (p.hd / 4u)");
  const st = (e: string) => w.store(1, e);
  const kvRows = w.q8
    ? `
  // The rows' largest magnitudes (a tree over the workgroup), then each word of four values and the scales.
  var mk = 0.0;
  var mv = 0.0;
  for (var i = lid; i < half; i += 64u) {
    let c = cs[pos * half + i];
    let a0 = qkv[kb + i];
    let a1 = qkv[kb + i + half];
    let r0 = a0 * c.x - a1 * c.y;
    let r1 = a1 * c.x + a0 * c.y;
    rk[i] = r0;
    rk[i + half] = r1;
    rv[i] = qkv[vb + i];
    rv[i + half] = qkv[vb + i + half];
    mk = max(mk, max(abs(r0), abs(r1)));
    mv = max(mv, max(abs(rv[i]), abs(rv[i + half])));
  }
  red[lid] = vec2<f32>(mk, mv);
  workgroupBarrier();
  for (var s = 32u; s > 0u; s >>= 1u) {
    if (lid < s) { red[lid] = max(red[lid], red[lid + s]); }
    workgroupBarrier();
  }
  let sk = ${w.scaleOf("red[0].x")};
  let sv = ${w.scaleOf("red[0].y")};
  let r = kvh * p.max_seq + pos;
  for (var e = lid; e < p.hd / 4u; e += 64u) {
    let k = vec4<f32>(rk[4u * e], rk[4u * e + 1u], rk[4u * e + 2u], rk[4u * e + 3u]);
    let v = vec4<f32>(rv[4u * e], rv[4u * e + 1u], rv[4u * e + 2u], rv[4u * e + 3u]);
    kc[r * (p.hd / 4u) + e] = ${w.store(4, "k", "sk")};
    vc[r * (p.hd / 4u) + e] = ${w.store(4, "v", "sv")};
  }
  if (lid == 0u) {
    ${w.storeScale("kc", "r", "sk")}
    ${w.storeScale("vc", "r", "sv")}
  }`
    : `
  let cb = (kvh * p.max_seq + pos) * p.hd;
  for (var i = lid; i < half; i += 64u) {
    let c = cs[pos * half + i];
    let a0 = qkv[kb + i];
    let a1 = qkv[kb + i + half];
    kc[cb + i] = ${st("a0 * c.x - a1 * c.y")};
    kc[cb + i + half] = ${st("a1 * c.x + a0 * c.y")};
    vc[cb + i] = ${st("qkv[vb + i]")};
    vc[cb + i + half] = ${st("qkv[vb + i + half]")};
  }`;
  return `${w.enable}${STEP_WGSL}
struct P { n_heads: u32, n_kv: u32, hd: u32, max_seq: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> step: Step;
@group(0) @binding(2) var<storage, read> cs: array<vec2<f32>>;
@group(0) @binding(3) var<storage, read_write> qkv: array<f32>;
@group(0) @binding(4) var<storage, read_write> kc: array<${w.vec(1)}>;
@group(0) @binding(5) var<storage, read_write> vc: array<${w.vec(1)}>;${
    w.q8
      ? `
var<workgroup> rk: array<f32, ${Q8_MAX_HEAD_DIM}>;
var<workgroup> rv: array<f32, ${Q8_MAX_HEAD_DIM}>;
var<workgroup> red: array<vec2<f32>, 64>;
var<workgroup> live: u32;`
      : ""
  }
@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let head = wg.y;
  let t = wg.z;
  let half = p.hd / 2u;
  ${
    w.q8
      ? `// The step lives in a storage buffer: whether this token is in it is made workgroup-uniform (barriers follow).
  if (lid == 0u) { live = select(0u, 1u, t < step.T); }
  if (workgroupUniformLoad(&live) == 0u) { return; }`
      : "if (t >= step.T) { return; }"
  }
  let pos = step.pos0 + t;
  let row = t * (p.n_heads + 2u * p.n_kv) * p.hd;
  if (head < p.n_heads) {
    let b = row + head * p.hd;
    for (var i = lid; i < half; i += 64u) {
      let c = cs[pos * half + i];
      let a0 = qkv[b + i];
      let a1 = qkv[b + i + half];
      qkv[b + i] = a0 * c.x - a1 * c.y;
      qkv[b + i + half] = a1 * c.x + a0 * c.y;
    }
    return;
  }
  let kvh = head - p.n_heads;
  let kb = row + (p.n_heads + kvh) * p.hd;
  let vb = row + (p.n_heads + p.n_kv + kvh) * p.hd;${kvRows}
}`;
});

/** llama3 scaling (transformers' `_compute_llama3_parameters`). */
export interface Llama3RopeScaling {
  type: "llama3";
  factor: number;
  lowFreqFactor: number;
  highFreqFactor: number;
  originalMaxPositionEmbeddings: number;
}

/** linear scaling (transformers' `_compute_linear_scaling_rope_parameters`): inverse frequencies / factor. */
export interface LinearRopeScaling {
  type: "linear";
  factor: number;
}

/**
 * yarn scaling (transformers' `_compute_yarn_parameters`), as DeepSeek-V3 and Kimi K2 use it. The config's
 * `rope_scaling` keys, camel-cased; the optional ones default as transformers does.
 */
export interface YarnRopeScaling {
  type: "yarn";
  /** `factor`. (transformers takes max_position_embeddings / original_max_position_embeddings when it is null.) */
  factor: number;
  originalMaxPositionEmbeddings: number;
  /** `beta_fast`: rotations where extrapolation ends. Default 32 (also for 0, as transformers' `or 32`). */
  betaFast?: number;
  /** `beta_slow`: rotations where interpolation begins. Default 1 (also for 0). */
  betaSlow?: number;
  /** `mscale`: numerator of the derived attention factor, used only with mscaleAllDim (both non-zero). */
  mscale?: number;
  /** `mscale_all_dim`: denominator of the attention factor; DeepSeek also scales the softmax by its mscale^2. */
  mscaleAllDim?: number;
  /** `attention_factor`: multiplies cos and sin. Default derived (ropeAttentionFactor). */
  attentionFactor?: number;
  /** `truncate`: round the correction range outward to whole dimensions. Default true. */
  truncate?: boolean;
}

/** A config's RoPE scaling, by type (null: plain RoPE). */
export type RopeScaling = Llama3RopeScaling | YarnRopeScaling | LinearRopeScaling;

/** Inverse frequencies as transformers computes them (f32), with llama3, yarn or linear scaling applied when given. */
export function ropeInvFreq(
  headDim: number,
  theta: number,
  scaling: RopeScaling | null,
): Float32Array {
  if (scaling?.type === "yarn") return yarnInvFreq(headDim, theta, scaling);
  const half = headDim / 2;
  const inv = new Float32Array(half);
  for (let i = 0; i < half; i++) inv[i] = 1 / Math.pow(theta, (2 * i) / headDim);
  if (scaling?.type === "linear") { for (let i = 0; i < half; i++) inv[i] = inv[i] / scaling.factor; }
  if (scaling?.type === "llama3") {
    const { factor, lowFreqFactor: lo, highFreqFactor: hi, originalMaxPositionEmbeddings: old } = scaling;
    const lowWl = old / lo;
    const highWl = old / hi;
    for (let i = 0; i < half; i++) {
      const wl = (2 * Math.PI) / inv[i];
      if (wl > lowWl) inv[i] = inv[i] / factor;
      else if (wl >= highWl) {
        const smooth = (old / wl - lo) / (hi - lo);
        inv[i] = (1 - smooth) * (inv[i] / factor) + smooth * inv[i];
      }
    }
  }
  return inv;
}

/** yarn's magnitude scale for a context `scale`-times longer (`get_mscale` / DeepSeek's `yarn_get_mscale`). */
export function yarnGetMscale(scale: number, mscale = 1): number {
  return scale <= 1 ? 1 : 0.1 * mscale * Math.log(scale) + 1;
}

/**
 * The factor yarn multiplies cos and sin by (transformers' `attention_factor`): the given one, else
 * mscale(factor, mscale) / mscale(factor, mscaleAllDim) when both are non-zero, else mscale(factor).
 * 1 for no scaling or llama3. Pass it to ropeTable.
 */
export function ropeAttentionFactor(
  scaling: RopeScaling | null,
): number {
  if (scaling?.type !== "yarn") return 1;
  const { factor, mscale, mscaleAllDim, attentionFactor } = scaling;
  if (attentionFactor !== undefined) return attentionFactor;
  if (mscale && mscaleAllDim) return yarnGetMscale(factor, mscale) / yarnGetMscale(factor, mscaleAllDim);
  return yarnGetMscale(factor);
}

/**
 * yarn: each frequency blends the interpolated (theta^(2i/d) * factor)^-1 and the original theta^(-2i/d) by a
 * linear ramp over the dimensions between beta_fast and beta_slow rotations in the original context. Each
 * step is rounded to f32 where transformers computes in f32 (torch tensors), kept f64 where it is Python.
 */
function yarnInvFreq(dim: number, theta: number, s: YarnRopeScaling): Float32Array {
  const f = Math.fround;
  if (!(s.factor > 0) || !(s.originalMaxPositionEmbeddings > 0)) {
    throw new RangeError(
      `yarn needs factor > 0 and original_max_position_embeddings > 0, got ${s.factor} and ${s.originalMaxPositionEmbeddings}`,
    );
  }
  const betaFast = s.betaFast || 32;
  const betaSlow = s.betaSlow || 1;
  const correctionDim = (rotations: number) =>
    (dim * Math.log(s.originalMaxPositionEmbeddings / (rotations * 2 * Math.PI))) / (2 * Math.log(theta));
  let low = correctionDim(betaFast);
  let high = correctionDim(betaSlow);
  if (s.truncate ?? true) {
    low = Math.floor(low);
    high = Math.ceil(high);
  }
  low = Math.max(low, 0);
  high = Math.min(high, dim - 1);
  if (low === high) high += 0.001;
  const half = dim / 2;
  const inv = new Float32Array(half);
  for (let i = 0; i < half; i++) {
    const posFreq = f(Math.pow(theta, f((2 * i) / dim)));
    const extrapolation = f(1 / posFreq);
    const interpolation = f(1 / f(s.factor * posFreq));
    const ramp = Math.min(1, Math.max(0, f(f(i - f(low)) / f(high - low))));
    const extrapolationFactor = f(1 - ramp);
    inv[i] = f(f(interpolation * f(1 - extrapolationFactor)) + f(extrapolation * extrapolationFactor));
  }
  return inv;
}

/**
 * cos/sin pairs [positions, headDim/2] with the angle rounded to f32 as transformers does, each times
 * `attentionFactor` (default 1; yarn's ropeAttentionFactor) rounded to f32 as transformers does.
 */
export function ropeTable(
  invFreq: Float32Array,
  positions: number,
  opts: { attentionFactor?: number } = {},
): Float32Array {
  const half = invFreq.length;
  const af = opts.attentionFactor ?? 1;
  const out = new Float32Array(positions * half * 2);
  for (let p = 0; p < positions; p++) {
    for (let i = 0; i < half; i++) {
      const angle = Math.fround(p * invFreq[i]);
      out[(p * half + i) * 2] = Math.fround(Math.cos(angle)) * af;
      out[(p * half + i) * 2 + 1] = Math.fround(Math.sin(angle)) * af;
    }
  }
  return out;
}

export interface RopeDims {
  heads: number;
  kvHeads: number;
  headDim: number;
  /** Capacity of the KV cache in positions. */
  maxSeq: number;
  /** Tokens dispatched (the step's T must not exceed it). */
  T: number;
  /** The caches' element type (default f32). */
  kv?: KvType;
}

export function ropeKvCall(
  gpu: Gpu,
  bufs: { step: GPUBuffer; table: GPUBuffer; qkv: GPUBuffer; kcache: GPUBuffer; vcache: GPUBuffer },
  d: RopeDims,
): KernelCall {
  if (d.headDim % 2 !== 0) throw new RangeError(`head_dim must be even for RoPE, got ${d.headDim}`);
  if (d.kv === "q8" && (d.headDim % 4 !== 0 || d.headDim > Q8_MAX_HEAD_DIM)) {
    throw new RangeError(`a q8 KV cache needs head_dim % 4 == 0 and <= ${Q8_MAX_HEAD_DIM}, got ${d.headDim}`);
  }
  const params = uniformBuffer(gpu, [d.heads, d.kvHeads, d.headDim, d.maxSeq]);
  return kernelCall(
    gpu,
    pipeline(gpu, source(d.kv ?? "f32")),
    [
      params,
      bufs.step,
      bufs.table,
      bufs.qkv,
      bufs.kcache,
      bufs.vcache,
    ],
    [1, d.heads + d.kvHeads, d.T],
    "rope_kv",
  );
}

/** Rotates one head vector in place (reference). */
export function ropeRef(v: Float32Array, table: Float32Array, pos: number): void {
  const half = v.length / 2;
  for (let i = 0; i < half; i++) {
    const c = table[(pos * half + i) * 2], s = table[(pos * half + i) * 2 + 1];
    const a0 = v[i], a1 = v[i + half];
    v[i] = a0 * c - a1 * s;
    v[i + half] = a1 * c + a0 * s;
  }
}
