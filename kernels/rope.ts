// Rotary position embedding (Llama's rotate-half layout) applied to the q and k parts of the fused qkv
// activations, writing rotated k and plain v into the layer's KV cache at their positions.
// cos/sin come from a table built on the CPU (ropeTable), so every scaling rule (none, llama3, later yarn)
// lives in one place in plain TypeScript and the angles match transformers' f32 computation exactly.
import { ceilDiv, type Gpu, type KernelCall, kernelCall, pipeline, uniformBuffer } from "./gpu.ts";
import { STEP_WGSL } from "./step.ts";

const SOURCE = `${STEP_WGSL}
struct P { n_heads: u32, n_kv: u32, hd: u32, max_seq: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> step: Step;
@group(0) @binding(2) var<storage, read> cs: array<vec2<f32>>;
@group(0) @binding(3) var<storage, read_write> qkv: array<f32>;
@group(0) @binding(4) var<storage, read_write> kc: array<f32>;
@group(0) @binding(5) var<storage, read_write> vc: array<f32>;
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
  kc[cb + i] = a0 * c.x - a1 * c.y;
  kc[cb + i + half] = a1 * c.x + a0 * c.y;
  vc[cb + i] = qkv[vb + i];
  vc[cb + i + half] = qkv[vb + i + half];
}`;

export interface RopeScaling {
  type: "llama3";
  factor: number;
  lowFreqFactor: number;
  highFreqFactor: number;
  originalMaxPositionEmbeddings: number;
}

/** Inverse frequencies as transformers computes them (f32), with llama3 scaling applied when given. */
export function ropeInvFreq(headDim: number, theta: number, scaling: RopeScaling | null): Float32Array {
  const half = headDim / 2;
  const inv = new Float32Array(half);
  for (let i = 0; i < half; i++) inv[i] = 1 / Math.pow(theta, (2 * i) / headDim);
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

/** cos/sin pairs [positions, headDim/2] with the angle rounded to f32 as transformers does. */
export function ropeTable(invFreq: Float32Array, positions: number): Float32Array {
  const half = invFreq.length;
  const out = new Float32Array(positions * half * 2);
  for (let p = 0; p < positions; p++) {
    for (let i = 0; i < half; i++) {
      const angle = Math.fround(p * invFreq[i]);
      out[(p * half + i) * 2] = Math.cos(angle);
      out[(p * half + i) * 2 + 1] = Math.sin(angle);
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
}

export function ropeKvCall(
  gpu: Gpu,
  bufs: { step: GPUBuffer; table: GPUBuffer; qkv: GPUBuffer; kcache: GPUBuffer; vcache: GPUBuffer },
  d: RopeDims,
): KernelCall {
  if (d.headDim % 2 !== 0) throw new RangeError(`head_dim must be even for RoPE, got ${d.headDim}`);
  const params = uniformBuffer(gpu, [d.heads, d.kvHeads, d.headDim, d.maxSeq]);
  return kernelCall(gpu, pipeline(gpu, SOURCE), [
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
