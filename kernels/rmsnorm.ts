// RMSNorm as Llama computes it (in f32): y = x / sqrt(mean(x^2) + eps) * w, one workgroup per row.
// `srcRow0` lets the head normalise only the last row of a prefill chunk; `half` writes y as f16 (the
// input of a prefill GEMM that multiplies in f16: kernels/gemm.ts gemmHalfInput).
import {
  type Gpu,
  type KernelCall,
  kernelCall,
  pipeline,
  uniformBuffer,
  type WeightType,
  weightType,
} from "./gpu.ts";

function source(wt: WeightType, half: boolean): string {
  const w = weightType(wt);
  return `${w.enable || (half ? "enable f16;" : "")}
struct P { H: u32, eps: f32, src_row0: u32, rows: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<${w.type}>;
@group(0) @binding(3) var<storage, read_write> y: array<${half ? "f16" : "f32"}>;
var<workgroup> red: array<f32, 256>;
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  let r = wg.x;
  let tid = lid.x;
  let src = (p.src_row0 + r) * p.H;
  var s = 0.0;
  for (var i = tid; i < p.H; i += 256u) { let v = x[src + i]; s += v * v; }
  red[tid] = s;
  workgroupBarrier();
  for (var stride = 128u; stride > 0u; stride >>= 1u) {
    if (tid < stride) { red[tid] += red[tid + stride]; }
    workgroupBarrier();
  }
  let inv = inverseSqrt(red[0] / f32(p.H) + p.eps);
  for (var i = tid; i < p.H; i += 256u) { y[r * p.H + i] = ${
    half ? "f16" : ""
  }(x[src + i] * inv * f32(w[i])); }
}`;
}

export function rmsnormCall(
  gpu: Gpu,
  bufs: { x: GPUBuffer; w: GPUBuffer; y: GPUBuffer },
  dims: { hidden: number; rows: number; eps: number; srcRow0?: number; weights: WeightType; half?: boolean },
): KernelCall {
  if (dims.half && !gpu.hasF16) {
    throw new RangeError(`an f16 RMSNorm output needs shader-f16 (${gpu.adapterName})`);
  }
  const pipe = pipeline(gpu, source(dims.weights, dims.half === true));
  const params = uniformBuffer(gpu, [dims.hidden, dims.eps, dims.srcRow0 ?? 0, dims.rows], [1]);
  return kernelCall(gpu, pipe, [params, bufs.x, bufs.w, bufs.y], [dims.rows], "rmsnorm");
}

export function rmsnormRef(x: Float32Array, w: Float32Array, hidden: number, eps: number): Float32Array {
  const y = new Float32Array(x.length);
  for (let r = 0; r < x.length / hidden; r++) {
    let s = 0;
    for (let i = 0; i < hidden; i++) s += x[r * hidden + i] ** 2;
    const inv = 1 / Math.sqrt(s / hidden + eps);
    for (let i = 0; i < hidden; i++) y[r * hidden + i] = x[r * hidden + i] * inv * w[i];
  }
  return y;
}
