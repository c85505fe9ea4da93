// The SiLU-gated MLP's middle: a[t, i] = silu(gu[t, i]) * gu[t, I + i], where gu is the fused
// gate/up projection [T, 2I] (gate rows first, then up rows, as the model loader concatenates them).
import { ceilDiv, type Gpu, type KernelCall, kernelCall, pipeline, uniformBuffer } from "./gpu.ts";

const SOURCE = `
struct P { I: u32, T: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> gu: array<f32>;
@group(0) @binding(2) var<storage, read_write> a: array<f32>;
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
  let i = g.x;
  let t = g.y;
  if (i >= p.I || t >= p.T) { return; }
  let x = gu[t * 2u * p.I + i];
  a[t * p.I + i] = x / (1.0 + exp(-x)) * gu[t * 2u * p.I + p.I + i];
}`;

export function siluMulCall(
  gpu: Gpu,
  bufs: { gu: GPUBuffer; a: GPUBuffer },
  d: { intermediate: number; T: number },
): KernelCall {
  const params = uniformBuffer(gpu, [d.intermediate, d.T]);
  return kernelCall(gpu, pipeline(gpu, SOURCE), [params, bufs.gu, bufs.a], [
    ceilDiv(d.intermediate, 256),
    d.T,
  ], "silu_mul");
}

export function siluMulRef(gu: Float32Array, intermediate: number): Float32Array {
  const T = gu.length / (2 * intermediate);
  const a = new Float32Array(T * intermediate);
  for (let t = 0; t < T; t++) {
    for (let i = 0; i < intermediate; i++) {
      const x = gu[t * 2 * intermediate + i];
      a[t * intermediate + i] = (x / (1 + Math.exp(-x))) * gu[t * 2 * intermediate + intermediate + i];
    }
  }
  return a;
}
