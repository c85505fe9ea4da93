// Puts named checkpoint tensors on the GPU in the engine's storage, for the model loader (models/model.ts)
// and the expert hosts (models/experts.ts). The raw bytes go up as the file holds them (bf16, f16, f32, or
// fp8 codes with their block scales) and one compute dispatch (kernels/convert.ts) rounds, dequantises or
// quantises them there, bit-identical to the CPU conversion (models/dtype.ts, models/fp8.ts,
// kernels/quant.ts), which stays as the reference and the path for mixed dtypes. A source that makes its
// weights (models/random_weights.ts) skips the upload: the same kernel generates them.
import { type DType, dtypeSize, numel } from "./safetensors.ts";
import type { ModelConfig } from "./config.ts";
import { CheckpointError } from "./errors.ts";
import { toF16Bits, toF32 } from "./dtype.ts";
import type { Fp8Tensor } from "./fp8.ts";
import type { ReadAheadLimits } from "./read_ahead.ts";
import {
  convertCall,
  convertedBytes,
  type ConvertTarget,
  type Fp8Blocks,
  type Gpu,
  isQuant,
  quantize,
  type RandomFill,
  type RawType,
  readBack,
  releaseCalls,
  runCalls,
  storageBuffer,
  uploadBuffer,
  writeBytes,
} from "../kernels/mod.ts";

/** Where weights come from: a checkpoint on disk (models/checkpoint.ts) or a generator. */
export interface WeightSource {
  readonly dir: string;
  readonly config: ModelConfig;
  /** Decoder layers the weights hold. */
  layersStored(): number;
  /** A tensor's dtype and shape, and its byte range (for progress); CheckpointError when missing. */
  info(name: string): { dtype: DType; shape: number[]; begin: number; end: number };
  /** A tensor's raw little-endian bytes in its dtype (a checkpoint's block-scaled fp8 comes as F32). */
  read(name: string): Promise<{ dtype: DType; shape: number[]; bytes: Uint8Array }>;
  /** A tensor as f32 values (for weights the loader transforms on the CPU). */
  readF32(name: string): Promise<Float32Array>;
  /** An F8_E4M3 tensor's codes and block scales as stored (a checkpoint's; models/fp8.ts). */
  readFp8?(name: string): Promise<Fp8Tensor>;
  /** For generated weights: what the GPU makes for the tensors uploaded under this (first) name. */
  random?(name: string): RandomFill;
  /** Starts reading these tensors ahead of their use, in this order (models/read_ahead.ts). */
  readAhead?(names: Iterable<string>, limits?: ReadAheadLimits): void;
  /** Lets go of what was read ahead and not used. */
  stopReadAhead?(): void;
}

/** How tensors are converted: on the GPU (default) or on the CPU (the reference, and the old path). */
export type ConvertOn = "gpu" | "cpu";

const RAW: ReadonlySet<string> = new Set(["BF16", "F16", "F32"]);

/** Uploads tensors one call at a time; `finish` checks what the GPU found and frees the staging space. */
export class WeightUploader {
  /** Bytes of weights put on the GPU. */
  bytes = 0;
  #staging: GPUBuffer | undefined;
  #bad: { buf: GPUBuffer; names: string }[] = [];
  #dummy: GPUBuffer | undefined;
  #old: GPUBuffer[] = [];

  constructor(
    readonly gpu: Gpu,
    readonly source: WeightSource,
    readonly opts: { on?: ConvertOn } = {},
  ) {}

