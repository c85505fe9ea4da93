// The gated MLP, pre-normed, adding into the residual:
//   xn  = rmsnorm(x) * post_attention_layernorm     [H]
//   gu  = xn @ [gate_proj; up_proj]^T               [2 I]
//   x  += (silu(gate) * up) @ down_proj^T           [H]
// Decode steps (fused, T <= 16) pair gate and up in one GEMV that writes a = silu(gate) * up [I] where a
// subgroup kernel serves it (gpu.tuning.pairGateUp), else write gu and fold silu_mul into down's staging;
// prefill writes gu and the GEMM reads silu_mul as it stages.
import {
  gemmCalls,
  gemmFits,
  gemmHalfInput,
  gemvFusedCalls,
  type GemvFusedDims,
  gemvPairFits,
  int8CopyFor,
  int8CopyOutFits,
  type KernelCall,
  normCopyFor,
  prefillLinearCalls,
  siluMulCall,
} from "../../kernels/mod.ts";
import type { DenseMlp } from "../config.ts";
import type { BlockContext, LayerLink, StepBuffers, TensorReader } from "./context.ts";
import { normedPrefillCalls } from "./linear.ts";

export interface MlpWeights {
  norm: GPUBuffer;
  gateUp: GPUBuffer;
  down: GPUBuffer;
}

export function mlpWidths(f: DenseMlp): { gu: number; a: number } {
  return { gu: 2 * f.intermediate, a: f.intermediate };
}

export async function loadMlp(
  read: TensorReader,
  f: DenseMlp,
  hidden: number,
  p: string,
): Promise<MlpWeights> {
  return {
    norm: await read([`${p}post_attention_layernorm.weight`]),
    gateUp: await read([`${p}mlp.gate_proj.weight`, `${p}mlp.up_proj.weight`], hidden),
    down: await read([`${p}mlp.down_proj.weight`], f.intermediate),
  };
}

/**
 * The paired gate/up GEMV of a decode-sized step (gemv_sg.ts: it writes silu(gate) * up [T, I]), or undefined
 * where it does not serve (prefill, or no subgroup kernel for the shape).
 */
export function mlpGateUpDims(
  ctx: BlockContext,
  f: DenseMlp,
  w: MlpWeights,
  d: { hidden: number; T: number; fused: boolean },
): GemvFusedDims | undefined {
  const wt = ctx.typeOf(w.gateUp);
  if (!d.fused || !gemvPairFits(ctx.gpu, d.hidden, d.T, wt)) return undefined;
  return {
    K: d.hidden,
    N: f.intermediate,
    T: d.T,
    weights: wt,
    normWeights: ctx.normType,
    transform: "rmsnorm",
    eps: ctx.eps,
    pairs: true,
    int8One: ctx.int8One,
  };
}

export function mlpProgram(
  ctx: BlockContext,
  f: DenseMlp,
  w: MlpWeights,
  bufs: StepBuffers & { scratch: Record<string, GPUBuffer> },
  d: { hidden: number; T: number; fused: boolean; link?: LayerLink },
): KernelCall[] {
  const { gpu, normType, eps } = ctx;
  const wt = (b: GPUBuffer) => ctx.typeOf(b);
  const { x, xn } = bufs;
  const { gu, a } = bufs.scratch;
  const { T, hidden: H } = d;
  const I = f.intermediate;
  // Paired (gemv_sg.ts): the gate/up GEMV writes silu(gate) * up into `a` [T, I] and down reads it as it is.
  const gateUp = mlpGateUpDims(ctx, f, w, d);
  if (gateUp) {
    const down = { K: I, N: H, T, accumulate: true, weights: wt(w.down), int8One: ctx.int8One };
    // k-steps in the int8 direct mode: gate/up writes down's int8 input itself (no input pass for down), and
    // reads its own from the attention's o_proj where that wrote it (d.link).
    const copy = int8CopyOutFits(gpu, gateUp) ? int8CopyFor(gpu, down) : undefined;
    const copyIn = d.link?.copy;
    // down writes the input of the RMSNorm GEMV after the layer (the next layer's qkv or the LM head;
    // normCopyFor): f32 in f32 k-steps; int8 where down's workgroups, widened to whole blocks of 32 rows, stay
    // within int8NormCopyMaxThreads (one-token steps; at 32 lanes not k-steps, which would need 1,024 threads).
    const after = d.link?.after ? normCopyFor(gpu, down, d.link.after.dims, d.link.after.norm) : undefined;
    if (after && d.link) d.link.afterCopy = after;
    return [
      ...gemvFusedCalls(gpu, { x, w: w.gateUp, y: a, normWeight: w.norm, copyIn, copyOut: copy }, gateUp),
      ...gemvFusedCalls(gpu, { x: a, w: w.down, y: x, copyIn: copy, copyOut: after }, down),
    ];
  }
  if (d.fused) {
    return [
      ...gemvFusedCalls(gpu, { x, w: w.gateUp, y: gu, normWeight: w.norm }, {
        K: H,
        N: 2 * I,
        T,
        weights: wt(w.gateUp),
        normWeights: normType,
        transform: "rmsnorm",
        eps,
      }),
      ...gemvFusedCalls(gpu, { x: gu, w: w.down, y: x }, {
        K: I,
        N: H,
        T,
        accumulate: true,
        weights: wt(w.down),
        transform: "silu_mul",
      }),
    ];
  }
  const down = { K: I, N: H, T, accumulate: true, weights: wt(w.down), f16Math: ctx.gemmF16 };
  // gate/up written as f16 where down multiplies in f16 (it would round them as it stages them).
  const guHalf = gemmHalfInput(gpu, down, down.weights, ctx.gemmF16) && gemmFits(H, wt(w.gateUp));
  return [
    ...normedPrefillCalls(ctx, { x, norm: w.norm, normed: xn, w: w.gateUp, y: gu }, {
      K: H,
      N: 2 * I,
      T,
      eps,
      yHalf: guHalf,
    }),
    // The GEMM reads silu(gate) * up as it stages its input; other shapes take the separate kernel.
    ...(gemmFits(I, down.weights)
      ? gemmCalls(gpu, { x: gu, w: w.down, y: x }, { ...down, transform: "silu_mul" as const, xHalf: guHalf })
      : [
        siluMulCall(gpu, { gu, a }, { intermediate: I, T }),
        ...prefillLinearCalls(gpu, { x: a, w: w.down, y: x }, down),
      ]),
  ];
}

export function mlpBuffers(w: MlpWeights): GPUBuffer[] {
  return [w.norm, w.gateUp, w.down];
}
