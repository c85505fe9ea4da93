// A decoder-only transformer on WebGPU, for every family (models/families/): the family's config says what
// each layer runs (models/config.ts), the blocks (models/blocks/) load their weights and build their
// kernels. A Model may be the whole network or a part of it: a contiguous layer range, with or without
// the embedding (first stage) and the final norm + head + sampler (last stage).
//
// Per token t (shapes for one token; prefill runs T at once):
//   x      = embed_tokens[token]                          [H]
//   each layer:
//     x   += attention(rmsnorm(x))                        [H]   (blocks/gqa.ts, blocks/mla.ts)
//     x   += ffn(rmsnorm(x))                              [H]   (blocks/mlp.ts, blocks/moe.ts)
//   logits = rmsnorm(x) * norm @ lm_head^T                [V]   (lm_head = embed_tokens when tied)
//   token  = sample(logits)
import { type ConvertOn, type WeightSource, WeightUploader } from "./upload.ts";
import type { ReadAheadLimits } from "./read_ahead.ts";
import type { ModelConfig } from "./config.ts";
import { bf16ToF32, f16ToF32, f32ToBf16, f32ToF16 } from "./dtype.ts";
import { CheckpointError, RequestError } from "./errors.ts";
import { type ModelPart, mtpTensors, tensorShapes } from "./tensors.ts";
import {
  attentionLengthBucket,
  biasAddCall,
  createStepBuffer,
  DECODE_MAX_T,
  deviceLost,
  embedCall,
  EnvError,
  GEMV_MULTI_MAX_T,
  gemvFusedCalls,
  gemvFusedFits,
  type Gpu,
  GpuMemoryError,
  type InputCopy,
  isKvType,
  isQuant,
  type KernelCall,
  KV_TYPES,
  type KvType,
  mlaLengthBucket,
  outOfMemoryErrors,
  outOfMemorySince,
  packColumnBlocksCall,
  prefillLinearCalls,
  quantFits,
  type QuantType,
  releaseCalls,
  rmsnormCall,
  ropeAttentionFactor,
  ropeInvFreq,
  ropeTable,
  runCalls,
  sameLengthBuckets,
  sampleCalls,
  samplingBuffer,
  type SamplingOptions,
  storageBuffer,
  uploadBuffer,
  type WeightType,
  withSharedUniforms,
  writeSampling,
} from "../kernels/mod.ts";
import type { BlockContext, TensorReader } from "./blocks/context.ts";
import {
  attentionBuffers,
  attentionCache,
  attentionInput,
  attentionPartBytes,
  attentionProgram,
  type AttentionWeights,
  ffnBuffers,
  ffnProgram,
  type FfnWeights,
  kvBytesPerToken,
  layerLink,
  loadAttention,
  loadFfn,
  ropeDim,
  scratchWidths,
} from "./blocks/mod.ts";
import { moeScratch, moeScratchBuffers } from "./blocks/moe.ts";
import type { MoeFfn } from "./config.ts";
import { layerPrefix } from "./tensors.ts";

/** Weight storage on the GPU: floats, or 8 / 4-bit groups of 32 quantised at load. */
export type WeightsOption = WeightType | QuantType;

export interface LoadOptions {
  /**
   * Weight storage on the GPU. Default: "f16" where the GPU has shader-f16, else "f32" (exact against
   * the fixtures). "q8" / "q4" quantise every matrix at load (kernels/quant.ts), norms staying f32; a
   * matrix whose rows are not a multiple of 32 stays f16 (f32 without shader-f16).
   */
  weights?: WeightsOption;
  /**
   * The KV cache's element type (kernels/kv.ts). Default: gpu.tuning.kv, else env SWACTOR_KV, else f16 where
   * the GPU has shader-f16 and the weights are not f32, else f32 (kvCacheType).
   */
  kv?: KvType;
  /** Layers [start, end) this part runs. Default: all. */
  layers?: [number, number];
  /** Whether this part embeds tokens (the first stage). Default: layers start at 0. */
  embed?: boolean;
  /** Whether this part applies the final norm, head and sampler (the last stage). Default: layers end at L. */
  head?: boolean;
  /** Called after each tensor is on the GPU, with bytes read so far and in all. */
  onProgress?: (done: number, total: number) => void;
  /**
   * MoE layers (in this part) whose routed experts are held by expert hosts (models/experts.ts) instead of
   * here: the step stops after such a layer's router, and the engine adds the hosts' sum. Default: none.
   */
  remoteExperts?: readonly number[];
  /** Where the checkpoint's floats are converted to the storage: "gpu" (default) or "cpu" (the reference). */
  convert?: ConvertOn;
  /** How far the checkpoint is read ahead of the uploads (models/read_ahead.ts); `{bytes: 0}` reads each as asked. */
  readAhead?: ReadAheadLimits;
  /**
   * Load `mtp`'s first multi-token-prediction module instead of a layer range (models/mtp.ts): its decoder
   * layer (numLayers), enorm, hnorm, eh_proj, and its head's norm and matrix where the checkpoint ships them.
   * It shares the target's embedding table (and final norm or lm_head where it has none of its own); `mtp`
   * must be the whole model, loaded from the same checkpoint.
   */
  mtp?: Model;
}

/** An MTP module's own weights: h' = eh_proj(concat(enorm(embed(next)), hnorm(h))) = ehEmbed · e + ehHidden · h. */
export interface MtpWeights {
  enorm: GPUBuffer;
  hnorm: GPUBuffer;
  /** eh_proj's columns 0..H-1 [H, H] (they multiply the normalised embedding). */
  ehEmbed: GPUBuffer;
  /** eh_proj's columns H..2H-1 [H, H] (they multiply the normalised hidden state). */
  ehHidden: GPUBuffer;
}

/** Whether a weight source holds tensor `name`. */
function holds(ckpt: WeightSource, name: string): boolean {
  try {
    ckpt.info(name);
    return true;
  } catch (e) {
    if (e instanceof CheckpointError) return false;
    throw e;
  }
}

/** A matrix's storage when the model asks for `wt`: quantised only if its rows (K) allow. */
export function matrixStorage(wt: WeightsOption, K: number, floatType: WeightType): WeightsOption {
  return isQuant(wt) && !quantFits(K) ? floatType : wt;
}

/** The default weight storage on this GPU: f16 where shader-f16 exists, else f32. */
export function defaultWeights(gpu: Gpu): WeightType {
  return gpu.hasF16 ? "f16" : "f32";
}

/**
 * The KV cache's element type (GQA's K and V, MLA's latent rows) for weights `wt`, chosen once per Model.load:
 * `asked` (LoadOptions.kv: `--kv`, or the Plan's ModelRef), else `gpu.tuning.kv`, else env SWACTOR_KV (f16 |
 * f32 | q8), else f16 where the adapter has shader-f16 and the weights are not f32 (f16, q8, q4: half the bytes
 * the decode attention reads), else f32 (f32 weights stay exact to the fixtures). q8 (int8 rows with a scale
 * each, kernels/kv.ts) is opt-in: GQA layers whose head_dim is a multiple of 4 take it, the others keep f16.
 */
