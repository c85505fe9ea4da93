// Rotary position embedding (Llama's rotate-half layout) applied to the q and k parts of the fused qkv
// activations, writing rotated k and plain v into the layer's KV cache at their positions.
// cos/sin come from a table built on the CPU (ropeTable), so every scaling rule (none, llama3, yarn) lives in
// one place in plain TypeScript and the angles match transformers' f32 computation exactly.
import {
  ceilDiv,
  type Gpu,
  type KernelCall,
  kernelCall,
  type KvType,
  kvWgsl,
  memoSource,
  pipeline,
  uniformBuffer,
} from "./gpu.ts";
import { STEP_WGSL } from "./step.ts";

/** The kernel for a cache of `kv` elements (an f16 cache rounds each value as it is written). */
const source = memoSource((kv: KvType) => {
  const w = kvWgsl(kv);
  const st = (e: string) => w.store(1, e);
  return `${w.enable}${STEP_WGSL}
struct P { n_heads: u32, n_kv: u32, hd: u32, max_seq: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> step: Step;
@group(0) @binding(2) var<storage, read> cs: array<vec2<f32>>;
@group(0) @binding(3) var<storage, read_write> qkv: array<f32>;
@group(0) @binding(4) var<storage, read_write> kc: array<${w.vec(1)}>;
@group(0) @binding(5) var<storage, read_write> vc: array<${w.vec(1)}>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
  let i = g.x;
  let head = g.y;
  let t = g.z;
  let half = p.hd / 2u;
  if (i >= half || t >= step.T) { return; }
  let pos = step.pos0 + t;
  let c = cs[pos * half + i];
  let row = t * (p.n_heads + 2u * p.n_kv) * p.hd;
  if (head < p.n_heads) {
    let b = row + head * p.hd;
    let a0 = qkv[b + i];
    let a1 = qkv[b + i + half];
    qkv[b + i] = a0 * c.x - a1 * c.y;
    qkv[b + i + half] = a1 * c.x + a0 * c.y;
    return;
  }
  let kvh = head - p.n_heads;
  let kb = row + (p.n_heads + kvh) * p.hd;
  let vb = row + (p.n_heads + p.n_kv + kvh) * p.hd;
  let a0 = qkv[kb + i];
  let a1 = qkv[kb + i + half];
  let cb = (kvh * p.max_seq + pos) * p.hd;
  kc[cb + i] = ${st("a0 * c.x - a1 * c.y")};
  kc[cb + i + half] = ${st("a1 * c.x + a0 * c.y")};
  vc[cb + i] = ${st("qkv[vb + i]")};
  vc[cb + i + half] = ${st("qkv[vb + i + half]")};
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
  const params = uniformBuffer(gpu, [d.heads, d.kvHeads, d.headDim, d.maxSeq]);
  return kernelCall(gpu, pipeline(gpu, source(d.kv ?? "f32")), [
    params,
    bufs.step,
    bufs.table,
    bufs.qkv,
    bufs.kcache,
    bufs.vcache,
  ], [
    ceilDiv(d.headDim / 2, 64),
    d.heads + d.kvHeads,
    d.T,
  ], "rope_kv");
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