  /**
   * `names` concatenated row-wise, stored as `as`. q8 / q4 need K (the row length, a multiple of 32). The
   * result is bound whole by the kernels, so it must fit the adapter's largest binding.
   */
  async upload(names: string[], as: ConvertTarget, K?: number): Promise<GPUBuffer> {
    const infos = names.map((n) => this.source.info(n));
    const count = infos.reduce((s, i) => s + numel(i.shape), 0);
    const outBytes = convertedBytes(count, as);
    const maxBinding = this.gpu.device.limits.maxStorageBufferBindingSize;
    const what = names.length > 3 ? `${names[0]} (+ ${names.length - 1} more)` : names.join("+");
    if (outBytes > maxBinding) {
      throw new Error(
        `${what} needs ${outBytes} bytes on the GPU, above ${this.gpu.adapterName}'s largest ` +
          `binding (${maxBinding})${as === "f32" ? "; try 16-bit weights" : ""}`,
      );
    }
    if (isQuant(as) && (K === undefined || count % K !== 0)) {
      throw new RangeError(`${what}: ${as} storage needs the row length K`);
    }
    const label = names[0];
    this.bytes += outBytes;
    const random = this.source.random?.(names[0]);
    if (random) return this.#convert({ count, from: "random", to: as, K, random }, undefined, label);
    // Block-scaled fp8 (models/fp8.ts): the codes and scales go up as stored and the GPU dequantises them,
    // where the stack shares one block layout; otherwise `read` dequantises on the CPU, below.
    const q = this.source.config.weightQuant;
    if (q && this.source.readFp8 && this.opts.on !== "cpu" && fp8Stack(infos, q.block[0])) {
      const parts = await Promise.all(names.map((n) => this.source.readFp8!(n)));
      const src = this.#stage(parts.map((p) => p.codes), count);
      const scales = new Float32Array(parts.reduce((s, p) => s + p.scales.length, 0));
      let at = 0;
      for (const p of parts) {
        scales.set(p.scales, at);
        at += p.scales.length;
      }
      const sbuf = uploadBuffer(this.gpu, scales, "fp8 scales");
      this.#old.push(sbuf);
      const fp8 = { K: infos[0].shape[1], bn: q.block[0], bk: q.block[1], scales: sbuf };
      return this.#convert({ count, from: "F8_E4M3", to: as, K, fp8 }, src, label);
    }
    // The dtypes as read (a source may dequantise: fp8 checkpoints read as F32), not as stored.
    const parts = await Promise.all(names.map((n) => this.source.read(n)));
    const dtype = parts[0].dtype;
    const same = parts.every((p) => p.dtype === dtype) && RAW.has(dtype);
    if (this.opts.on === "cpu" || !same) {
      return uploadBuffer(this.gpu, cpuConvert(names, parts, as, K), label);
    }
    const raw = dtype as RawType;
    // Stored as it is: no conversion to do.
    if ((raw === "F32" && as === "f32") || (raw === "F16" && as === "f16")) {
      return this.#stage(parts.map((p) => p.bytes), outBytes, label);
    }
    const src = this.#stage(parts.map((p) => p.bytes), count * dtypeSize(dtype));
    return this.#convert({ count, from: raw, to: as, K }, src, label);
  }

  /** Raw bytes into the (reused, grown) staging buffer, or into a new buffer of `keep` bytes. */
  #stage(parts: Uint8Array[], bytes: number, keep?: string): GPUBuffer {
    let buf: GPUBuffer;
    if (keep !== undefined) buf = storageBuffer(this.gpu, bytes, keep);
    else {
      if (!this.#staging || this.#staging.size < bytes) {
        if (this.#staging) this.#old.push(this.#staging);
        this.#staging = storageBuffer(this.gpu, bytes, "weight staging");
      }
      buf = this.#staging;
    }
    let at = 0;
    const aligned = parts.every((p, i) => i === parts.length - 1 || p.byteLength % 4 === 0);
    if (aligned) {
      for (const p of parts) {
        writeBytes(this.gpu, buf, at, p);
        at += p.byteLength;
      }
    } else {
      const all = new Uint8Array(parts.reduce((s, p) => s + p.byteLength, 0));
      for (const p of parts) {
        all.set(p, at);
        at += p.byteLength;
      }
      writeBytes(this.gpu, buf, 0, all);
    }
    return buf;
  }

