// RMSNorm over each attention head's q and k, in place in the fused qkv activations [T, (nH + 2 nKV) * hd]
// (Qwen3's q_norm / k_norm, applied before RoPE): heads 0..nH-1 with the q weights, the next nKV with the
// k weights; v is untouched. One workgroup per (head, token); f32 arithmetic and weights.
import { type Gpu, type KernelCall, kernelCall, pipeline, uniformBuffer } from "./gpu.ts";

const SOURCE = `
struct P { n_heads: u32, n_kv: u32, hd: u32, eps: f32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> wq: array<f32>;
@group(0) @binding(2) var<storage, read> wk: array<f32>;
@group(0) @binding(3) var<storage, read_write> qkv: array<f32>;
var<workgroup> red: array<f32, 64>;
@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  let head = wg.x;
  let t = wg.y;
  let tid = lid.x;
  let base = (t * (p.n_heads + 2u * p.n_kv) + head) * p.hd;
  var s = 0.0;
  for (var i = tid; i < p.hd; i += 64u) { let v = qkv[base + i]; s += v * v; }
  red[tid] = s;
  workgroupBarrier();
  for (var stride = 32u; stride > 0u; stride >>= 1u) {
    if (tid < stride) { red[tid] += red[tid + stride]; }
    workgroupBarrier();
  }
  let inv = inverseSqrt(red[0] / f32(p.hd) + p.eps);
  for (var i = tid; i < p.hd; i += 64u) {
    let w = select(wk[i], wq[i], head < p.n_heads);
    qkv[base + i] = qkv[base + i] * inv * w;
  }
}`;

export function headNormCall(
  gpu: Gpu,
  bufs: { qkv: GPUBuffer; wq: GPUBuffer; wk: GPUBuffer },
  d: { heads: number; kvHeads: number; headDim: number; T: number; eps: number },
): KernelCall {
  const params = uniformBuffer(gpu, [d.heads, d.kvHeads, d.headDim, d.eps], [3]);
  return kernelCall(gpu, pipeline(gpu, SOURCE), [params, bufs.wq, bufs.wk, bufs.qkv], [
    d.heads + d.kvHeads,
    d.T,
  ], "head_norm");
}

/** CPU reference: returns a normalised copy of qkv [T, (nH + 2 nKV) * hd]. */
export function headNormRef(
  qkv: Float32Array,
  wq: Float32Array,
  wk: Float32Array,
  d: { heads: number; kvHeads: number; headDim: number; eps: number },
): Float32Array {
  const out = qkv.slice();
  const hd = d.headDim;
  const row = (d.heads + 2 * d.kvHeads) * hd;
  for (let t = 0; t < qkv.length / row; t++) {
    for (let h = 0; h < d.heads + d.kvHeads; h++) {
      const b = t * row + h * hd;
      let s = 0;
      for (let i = 0; i < hd; i++) s += qkv[b + i] ** 2;
      const inv = 1 / Math.sqrt(s / hd + d.eps);
      const w = h < d.heads ? wq : wk;
      for (let i = 0; i < hd; i++) out[b + i] = qkv[b + i] * inv * w[i];
    }
  }
  return out;
}
