// Adds a bias vector to every row: y[t, n] += b[n] for t < T, n < N (the q/k/v biases of Qwen2 after the
// fused qkv projection, o_proj's bias after the residual add). The bias is f32 (small; read once a row).
import { ceilDiv, type Gpu, type KernelCall, kernelCall, pipeline, uniformBuffer } from "./gpu.ts";

const SOURCE = `
struct P { N: u32, T: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
  let n = g.x;
  let t = g.y;
  if (n >= p.N || t >= p.T) { return; }
  y[t * p.N + n] += b[n];
}`;

export function biasAddCall(
  gpu: Gpu,
  bufs: { b: GPUBuffer; y: GPUBuffer },
  d: { N: number; T: number },
): KernelCall {
  const params = uniformBuffer(gpu, [d.N, d.T]);
  return kernelCall(
    gpu,
    pipeline(gpu, SOURCE),
    [params, bufs.b, bufs.y],
    [ceilDiv(d.N, 256), d.T],
    "bias_add",
  );
}

export function biasAddRef(y: Float32Array, b: Float32Array): Float32Array {
  const out = y.slice();
  for (let i = 0; i < out.length; i++) out[i] += b[i % b.length];
  return out;
}
