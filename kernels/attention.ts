// Causal attention of T new queries over the KV cache, grouped-query heads, online softmax in chunks of
// 64 keys (one workgroup per (head, token)). q comes from the fused qkv activations; out is [T, heads*hd].
import { type Gpu, type KernelCall, kernelCall, pipeline, uniformBuffer } from "./gpu.ts";
import { type KvType, kvWgsl } from "./kv.ts";
import { STEP_WGSL } from "./step.ts";

/** The largest head_dim this kernel supports (each of 64 threads keeps up to 4 output dims). */
export const MAX_HEAD_DIM = 256;

function source(vec4: boolean, kv: KvType): string {
  const w = kvWgsl(kv, "p.n_kv * p.max_seq * (p.hd / 4u)");
  // Scores: each thread dots q with one key; with head_dim % 4 == 0 it reads the key as vec4s.
  const dot = vec4
    ? `let kb = (cache0 + s) * (p.hd / 4u);
      for (var d = 0u; d < p.hd / 4u; d++) {
        dotv += dot(vec4<f32>(qs[4u * d], qs[4u * d + 1u], qs[4u * d + 2u], qs[4u * d + 3u]), ${
      w.load(4, "kc4", "kb + d", "cache0 + s")
    });
      }`
    : `let kb = (cache0 + s) * p.hd;
      for (var d = 0u; d < p.hd; d++) { dotv += qs[d] * ${w.load1("kc", "kb + d", "cache0 + s")}; }`;
  // Value element d of key row `row` (cache row index).
  const v = (row: string) => w.load1("vc", `(${row}) * p.hd + d`, row);
  return `${w.enable}${STEP_WGSL}
struct P { n_heads: u32, n_kv: u32, hd: u32, max_seq: u32, scale: f32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> step: Step;
@group(0) @binding(2) var<storage, read> qkv: array<f32>;
@group(0) @binding(3) var<storage, read> ${vec4 ? `kc4: array<${w.vec(4)}>` : `kc: array<${w.vec(1)}>`};
@group(0) @binding(4) var<storage, read> vc: array<${w.vec(1)}>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;
var<workgroup> qs: array<f32, ${MAX_HEAD_DIM}>;
var<workgroup> ps: array<f32, 64>;
var<workgroup> red: array<f32, 64>;
var<workgroup> keys: u32;
@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  let h = wg.x;
  let t = wg.y;
  let j = lid.x;
  // The step lives in a storage buffer (the GPU advances it between decode steps), so the key count is
  // made workgroup-uniform explicitly before it bounds a loop with barriers.
  if (j == 0u) { keys = select(0u, step.pos0 + t + 1u, t < step.T); }
  let n = workgroupUniformLoad(&keys);
  if (n == 0u) { return; }
  let kvh = h / (p.n_heads / p.n_kv);
  let qb = t * (p.n_heads + 2u * p.n_kv) * p.hd + h * p.hd;
  for (var d = j; d < p.hd; d += 64u) { qs[d] = qkv[qb + d]; }
  workgroupBarrier();
  var m = -3.0e38;
  var l = 0.0;
  var acc = array<f32, 4>(0.0, 0.0, 0.0, 0.0);
  let cache0 = kvh * p.max_seq;
  for (var base = 0u; base < n; base += 64u) {
    let s = base + j;
    var score = -3.0e38;
    if (s < n) {
      var dotv = 0.0;
      ${dot}
      score = dotv * p.scale;
    }
    red[j] = score;
    workgroupBarrier();
    for (var stride = 32u; stride > 0u; stride >>= 1u) {
      if (j < stride) { red[j] = max(red[j], red[j + stride]); }
      workgroupBarrier();
    }
    let m_new = max(m, red[0]);
    workgroupBarrier();
    let e = select(0.0, exp(score - m_new), s < n);
    ps[j] = e;
    red[j] = e;
    workgroupBarrier();
    for (var stride = 32u; stride > 0u; stride >>= 1u) {
      if (j < stride) { red[j] += red[j + stride]; }
      workgroupBarrier();
    }
    let corr = exp(m - m_new);
    l = l * corr + red[0];
    let count = min(64u, n - base);
    for (var i = 0u; i < 4u; i++) {
      let d = j + i * 64u;
      if (d < p.hd) {
        // Four partial sums, so the loop is not one long chain of dependent adds.
        var a = vec4<f32>(0.0);
        var jj = 0u;
        for (; jj + 4u <= count; jj += 4u) {
          let r = cache0 + base + jj;
          a += vec4<f32>(ps[jj], ps[jj + 1u], ps[jj + 2u], ps[jj + 3u]) *
            vec4<f32>(${v("r")}, ${v("r + 1u")}, ${v("r + 2u")}, ${v("r + 3u")});
        }
        for (; jj < count; jj++) { a.x += ps[jj] * ${v("cache0 + base + jj")}; }
        acc[i] = acc[i] * corr + (a.x + a.y) + (a.z + a.w);
      }
    }
    m = m_new;
    workgroupBarrier();
  }
  for (var i = 0u; i < 4u; i++) {
    let d = j + i * 64u;
    if (d < p.hd) { out[(t * p.n_heads + h) * p.hd + d] = acc[i] / l; }
  }
}`;
}