export function kvCacheType(gpu: Gpu, wt: WeightsOption, asked?: KvType): KvType {
  const given = asked ?? gpu.tuning.kv;
  const env = given ? undefined : Deno.env.get("SWACTOR_KV") || undefined;
  if (env !== undefined && !isKvType(env)) {
    throw new EnvError(`SWACTOR_KV must be one of ${KV_TYPES.join(", ")}, got "${env}"`);
  }
  const kv = given ?? (env as KvType | undefined) ?? (gpu.hasF16 && wt !== "f32" ? "f16" : "f32");
  if (kv !== "f32" && !gpu.hasF16) {
    throw new RequestError(`an ${kv} KV cache needs shader-f16, which ${gpu.adapterName} lacks`);
  }
  if (kv === "q8" && !gpu.hasDp4) {
    throw new RequestError(
      `a q8 KV cache needs WGSL's packed_4x8_integer_dot_product (pack4xI8), which ${gpu.adapterName} lacks`,
    );
  }
  return kv;
}

interface LayerWeights {
  attention: AttentionWeights;
  ffn: FfnWeights;
}

/**
 * RoPE inverse frequencies as transformers uses them for this checkpoint. transformers keeps them in a
 * module buffer, which is cast with the model: a model cast to bf16 (or f16) rounds its inverse
 * frequencies to that dtype, and the reference outputs (fixtures/README.md) are computed that way.
 * So for a checkpoint whose torch_dtype is bfloat16 / float16 we round them the same way.
 */
export function ropeInvFreqAsStored(c: ModelConfig, headDim: number): Float32Array {
  const inv = ropeInvFreq(headDim, c.rope.theta, c.rope.scaling);
  if (c.torchDtype === "bfloat16") return bf16ToF32(f32ToBf16(inv));
  if (c.torchDtype === "float16") return f16ToF32(f32ToF16(inv));
  return inv;
}

/** CheckpointError unless `ckpt` holds as many layers as config.json says (before any table is built for them). */
export function checkLayersStored(ckpt: WeightSource): void {
  const c = ckpt.config;
  if (c.numLayers > ckpt.layersStored()) {
    throw new CheckpointError(
      `${ckpt.dir}: config.json says num_hidden_layers = ${c.numLayers}, but the weights hold ${ckpt.layersStored()} layers`,
    );
  }
}

/**
 * Checks, before anything is built or uploaded, that `ckpt` holds as many layers as config.json says and
 * every tensor of `wanted` (default: the whole model's, tensorShapes) in the shape config.json implies:
 * CheckpointError naming the first that is missing or misshapen. Returns their bytes as stored.
 */
export function checkWeights(ckpt: WeightSource, wanted?: Map<string, number[]>): number {
  checkLayersStored(ckpt);
  let total = 0;
  for (const [name, shape] of wanted ?? tensorShapes(ckpt.config)) {
    const info = ckpt.info(name);
    if (info.shape.join() !== shape.join()) {
      throw new CheckpointError(
        `tensor ${name} has shape [${info.shape}], expected [${shape}] from config.json`,
      );
    }
    total += info.end - info.begin;
  }
  return total;
}

/** Weights of one part (or the whole model) resident on the GPU. */
export class Model {
  /** partShape, made on first use (the part never changes). */
  #shape: PartShape | undefined;
  private constructor(
    readonly gpu: Gpu,
    readonly config: ModelConfig,
    readonly part: ModelPart,
    /** The weight storage asked for (a matrix may differ: see typeOf). */
    readonly weightType: WeightsOption,
    /** Storage of the norm weights. */
    readonly normType: WeightType,
    /** Element type of the GQA KV cache its sequences allocate (kvCacheType). */
    readonly kvType: KvType,
    private readonly types: Map<GPUBuffer, WeightsOption>,
    readonly embedTable: GPUBuffer | null,
    readonly layers: LayerWeights[],
    readonly finalNorm: GPUBuffer | null,
    readonly lmHead: GPUBuffer | null,
    /** Bytes of weights on the GPU. */
    readonly weightBytes: number,
    /** An MTP module's own weights (part.mtp), else null. */
    readonly mtp: MtpWeights | null = null,
    /** Buffers another model owns (an MTP module's shared embedding and head): destroy leaves them. */
    private readonly borrowed: ReadonlySet<GPUBuffer> = new Set(),
  ) {}

  /** RoPE tables by capacity in positions, shared by the model's sequences (ropeTableFor). */
  readonly #ropeTables = new Map<number, GPUBuffer>();

  /**
   * The RoPE (cos, sin) table a sequence of `maxSeq` positions reads: at least maxSeq rows, made once per
   * capacity (a power of two from 1,024, at most the model's positions) and shared by all its sequences, as a
   * row depends on its position alone. Computed per request it cost the host 4-5 ms at 1,056 positions and
   * 65-146 ms at 32,768 (head_dim 64 / 128), with the GPU memory and upload of one more table each.
   * It carries yarn's attention factor where the scaling has one (transformers multiplies cos and sin by it).
   */
  ropeTableFor(maxSeq: number): GPUBuffer {
    const c = this.config;
    // Every layer of a family shares one RoPE width, so one table serves the part.
    const spec = this.partShape().specs[0];
    const dim = spec ? ropeDim(spec.attention) : 2;
    const rowBytes = (dim / 2) * 8;
    let rows = Math.min(
      2 ** Math.ceil(Math.log2(Math.max(maxSeq, 1024))),
      Math.max(maxSeq, c.maxPositionEmbeddings),
    );
    // Where the rounded table would not fit a binding, exactly the rows asked for.
    if (rows * rowBytes > this.gpu.device.limits.maxStorageBufferBindingSize) rows = maxSeq;
    let table = this.#ropeTables.get(rows);
    if (!table) {
      const values = ropeTable(ropeInvFreqAsStored(c, dim), rows, {
        attentionFactor: ropeAttentionFactor(c.rope.scaling),
      });
      table = uploadBuffer(this.gpu, values, "rope");
      this.#ropeTables.set(rows, table);
    }
    return table;
  }

  #dense: boolean | undefined;
  /** Whether no layer of this model routes to experts (denseFor): its BlockContext's gemmF16 and int8One. */
  get dense(): boolean {
    return this.#dense ??= denseFor(this.config);
  }

  get hasEmbed(): boolean {
    return this.part.embed;
  }

  get hasHead(): boolean {
    return this.part.head;
  }

  /** What the blocks need of the model (programs only: weights are loaded by Model.load). */
  get context(): BlockContext {
    return {
      gpu: this.gpu,
      normType: this.normType,
      kv: this.kvType,
      gemmF16: this.dense,
      int8One: this.dense,
      typeOf: (b) => this.typeOf(b),
      eps: this.config.rmsNormEps,
      upload: () => {
        throw new Error("weights are uploaded while loading");
      },
      packColumns: () => {
        throw new Error("weights are packed while loading");
      },
    };
  }

