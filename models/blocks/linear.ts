// One linear layer of a block, y (+)= f(x) @ W^T, with an optional RMSNorm of x folded in: the fused GEMV
// (the norm computed as the row is read) where the step has at most 16 tokens and the row length allows, else
// rmsnorm into `normed` and the tiled matmul. Every block builds its projections through here.
import {
  gemmHalfInput,
  GEMV_MULTI_MAX_T,
  gemvFusedCalls,
  gemvFusedFits,
  type KernelCall,
  prefillLinearCalls,
  rmsnormCall,
} from "../../kernels/mod.ts";
import type { BlockContext } from "./context.ts";

export interface LinearBuffers {
  x: GPUBuffer;
  w: GPUBuffer;
  y: GPUBuffer;
  /** RMSNorm weight for x (each row normalised first); needs `normed` scratch of [T, K] when not fused. */
  norm?: GPUBuffer;
  normed?: GPUBuffer;
}

export function linear(
  ctx: BlockContext,
  b: LinearBuffers,
  d: { K: number; N: number; T: number; accumulate?: boolean; eps?: number },
): KernelCall[] {
  const { gpu, normType } = ctx;
  const weights = ctx.typeOf(b.w);
  const eps = d.eps ?? ctx.eps;
  const dims = { K: d.K, N: d.N, T: d.T, accumulate: d.accumulate, weights };
  const gemm = { ...dims, f16Math: ctx.gemmF16 };
  // M <= 16 -> the GEMV family (one row, or 2..16 rows sharing each weight read: kernels/gemv_multi.ts).
  if (d.T <= GEMV_MULTI_MAX_T && gemvFusedFits(d.K)) {
    return gemvFusedCalls(gpu, { x: b.x, w: b.w, y: b.y, normWeight: b.norm }, {
      ...dims,
      ...(b.norm ? { transform: "rmsnorm" as const, normWeights: normType, eps } : {}),
    });
  }
  if (!b.norm) return prefillLinearCalls(gpu, { x: b.x, w: b.w, y: b.y }, gemm);
  if (!b.normed) throw new TypeError("a normed linear layer off the fused path needs `normed` scratch");
  return normedPrefillCalls(ctx, { x: b.x, norm: b.norm, normed: b.normed, w: b.w, y: b.y }, {
    ...dims,
    eps,
  });
}

/**
 * A prefill projection of RMSNorm(x): the norm into `normed` ([T, K], written as f16 where the GEMM
 * multiplies in f16 and so reads f16: gemmHalfInput), then the GEMM (or the tiled matmul; `yHalf`, y as f16
 * for a GEMM reading it as f16, takes the GEMM).
 */
export function normedPrefillCalls(
  ctx: BlockContext,
  b: { x: GPUBuffer; norm: GPUBuffer; normed: GPUBuffer; w: GPUBuffer; y: GPUBuffer },
  d: { K: number; N: number; T: number; accumulate?: boolean; eps: number; yHalf?: boolean },
): KernelCall[] {
  const { gpu, normType } = ctx;
  const weights = ctx.typeOf(b.w);
  const half = gemmHalfInput(gpu, d, weights, ctx.gemmF16);
  return [
    rmsnormCall(gpu, { x: b.x, w: b.norm, y: b.normed }, {
      hidden: d.K,
      rows: d.T,
      eps: d.eps,
      weights: normType,
      half,
    }),
    ...prefillLinearCalls(gpu, { x: b.normed, w: b.w, y: b.y }, {
      K: d.K,
      N: d.N,
      T: d.T,
      accumulate: d.accumulate,
      weights,
      xHalf: half,
      yHalf: d.yHalf,
      f16Math: ctx.gemmF16,
    }),
  ];
}
