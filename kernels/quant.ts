// Group-quantised weight formats (q8, q4), made at load time from the checkpoint's floats, and their
// CPU references. A matrix W[N, K] (K % 32 == 0) is cut into groups of 32 consecutive values of a row, so
// rows stay independent and row blocks concatenate (q/k/v, gate/up). One GPU buffer per matrix holds
//   values: q8: one int8 per weight (little-endian, 16 to a 16-byte load)
//           q4: one 4-bit code per weight, code = q + 8 (q in -8..7), 8 to a u32 with value i at bits 4i,
//               so a 16-byte load is exactly one group
//   scales: one bf16 per group, after the values (at byte N*K or N*K/2), in group order
// and a weight is q * scale. The scale is bf16, not f16: it has f32's range (no subnormal scales for
// small groups) and, because values are quantised against the rounded scale, its short mantissa costs
// nothing but a step at most 2^-7 wider (docs/KERNELS.md).
//   q8: scale = amax / 127 rounded up to bf16, q = round(x / scale) in -127..127: |x - q s| <= s / 2.
//   q4: like llama.cpp's Q4_0: the value of largest magnitude m maps to -8 (scale = -m / 8, signed), so
//       all 16 codes are used; |x - q s| <= |s| / 2 except values of the other sign beyond 7.5 |s|,
//       clamped to 7 (error <= |s|).
export type QuantType = "q8" | "q4";

export const QUANT_GROUP = 32;

export function isQuant(t: string): t is QuantType {
  return t === "q8" || t === "q4";
}

/** Whether a matrix with rows of K values can be quantised (else it stays in floats). */
export function quantFits(K: number): boolean {
  return K > 0 && K % QUANT_GROUP === 0;
}

/** Bytes of the values part (the scales follow at this offset). */
export function quantValueBytes(N: number, K: number, t: QuantType): number {
  return t === "q8" ? N * K : (N * K) / 2;
}

/** Bytes of the whole quantised matrix (values + bf16 scales). */
export function quantBytes(N: number, K: number, t: QuantType): number {
  return quantValueBytes(N, K, t) + (N * K / QUANT_GROUP) * 2;
}

function checkDims(length: number, N: number, K: number): void {
  if (!quantFits(K)) throw new RangeError(`quantised rows need K % ${QUANT_GROUP} == 0, got K = ${K}`);
  if (!(Number.isInteger(N) && N >= 1) || length !== N * K) {
    throw new RangeError(`matrix of ${length} values is not N x K = ${N} x ${K}`);
  }
}

const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);

/** The bf16 at or above |v| in magnitude (keeping v's sign): the quantiser's scale. */
function bf16AwayFromZero(v: number): number {
  f32[0] = v;
  if ((u32[0] & 0xffff) !== 0) u32[0] = ((u32[0] & 0xffff0000) + 0x10000) >>> 0;
  return u32[0] >>> 16;
}

function bf16Value(bits: number): number {
  u32[0] = bits << 16;
  return f32[0];
}

/** Round half away from zero. */
function roundHalfAway(v: number): number {
  return Math.sign(v) * Math.round(Math.abs(v));
}

/** Quantises W[N, K] (row-major) into the GPU layout above. */
export function quantize(w: Float32Array, dims: { N: number; K: number }, t: QuantType): Uint8Array {
  const { N, K } = dims;
  checkDims(w.length, N, K);
  const out = new Uint8Array(quantBytes(N, K, t));
  const scales = new Uint16Array(out.buffer, quantValueBytes(N, K, t), (N * K) / QUANT_GROUP);
  const q8 = new Int8Array(out.buffer, 0, t === "q8" ? N * K : 0);
  for (let g = 0; g < scales.length; g++) {
    const base = g * QUANT_GROUP;
    let m = 0;
    for (let i = 0; i < QUANT_GROUP; i++) {
      const v = w[base + i];
      if (!Number.isFinite(v)) {
        throw new RangeError(
          `weight ${base + i} (row ${Math.floor((base + i) / K)}) is ${v}; cannot quantise`,
        );
      }
      if (Math.abs(v) > Math.abs(m)) m = v;
    }
    // An all-zero group keeps scale 0 and codes that decode to 0.
    const bits = m === 0 ? 0 : bf16AwayFromZero(t === "q8" ? Math.abs(m) / 127 : -m / 8);
    scales[g] = bits;
    const s = bf16Value(bits);
    for (let i = 0; i < QUANT_GROUP; i++) {
      const q = s === 0 ? 0 : roundHalfAway(w[base + i] / s);
      if (t === "q8") q8[base + i] = Math.max(-127, Math.min(127, q));
      else {
        const code = Math.max(0, Math.min(15, q + 8));
        out[(base + i) >> 1] |= code << (4 * ((base + i) & 1));
      }
    }
  }
  return out;
}

/** The floats a quantised matrix stands for (the reference the kernels are tested against). */
export function dequantize(data: Uint8Array, dims: { N: number; K: number }, t: QuantType): Float32Array {
  const { N, K } = dims;
  checkDims(N * K, N, K);
  if (data.byteLength < quantBytes(N, K, t)) {
    throw new RangeError(`${t} matrix ${N}x${K} needs ${quantBytes(N, K, t)} bytes, got ${data.byteLength}`);
  }
  const w = new Float32Array(N * K);
  const sAt = quantValueBytes(N, K, t);
  const q8 = new Int8Array(data.buffer, data.byteOffset, t === "q8" ? N * K : 0);
  for (let i = 0; i < N * K; i++) {
    const g = Math.floor(i / QUANT_GROUP);
    const s = bf16Value(data[sAt + 2 * g] | (data[sAt + 2 * g + 1] << 8));
    const q = t === "q8" ? q8[i] : ((data[i >> 1] >> (4 * (i & 1))) & 15) - 8;
    w[i] = q * s;
  }
  return w;
}

/** The bf16 scale of group g, as a number (tests check round-trip bounds against it). */
export function groupScale(
  data: Uint8Array,
  dims: { N: number; K: number },
  t: QuantType,
  g: number,
): number {
  const at = quantValueBytes(dims.N, dims.K, t) + 2 * g;
  return bf16Value(data[at] | (data[at + 1] << 8));
}

/**
 * WGSL for reading one weight of a quantised matrix bound as `array<u32>` named `name`, with the scales
 * at u32 word `soff`: `fn <name>_at(e: u32, soff: u32) -> f32` for flat index e = n * K + k.
 */
export function quantElementWgsl(t: QuantType, name: string): string {
  const q = t === "q8"
    ? `f32(bitcast<i32>(${name}[e / 4u] << (24u - 8u * (e % 4u))) >> 24u)`
    : `f32((${name}[e / 8u] >> (4u * (e % 8u))) & 15u) - 8.0`;
  return `fn ${name}_at(e: u32, soff: u32) -> f32 {
  let g = e / ${QUANT_GROUP}u;
  let sw = ${name}[soff + g / 2u];
  return (${q}) * bitcast<f32>(select(sw << 16u, sw & 0xffff0000u, (g & 1u) == 1u));
}`;
}

/** The u32 word at which a quantised matrix's scales begin (a kernel parameter). */
export function quantScaleWord(N: number, K: number, t: QuantType): number {
  return quantValueBytes(N, K, t) / 4;
}