  /** How a weight buffer of this model is stored. */
  typeOf(buf: GPUBuffer): WeightsOption {
    const t = this.types.get(buf);
    if (!t) throw new Error(`buffer ${buf.label} is not one of this model's weights`);
    return t;
  }

  /** Reads this part's tensors (only their byte ranges), checking every shape first, and uploads them. */
  static async load(gpu: Gpu, ckpt: WeightSource, opts: LoadOptions = {}): Promise<Model> {
    const c = ckpt.config;
    const wt = opts.weights ?? defaultWeights(gpu);
    if (wt === "f16" && !gpu.hasF16) {
      throw new RequestError(`f16 weights need shader-f16, which ${gpu.adapterName} lacks`);
    }
    const target = opts.mtp;
    const same = (k: "numLayers" | "hiddenSize" | "vocabSize") => target!.config[k] === c[k];
    if (
      target &&
      !(target.hasEmbed && target.hasHead && same("numLayers") && same("hiddenSize") && same("vocabSize"))
    ) {
      throw new TypeError("an MTP module is loaded beside its whole target model, from the same checkpoint");
    }
    if (target && c.mtpLayers < 1) {
      throw new CheckpointError(`${ckpt.dir}: the checkpoint has no multi-token-prediction module`);
    }
    const layers: [number, number] = target
      ? [c.numLayers, c.numLayers + 1]
      : opts.layers ?? [0, c.numLayers];
    if (!target && !(layers[0] >= 0 && layers[0] <= layers[1] && layers[1] <= c.numLayers)) {
      throw new RequestError(`layer range [${layers}] is outside the model's ${c.numLayers} layers`);
    }
    checkLayersStored(ckpt); // before the part's tensor table is built (a config may claim millions of layers)
    const part: ModelPart = target
      ? { layers, embed: false, head: true, remoteExperts: new Set(), mtp: true }
      : {
        layers,
        embed: opts.embed ?? layers[0] === 0,
        head: opts.head ?? layers[1] === c.numLayers,
        remoteExperts: new Set(opts.remoteExperts ?? []),
      };
    const wanted = tensorShapes(c, target ? { ...part, head: false } : part);
    const mtpPrefix = layerPrefix(c.numLayers);
    const own = {
      norm: target !== undefined && holds(ckpt, mtpPrefix + "shared_head.norm.weight"),
      head: target !== undefined && holds(ckpt, mtpPrefix + "shared_head.head.weight"),
    };
    if (target) { for (const [n, shape] of mtpTensors(c, 0, own)) wanted.set(n, shape); }
    const total = checkWeights(ckpt, wanted);
    // In the order the layers ask for them; stopped once the last is read (a load that throws leaves at most
    // the limit's bytes read ahead, dropped with the checkpoint or its next read-ahead).
    ckpt.readAhead?.(wanted.keys(), opts.readAhead);
    let done = 0;
    const types = new Map<GPUBuffer, WeightsOption>();
    const normType: WeightType = isQuant(wt) ? "f32" : wt;
    const kvType = kvCacheType(gpu, wt, opts.kv);
    const floatType: WeightType = gpu.hasF16 ? "f16" : "f32";
    const uploader = new WeightUploader(gpu, ckpt, { on: opts.convert });
    // A buffer the GPU cannot allocate is invalid, not an exception, and a GPU short of memory may lose its
    // device instead (an H100, 2026-12-07: "Parent device is lost"). The load stops at the first sign of
    // either and frees what it had made, rather than give a model that computes garbage, and says why.
    const oom0 = outOfMemoryErrors(gpu);
    const memoryError = (why: string) => {
      ckpt.stopReadAhead?.();
      for (const b of types.keys()) if (!borrowed.has(b)) b.destroy();
      uploader.close();
      const gb = (bytes: number) => (bytes / 1e9).toFixed(1);
      const progress = `${gb(done)} of ${gb(total)} GB of the checkpoint read`;
      return new GpuMemoryError(
        `${gpu.adapterName} ran out of memory loading the model's layers ${layers[0]}-${layers[1] - 1} ` +
          `as ${wt} (${why}; ${progress}): use fewer layers per node (--local N, a cluster), smaller ` +
          `weights (--weights q8 / q4) or a GPU with more memory free`,
      );
    };
    const lostWhy = () => {
      const lost = deviceLost(gpu);
      return lost === undefined ? undefined : `its device was lost: ${lost}`;
    };
    const checkMemory = () => {
      const why = outOfMemorySince(gpu, oom0) ?? lostWhy();
      if (why !== undefined) throw memoryError(why);
    };
    const read: TensorReader = async (names, K, vector = "norm") => {
      const as = K === undefined ? (vector === "f32" ? "f32" : normType) : matrixStorage(wt, K, floatType);
      const buf = await uploader.upload(names, as, K).catch((e) => {
        const lost = lostWhy() ??
          (/device is lost/i.test(String(e?.message)) ? String(e.message) : undefined);
        throw lost === undefined ? e : memoryError(lost);
      });
      for (const n of names) done += ckpt.info(n).end - ckpt.info(n).begin;
      types.set(buf, as);
      checkMemory();
      opts.onProgress?.(done, total);
      return buf;
    };
    const readF32 = async (name: string) => {
      const data = await ckpt.readF32(name);
      done += ckpt.info(name).end - ckpt.info(name).begin;
      opts.onProgress?.(done, total);
      return data;
    };
    let gpuBytes = 0;
    const dense = denseFor(c);
    const ctx: BlockContext = {
      gpu,
      normType,
      kv: kvType,
      gemmF16: dense,
      int8One: dense,
      typeOf: (b) => types.get(b)!,
      eps: c.rmsNormEps,
      upload: (data, as, label) => {
        const bits = as === "f16" ? f32ToF16(data) : data;
        gpuBytes += bits.byteLength;
        const buf = uploadBuffer(gpu, bits, label);
        types.set(buf, as);
        return buf;
      },
      packColumns: async (src, d) => {
        const as = types.get(src);
        if (as !== "q8" && as !== "q4") {
          throw new TypeError(`column blocks are for q8 / q4 stacks, not ${as}`);
        }
        const out = gpu.device.createBuffer({
          size: src.size,
          usage: src.usage,
          label: `${src.label} (columns)`,
        });
        await runCalls(gpu, [packColumnBlocksCall(gpu, { src, out }, { ...d, type: as })]);
        types.delete(src);
        src.destroy();
        types.set(out, as);
        return out;
      },
    };
    const H = c.hiddenSize;
    const borrowed = new Set<GPUBuffer>();
    const borrow = (b: GPUBuffer) => {
      borrowed.add(b);
      types.set(b, target!.typeOf(b));
      return b;
    };
    // A tied embedding table is the head too, the largest matrix: it is quantised like the others.
    const embedTable = target
      ? borrow(target.embedTable!)
      : wanted.has("model.embed_tokens.weight")
      ? await read(["model.embed_tokens.weight"], H)
      : null;
    const lw: LayerWeights[] = [];
    const loaders = { read, readF32 };
    for (let i = layers[0]; i < layers[1]; i++) {
      const spec = c.layer(i);
      const p = layerPrefix(i);
      lw.push({
        attention: await loadAttention(ctx, loaders, spec.attention, H, p),
        ffn: await loadFfn(ctx, loaders, spec.ffn, H, p, !part.remoteExperts!.has(i)),
      });
    }
    let mtp: MtpWeights | null = null;
    let finalNorm: GPUBuffer | null, lmHead: GPUBuffer | null;
    if (target) {
      // eh_proj [H, 2H] is split into its two [H, H] halves, so the concatenation is never built: two
      // products summed. They stay floats (f32 when asked for, else the GPU's float) under q8 / q4.
      const eh = await readF32(mtpPrefix + "eh_proj.weight");
      const halves = [new Float32Array(H * H), new Float32Array(H * H)];
      for (let r = 0; r < H; r++) {
        halves[0].set(eh.subarray(r * 2 * H, r * 2 * H + H), r * H);
        halves[1].set(eh.subarray(r * 2 * H + H, (r + 1) * 2 * H), r * H);
      }
      const ehType: WeightType = isQuant(wt) ? floatType : wt;
      mtp = {
        enorm: await read([mtpPrefix + "enorm.weight"]),
        hnorm: await read([mtpPrefix + "hnorm.weight"]),
        ehEmbed: ctx.upload(halves[0], ehType, "mtp eh_proj (embedding)"),
        ehHidden: ctx.upload(halves[1], ehType, "mtp eh_proj (hidden)"),
      };
      finalNorm = own.norm ? await read([mtpPrefix + "shared_head.norm.weight"]) : borrow(target.finalNorm!);
      lmHead = own.head ? await read([mtpPrefix + "shared_head.head.weight"], H) : borrow(target.lmHead!);
    } else {
      finalNorm = part.head ? await read(["model.norm.weight"]) : null;
      lmHead = part.head ? (c.tieWordEmbeddings ? embedTable : await read(["lm_head.weight"], H)) : null;
    }
    ckpt.stopReadAhead?.();
    await uploader.finish(); // the queue drained: every allocation's error is in
    checkMemory();
    gpuBytes += uploader.bytes;
    return new Model(
      gpu,
      c,
      part,
      wt,
      normType,
      kvType,
      types,
      embedTable,
      lw,
      finalNorm,
      lmHead,
      gpuBytes,
      mtp,
      borrowed,
    );
  }

