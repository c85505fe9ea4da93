// y[t, n] (+)= sum_k x[t, k] * W[n, k]: every linear layer (W as the checkpoint stores it, [out, in]).
// Up to GEMV_MULTI_MAX_T rows with K % 8 == 0 this is the GEMV family (gemv_fused.ts: one row on the
// subgroup or team kernel, 2..16 rows on gemv_multi.ts, each weight read once); otherwise a 16x16 tiled
// matmul (any shape; prefill). `accumulate` adds into y (residual connections). q8 / q4 weights: the same
// GEMVs, or matmul_quant.ts's tiled variant.
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
import { gemvFusedCall, gemvFusedFits } from "./gemv_fused.ts";
import { GEMV_MULTI_MAX_T } from "./gemv_multi.ts";
import { tiledQuantSource } from "./matmul_quant.ts";
import { isQuant, quantFits, quantScaleWord, type QuantType } from "./quant.ts";
import { tiledMatmulSource } from "./wgsl.ts";

/**
 * Up to this many rows the MoE FFN (moe_ffn.ts) runs its experts as per-token GEMVs rather than grouped.
 * (Every other linear layer takes the GEMV family up to GEMV_MULTI_MAX_T rows: gemv_multi.ts.)
 */
export const GEMV_MAX_T = 4;

const PARAMS = `struct P { K: u32, N: u32, T: u32, acc: u32, x_row0: u32 }`;

function tiledSource(wt: WeightType): string {
  const w = weightType(wt);
  return tiledMatmulSource({
    enable: w.enable,
    params: PARAMS,
    wDecl: `array<${w.type}>`,
    wAt: (e) => `f32(W[${e}])`,
  });
}

export interface MatmulDims {
  /** Input features (columns of W). */
  K: number;
  /** Output features (rows of W). */
  N: number;
  /** Rows of x to multiply (tokens). */
  T: number;
  /** Add into y instead of overwriting it. Default false. */
  accumulate?: boolean;
  /** First row of x to read (e.g. the last token of a chunk). Default 0. */
  xRow0?: number;
  /** Weight storage; q8 / q4 need K % 32 == 0. */
  weights: WeightType | QuantType;
}

export function matmulCall(
  gpu: Gpu,
  bufs: { x: GPUBuffer; w: GPUBuffer; y: GPUBuffer },
  d: MatmulDims,
): KernelCall {
  const wt = d.weights;
  if (isQuant(wt)) return quantMatmulCall(gpu, bufs, { ...d, weights: wt });
  if (d.T <= GEMV_MULTI_MAX_T && gemvFusedFits(d.K)) return gemvFusedCall(gpu, bufs, d);
  const params = uniformBuffer(gpu, [d.K, d.N, d.T, d.accumulate ? 1 : 0, d.xRow0 ?? 0]);
  const pipe = pipeline(gpu, tiledSource(wt));
  return kernelCall(
    gpu,
    pipe,
    [params, bufs.x, bufs.w, bufs.y],
    [ceilDiv(d.N, 16), ceilDiv(d.T, 16)],
    "matmul",
  );
}

function quantMatmulCall(
  gpu: Gpu,
  bufs: { x: GPUBuffer; w: GPUBuffer; y: GPUBuffer },
  d: MatmulDims & { weights: QuantType },
): KernelCall {
  if (!quantFits(d.K)) throw new RangeError(`${d.weights} weights need K % 32 == 0, got K = ${d.K}`);
  if (d.T <= GEMV_MULTI_MAX_T) return gemvFusedCall(gpu, bufs, d);
  const soff = quantScaleWord(d.N, d.K, d.weights);
  const params = uniformBuffer(gpu, [d.K, d.N, d.T, d.accumulate ? 1 : 0, d.xRow0 ?? 0, soff]);
  return kernelCall(
    gpu,
    pipeline(gpu, tiledQuantSource(d.weights)),
    [params, bufs.x, bufs.w, bufs.y],
    [ceilDiv(d.N, 16), ceilDiv(d.T, 16)],
    "matmul",
  );
}

/** CPU reference in f64 accumulation; `y0` is the prior content of y when accumulating. */
export function matmulRef(x: Float32Array, w: Float32Array, d: MatmulDims, y0?: Float32Array): Float32Array {
  const y = new Float32Array(d.T * d.N);
  const r0 = d.xRow0 ?? 0;
  for (let t = 0; t < d.T; t++) {
    for (let n = 0; n < d.N; n++) {
      let s = d.accumulate && y0 ? y0[t * d.N + n] : 0;
      for (let k = 0; k < d.K; k++) s += x[(r0 + t) * d.K + k] * w[n * d.K + k];
      y[t * d.N + n] = s;
    }
  }
  return y;
}