  #convert(
    d: Conversion & { fp8?: Fp8Blocks },
    src: GPUBuffer | undefined,
    label: string,
  ): GPUBuffer {
    const out = storageBuffer(this.gpu, convertedBytes(d.count, d.to), label);
    const bad = storageBuffer(this.gpu, 4, "convert check");
    this.#dummy ??= storageBuffer(this.gpu, 16, "convert dummy");
    const call = convertCall(this.gpu, { src: src ?? this.#dummy, out, bad }, {
      ...d,
      N: d.K ? d.count / d.K : undefined,
    });
    const enc = this.gpu.device.createCommandEncoder();
    const pass = enc.beginComputePass();
    pass.setPipeline(call.pipeline);
    pass.setBindGroup(0, call.bindGroup);
    pass.dispatchWorkgroups(...call.workgroups);
    pass.end();
    this.gpu.device.queue.submit([enc.finish()]);
    releaseCalls([call]);
    if (isQuant(d.to)) this.#bad.push({ buf: bad, names: label });
    else bad.destroy();
    return out;
  }

  /** Waits for the GPU, throws if a quantised tensor held a value that is not finite, frees staging. */
  async finish(): Promise<void> {
    await this.gpu.device.queue.onSubmittedWorkDone();
    try {
      for (const { buf, names } of this.#bad) {
        const v = new Uint32Array(await readBack(this.gpu, buf, 4))[0];
        if (v !== 0) {
          throw new RangeError(`${names}: weight ${0xffffffff - v} is not finite; cannot quantise`);
        }
      }
    } finally {
      this.close();
    }
  }

  /** Frees the staging space (the uploaded weights stay). */
  close(): void {
    for (const b of [...this.#bad.map((b) => b.buf), ...this.#old, this.#staging, this.#dummy]) b?.destroy();
    this.#bad = [];
    this.#old = [];
    this.#staging = this.#dummy = undefined;
  }
}

/** What one conversion dispatch makes (kernels/convert.ts convertCall's description, less its layout). */
type Conversion = {
  count: number;
  from: RawType | "random";
  to: ConvertTarget;
  K?: number;
  random?: RandomFill;
};

/**
 * Whether matrices stacked row-wise can be dequantised as one fp8 source (kernels/convert.ts Fp8Blocks):
 * all F8_E4M3 with the same columns, every one but the last a whole number of row blocks (bn rows).
 */
function fp8Stack(infos: { dtype: DType; shape: number[] }[], bn: number): boolean {
  const K = infos[0].shape[1];
  return infos.every((i, j) =>
    i.dtype === "F8_E4M3" && i.shape.length === 2 && i.shape[1] === K &&
    (j === infos.length - 1 || i.shape[0] % bn === 0)
  );
}

/** The CPU conversion: f32 / f16 values, quantised when asked. */
function cpuConvert(
  names: string[],
  parts: { dtype: DType; bytes: Uint8Array }[],
  as: ConvertTarget,
  K?: number,
): Uint8Array | Uint16Array | Float32Array {
  const f16 = as === "f16";
  const conv = parts.map((p, i) => {
    try {
      return f16 ? toF16Bits(p.bytes, p.dtype) : toF32(p.bytes, p.dtype);
    } catch (e) {
      if (e instanceof CheckpointError) throw new CheckpointError(`tensor ${names[i]}: ${e.message}`);
      throw e;
    }
  });
  const length = conv.reduce((s, p) => s + p.length, 0);
  const all = f16 ? new Uint16Array(length) : new Float32Array(length);
  let at = 0;
  for (const p of conv) {
    all.set(p, at);
    at += p.length;
  }
  return isQuant(as) ? quantize(all as Float32Array, { N: length / K!, K: K! }, as) : all;
}

/** Runs a conversion alone and reads it back (tests compare it with the CPU's). */
export async function convertOnGpu(
  gpu: Gpu,
  bytes: Uint8Array,
  /** `fp8`: an F8_E4M3 source's layout, its scales as f32 (kernels/convert.ts Fp8Blocks). */
  d: Conversion & { fp8?: Omit<Fp8Blocks, "scales"> & { scales: Float32Array } },
): Promise<{ out: Uint8Array; bad: number }> {
  const src = uploadBuffer(gpu, bytes.byteLength ? bytes : new Uint8Array(4), "convert src");
  const out = storageBuffer(gpu, convertedBytes(d.count, d.to), "convert out");
  const bad = storageBuffer(gpu, 4, "convert bad");
  const scales = d.fp8 ? uploadBuffer(gpu, d.fp8.scales, "convert scales") : undefined;
  const fp8 = d.fp8 && scales ? { ...d.fp8, scales } : undefined;
  const call = convertCall(gpu, { src, out, bad }, { ...d, fp8, N: d.K ? d.count / d.K : undefined });
  try {
    await runCalls(gpu, [call]);
    return {
      out: new Uint8Array(await readBack(gpu, out, Math.ceil(convertedBytes(d.count, d.to) / 4) * 4))
        .subarray(0, convertedBytes(d.count, d.to)),
      bad: new Uint32Array(await readBack(gpu, bad, 4))[0],
    };
  } finally {
    releaseCalls([call]);
    for (const b of [src, out, bad, scales]) b?.destroy();
  }
}
