// A model directory as the hub ships it: config.json plus the weights, in one model.safetensors,
// in shards listed by model.safetensors.index.json, or in several *.safetensors without an index.
// Opening reads only headers; each read touches only the named tensor's byte range, so a pipeline
// stage that needs layers 10..19 of a 100 GB model reads just those.
import { basename, join } from "node:path";
import { type ModelConfig, readJsonFile } from "./config.ts";
import { readModelConfig } from "./family.ts";
import { toF16Bits, toF32 } from "./dtype.ts";
import { checkFp8Shapes, dequantFp8, type Fp8Tensor, scaleNameOf } from "./fp8.ts";
import { CheckpointError } from "./errors.ts";
import { type DType, readSafetensorsHeader, readTensorBytes, type TensorInfo } from "./safetensors.ts";
import { READ_AHEAD, ReadAhead, type ReadAheadLimits } from "./read_ahead.ts";

const INDEX_FILE = "model.safetensors.index.json";
const SINGLE_FILE = "model.safetensors";

/** The weights of a model directory, headers only: which tensor lives in which file at which bytes. */
export interface Shards {
  /** The safetensors files in use, as paths under the directory. */
  files: string[];
  tensors: Map<string, TensorInfo>;
}

/** Throws CheckpointError unless `dir` exists and is a directory. */
async function checkDir(dir: string): Promise<void> {
  let stat: Deno.FileInfo;
  try {
    stat = await Deno.stat(dir);
  } catch (e) {
    if (e instanceof Deno.errors.NotFound) throw new CheckpointError(`model directory ${dir} not found`);
    throw e;
  }
  if (!stat.isDirectory) throw new CheckpointError(`model directory ${dir} is not a directory`);
}

async function exists(path: string): Promise<boolean> {
  try {
    await Deno.stat(path);
    return true;
  } catch (e) {
    if (e instanceof Deno.errors.NotFound) return false;
    throw e;
  }
}

/**
 * Reads the headers of every weight file in `dir`, whatever the layout: the index (every listed shard
 * must exist and hold the tensors mapped to it), else model.safetensors, else every *.safetensors
 * (a tensor in two of them is an error). Independent of config.json, so any architecture's shards open.
 */
export async function openShards(dir: string): Promise<Shards> {
  await checkDir(dir);
  const indexPath = join(dir, INDEX_FILE);
  if (await exists(indexPath)) return await openIndexed(dir, indexPath);
  if (await exists(join(dir, SINGLE_FILE))) {
    const file = join(dir, SINGLE_FILE);
    return { files: [file], tensors: await readSafetensorsHeader(file) };
  }
  const names: string[] = [];
  for await (const e of Deno.readDir(dir)) {
    if (e.isFile && e.name.endsWith(".safetensors")) names.push(e.name);
  }
  if (names.length === 0) {
    throw new CheckpointError(
      `${dir}: no weights: expected ${SINGLE_FILE}, ${INDEX_FILE} or *.safetensors files`,
    );
  }
  names.sort();
  const files = names.map((n) => join(dir, n));
  const tensors = new Map<string, TensorInfo>();
  for (const file of files) {
    for (const [name, info] of await readSafetensorsHeader(file)) {
      const prev = tensors.get(name);
      if (prev) {
        throw new CheckpointError(
          `${dir}: tensor ${name} is in both ${basename(prev.file)} and ${
            basename(file)
          } (and there is no ${INDEX_FILE})`,
        );
      }
      tensors.set(name, info);
    }
  }
  return { files, tensors };
}

