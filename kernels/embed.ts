// Embedding gather: x[t, :] = table[tokens[pos0 + t], :]. The token buffer is indexed by position, so
// a decode step reads the token that the previous step's sampler wrote, without a round trip to the CPU.
// A q8 / q4 table (quant.ts) is dequantised per element: with tied embeddings it is also the head.
import {
  ceilDiv,
  type Gpu,
  type KernelCall,
  kernelCall,
  pipeline,
  uniformBuffer,
  type WeightType,
  weightType,
} from "./gpu.ts";
import { isQuant, quantElementWgsl, quantFits, quantScaleWord, type QuantType } from "./quant.ts";
import { STEP_WGSL } from "./step.ts";

function source(wt: WeightType | QuantType): string {
  const q = isQuant(wt);
  const w = q ? { enable: "", type: "u32" } : weightType(wt);
  return `${w.enable}
${STEP_WGSL}
struct P { H: u32, V: u32, soff: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> step: Step;
@group(0) @binding(2) var<storage, read> tokens: array<u32>;
@group(0) @binding(3) var<storage, read> table: array<${w.type}>;
@group(0) @binding(4) var<storage, read_write> x: array<f32>;
${q ? quantElementWgsl(wt, "table") : ""}
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
  let i = g.x;
  let t = g.y;
  if (i >= p.H || t >= step.T) { return; }
  let tok = min(tokens[step.pos0 + t], p.V - 1u);
  x[t * p.H + i] = ${q ? "table_at(tok * p.H + i, p.soff)" : "f32(table[tok * p.H + i])"};
}`;
}

export interface EmbedDims {
  hidden: number;
  vocab: number;
  /** Rows dispatched (the step's T must not exceed it). */
  T: number;
}

/** x[T, H] from token ids; out-of-range ids are clamped here and rejected on the CPU before upload. */
export function embedCall(
  gpu: Gpu,
  bufs: { step: GPUBuffer; tokens: GPUBuffer; table: GPUBuffer; x: GPUBuffer },
  dims: EmbedDims & { weights: WeightType | QuantType },
): KernelCall {
  const wt = dims.weights;
  if (isQuant(wt) && !quantFits(dims.hidden)) {
    throw new RangeError(`${wt} table needs hidden % 32 == 0, got ${dims.hidden}`);
  }
  const pipe = pipeline(gpu, source(wt));
  const soff = isQuant(wt) ? quantScaleWord(dims.vocab, dims.hidden, wt) : 0;
  const params = uniformBuffer(gpu, [dims.hidden, dims.vocab, soff]);
  return kernelCall(gpu, pipe, [params, bufs.step, bufs.tokens, bufs.table, bufs.x], [
    ceilDiv(dims.hidden, 256),
    dims.T,
  ], "embed");
}

export function embedRef(table: Float32Array, tokens: ArrayLike<number>, hidden: number): Float32Array {
  const x = new Float32Array(tokens.length * hidden);
  for (let t = 0; t < tokens.length; t++) {
    x.set(table.subarray(tokens[t] * hidden, (tokens[t] + 1) * hidden), t * hidden);
  }
  return x;
}