  /**
   * Starts a sequence (one request): its KV cache for `maxSeq` positions and working buffers. An MTP module's
   * sequence reads the target's hidden states from `hidden` (the target sequence's `x`).
   */
  newSequence(opts: SequenceOptions): Sequence {
    return new Sequence(this, opts);
  }

  /** The positions and rows a new sequence for `opts` holds (RequestError where maxSeq is out of range). */
  sequenceShape(opts: SequenceOptions): SequenceShape {
    const c = this.config;
    checkMaxSeq(opts.maxSeq, c.maxPositionEmbeddings);
    const { widths, moe, moeRow } = this.partShape();
    const maxChunk = stepChunk(opts.maxSeq, this.stepChunkLimits(opts.maxChunk), opts.prompt);
    const actBytes = Math.max(c.hiddenSize, moeRow, ...Object.values(widths)) * 4;
    const prefillChunk = Math.max(
      maxChunk,
      Math.min(
        opts.prefillChunk ?? (opts.maxChunk ?? prefillChunkFor(this, moe !== undefined, maxChunk)),
        opts.maxSeq,
        opts.prompt ?? Infinity,
        Math.floor(this.gpu.device.limits.maxStorageBufferBindingSize / actBytes),
      ),
    );
    const logitsRows = Math.max(1, Math.min(maxChunk, opts.logitsRows ?? LOGITS_ROWS));
    return { maxSeq: opts.maxSeq, maxChunk, prefillChunk, logitsRows };
  }