export interface AttentionDims {
  heads: number;
  kvHeads: number;
  headDim: number;
  maxSeq: number;
  /** Tokens dispatched (the step's T must not exceed it). */
  T: number;
  /** The caches' element type (default f32). */
  kv?: KvType;
}

export function attentionCall(
  gpu: Gpu,
  bufs: { step: GPUBuffer; qkv: GPUBuffer; kcache: GPUBuffer; vcache: GPUBuffer; out: GPUBuffer },
  d: AttentionDims,
): KernelCall {
  if (d.headDim > MAX_HEAD_DIM) throw new RangeError(`head_dim ${d.headDim} exceeds ${MAX_HEAD_DIM}`);
  if (d.heads % d.kvHeads !== 0) {
    throw new RangeError(`heads (${d.heads}) must be a multiple of kv heads (${d.kvHeads})`);
  }
  const params = uniformBuffer(gpu, [d.heads, d.kvHeads, d.headDim, d.maxSeq, 1 / Math.sqrt(d.headDim)], [4]);
  return kernelCall(gpu, pipeline(gpu, source(d.headDim % 4 === 0, d.kv ?? "f32")), [
    params,
    bufs.step,
    bufs.qkv,
    bufs.kcache,
    bufs.vcache,
    bufs.out,
  ], [
    d.heads,
    d.T,
  ], "attention");
}

/**
 * Reference: q [T, heads, hd] at positions pos0.., k/v caches [kvHeads, maxSeq, hd] already holding
 * positions 0..pos0+T-1. Returns [T, heads * hd].
 */
export function attentionRef(
  q: Float32Array,
  kc: Float32Array,
  vc: Float32Array,
  d: AttentionDims & { pos0: number },
): Float32Array {
  const { heads, kvHeads, headDim: hd, maxSeq } = d;
  const out = new Float32Array(d.T * heads * hd);
  const group = heads / kvHeads;
  for (let t = 0; t < d.T; t++) {
    const n = d.pos0 + t + 1;
    for (let h = 0; h < heads; h++) {
      const kvh = Math.floor(h / group);
      const scores = new Float64Array(n);
      for (let s = 0; s < n; s++) {
        let dot = 0;
        for (let i = 0; i < hd; i++) dot += q[(t * heads + h) * hd + i] * kc[(kvh * maxSeq + s) * hd + i];
        scores[s] = dot / Math.sqrt(hd);
      }
      const m = Math.max(...scores);
      let z = 0;
      for (let s = 0; s < n; s++) z += scores[s] = Math.exp(scores[s] - m);
      for (let i = 0; i < hd; i++) {
        let a = 0;
        for (let s = 0; s < n; s++) a += scores[s] * vc[(kvh * maxSeq + s) * hd + i];
        out[(t * heads + h) * hd + i] = a / z;
      }
    }
  }
  return out;
}
