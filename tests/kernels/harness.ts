// What the kernel tests share: the GPU (or a clear skip), seeded random data, upload/readback, and the
// tolerance check |gpu - ref| <= atol + |ref| * rtol.
import {
  dequantize,
  gemvFusedCalls,
  gemvInt8InputCall,
  getGpu,
  type Gpu,
  matmulRef,
  NoGpuError,
  quantize,
  type QuantType,
  readBack,
  rmsnormRef,
  runCalls,
  siluMulRef,
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

/**
 * Throws unless two int8 copies of T rows of K (the words and the blocks' scale pairs: an input pass's and
 * one a producer kernel wrote) are equal bit for bit.
 */
export async function assertSameInt8Copy(
  gpu: Gpu,
  got: { q: GPUBuffer; s: GPUBuffer },
  want: { q: GPUBuffer; s: GPUBuffer },
  n: number,
  what: string,
): Promise<void> {
  for (const [a, b, words] of [[got.q, want.q, n / 4], [got.s, want.s, n / 16]] as const) {
    const x = await readU32(gpu, a, words), y = await readU32(gpu, b, words);
    const i = x.findIndex((v, j) => v !== y[j]);
    if (i >= 0) throw new Error(`${what}: word ${i} of ${words}: ${x[i]} against ${y[i]}`);
  }
}

/** A producer's int8 copy is, bit for bit, what the input pass (gemvInt8InputCall) makes of x's T rows of K. */
export async function assertCopyIsPass(
  g: Gpu,
  copy: { q: GPUBuffer; s: GPUBuffer },
  x: GPUBuffer,
  d: { K: number; T: number; wt: "q8" | "q4" },
  what: string,
): Promise<void> {
  const pass = gemvInt8InputCall(g, { x }, { ...d, transform: "none", normWeights: "f32" });
  await runCalls(g, [pass.call]);
  await assertSameInt8Copy(g, copy, { q: pass.xq, s: pass.xqs }, d.T * d.K, what);
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
 * A q8 KV cache (kernels/kv.ts) against the CPU's quantisation `want` of rows `raw` (rows of `hd`): each value
 * within one step (the row's largest magnitude / 127), since the GPU's 1 / s may differ from the CPU's in the
 * last bit and move a value sitting on a half.
 */
export function assertQ8Rows(
  got: Float32Array,
  want: Float32Array,
  raw: Float32Array,
  hd: number,
  what: string,
) {
  for (let r = 0; r < want.length / hd; r++) {
    let mx = 0;
    for (let i = 0; i < hd; i++) mx = Math.max(mx, Math.abs(raw[r * hd + i]));
    const row = (a: Float32Array) => a.slice(r * hd, (r + 1) * hd);
    assertClose(row(got), row(want), (mx / 127) * 1.001 + 1e-7, 0, `${what} row ${r}`);
  }
}

/**
 * Rows r0 .. r0 + T - 1 of x as a kernel's input pass reads them, [T, K]: as they are, or (silu) silu(gate) *
 * up of [gate | up] rows 2K wide, in f32 as the GPU computes it (what checkDp4's int8 simulation quantises).
 */
export function inputRows(x: Float32Array, r0: number, T: number, K: number, silu: boolean): Float32Array {
  const width = silu ? 2 * K : K;
  return Float32Array.from({ length: T * K }, (_, i) => {
    const at = (r0 + Math.floor(i / K)) * width + (i % K);
    if (!silu) return x[at];
    const g = x[at];
    return Math.fround(Math.fround(g / Math.fround(1 + Math.fround(Math.exp(-g)))) * x[at + K]);
  });
}

/** |error| bound of each output [T, N] of a dp4 (int8 activation) GEMV: checkDp4's, for other checks. */
export function dp4Bounds(
  input: Float32Array,
  w: Float32Array,
  T: number,
  N: number,
  K: number,
): Float32Array {
  const out = new Float32Array(T * N);
  for (let r = 0; r < T; r++) {
    for (let n = 0; n < N; n++) {
      let bound = 0;
      for (let b = 0; b < K / 32; b++) {
        let amax = 0, wsum = 0;
        for (let i = b * 32; i < b * 32 + 32; i++) {
          amax = Math.max(amax, Math.abs(input[r * K + i]));
          wsum += Math.abs(w[n * K + i]);
        }
        bound += (amax / 127 / 2) * wsum * 1.001;
      }
      out[r * N + n] = bound;
    }
  }
  return out;
}

/**
 * How far a dp4 GEMV's outputs sit from the exact products, in f64: each block of 32 inputs quantised as
 * int8BlocksWgsl does (scale amax / 127, q = round(x / scale), ties to even as WGSL's round), times the
 * weights, less the products of the inputs themselves (`shift`, added to the exact reference, which may hold
 * an accumulated output); and each output's tolerance:
 * f32 rounding (1e-4 of the sum of |terms|) plus one code off by one in its row (the GPU's transformed x can
 * sit a rounding away from a tie the reference rounds the other way).
 */
export function dp4Simulated(
  input: Float32Array,
  w: Float32Array,
  T: number,
  N: number,
  K: number,
): { shift: Float64Array; tol: Float64Array } {
  const xq = new Float64Array(T * K), step = new Float64Array(T * K);
  for (let r = 0; r < T; r++) {
    for (let b = 0; b < K / 32; b++) {
      const o = r * K + b * 32;
      let amax = 0;
      for (let i = 0; i < 32; i++) amax = Math.max(amax, Math.abs(input[o + i]));
      const sc = amax === 0 ? 1 : Math.fround(amax / 127);
      for (let i = 0; i < 32; i++) {
        const v = input[o + i] / sc, f = Math.floor(v);
        xq[o + i] = sc * (v - f === 0.5 ? (f % 2 === 0 ? f : f + 1) : Math.round(v));
        step[o + i] = sc;
      }
    }
  }
  const shift = new Float64Array(T * N), tol = new Float64Array(T * N);
  for (let r = 0; r < T; r++) {
    for (let n = 0; n < N; n++) {
      let sum = 0, mag = 0, flip = 0;
      for (let k = 0; k < K; k++) {
        const t = xq[r * K + k] * w[n * K + k];
        sum += t - input[r * K + k] * w[n * K + k];
        mag += Math.abs(t);
        flip = Math.max(flip, step[r * K + k] * Math.abs(w[n * K + k]));
      }
      shift[r * N + n] = sum;
      tol[r * N + n] = 1e-5 + 1e-4 * mag + 1.001 * flip;
    }
  }
  return { shift, tol };
}

/**
 * int8 activations: each x is off by at most half its block's step (amax / 127 / 2), so a row's error is
 * at most the sum over its blocks of step / 2 * sum |w| in the block (+ f32 rounding). A wrong layout or
 * scale misses this bound by orders of magnitude. Then, tighter, the output must be the int8 product
 * itself (dp4Simulated): a scale off in one block, which the bound above can hide, is caught there.
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
  const bounds = dp4Bounds(input, w, T, N, K);
  for (let r = 0; r < T; r++) {
    for (let n = 0; n < N; n++) {
      const bound = 1e-4 + 1e-4 * Math.abs(want[r * N + n]) + bounds[r * N + n];
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
  const sim = dp4Simulated(input, w, T, N, K);
  for (let i = 0; i < T * N; i++) {
    const int8 = want[i] + sim.shift[i];
    const err = Math.abs(got[i] - int8);
    if (!(err <= 1e-4 * Math.abs(want[i]) + sim.tol[i])) {
      throw new Error(
        `dp4 ${what} K${K}: output ${i}: got ${got[i]}, the int8 product is ${int8} (|err| ${err} > ${
          sim.tol[i]
        })`,
      );
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

/**
 * One GEMV case through gemvFusedCalls (x read from row 1 of a random [T + 1, width] input, y preloaded with
 * random values for `accumulate`) and its CPU reference: what the GEMV tests compare, whatever kernel the
 * options and gpu.tuning pick (`tuning` / `multi`, multiInt8). `input` is f(x) as the reference used it, `deq` the weights.
 */
export async function gemvCase(
  g: Gpu,
  c: {
    wt: "f32" | "f16" | QuantType;
    K: number;
    N: number;
    T: number;
    transform: "none" | "rmsnorm" | "silu_mul";
    accumulate: boolean;
    normWeights: "f32" | "f16";
    seed: number;
  },
  opts: Partial<Parameters<typeof gemvFusedCalls>[2]>,
): Promise<{ got: Float32Array; want: Float32Array; input: Float32Array; deq: Float32Array }> {
  const { wt, K, N, T, transform, accumulate, normWeights, seed } = c;
  const width = transform === "silu_mul" ? 2 * K : K;
  const x = randoms((T + 1) * width, seed, 2);
  const w = packedWeights(wt, randoms(N * K, N + seed, 0.5), N, K);
  let nw = randoms(K, K + 3);
  const nbuf = normWeights === "f16" ? upload(g, f32ToF16(nw)) : upload(g, nw);
  if (normWeights === "f16") nw = f16ToF32(f32ToF16(nw));
  const y0 = randoms(T * N, 9);
  const y = upload(g, y0);
  await runCalls(
    g,
    gemvFusedCalls(g, { x: upload(g, x), w: uploadBuffer(g, w.bytes), y, normWeight: nbuf }, {
      K,
      N,
      T,
      accumulate,
      xRow0: 1,
      weights: wt,
      normWeights,
      transform,
      eps: 1e-5,
      ...opts,
    }),
  );
  const rows = x.slice(width, (T + 1) * width);
  const input = transform === "rmsnorm"
    ? rmsnormRef(rows, nw, K, 1e-5)
    : transform === "silu_mul"
    ? siluMulRef(rows, K)
    : rows;
  const want = matmulRef(input, w.deq, { K, N, T, accumulate, weights: "f32" }, y0);
  return { got: await readF32(g, y, T * N), want, input, deq: w.deq };
}