async function openIndexed(dir: string, indexPath: string): Promise<Shards> {
  const index = await readJsonFile(indexPath);
  const map = (index as { weight_map?: unknown } | null)?.weight_map;
  if (typeof map !== "object" || map === null || Array.isArray(map)) {
    throw new CheckpointError(`${indexPath}: expected an object with weight_map {tensor name: shard file}`);
  }
  const byFile = new Map<string, string[]>();
  for (const [name, file] of Object.entries(map as Record<string, unknown>)) {
    if (typeof file !== "string" || file.includes("/") || file.includes("\\") || file.startsWith(".")) {
      throw new CheckpointError(
        `${indexPath}: tensor ${name} maps to ${JSON.stringify(file)}, expected a file name`,
      );
    }
    if (!byFile.has(file)) byFile.set(file, []);
    byFile.get(file)!.push(name);
  }
  const files: string[] = [];
  const tensors = new Map<string, TensorInfo>();
  for (const [shard, names] of byFile) {
    const path = join(dir, shard);
    if (!(await exists(path))) {
      throw new CheckpointError(`${indexPath}: shard ${shard} (holding ${names[0]}) not found in ${dir}`);
    }
    files.push(path);
    const header = await readSafetensorsHeader(path);
    for (const name of names) {
      const info = header.get(name);
      if (!info) {
        throw new CheckpointError(`${indexPath}: maps tensor ${name} to ${shard}, which does not hold it`);
      }
      tensors.set(name, info);
    }
  }
  return { files, tensors };
}

/** Up to `n` tensor names closest to `name` (edit distance), for "did you mean" in errors. */
function similarNames(name: string, names: Iterable<string>, n = 3): string[] {
  const scored: [number, string][] = [];
  for (const other of names) scored.push([editDistance(name, other), other]);
  scored.sort((a, b) => a[0] - b[0] || a[1].localeCompare(b[1]));
  return scored.slice(0, n).map(([, s]) => s);
}

function editDistance(a: string, b: string): number {
  let prev = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    const cur = [i];
    for (let j = 1; j <= b.length; j++) {
      cur[j] = Math.min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] === b[j - 1] ? 0 : 1));
    }
    prev = cur;
  }
  return prev[b.length];
}

function sameShape(a: readonly number[], b: readonly number[]): boolean {
  return a.length === b.length && a.every((d, i) => d === b[i]);
}

/** An opened model directory: its config and where each tensor is. Reading loads one tensor at a time. */
export class Checkpoint {
  private constructor(
    readonly dir: string,
    readonly config: ModelConfig,
    readonly tensors: Map<string, TensorInfo>,
    /** The safetensors files in use. */
    readonly files: string[],
  ) {}

  #ahead: ReadAhead | undefined;

  /**
   * Reads `names` (those this checkpoint holds) ahead of their use, in that order, within `limits`
   * (models/read_ahead.ts), replacing any read-ahead before; `stopReadAhead` lets go of what is left.
   */
  readAhead(names: Iterable<string>, limits: ReadAheadLimits = READ_AHEAD): void {
    this.#ahead?.stop();
    const infos = [...names].flatMap((n) => this.tensors.get(n) ?? []);
    this.#ahead = limits.bytes > 0 ? new ReadAhead(infos, limits) : undefined;
  }

  stopReadAhead(): void {
    this.#ahead?.stop();
    this.#ahead = undefined;
  }

