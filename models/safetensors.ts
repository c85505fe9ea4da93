// The safetensors format, read by byte range. A file is: u64 little-endian header length N, N bytes
// of JSON ({name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}}), then the data;
// offsets are relative to the end of the header. We parse only the header and read each tensor's own
// range, so that a pipeline stage loads its layers from a multi-GB shard without reading the rest
// (npm `safetensors` parses a whole file held in memory, which is why this is hand-written).
import { CheckpointError } from "./errors.ts";

/** Every dtype name the safetensors format defines (F4/F6 packed types excepted). */
export type DType =
  | "BOOL"
  | "U8"
  | "I8"
  | "F8_E5M2"
  | "F8_E4M3"
  | "F8_E8M0"
  | "I16"
  | "U16"
  | "F16"
  | "BF16"
  | "I32"
  | "U32"
  | "F32"
  | "I64"
  | "U64"
  | "F64";

const DTYPE_SIZES: Record<DType, number> = {
  BOOL: 1,
  U8: 1,
  I8: 1,
  F8_E5M2: 1,
  F8_E4M3: 1,
  F8_E8M0: 1,
  I16: 2,
  U16: 2,
  F16: 2,
  BF16: 2,
  I32: 4,
  U32: 4,
  F32: 4,
  I64: 8,
  U64: 8,
  F64: 8,
};

/** Bytes per element of a dtype. */
export function dtypeSize(dtype: DType): number {
  return DTYPE_SIZES[dtype];
}

/** True when `s` is a dtype name this parser knows. */
export function isDType(s: unknown): s is DType {
  return typeof s === "string" && Object.hasOwn(DTYPE_SIZES, s);
}

/** Where one tensor lives: `begin`/`end` are absolute byte offsets in `file`. */
export interface TensorInfo {
  name: string;
  dtype: DType;
  shape: number[];
  file: string;
  begin: number;
  end: number;
}

/** A tensor to write: raw little-endian bytes of `dtype`, `numel(shape) * dtypeSize` long. */
export interface TensorData {
  name: string;
  dtype: DType;
  shape: number[];
  data: Uint8Array;
}

/** A header over 100 MB is corruption, not a model (real ones are well under 10 MB). */
const MAX_HEADER_BYTES = 100 * 1024 * 1024;

/** Product of the dimensions (1 for a scalar). */
export function numel(shape: readonly number[]): number {
  return shape.reduce((a, b) => a * b, 1);
}

/**
 * Reads and validates the header of one safetensors file, without reading its tensor data.
 * Throws CheckpointError for a missing file, a header length that is absurd or past the end of the
 * file, JSON that is not an object of tensor entries, an unknown dtype, a byte range that is out of
 * order, disagrees with the shape, or lies past the end of the file (a truncated download).
 */
export async function readSafetensorsHeader(path: string): Promise<Map<string, TensorInfo>> {
  let file: Deno.FsFile;
  try {
    file = await Deno.open(path, { read: true });
  } catch (e) {
    if (e instanceof Deno.errors.NotFound) throw new CheckpointError(`${path}: file not found`);
    throw e;
  }
  try {
    const size = (await file.stat()).size;
    if (size < 8) {
      throw new CheckpointError(
        `${path}: bad safetensors header: file has ${size} bytes, expected at least 8`,
      );
    }
    const lenBytes = await readFully(file, 0, 8, path);
    const len = new DataView(lenBytes.buffer).getBigUint64(0, true);
    if (len > BigInt(MAX_HEADER_BYTES) || Number(len) + 8 > size) {
      throw new CheckpointError(
        `${path}: bad safetensors header: header length ${len} ` +
          `(expected at most ${Math.min(MAX_HEADER_BYTES, size - 8)} for a file of ${size} bytes)`,
      );
    }
    const headerLen = Number(len);
    const text = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });
    let json: unknown;
    try {
      json = JSON.parse(text.decode(await readFully(file, 8, headerLen, path)));
    } catch (e) {
      if (e instanceof CheckpointError) throw e;
      throw new CheckpointError(
        `${path}: bad safetensors header: not valid UTF-8 JSON (${(e as Error).message})`,
      );
    }
    return parseHeader(json, path, 8 + headerLen, size);
  } finally {
    file.close();
  }
}

