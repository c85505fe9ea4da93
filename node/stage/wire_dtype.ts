// Activations on the wire: f16 (default, half the bytes) or f32 (exact), little-endian.
import { f16ToF32, f32ToF16 } from "../../models/dtype.ts";
import type { WireDtype } from "./messages.ts";

export function packHidden(x: Float32Array, dtype: WireDtype): Uint8Array {
  const v = dtype === "f16" ? f32ToF16(x) : x;
  return new Uint8Array(v.buffer, v.byteOffset, v.byteLength);
}

/** Unpacks `bytes` (copied, so any alignment works); RangeError when the size is not [rows, width]. */
export function unpackHidden(bytes: Uint8Array, dtype: WireDtype, elements: number): Float32Array {
  const size = dtype === "f16" ? 2 : 4;
  if (bytes.length !== elements * size) {
    throw new RangeError(`activations of ${bytes.length} bytes; expected ${elements} ${dtype} values`);
  }
  const copy = bytes.slice();
  return dtype === "f16" ? f16ToF32(new Uint16Array(copy.buffer)) : new Float32Array(copy.buffer);
}
