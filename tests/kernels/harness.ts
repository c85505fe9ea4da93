// What the kernel tests share: the GPU (or a clear skip), seeded random data, upload/readback, and the
// tolerance check |gpu - ref| <= atol + |ref| * rtol.
import {
  dequantize,
  getGpu,
  type Gpu,
  NoGpuError,
  quantize,
  type QuantType,
  readBack,
  uploadBuffer,
} from "../../kernels/mod.ts";
import { f16ToF32, f32ToF16 } from "../../models/dtype.ts";
import { seededRandom } from "../../node/random.ts";

/** The GPU, or null (with one line saying the GPU tests are skipped) when this machine has no adapter. */
export async function gpuOrSkip(): Promise<Gpu | null> {
  try {
    return await getGpu();
  } catch (e) {
    if (!(e instanceof NoGpuError)) throw e;
    console.log(`skipped: GPU kernel tests (${e.message})`);
    return null;
  }
}

/** Deterministic uniform numbers in [-scale, scale). */
export function randoms(n: number, seed: number, scale = 1): Float32Array {
  const next = seededRandom(seed);
  return Float32Array.from({ length: n }, () => (next() * 2 - 1) * scale);
}

export function upload(gpu: Gpu, data: Float32Array | Uint32Array | Uint16Array): GPUBuffer {
  return uploadBuffer(gpu, data);
}

export async function readF32(gpu: Gpu, buf: GPUBuffer, n: number): Promise<Float32Array> {
  return new Float32Array(await readBack(gpu, buf, n * 4));
}

export async function readU32(gpu: Gpu, buf: GPUBuffer, n: number): Promise<Uint32Array> {
  return new Uint32Array(await readBack(gpu, buf, n * 4));
}

/** Throws naming the first element where |got - want| > atol + |want| * rtol (or NaN). */
export function assertClose(
  got: Float32Array,
  want: Float32Array,
  atol: number,
  rtol: number,
  what = "",
): void {
  if (got.length < want.length) throw new Error(`${what}: got ${got.length} values, want ${want.length}`);
  let worst = 0;
  for (let i = 0; i < want.length; i++) {
    const err = Math.abs(got[i] - want[i]);
    const bound = atol + Math.abs(want[i]) * rtol;
    if (!(err <= bound)) {
      throw new Error(`${what}: element ${i}: got ${got[i]}, want ${want[i]} (|err| ${err} > ${bound})`);
    }
    worst = Math.max(worst, err);
  }
}

/**
 * int8 activations: each x is off by at most half its block's step (amax / 127 / 2), so a row's error is
 * at most the sum over its blocks of step / 2 * sum |w| in the block (+ f32 rounding). A wrong layout or
 * scale misses this bound by orders of magnitude.
 */
export function checkDp4(
  got: Float32Array,
  want: Float32Array,
  input: Float32Array,
  w: Float32Array,
  d: { T: number; N: number; K: number },
  what: string,
): void {
  const { T, N, K } = d;
  for (let r = 0; r < T; r++) {
    for (let n = 0; n < N; n++) {
      let bound = 1e-4 + 1e-4 * Math.abs(want[r * N + n]);
      for (let b = 0; b < K / 32; b++) {
        let amax = 0, wsum = 0;
        for (let i = b * 32; i < b * 32 + 32; i++) {
          amax = Math.max(amax, Math.abs(input[r * K + i]));
          wsum += Math.abs(w[n * K + i]);
        }
        bound += (amax / 127 / 2) * wsum * 1.001;
      }
      const err = Math.abs(got[r * N + n] - want[r * N + n]);
      if (!(err <= bound)) {
        throw new Error(
          `dp4 ${what} K${K}: row ${r} col ${n}: got ${got[r * N + n]}, want ${
            want[r * N + n]
          } (|err| ${err} > ${bound})`,
        );
      }
    }
  }
}

/** A matrix's bytes as the GPU stores it (f32, f16, q8 or q4) and the weights those bytes stand for. */
export function packedWeights(t: "f32" | "f16" | QuantType, w: Float32Array, N: number, K: number) {
  if (t === "f32") return { bytes: new Uint8Array(w.buffer), deq: w };
  if (t === "f16") return { bytes: new Uint8Array(f32ToF16(w).buffer), deq: f16ToF32(f32ToF16(w)) };
  const q = quantize(w, { N, K }, t);
  return { bytes: q, deq: dequantize(q, { N, K }, t) };
}