  /**
   * The layers of this part, the widest per-layer scratch (buffer by buffer), its MoE block if any and the
   * widest row that block's scratch needs: what a Sequence sizes its buffers and chunks by.
   */
  partShape(): PartShape {
    if (this.#shape) return this.#shape;
    const c = this.config;
    const specs = Array.from(
      { length: this.part.layers[1] - this.part.layers[0] },
      (_, i) => c.layer(this.part.layers[0] + i),
    );
    const widths: Record<string, number> = {};
    for (const s of specs) {
      for (const [name, w] of Object.entries(scratchWidths(s.attention, s.ffn))) {
        widths[name] = Math.max(widths[name] ?? 1, w);
      }
    }
    const moe = specs.map((s) => s.ffn).find((f): f is MoeFfn => f.kind === "moe");
    const moeRow = moe ? moe.routing.topK * Math.max(2 * moe.intermediate, c.hiddenSize) : 1;
    return this.#shape = { specs, widths, moe, moeRow };
  }

  /**
   * What bounds a step's tokens on this part (stepChunk): `base`, the rows asked for (SequenceOptions.maxChunk)
   * or the default, and `cap`, the most rows whose widest buffer fits one binding. A chunk bounds how long one
   * submit holds the GPU (and, in Deno, this thread: docs/DENO_WEBGPU.md); a software adapter computes on
   * the CPU, so its chunks are smaller. On a GPU, 512 rows give the prefill GEMM (kernels/gemm.ts) enough
   * tiles to fill the SMs (a 512-token chunk of a 1B model is ~30 ms).
   */
  stepChunkLimits(maxChunk?: number): ChunkLimits {
    const c = this.config;
    const { widths, moeRow } = this.partShape();
    const rowBytes =
      Math.max(this.hasHead ? c.vocabSize : 1, c.hiddenSize, moeRow, ...Object.values(widths)) * 4;
    return {
      base: maxChunk ?? (this.gpu.isSoftware ? 32 : 512),
      cap: Math.floor(this.gpu.device.limits.maxStorageBufferBindingSize / rowBytes),
    };
  }

  /** KV-cache bytes one position costs on this part (all its layers). */
  kvBytesPerToken(): number {
    let n = 0;
    for (let i = this.part.layers[0]; i < this.part.layers[1]; i++) {
      n += kvBytesPerToken(this.config.layer(i).attention, this.kvType);
    }
    return n;
  }

  destroy(): void {
    const bufs = new Set<GPUBuffer>();
    for (const b of [this.embedTable, this.finalNorm, this.lmHead]) if (b) bufs.add(b);
    if (this.mtp) { for (const b of Object.values(this.mtp)) bufs.add(b); }
    for (const l of this.layers) {
      for (const b of [...attentionBuffers(l.attention), ...ffnBuffers(l.ffn)]) bufs.add(b);
    }
    for (const b of bufs) if (!this.borrowed.has(b)) b.destroy();
    for (const t of this.#ropeTables.values()) t.destroy();
    this.#ropeTables.clear();
  }
}

export interface SequenceOptions {
  maxSeq: number;
  sampling: SamplingOptions;
  /** Most tokens a step. Default: 32 on a software adapter, else 512 (bounded by the binding size). */
  maxChunk?: number;
  /**
   * Most tokens a chunk of the engine's own prefill of a whole prompt (Engine.generate; a pipeline stage's
   * steps keep maxChunk). Default: maxChunk where that is given, else prefillChunkFor (>= maxChunk).
   */
  prefillChunk?: number;
  /**
   * Tokens of the request's prompt, where the opener knows them: the activations (x, xn, qkv, gate/up, ...:
   * [rows, width] f32 each) then get rows for that many tokens (at least LOGITS_ROWS) instead of a whole
   * chunk, and a prompt that fits a chunk is still prefilled in one (stepChunk). A chat request's 100-token
   * prompt on Llama-3.2-1B: 14 MB of activations instead of 149 (1,100 positions) or 277 (2,048 and more).
   */
  prompt?: number;
  /** An MTP module's sequence: the target's hidden state [T, H] it reads (the target sequence's `x`). */
  hidden?: GPUBuffer;
  /**
   * Most rows a "logits" step fills (at most maxChunk). Default LOGITS_ROWS, verification's: a generation
   * needs one row, or k + 1 <= 17 to verify k drafts. Teacher-forced logits over a prompt ask for more
   * (Engine.logits). The buffer is [rows, vocab] f32: 263 MB at 512 rows of Llama 3's vocabulary.
   */
  logitsRows?: number;
  /**
   * The KV cache's positions (>= maxSeq; default maxSeq): room past the request's own, so that a later
   * request may reuse the sequence (Engine's spares: reuseCapacity).
   */
  capacity?: number;
}

/**
 * The positions an engine gives a new sequence of `maxSeq` (pure): maxSeq rounded up on a grid of four steps
 * an octave (a multiple of 2^(floor(log2 maxSeq) - 2)), at most `maxPositions`. Less than REUSE_SLACK times
 * maxSeq, never past the power of two at or above it (so the decode attention's buckets stay: its thresholds
 * are powers of two), and the same for every request in the grid step, which a released sequence then serves.
 */
export function reuseCapacity(maxSeq: number, maxPositions: number): number {
  const step = 2 ** Math.max(0, Math.floor(Math.log2(maxSeq)) - 2);
  return Math.max(maxSeq, Math.min(Math.ceil(maxSeq / step) * step, maxPositions));
}

/** Rows of logits a sequence holds unless it asks for more (SequenceOptions.logitsRows). */
export const LOGITS_ROWS = 32;

/**
 * A sequence's geometry (Model.sequenceShape): its positions, the most tokens a step and a prefill chunk, the
 * rows of logits. What its buffers hold, or what a request asks of the sequence serving it.
 */
export interface SequenceShape {
  maxSeq: number;
  maxChunk: number;
  prefillChunk: number;
  logitsRows: number;
}

/**
 * The most positions a released sequence may hold past what a request asks, for that request to reuse it
 * (Sequence.reopen): KV bytes held past the request's own, bounded.
 */
export const REUSE_SLACK = 1.25;

/**
 * Whether a sequence of shape `have` can serve a request asking `want` exactly as a new one would (pure):
 * it holds every position and row the request may use, at most REUSE_SLACK times the positions, and builds
 * the same decode attention for every length the request reaches (kernels/attention_decode.ts
 * sameLengthBuckets; MLA's buckets do not depend on the capacity). A step's kernels otherwise follow its
 * tokens, not the buffers' sizes, and the request keeps its own chunks (Sequence.reopen).
 */
export function shapeServes(have: SequenceShape, want: SequenceShape): boolean {
  return want.maxSeq <= have.maxSeq && have.maxSeq <= want.maxSeq * REUSE_SLACK &&
    sameLengthBuckets(have.maxSeq, want.maxSeq) && want.maxChunk <= have.maxChunk &&
    want.prefillChunk <= have.prefillChunk && want.logitsRows <= have.logitsRows;
}

/** What a program ends with: nothing (hidden state stays in `x`), sampled token, or logits of every row. */
export type ProgramOutput = "hidden" | "sample" | "logits";

/** How a step is built. */
export interface StepOptions {
  /** Whether the step embeds tokens. Default: the part's. */
  embed?: boolean;
  /** An MTP module's chained step: read the hidden input from row `hiddenRow` of its own `x` (T = 1). */
  hiddenRow?: number;
  /**
   * Called, while a program is first built, after each layer with the calls so far (its one segment's; not
   * called where the step is split or the program is cached): the prefill submits the first layers while
   * the rest are built.
   */
  onLayer?: (calls: readonly KernelCall[]) => void;
  /**
   * The most keys the step attends to (pos0 + T), where the caller knows it: the step then takes the program
   * built for its cache's length. One-token steps of MLA (kernels/mla_attention.ts mlaLengthBucket): the whole
   * attention in one dispatch up to mlaFusedKeys; with many heads, one head a workgroup up to MLA_SHORT_KEYS,
   * head groups past it. Steps of up to DECODE_MAX_T tokens of GQA (kernels/attention_decode.ts
   * attentionLengthBucket): no flash-decoding splits up to 1,024 keys, whatever the cache holds, and not the
   * grouped kernel up to 4,096. Unknown: the long caches' program, the one for the cache's capacity.
   */
  keys?: number;
}

/** Part of a step: its kernel calls, and the MoE layer whose remote experts run after it (if any). */
export interface Segment {
  calls: KernelCall[];
  split?: number;
}

/**
 * Whether no layer of the model (any part's) routes to experts. Such a model's BlockContext has gemmF16 (its
 * prefill GEMMs may multiply in f16) and int8One (its one-token q4 GEMVs chain int8 copies).
 */
export function denseFor(c: ModelConfig): boolean {
  for (let i = 0; i < c.numLayers; i++) if (c.layer(i).ffn.kind === "moe") return false;
  return true;
}

/**
 * Parameters x tokens of one prefill chunk at most (2 FLOP each): a chunk of a 1B model takes 2048 tokens,
 * of a 3B 1024, of an 8B the step's 512, so no chunk holds the GPU (and Deno's thread, which waits on it:
 * docs/DENO_WEBGPU.md) longer than an 8B model's 512-token chunk did.
 */
const PREFILL_CHUNK_WORK = 4e12;
/** The prefill chunk's cap: the H200's GEMM tiles gain little past 2048 rows (docs/BENCHMARKS.md). */
const PREFILL_CHUNK_MAX = 2048;

/** Model.partShape: a part's layers and what its per-request buffers are sized by. */
export interface PartShape {
  specs: ReturnType<ModelConfig["layer"]>[];
  widths: Record<string, number>;
  moe: MoeFfn | undefined;
  moeRow: number;
}

/** Model.stepChunkLimits: the rows asked for (or the default) and the most that fit one binding. */
export interface ChunkLimits {
  base: number;
  cap: number;
}

/**
 * The most tokens a step of a `maxSeq`-position sequence takes (Sequence.maxChunk; pure): with the request's
 * `prompt` length (SequenceOptions.prompt), no more than the power of two at or above max(prompt,
 * LOGITS_ROWS), which still takes the prompt in the chunks it would have had (one where it fits a chunk) and
 * every later step (verification's k + 1 <= 17 tokens, a resumed request's one). The power of two lets a
 * released sequence serve the next request of a similar prompt (Sequence.reopen) for at most twice the
 * prompt's rows of activations.
 */
export function stepChunk(maxSeq: number, limits: ChunkLimits, prompt?: number): number {
  const rows = prompt === undefined ? limits.base : 2 ** Math.ceil(Math.log2(Math.max(prompt, LOGITS_ROWS)));
  const asked = Math.min(limits.base, rows);
  return Math.max(1, Math.min(asked, maxSeq, limits.cap));
}

/** A sequence's positions must be a whole number in [1, the model's positions]: RequestError otherwise. */
export function checkMaxSeq(maxSeq: number, maxPositions: number): void {
  if (!(Number.isInteger(maxSeq) && maxSeq >= 1)) {
    throw new RequestError(`maxSeq must be >= 1, got ${maxSeq}`);
  }
  if (maxSeq > maxPositions) {
    throw new RequestError(`context of ${maxSeq} tokens exceeds the model's ${maxPositions} positions`);
  }
}

/**
 * Default tokens a chunk of the engine's own prefill: longer chunks than a step's make the prefill GEMMs'
 * tiles fuller and need fewer submits (H200, Llama-3.2-1B, 2048-token prompt: 12.6k tok/s in chunks of 512,
 * 13.8k in one of 2048). Bounded by PREFILL_CHUNK_WORK over the part's parameters (its weight bytes over
 * their storage's bytes a weight), in multiples of 256; a step's chunk on a software adapter and on parts
 * with MoE layers (their scratch grows with top-k rows a token).
 */
export function prefillChunkFor(model: Model, moe: boolean, maxChunk: number): number {
  if (model.gpu.isSoftware || moe) return maxChunk;
  const perWeight = { f32: 4, f16: 2, q8: 34 / 32, q4: 18 / 32 }[model.weightType];
  const params = model.weightBytes / perWeight;
  const tokens = Math.floor(PREFILL_CHUNK_WORK / params / 256) * 256;
  return Math.max(maxChunk, Math.min(PREFILL_CHUNK_MAX, tokens));
}

/** One request's state on one part: KV cache, activations, the token buffer, and cached programs. */
export class Sequence {
  /** What the buffers hold (the request's own limits are maxSeq, maxChunk, prefillChunk and logitsRows). */
  readonly capacity: SequenceShape;
  /** The request's: its positions, most tokens a step and a prefill chunk, rows of logits (Sequence.reopen). */
  #limits: SequenceShape;
  /** Token ids by position (the sampler writes position p + 1's token while computing position p). */
  readonly tokens: GPUBuffer;
  /** The step uniform (pos0, T, tok_out). */
  readonly step: GPUBuffer;
  /** Hidden state [maxChunk, H]: a stage's input when it does not embed, its output when it has no head. */
  readonly x: GPUBuffer;
  /** Logits [capacity.logitsRows, V] (row 0 only when sampling). */
  readonly logits: GPUBuffer | null;
  /** The sampler's options (kernels/sample.ts samplingBuffer): the request's, rewritten by reopen. */
  readonly #sampling: GPUBuffer;
  /** Bytes of this sequence's KV cache. */
  readonly kvBytes: number;
  /** Bytes of its other buffers: activations (sized by SequenceOptions.prompt where given), logits, token ids. */
  readonly activationBytes: number;
  private readonly buffers: GPUBuffer[] = [];
  private readonly caches: GPUBuffer[][] = [];
  private readonly xn: GPUBuffer;
  /** An MTP module's normalised hidden input [maxChunk, H]. */
  private readonly hn: GPUBuffer | undefined;
  private readonly scratch: Record<string, GPUBuffer> = {};
  private readonly moe: ReturnType<typeof moeScratch> | undefined;
  private readonly ropeTable: GPUBuffer;
  /** The split MLA attention's partials, one buffer for every layer and program (blocks attentionPartBytes). */
  private readonly mlaPart: GPUBuffer | undefined;
  private readonly programs = new Map<string, Segment[]>();
  /** The programs' uniform parameter buffers by contents (kernels/gpu.ts withSharedUniforms). */
  private readonly uniforms = new Map<string, GPUBuffer>();
  /** The MLA heads of this part's layers (their decode cut follows the cache's length), else null. */
  readonly #mlaHeads: number | null;
  /** Whether this part has GQA layers (their decode attention's splits follow the cache's length). */
  readonly #gqa: boolean;
  #expertSum: GPUBuffer | undefined;
  private destroyed = false;

  constructor(
    readonly model: Model,
    private opts: SequenceOptions,
  ) {
    const { gpu, config: c } = model;
    this.#limits = model.sequenceShape(opts);
    const room = opts.capacity ?? opts.maxSeq;
    if (!(Number.isInteger(room) && room >= opts.maxSeq)) {
      throw new RangeError(`a sequence's capacity ${room} is below its ${opts.maxSeq} positions`);
    }
    this.capacity = room === opts.maxSeq ? this.#limits : model.sequenceShape({ ...opts, maxSeq: room });
    const H = c.hiddenSize, V = c.vocabSize;
    const { specs, widths, moe } = model.partShape();
    const mla = specs.map((s) => s.attention).find((a) => a.kind === "mla");
    this.#mlaHeads = mla ? mla.heads : null;
    this.#gqa = specs.some((s) => s.attention.kind === "gqa");
    const cap = this.capacity, C = cap.prefillChunk;
    const buf = (bytes: number, label: string) => {
      const b = storageBuffer(gpu, bytes, label);
      this.buffers.push(b);
      return b;
    };
    this.tokens = buf((cap.maxSeq + 1) * 4, "tokens");
    this.step = createStepBuffer(gpu);
    this.x = buf(C * H * 4, "x");
    this.xn = buf(C * H * 4, "xn");
    if (model.mtp) {
      if (!opts.hidden) {
        throw new TypeError("an MTP module's sequence reads the target's hidden state: give it");
      }
      this.hn = buf(C * H * 4, "mtp hidden");
    }
    for (const [name, w] of Object.entries(widths)) this.scratch[name] = buf(C * w * 4, name);
    this.logits = model.hasHead ? buf(cap.logitsRows * V * 4, "logits") : null;
    this.#sampling = samplingBuffer(gpu, opts.sampling);
    this.buffers.push(this.#sampling);
    if (moe) {
      this.moe = moeScratch(model.context, moe, H, C);
      if (model.part.remoteExperts?.size) this.#expertSum = buf(C * H * 4, "expert sum");
      this.buffers.push(...moeScratchBuffers(this.moe));
    }
    const partBytes = Math.max(
      0,
      ...specs.map((s) => attentionPartBytes(model.context, s.attention, { maxT: C, maxSeq: cap.maxSeq })),
    );
    this.mlaPart = partBytes > 0 ? buf(partBytes, "mla part") : undefined;
    let kvBytes = 0;
    for (const s of specs) {
      const { buffers, bytes } = attentionCache(model.context, s.attention, cap.maxSeq);
      this.caches.push(buffers);
      this.buffers.push(...buffers);
      kvBytes += bytes;
    }
    this.kvBytes = kvBytes;
    this.activationBytes = this.buffers.reduce((n, b) => n + b.size, 0) - kvBytes;
    // The model's table, shared with its other sequences (not this sequence's to destroy).
    this.ropeTable = model.ropeTableFor(cap.maxSeq);
  }

  /** The request's positions (its KV cache holds capacity.maxSeq). */
  get maxSeq(): number {
    return this.#limits.maxSeq;
  }

  /** Largest number of tokens per step of the request (and rows of a "logits" step). */
  get maxChunk(): number {
    return this.#limits.maxChunk;
  }

  /** Largest number of tokens per chunk of the engine's own prefill (>= maxChunk). */
  get prefillChunk(): number {
    return this.#limits.prefillChunk;
  }

  /** Most rows a "logits" step of the request fills (SequenceOptions.logitsRows, at most maxChunk). */
  get logitsRows(): number {
    return this.#limits.logitsRows;
  }

  /**
   * Takes this released sequence for a new request asking `opts`, programs and buffers as they are, where it
   * serves that request exactly as a new sequence would (shapeServes; not an MTP module's): the request gets
   * its own limits and sampling options; its steps must start at position 0 (the KV cache past a step's own
   * positions is never read). False, and nothing changed, where it does not serve.
   */
  reopen(opts: SequenceOptions): boolean {
    if (this.destroyed || opts.hidden || this.opts.hidden) return false;
    const want = this.model.sequenceShape(opts);
    if (!shapeServes(this.capacity, want)) return false;
    writeSampling(this.model.gpu, this.#sampling, opts.sampling);
    this.opts = opts;
    this.#limits = want;
    return true;
  }

  /**
   * The kernel calls for a step of T tokens (built once per (T, output) and reused; one-token steps of
   * MLA also per cache-length bucket, opts.keys), ending as `output` says: "sample" writes the next
   * token into `tokens`; "logits" fills `logits` for all T rows; "hidden" leaves the hidden state in `x` for
   * the next stage. A part with remote experts runs its steps in segments instead (`segments`). An MTP module's
   * step (models/mtp.ts) reads, at positions pos0.., the tokens that follow them from `tokens` and the target's
   * hidden states of rows 0..T-1 of `hidden`, or with `hiddenRow` (T = 1) row `hiddenRow` of its own `x` (its
   * previous step's output: chained drafting).
   */
  program(T: number, output: ProgramOutput, opts: StepOptions = {}): KernelCall[] {
    const segments = this.segments(T, output, opts);
    if (segments.length > 1) throw new Error("this part's experts are remote: run its steps by segments");
    return segments[0].calls;
  }

  /**
   * A step as segments: each ends either the step or at a MoE layer whose routed experts are remote
   * (`split`: the layer). Then `xn` holds the layer's normalised input and the MoE scratch its router's ids
   * and weights; the caller writes the experts' sum into `expertSum` [T, H], and the next segment adds it
   * into the residual stream first.
   */
  segments(T: number, output: ProgramOutput, opts: StepOptions = {}): Segment[] {
    if (this.destroyed) throw new Error("sequence was released");
    // The engine's prefill chunks may be longer than a step: their rows fit the activations, and they end
    // in the hidden state or one sampled row, never in logits for every row.
    const most = output === "logits" ? this.logitsRows : this.prefillChunk;
    if (!(T >= 1 && T <= most)) {
      throw new RangeError(
        output === "logits"
          ? `a logits step of ${T} rows; this sequence holds ${most} (SequenceOptions.logitsRows)`
          : `step of ${T} tokens; at most ${most}`,
      );
    }
    const embed = opts.embed ?? this.model.hasEmbed;
    // Decode steps: a program per cache-length bucket, built for its most keys (StepOptions.keys).
    const bucket = T === 1 && this.#mlaHeads !== null
      ? mlaLengthBucket(this.#mlaHeads, opts.keys)
      : this.#gqa && T <= DECODE_MAX_T
      ? attentionLengthBucket(this.capacity.maxSeq, opts.keys)
      : undefined;
    const key = `${T}/${output}/${embed}/${opts.hiddenRow}/${bucket}`;
    const cached = this.programs.get(key);
    if (cached) return cached;
    // The sequence's programs share uniform buffers of the same contents (released together in destroy).
    const segments = withSharedUniforms(
      this.model.gpu,
      this.uniforms,
      () => this.#build(T, output, embed, opts, bucket),
    );
    this.programs.set(key, segments);
    return segments;
  }

  /** Builds a step's segments (segments() caches them): see there. */
  #build(
    T: number,
    output: ProgramOutput,
    embed: boolean,
    opts: StepOptions,
    bucket: number | undefined,
  ): Segment[] {
    const segments: Segment[] = [];
    let calls: KernelCall[];
    const m = this.model;
    const { gpu, config: c, normType } = m;
    const ctx = m.context;
    const wt = (b: GPUBuffer) => m.typeOf(b);
    const { step, x, tokens, xn } = this;
    const H = c.hiddenSize, V = c.vocabSize;
    calls = [];
    segments.push({ calls });
    if (m.mtp) calls.push(...this.#mtpInput(T, opts.hiddenRow));
    else if (embed) {
      if (!m.embedTable) throw new Error("this stage has no embedding");
      calls.push(embedCall(gpu, { step, tokens, table: m.embedTable, x }, {
        hidden: H,
        vocab: V,
        T,
        weights: wt(m.embedTable),
      }));
    }
    const bufs = {
      step,
      x,
      xn,
      scratch: this.scratch,
      moe: this.moe,
      rope: this.ropeTable,
      maxSeq: this.capacity.maxSeq,
      mlaPart: this.mlaPart,
    };
    // Steps of up to 16 tokens use the fused GEMVs (the norm folded in; 2..16 rows share each weight read,
    // kernels/gemv_multi.ts); prefill chunks and odd shapes the plain kernels.
    // (GQA and the dense MLP decide for the whole block; MLA and MoE per projection, blocks/linear.ts.)
    const layerDims = (i: number) => {
      const spec = c.layer(m.part.layers[0] + i);
      const ks = [H];
      if (spec.attention.kind === "gqa") ks.push(spec.attention.heads * spec.attention.headDim);
      if (spec.ffn.kind === "mlp") ks.push(spec.ffn.intermediate);
      return {
        spec,
        d: {
          hidden: H,
          T,
          fused: T <= GEMV_MULTI_MAX_T && ks.every(gemvFusedFits),
          keys: bucket,
        },
      };
    };
    // The LM head's fused GEMV (RMSNorm folded in), where it serves.
    const rows = output === "logits" ? T : 1;
    const srcRow0 = output === "logits" ? 0 : T - 1;
    const head =
      output !== "hidden" && m.finalNorm && m.lmHead && gemvFusedFits(H) && rows <= GEMV_MULTI_MAX_T
        ? {
          dims: {
            K: H,
            N: V,
            T: rows,
            xRow0: srcRow0,
            weights: wt(m.lmHead),
            normWeights: normType,
            transform: "rmsnorm" as const,
            eps: c.rmsNormEps,
            int8One: ctx.int8One,
          },
          norm: m.finalNorm,
        }
        : undefined;
    // The copy of the next RMSNorm GEMV's input that the layer before wrote (blocks/context.ts LayerLink).
    let input: InputCopy | undefined;
    m.layers.forEach((l, i) => {
      const { spec, d } = layerDims(i);
      const layer = m.part.layers[0] + i;
      // What the blocks hand each other: within the layer o_proj writes the FFN's input copy; across layers
      // the FFN's last GEMV writes the next layer's qkv's or the head's (k-steps; where both sides can).
      const link = layerLink(ctx, spec.ffn, l.ffn, d);
      link.input = input;
      if (!m.part.remoteExperts?.has(layer)) {
        if (i + 1 < m.layers.length) {
          const next = layerDims(i + 1);
          link.after = attentionInput(ctx, next.spec.attention, m.layers[i + 1].attention, next.d);
        } else link.after = head && { ...head, dims: { ...head.dims, int8One: true } };
      }
      calls.push(
        ...attentionProgram(ctx, spec.attention, l.attention, this.caches[i], bufs, { ...d, link }),
        ...ffnProgram(ctx, spec.ffn, l.ffn, bufs, { ...d, link }),
      );
      input = link.afterCopy;
      if (m.part.remoteExperts?.has(layer)) {
        segments.at(-1)!.split = layer;
        calls = [biasAddCall(gpu, { b: this.expertSum!, y: x }, { N: T * H, T: 1 })];
        segments.push({ calls });
      }
      if (segments.length === 1) opts.onLayer?.(calls);
    });
    if (output !== "hidden") {
      const { finalNorm, lmHead } = m;
      if (!finalNorm || !lmHead || !this.logits) throw new Error("this stage has no head");
      const eps = c.rmsNormEps;
      if (head) {
        calls.push(
          ...gemvFusedCalls(
            gpu,
            { x, w: lmHead, y: this.logits, normWeight: finalNorm, copyIn: input },
            head.dims,
          ),
        );
      } else {
        calls.push(
          rmsnormCall(gpu, { x, w: finalNorm, y: xn }, { hidden: H, rows, eps, srcRow0, weights: normType }),
          ...prefillLinearCalls(gpu, { x: xn, w: lmHead, y: this.logits }, {
            K: H,
            N: V,
            T: rows,
            weights: wt(lmHead),
            f16Math: m.dense,
          }),
        );
      }
      if (output === "sample") {
        calls.push(
          ...sampleCalls(gpu, { step, logits: this.logits, tokens, sampling: this.#sampling }, {
            vocab: V,
            ...this.opts.sampling,
          }),
        );
      }
    }
    return segments;
  }

  /**
   * An MTP module's input into `x`: eh_proj(concat(enorm(embed(token)), hnorm(h))), with eh_proj's halves
   * applied apart and summed (the concatenation is never built). The hidden input is normalised first, as
   * chaining reads it from `x`, which the embedding then overwrites.
   */
  #mtpInput(T: number, hiddenRow: number | undefined): KernelCall[] {
    const m = this.model, w = m.mtp!, { gpu, config: c, normType } = m;
    const H = c.hiddenSize, eps = c.rmsNormEps;
    if (hiddenRow !== undefined && T !== 1) throw new RangeError("a chained MTP step is one token");
    const { x, xn, hn, step, tokens } = this;
    const src = hiddenRow === undefined ? this.opts.hidden! : x;
    const linear = (from: GPUBuffer, weight: GPUBuffer, y: GPUBuffer) =>
      prefillLinearCalls(gpu, { x: from, w: weight, y }, {
        K: H,
        N: H,
        T,
        weights: m.typeOf(weight),
        f16Math: m.dense,
      });
    return [
      rmsnormCall(gpu, { x: src, w: w.hnorm, y: hn! }, {
        hidden: H,
        rows: T,
        eps,
        srcRow0: hiddenRow ?? 0,
        weights: normType,
      }),
      embedCall(gpu, { step, tokens, table: m.embedTable!, x }, {
        hidden: H,
        vocab: c.vocabSize,
        T,
        weights: m.typeOf(m.embedTable!),
      }),
      rmsnormCall(gpu, { x, w: w.enorm, y: xn }, { hidden: H, rows: T, eps, weights: normType }),
      ...linear(xn, w.ehEmbed, x),
      ...linear(hn!, w.ehHidden, xn),
      biasAddCall(gpu, { b: xn, y: x }, { N: T * H, T: 1 }),
    ];
  }

  /** The routed experts' sum of a split layer, [maxChunk, H] (parts with remote experts only). */
  get expertSum(): GPUBuffer | undefined {
    return this.#expertSum;
  }

  /** The MoE router's output of the last split layer: ids [T, k] (u32) and weights [T, k] (f32). */
  get routing(): { ids: GPUBuffer; weights: GPUBuffer } | undefined {
    return this.moe && { ids: this.moe.ids, weights: this.moe.routeWeights };
  }

  /** The normalised input of the last split layer, [T, H]. */
  get normed(): GPUBuffer {
    return this.xn;
  }

  /** Frees the KV cache and working buffers (teardown). Safe to call twice. */
  destroy(): void {
    if (this.destroyed) return;
    this.destroyed = true;
    for (const b of this.buffers) b.destroy();
    for (const segments of this.programs.values()) {
      for (const s of segments) releaseCalls(s.calls, this.step);
    }
    // Also those of a build that threw (no program lists them); the rest again, which WebGPU allows.
    for (const b of this.uniforms.values()) b.destroy();
    this.step.destroy();
    this.programs.clear();
    this.uniforms.clear();
  }
}