  #bytes(info: TensorInfo): Promise<Uint8Array> {
    return this.#ahead?.take(info) ?? readTensorBytes(info);
  }

  /**
   * Opens `dir`: checks that it exists, parses config.json with its family (models/family.ts) and reads
   * the headers of its weight files. Throws CheckpointError for any bad input.
   */
  static async open(dir: string): Promise<Checkpoint> {
    await checkDir(dir);
    const config = await readModelConfig(dir);
    const { files, tensors } = await openShards(dir);
    return new Checkpoint(dir, config, tensors, files);
  }

  has(name: string): boolean {
    return this.tensors.has(name);
  }

  /** Decoder layers the weights hold tensors for (`model.layers.{i}.*`, counted by distinct i). */
  layersStored(): number {
    const layers = new Set<string>();
    for (const name of this.tensors.keys()) {
      const m = /^model\.layers\.(\d+)\./.exec(name);
      if (m) layers.add(m[1]);
    }
    return layers.size;
  }

  /** Where tensor `name` is; CheckpointError naming a few similar names when there is none. */
  info(name: string): TensorInfo {
    const info = this.tensors.get(name);
    if (!info) {
      const near = similarNames(name, this.tensors.keys());
      throw new CheckpointError(
        `${this.dir}: missing tensor ${name}` +
          (near.length ? ` (similar: ${near.join(", ")})` : " (no tensors)"),
      );
    }
    return info;
  }

  /**
   * Reads one tensor's raw bytes (little-endian, in its stored dtype; block-scaled fp8 weights come
   * dequantised, as F32), after checking its shape against `expectShape` when given: "tensor X has shape
   * [..], expected [..]" otherwise.
   */
  async read(
    name: string,
    expectShape?: number[],
  ): Promise<{ dtype: DType; shape: number[]; bytes: Uint8Array }> {
    const info = this.info(name);
    if (expectShape && !sameShape(info.shape, expectShape)) {
      throw new CheckpointError(
        `${basename(info.file)}: tensor ${name} has shape [${info.shape.join(", ")}], expected [${
          expectShape.join(", ")
        }]`,
      );
    }
    if (info.dtype !== "F8_E4M3") {
      return { dtype: info.dtype, shape: info.shape, bytes: await this.#bytes(info) };
    }
    // Block-scaled fp8 (models/fp8.ts): dequantised here, so every reader sees f32.
    const t = await this.readFp8(name);
    const values = dequantFp8(name, t.codes, t.shape, t.scales, t.scaleShape, this.config.weightQuant!);
    return { dtype: "F32", shape: info.shape, bytes: new Uint8Array(values.buffer) };
  }

  /**
   * An F8_E4M3 tensor as stored, with its block scales (`<name>_scale_inv`, as f32), for a reader that
   * dequantises on its own (the GPU conversion, models/upload.ts). CheckpointError naming what is missing
   * or misshapen, or when config.json says nothing of fp8.
   */
  async readFp8(name: string): Promise<Fp8Tensor> {
    const info = this.info(name);
    const q = this.config.weightQuant;
    if (!q) {
      throw new CheckpointError(
        `${
          basename(info.file)
        }: tensor ${name} is ${info.dtype}, but config.json has no quantization_config ` +
          `(quant_method "fp8", weight_block_size) to say how it is scaled`,
      );
    }
    if (info.dtype !== "F8_E4M3") {
      throw new CheckpointError(`${basename(info.file)}: tensor ${name} is ${info.dtype}, not F8_E4M3`);
    }
    const scale = this.info(scaleNameOf(name));
    checkFp8Shapes(name, info.shape, scale.shape, q);
    const scaleBytes = await this.#bytes(scale);
    const scales = convert(scaleNameOf(name), () => toF32(scaleBytes, scale.dtype));
    return { codes: await this.#bytes(info), shape: info.shape, scales, scaleShape: scale.shape };
  }

  /** Reads one tensor as float32 (F32, F16, BF16 stored; others are CheckpointError). */
  async readF32(name: string, expectShape?: number[]): Promise<Float32Array> {
    const { dtype, bytes } = await this.read(name, expectShape);
    return convert(name, () => toF32(bytes, dtype));
  }

  /** Reads one tensor as f16 bits, rounding F32/BF16 to nearest even. */
  async readF16(name: string, expectShape?: number[]): Promise<Uint16Array> {
    const { dtype, bytes } = await this.read(name, expectShape);
    return convert(name, () => toF16Bits(bytes, dtype));
  }
}

/** Adds the tensor's name to a dtype error, which alone would not say which tensor was the problem. */
function convert<T>(name: string, f: () => T): T {
  try {
    return f();
  } catch (e) {
    if (e instanceof CheckpointError) throw new CheckpointError(`tensor ${name}: ${e.message}`);
    throw e;
  }
}
