// Block-scaled fp8 weights, as DeepSeek-V3, Kimi K2 and Qwen3's FP8 checkpoints ship them
// (`quantization_config.quant_method: "fp8"`): a matrix [N, K] of E4M3 codes, and beside it `<name>_scale_inv`
// [ceil(N / bn), ceil(K / bk)] of f32 scales, one a block of bn x bk; a weight is its code times its block's
// scale. Dequantised once at load into f32 (each product rounded to f32, as transformers' dequantising loader
// computes it), after which the weight is converted like any other (f16, q8, q4, on the GPU).
import type { WeightQuant } from "./config.ts";
import { CheckpointError } from "./errors.ts";

/**
 * The 256 E4M3 ("fn": no infinities) values: sign, 4 exponent bits (bias 7), 3 mantissa bits; exponent 0 is
 * subnormal (m / 8 * 2^-6), and S.1111.111 is NaN. The largest finite value is 448.
 */
export const E4M3: Float32Array = (() => {
  const t = new Float32Array(256);
  for (let b = 0; b < 256; b++) {
    const e = (b >> 3) & 15, m = b & 7;
    const v = e === 15 && m === 7 ? NaN : e === 0 ? (m / 8) * 2 ** -6 : (1 + m / 8) * 2 ** (e - 7);
    t[b] = b & 128 ? -v : v;
  }
  return t;
})();

/** The tensor that holds `name`'s block scales (DeepSeek's naming: `...weight` -> `...weight_scale_inv`). */
export function scaleNameOf(name: string): string {
  return `${name}_scale_inv`;
}

/** CheckpointError unless `name` is a matrix [N, K] and its scales are [ceil(N / bn), ceil(K / bk)]. */
export function checkFp8Shapes(
  name: string,
  shape: readonly number[],
  scaleShape: readonly number[],
  q: WeightQuant,
): void {
  if (shape.length !== 2) {
    throw new CheckpointError(
      `tensor ${name}: fp8 weights must be matrices, got shape [${shape.join(", ")}]`,
    );
  }
  const [N, K] = shape;
  const [bn, bk] = q.block;
  const SN = Math.ceil(N / bn), SK = Math.ceil(K / bk);
  if (scaleShape.length !== 2 || scaleShape[0] !== SN || scaleShape[1] !== SK) {
    throw new CheckpointError(
      `tensor ${scaleNameOf(name)} has shape [${scaleShape.join(", ")}], expected [${SN}, ${SK}] ` +
        `(${name} [${N}, ${K}] in blocks of [${bn}, ${bk}], quantization_config.weight_block_size)`,
    );
  }
}

/** An fp8 tensor as stored: its codes [N, K] and its block scales (as f32) [ceil(N / bn), ceil(K / bk)]. */
export interface Fp8Tensor {
  codes: Uint8Array;
  shape: number[];
  scales: Float32Array;
  scaleShape: number[];
}

/**
 * Dequantises E4M3 `codes` of a matrix `shape` [N, K] with per-block `scales` (shape `scaleShape`, which must
 * be [ceil(N / bn), ceil(K / bk)]; edge blocks may be partial) into f32. Errors name `name`.
 */
export function dequantFp8(
  name: string,
  codes: Uint8Array,
  shape: readonly number[],
  scales: Float32Array,
  scaleShape: readonly number[],
  q: WeightQuant,
): Float32Array {
  checkFp8Shapes(name, shape, scaleShape, q);
  const [N, K] = shape;
  const [bn, bk] = q.block;
  const SK = Math.ceil(K / bk);
  // A product of two f32 values is exact in f64, so storing it rounds once: the f32 product.
  const out = new Float32Array(N * K);
  for (let n = 0; n < N; n++) {
    const srow = Math.floor(n / bn) * SK;
    for (let kb = 0; kb < SK; kb++) {
      const s = scales[srow + kb];
      const end = n * K + Math.min(K, (kb + 1) * bk);
      for (let i = n * K + kb * bk; i < end; i++) out[i] = E4M3[codes[i]] * s;
    }
  }
  return out;
}