function parseHeader(json: unknown, path: string, dataStart: number, size: number): Map<string, TensorInfo> {
  if (typeof json !== "object" || json === null || Array.isArray(json)) {
    throw new CheckpointError(`${path}: bad safetensors header: expected a JSON object of tensors`);
  }
  const out = new Map<string, TensorInfo>();
  for (const [name, entry] of Object.entries(json as Record<string, unknown>)) {
    if (name === "__metadata__") continue;
    const bad = (what: string) =>
      new CheckpointError(`${path}: bad safetensors header: tensor ${name}: ${what}`);
    if (typeof entry !== "object" || entry === null) throw bad("entry is not an object");
    const { dtype, shape, data_offsets: offsets } = entry as Record<string, unknown>;
    if (!isDType(dtype)) throw bad(`unknown dtype ${JSON.stringify(dtype)}`);
    if (!Array.isArray(shape) || !shape.every((d) => Number.isSafeInteger(d) && d >= 0)) {
      throw bad(`shape ${JSON.stringify(shape)} is not a list of non-negative integers`);
    }
    if (
      !Array.isArray(offsets) || offsets.length !== 2 ||
      !offsets.every((o) => Number.isSafeInteger(o) && o >= 0) || offsets[0] > offsets[1]
    ) {
      throw bad(`data_offsets ${JSON.stringify(offsets)} is not [begin, end] with 0 <= begin <= end`);
    }
    const begin = dataStart + offsets[0];
    const end = dataStart + offsets[1];
    const want = numel(shape) * DTYPE_SIZES[dtype];
    if (end - begin !== want) {
      throw bad(
        `data_offsets span ${end - begin} bytes, expected ${want} for ${dtype} [${shape.join(", ")}]`,
      );
    }
    if (end > size) {
      throw new CheckpointError(
        `${path}: truncated: tensor ${name} needs bytes ${begin}..${end} but file has ${size}`,
      );
    }
    out.set(name, { name, dtype, shape: shape as number[], file: path, begin, end });
  }
  return out;
}

/**
 * Reads exactly one tensor's byte range from its file (a positioned read; nothing else is touched).
 * Throws CheckpointError when the file ends early.
 */
export async function readTensorBytes(info: TensorInfo): Promise<Uint8Array> {
  let file: Deno.FsFile;
  try {
    file = await Deno.open(info.file, { read: true });
  } catch (e) {
    if (e instanceof Deno.errors.NotFound) throw new CheckpointError(`${info.file}: file not found`);
    throw e;
  }
  try {
    return await readFully(file, info.begin, info.end - info.begin, info.file, info.name);
  } finally {
    file.close();
  }
}

async function readFully(
  file: Deno.FsFile,
  offset: number,
  length: number,
  path: string,
  tensor?: string,
): Promise<Uint8Array> {
  const buf = new Uint8Array(length);
  await file.seek(offset, Deno.SeekMode.Start);
  let done = 0;
  while (done < length) {
    const n = await file.read(buf.subarray(done));
    if (n === null || n === 0) {
      const what = tensor ? `tensor ${tensor}` : "header";
      throw new CheckpointError(
        `${path}: truncated: ${what} needs bytes ${offset}..${offset + length} but the file ended at ${
          offset + done
        }`,
      );
    }
    done += n;
  }
  return buf;
}

/**
 * Writes a safetensors file atomically (a temporary file in the same folder, then a rename), so a
 * reader never sees a half-written file. Tensors are laid out in the order given; the header is
 * padded with spaces to a multiple of 8 bytes, as the format recommends.
 */
export async function writeSafetensors(
  path: string,
  tensors: TensorData[],
  metadata?: Record<string, string>,
): Promise<void> {
  const header: Record<string, unknown> = {};
  if (metadata) header.__metadata__ = metadata;
  let offset = 0;
  for (const t of tensors) {
    if (!isDType(t.dtype)) throw new TypeError(`tensor ${t.name}: unknown dtype ${t.dtype}`);
    const want = numel(t.shape) * DTYPE_SIZES[t.dtype];
    if (t.data.byteLength !== want) {
      throw new RangeError(
        `tensor ${t.name}: ${t.data.byteLength} bytes, expected ${want} for ${t.dtype} [${
          t.shape.join(", ")
        }]`,
      );
    }
    if (t.name in header) throw new TypeError(`tensor ${t.name} given twice`);
    header[t.name] = { dtype: t.dtype, shape: t.shape, data_offsets: [offset, offset + want] };
    offset += want;
  }
  let json = JSON.stringify(header);
  json += " ".repeat((8 - (new TextEncoder().encode(json).byteLength % 8)) % 8);
  const jsonBytes = new TextEncoder().encode(json);
  const prefix = new Uint8Array(8);
  new DataView(prefix.buffer).setBigUint64(0, BigInt(jsonBytes.byteLength), true);

  const tmp = `${path}.tmp-${Deno.pid}-${crypto.randomUUID().slice(0, 8)}`;
  const file = await Deno.open(tmp, { write: true, create: true, truncate: true });
  try {
    await writeAll(file, prefix);
    await writeAll(file, jsonBytes);
    for (const t of tensors) await writeAll(file, t.data);
  } catch (e) {
    file.close();
    await Deno.remove(tmp).catch(() => {});
    throw e;
  }
  file.close();
  await Deno.rename(tmp, path);
}

async function writeAll(file: Deno.FsFile, data: Uint8Array): Promise<void> {
  let done = 0;
  while (done < data.byteLength) done += await file.write(data.subarray(done));
}
