// Conversions between the floating dtypes checkpoints ship (F32, F16, BF16). All little-endian, as
// safetensors is and as every host we run on is. Rounding is to nearest even, like torch's `.to()`,
// so weights converted here match what transformers computes with.
import { CheckpointError } from "./errors.ts";
import type { DType } from "./safetensors.ts";

const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);

/** bf16 bits to float32: bf16 is the upper half of a float32, so this is exact. */
export function bf16ToF32(bits: Uint16Array): Float32Array {
  const out = new Float32Array(bits.length);
  const outBits = new Uint32Array(out.buffer);
  for (let i = 0; i < bits.length; i++) outBits[i] = bits[i] << 16;
  return out;
}

let f16Table: Uint32Array | null = null;

/** float32 bits of every f16 value, built once (256 KB) because a lookup beats the branches. */
function f16Bits(): Uint32Array {
  if (f16Table) return f16Table;
  const t = new Uint32Array(65536);
  for (let h = 0; h < 65536; h++) {
    const sign = (h & 0x8000) << 16;
    const exp = (h >>> 10) & 0x1f;
    const mant = h & 0x3ff;
    if (exp === 0x1f) {
      t[h] = sign | 0x7f800000 | (mant << 13); // inf, or nan keeping its payload
    } else if (exp !== 0) {
      t[h] = sign | ((exp - 15 + 127) << 23) | (mant << 13);
    } else {
      f32[0] = mant * 2 ** -24; // zero or subnormal: exact in float32
      t[h] = sign | u32[0];
    }
  }
  f16Table = t;
  return t;
}

/** f16 bits to float32 (exact: every f16 value is a float32 value). */
export function f16ToF32(bits: Uint16Array): Float32Array {
  const table = f16Bits();
  const out = new Float32Array(bits.length);
  const outBits = new Uint32Array(out.buffer);
  for (let i = 0; i < bits.length; i++) outBits[i] = table[bits[i]];
  return out;
}

/** One float32 (as bits) to f16 bits, rounding to nearest even; overflow gives inf, nan stays nan. */
function f32BitsToF16(x: number): number {
  const sign = (x >>> 16) & 0x8000;
  const exp = (x >>> 23) & 0xff;
  const mant = x & 0x7fffff;
  if (exp === 0xff) return mant ? sign | 0x7e00 | (mant >>> 13) : sign | 0x7c00;
  const e = exp - 127 + 15;
  if (e >= 0x1f) return sign | 0x7c00;
  if (e <= 0) {
    // f16 subnormal: value = m * 2^(e - 14 - 23 + 23) with the implicit bit made explicit.
    const shift = 14 - e;
    if (shift > 24) return sign; // below half the smallest subnormal: rounds to zero
    const m = mant | 0x800000;
    let h = m >>> shift;
    const rem = m & ((1 << shift) - 1);
    const half = 1 << (shift - 1);
    if (rem > half || (rem === half && (h & 1))) h++; // may carry into the smallest normal: correct
    return sign | h;
  }
  let h = (e << 10) | (mant >>> 13);
  const rem = mant & 0x1fff;
  if (rem > 0x1000 || (rem === 0x1000 && (h & 1))) h++; // a carry into the exponent is correct too
  return sign | h;
}

/** float32 to f16 bits, rounding to nearest even, with subnormals, inf and nan. */
export function f32ToF16(values: Float32Array): Uint16Array {
  const bits = new Uint32Array(values.buffer, values.byteOffset, values.length);
  const out = new Uint16Array(values.length);
  for (let i = 0; i < values.length; i++) out[i] = f32BitsToF16(bits[i]);
  return out;
}

/** float32 to bf16 bits, rounding to nearest even; nan stays a (quiet) nan. */
export function f32ToBf16(values: Float32Array): Uint16Array {
  const bits = new Uint32Array(values.buffer, values.byteOffset, values.length);
  const out = new Uint16Array(values.length);
  for (let i = 0; i < values.length; i++) {
    const x = bits[i];
    if ((x & 0x7fffffff) > 0x7f800000) {
      out[i] = (x >>> 16) | 0x40;
    } else {
      out[i] = ((x + 0x7fff + ((x >>> 16) & 1)) >>> 16) & 0xffff;
    }
  }
  return out;
}

/**
 * A typed view of `bytes` when its offset is aligned for `size`-byte elements, else a copy:
 * a tensor sliced out of a larger buffer may start at any byte.
 */
function aligned(bytes: Uint8Array, size: 2 | 4): ArrayBuffer {
  if (bytes.byteOffset % size === 0 && bytes.buffer instanceof ArrayBuffer) {
    return bytes.buffer;
  }
  return bytes.slice().buffer;
}

function view16(bytes: Uint8Array): Uint16Array {
  if (bytes.byteLength % 2) {
    throw new RangeError(`${bytes.byteLength} bytes is not a whole number of 16-bit values`);
  }
  const buf = aligned(bytes, 2);
  const off = buf === bytes.buffer ? bytes.byteOffset : 0;
  return new Uint16Array(buf, off, bytes.byteLength / 2);
}

function view32(bytes: Uint8Array): Float32Array {
  if (bytes.byteLength % 4) {
    throw new RangeError(`${bytes.byteLength} bytes is not a whole number of 32-bit values`);
  }
  const buf = aligned(bytes, 4);
  const off = buf === bytes.buffer ? bytes.byteOffset : 0;
  return new Float32Array(buf, off, bytes.byteLength / 4);
}

function unsupported(dtype: DType, want: string): CheckpointError {
  return new CheckpointError(`unsupported dtype ${dtype}: expected ${want}`);
}

/**
 * Raw little-endian tensor bytes to float32. F32 input is returned as a view of `bytes` when aligned
 * (no copy); F16 and BF16 are converted exactly. Other dtypes throw CheckpointError.
 */
export function toF32(bytes: Uint8Array, dtype: DType): Float32Array {
  switch (dtype) {
    case "F32":
      return view32(bytes);
    case "F16":
      return f16ToF32(view16(bytes));
    case "BF16":
      return bf16ToF32(view16(bytes));
    default:
      throw unsupported(dtype, "F32, F16 or BF16");
  }
}

/**
 * Raw little-endian tensor bytes to f16 bits. F16 input is returned as a view when aligned; F32 and
 * BF16 are rounded to nearest even (BF16 values outside f16's range become inf, tiny ones subnormal).
 */
export function toF16Bits(bytes: Uint8Array, dtype: DType): Uint16Array {
  switch (dtype) {
    case "F16":
      return view16(bytes);
    case "BF16":
      return f32ToF16(bf16ToF32(view16(bytes)));
    case "F32":
      return f32ToF16(view32(bytes));
    default:
      throw unsupported(dtype, "F32, F16 or BF16");
  }
}
