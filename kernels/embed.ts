// Embedding gather: x[t, :] = table[tokens[pos0 + t], :]. The token buffer is indexed by position, so
// a decode step reads the token that the previous step's sampler wrote, without a round trip to the CPU.
// A q8 / q4 table (quant.ts) is dequantised per element: with tied embeddings it is also the head.
// With `copyOut` (the first layer's qkv GEMV in the int8 direct mode) the same dispatch also writes that
// GEMV's input copy, as the layers' last GEMVs write the next layer's: x times the norm weights in int8 blocks
// of 32 and each block's sum of squares of x, so the GEMV needs no input pass (a dependent dispatch less).
import type { Int8CopyOut } from "./gemv_fused.ts";
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
import { int8BlocksWgsl, normWeightVec4 } from "./wgsl.ts";

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

/**
 * The copy mode: a thread a block of 32 values of one token's row, read into registers, written to x as vec4s,
 * its sum of squares to `ossq` and the block times the norm weights quantised (int8BlocksWgsl) into the
 * consumer's layout: q4 [T][even vec4s of the NB blocks | odd ones], q8 [T][NB][2], scales [T][NB].
 */
function copySource(wt: WeightType | QuantType, copy: QuantType, nwt: WeightType, H: number): string {
  const q = isQuant(wt);
  const w = q ? { enable: "", type: "u32" } : weightType(wt);
  const NB = H / 32;
  const val = (e: string) => q ? `table_at(${e}, p.soff)` : `f32(table[${e}])`;
  const r8 = Array.from({ length: 8 }, (_, i) => i);
  return `${w.enable}
${STEP_WGSL}
struct P { H: u32, V: u32, soff: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> step: Step;
@group(0) @binding(2) var<storage, read> tokens: array<u32>;
@group(0) @binding(3) var<storage, read> table: array<${w.type}>;
@group(0) @binding(4) var<storage, read_write> x: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read_write> oq: array<vec4<u32>>;
@group(0) @binding(6) var<storage, read_write> oqs: array<vec2<f32>>;
@group(0) @binding(7) var<storage, read> onw: array<${nwt === "f16" ? "vec2<u32>" : "vec4<f32>"}>;
@group(0) @binding(8) var<storage, read_write> ossq: array<f32>;
${q ? quantElementWgsl(wt, "table") : ""}
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
  let blk = g.x;
  let t = g.y;
  if (blk >= ${NB}u || t >= step.T) { return; }
  let e0 = min(tokens[step.pos0 + t], p.V - 1u) * p.H + 32u * blk;
  ${
    r8.map((i) => `let r${i} = vec4<f32>(${[0, 1, 2, 3].map((c) => val(`e0 + ${4 * i + c}u`)).join(", ")});`)
      .join("\n  ")
  }
  ${r8.map((i) => `x[t * ${H / 4}u + 8u * blk + ${i}u] = r${i};`).join("\n  ")}
  ossq[t * ${NB}u + blk] = ${r8.map((i) => `dot(r${i}, r${i})`).join(" + ")};${
    int8BlocksWgsl(
      copy,
      (_k, i) => `r${i} * ${normWeightVec4(nwt, `8u * blk + ${i}u`, "onw")}`,
      `${NB}u`,
      `${NB}u`,
      undefined,
      {
        first: "blk",
        words: (half) =>
          `oq[t * ${2 * NB}u + ${
            copy === "q4" ? `blk${half ? ` + ${NB}u` : ""}` : `2u * blk${half ? " + 1u" : ""}`
          }]`,
        scale: `oqs[t * ${NB}u + blk]`,
      },
    )
  }
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
  bufs: { step: GPUBuffer; tokens: GPUBuffer; table: GPUBuffer; x: GPUBuffer; copyOut?: Int8CopyOut },
  dims: EmbedDims & { weights: WeightType | QuantType },
): KernelCall {
  const wt = dims.weights;
  const copy = bufs.copyOut;
  if ((isQuant(wt) || copy) && !quantFits(dims.hidden)) {
    throw new RangeError(
      `a ${copy ? "copy of x" : `${wt} table`} needs hidden % 32 == 0, got ${dims.hidden}`,
    );
  }
  if (copy && (!copy.norm || !copy.ssq)) {
    throw new TypeError("embed writes an RMSNorm consumer's copy: norm and ssq");
  }
  const pipe = pipeline(gpu, copy ? copySource(wt, copy.weights, copy.norm!.type, dims.hidden) : source(wt));
  const soff = isQuant(wt) ? quantScaleWord(dims.vocab, dims.hidden, wt) : 0;
  const params = uniformBuffer(gpu, [dims.hidden, dims.vocab, soff]);
  const out = copy ? [copy.q, copy.s, copy.norm!.w, copy.ssq!] : [];
  return kernelCall(gpu, pipe, [params, bufs.step, bufs.tokens, bufs.table, bufs.x, ...out], [
    copy ? ceilDiv(dims.hidden / 32, 64) : ceilDiv(dims.hidden, 256),
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
