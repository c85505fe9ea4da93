// One linear layer of a block, y (+)= f(x) @ W^T, with an optional RMSNorm of x folded in: the fused GEMV
// (the norm computed as the row is read) where the step has at most 16 tokens and the row length allows, else
// rmsnorm into `normed` and the tiled matmul. Every block builds its projections through here.
import {
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
  // M <= 16 -> the GEMV family (one row, or 2..16 rows sharing each weight read: kernels/gemv_multi.ts).
  if (d.T <= GEMV_MULTI_MAX_T && gemvFusedFits(d.K)) {
    return gemvFusedCalls(gpu, { x: b.x, w: b.w, y: b.y, normWeight: b.norm }, {
      ...dims,
      ...(b.norm ? { transform: "rmsnorm" as const, normWeights: normType, eps } : {}),
    });
  }
  if (!b.norm) return prefillLinearCalls(gpu, { x: b.x, w: b.w, y: b.y }, dims);
  if (!b.normed) throw new TypeError("a normed linear layer off the fused path needs `normed` scratch");
  return [
    rmsnormCall(gpu, { x: b.x, w: b.norm, y: b.normed }, { hidden: d.K, rows: d.T, eps, weights: normType }),
    ...prefillLinearCalls(gpu, { x: b.normed, w: b.w, y: b.y }, dims),
  ];
}
