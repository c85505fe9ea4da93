// Random operands for the kernel microbenchmarks: timing on zeros misleads (the H200 ran the prefill GEMM's
// 64 x 64 tile at 512 x 2048 x 2048 at 8.1 TFLOP/s on zero buffers against 25.1 on random data, 2026-12-02).
import { quantBytes, quantScaleWord, type QuantType, type WeightType } from "../../kernels/mod.ts";

/** n floats uniform in [-1, 1). */
export function randomF32(n: number): Float32Array<ArrayBuffer> {
  const a = new Float32Array(n);
  for (let i = 0; i < n; i++) a[i] = Math.random() * 2 - 1;
  return a;
}

/**
 * An [N, K] weight matrix's bytes in the engine's storage (kernels/quant.ts's layout for q8 / q4): f16 values
 * in [-1, 1) of normal exponents, random codes with bf16 scales near 1. Padded to whole words.
 */
export function randomWeightBytes(wt: WeightType | QuantType, N: number, K: number): Uint8Array<ArrayBuffer> {
  if (wt === "f32") return new Uint8Array(randomF32(N * K).buffer);
  if (wt === "f16") {
    const a = new Uint16Array(N * K + ((N * K) & 1));
    for (let i = 0; i < a.length; i++) {
      a[i] = (Math.random() < 0.5 ? 0x8000 : 0) | ((5 + Math.floor(Math.random() * 9)) << 10) |
        Math.floor(Math.random() * 1024);
    }
    return new Uint8Array(a.buffer);
  }
  const b = new Uint8Array(Math.ceil(quantBytes(N, K, wt) / 4) * 4);
  for (let i = 0; i < b.length; i++) b[i] = Math.floor(Math.random() * 256);
  const u16 = new Uint16Array(b.buffer);
  for (let i = quantScaleWord(N, K, wt) * 2; i < u16.length; i++) {
    u16[i] = 0x3f80 | Math.floor(Math.random() * 64);
  }
  return b;
}
