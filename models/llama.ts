// The Llama family's forward pass on WebGPU, top to bottom. Field names follow the checkpoint's tensor
// names. A model may be a whole network or a pipeline stage: a contiguous layer range, with or without
// the embedding (first stage) and the final norm + head + sampler (last stage).
//
// Per token t (shapes for one token; prefill runs T at once):
//   x      = embed_tokens[token]                          [H]
//   each layer:
//     xn   = rmsnorm(x) * input_layernorm                 [H]
//     qkv  = xn @ [q_proj; k_proj; v_proj]^T              [(nH + 2 nKV) * hd]
//     q, k = rope(q, k, pos); kcache[pos], vcache[pos] = k, v
//     att  = softmax(q k^T / sqrt(hd)) v  (causal, GQA)   [nH * hd]
//     x   += att @ o_proj^T                               [H]
//     xn   = rmsnorm(x) * post_attention_layernorm        [H]
//     gu   = xn @ [gate_proj; up_proj]^T                  [2 I]
//     x   += (silu(gate) * up) @ down_proj^T              [H]
//   logits = rmsnorm(x) * norm @ lm_head^T                [V]   (lm_head = embed_tokens when tied)
//   token  = sample(logits)
import type { Checkpoint } from "./checkpoint.ts";
import type { LlamaConfig } from "./config.ts";
import { bf16ToF32, f16ToF32, f32ToBf16, f32ToF16 } from "./dtype.ts";
import { CheckpointError } from "./errors.ts";
import { llamaTensorShapes } from "./llama_tensors.ts";
import {
  attentionCall,
  attentionDecodeCall,
  attentionDecodeFits,
  createStepBuffer,
  embedCall,
  GEMV_MAX_T,
  gemvFusedCall,
  gemvFusedFits,
  type Gpu,
  isQuant,
  type KernelCall,
  matmulCall,
  quantFits,
  quantize,
  type QuantType,
  releaseCalls,
  rmsnormCall,
  ropeInvFreq,
  ropeKvCall,
  ropeTable,
  sampleCalls,
  type SamplingOptions,
  siluMulCall,
  storageBuffer,
  uploadBuffer,
  type WeightType,
} from "../kernels/mod.ts";

export interface LoadOptions {
  /**
   * Weight storage on the GPU. Default "f32" (exact against the fixtures); "f16" needs shader-f16.
   * "q8" / "q4" quantise every matrix at load (kernels/quant.ts), norms staying f32; a matrix whose rows
   * are not a multiple of 32 stays f16 (f32 without shader-f16).
   */
  weights?: WeightType | QuantType;
  /** Layers [start, end) this stage runs. Default: all. */
  layers?: [number, number];
  /** Whether this stage embeds tokens (the first stage). Default: layers start at 0. */
  embed?: boolean;
  /** Whether this stage applies the final norm, head and sampler (the last stage). Default: layers end at L. */
  head?: boolean;
  /** Called after each tensor is on the GPU, with bytes read so far and in all. */
  onProgress?: (done: number, total: number) => void;
}

interface LayerWeights {
  inputNorm: GPUBuffer;
  qkv: GPUBuffer;
  o: GPUBuffer;
  postNorm: GPUBuffer;
  gateUp: GPUBuffer;
  down: GPUBuffer;
}

/** Dimensions derived once from the config. */
export interface LlamaDims {
  H: number;
  I: number;
  V: number;
  nH: number;
  nKV: number;
  hd: number;
  /** Width of the fused qkv activations. */
  qkvDim: number;
}

export function llamaDims(c: LlamaConfig): LlamaDims {
  return {
    H: c.hiddenSize,
    I: c.intermediateSize,
    V: c.vocabSize,
    nH: c.numHeads,
    nKV: c.numKvHeads,
    hd: c.headDim,
    qkvDim: (c.numHeads + 2 * c.numKvHeads) * c.headDim,
  };
}

/** The tensors (name, shape) a stage needs, in checkpoint order. */
export function stageTensors(
  c: LlamaConfig,
  stage: { layers: [number, number]; embed: boolean; head: boolean },
): [string, number[]][] {
  const layerOf = (name: string) => Number(/^model\.layers\.(\d+)\./.exec(name)?.[1] ?? NaN);
  return [...llamaTensorShapes(c)].filter(([name]) => {
    if (name === "model.embed_tokens.weight") return stage.embed || (stage.head && c.tieWordEmbeddings);
    if (name === "model.norm.weight" || name === "lm_head.weight") return stage.head;
    const i = layerOf(name);
    return i >= stage.layers[0] && i < stage.layers[1];
  });
}

/**
 * RoPE inverse frequencies as transformers uses them for this checkpoint. transformers keeps them in a
 * module buffer, which is cast with the model: a model cast to bf16 (or f16) rounds its inverse
 * frequencies to that dtype, and the reference outputs (fixtures/README.md) are computed that way.
 * So for a checkpoint whose torch_dtype is bfloat16 / float16 we round them the same way.
 */
export function ropeInvFreqAsStored(c: LlamaConfig): Float32Array {
  const inv = ropeInvFreq(c.headDim, c.ropeTheta, c.ropeScaling);
  if (c.torchDtype === "bfloat16") return bf16ToF32(f32ToBf16(inv));
  if (c.torchDtype === "float16") return f16ToF32(f32ToF16(inv));
  return inv;
}

/** Weights of one stage (or the whole model) resident on the GPU. */
export class LlamaModel {
  private constructor(
    readonly gpu: Gpu,
    readonly config: LlamaConfig,
    readonly dims: LlamaDims,
    /** The weight storage asked for (a matrix may differ: see typeOf). */
    readonly weightType: WeightType | QuantType,
    /** Storage of the norm weights. */
    readonly normType: WeightType,
    private readonly types: Map<GPUBuffer, WeightType | QuantType>,
    readonly layerRange: [number, number],
    readonly embedTable: GPUBuffer | null,
    readonly layers: LayerWeights[],
    readonly finalNorm: GPUBuffer | null,
    readonly lmHead: GPUBuffer | null,
    /** Bytes of weights on the GPU. */
    readonly weightBytes: number,
    private readonly embeds: boolean,
  ) {}

  /** Whether this stage embeds tokens (the first stage); otherwise it takes hidden states in `x`. */
  get hasEmbed(): boolean {
    return this.embeds;
  }

  /** How a weight buffer of this model is stored. */
  typeOf(buf: GPUBuffer): WeightType | QuantType {
    const t = this.types.get(buf);
    if (!t) throw new Error(`buffer ${buf.label} is not one of this model's weights`);
    return t;
  }

  /** Reads this stage's tensors (only their byte ranges) and uploads them. */
  static async load(gpu: Gpu, ckpt: Checkpoint, opts: LoadOptions = {}): Promise<LlamaModel> {
    const c = ckpt.config;
    const d = llamaDims(c);
    const wt = opts.weights ?? "f32";
    if (wt === "f16" && !gpu.hasF16) {
      throw new RangeError(`f16 weights need shader-f16, which ${gpu.adapterName} lacks`);
    }
    const layers = opts.layers ?? [0, c.numLayers];
    if (!(layers[0] >= 0 && layers[0] <= layers[1] && layers[1] <= c.numLayers)) {
      throw new RangeError(`layer range [${layers}] is outside the model's ${c.numLayers} layers`);
    }
    const embed = opts.embed ?? layers[0] === 0;
    const head = opts.head ?? layers[1] === c.numLayers;
    const wanted = stageTensors(c, { layers, embed, head });
    for (const [name, shape] of wanted) {
      const info = ckpt.info(name);
      if (info.shape.join() !== shape.join()) {
        throw new CheckpointError(
          `tensor ${name} has shape [${info.shape}], expected [${shape}] from config.json`,
        );
      }
    }
    const total = wanted.reduce((s, [name]) => s + (ckpt.info(name).end - ckpt.info(name).begin), 0);
    const maxBinding = gpu.device.limits.maxStorageBufferBindingSize;
    let done = 0;
    let gpuBytes = 0;
    const types = new Map<GPUBuffer, WeightType | QuantType>();
    const normType: WeightType = isQuant(wt) ? "f32" : wt;
    const floatType: WeightType = gpu.hasF16 ? "f16" : "f32";
    // Matrices (rows of K) in the asked storage; norms (no K) in normType.
    const read = async (names: string[], K?: number): Promise<GPUBuffer> => {
      const as = K === undefined ? normType : !isQuant(wt) ? wt : quantFits(K) ? wt : floatType;
      const f16 = as === "f16";
      const parts = await Promise.all(names.map((n) => f16 ? ckpt.readF16(n) : ckpt.readF32(n)));
      const length = parts.reduce((s, p) => s + p.length, 0);
      let all: Uint16Array | Float32Array | Uint8Array = f16
        ? new Uint16Array(length)
        : new Float32Array(length);
      let at = 0;
      for (const p of parts) {
        all.set(p, at);
        at += p.length;
      }
      if (isQuant(as)) all = quantize(all as Float32Array, { N: length / K!, K: K! }, as);
      if (all.byteLength > maxBinding) {
        throw new RangeError(
          `${names.join("+")} needs ${all.byteLength} bytes on the GPU, above ${gpu.adapterName}'s largest ` +
            `binding (${maxBinding})${wt === "f32" ? "; try 16-bit weights" : ""}`,
        );
      }
      for (const n of names) done += ckpt.info(n).end - ckpt.info(n).begin;
      gpuBytes += all.byteLength;
      const buf = uploadBuffer(gpu, all, names[0]);
      types.set(buf, as);
      opts.onProgress?.(done, total);
      return buf;
    };
    // Norm weights stay in the weight type too (f32 when quantised); they are tiny either way. A tied
    // embedding table is the head too, the largest matrix: it is quantised like the others.
    const embedTable = embed || (head && c.tieWordEmbeddings)
      ? await read(["model.embed_tokens.weight"], d.H)
      : null;
    const lw: LayerWeights[] = [];
    for (let i = layers[0]; i < layers[1]; i++) {
      const p = `model.layers.${i}.`;
      lw.push({
        inputNorm: await read([`${p}input_layernorm.weight`]),
        qkv: await read([
          `${p}self_attn.q_proj.weight`,
          `${p}self_attn.k_proj.weight`,
          `${p}self_attn.v_proj.weight`,
        ], d.H),
        o: await read([`${p}self_attn.o_proj.weight`], d.nH * d.hd),
        postNorm: await read([`${p}post_attention_layernorm.weight`]),
        gateUp: await read([`${p}mlp.gate_proj.weight`, `${p}mlp.up_proj.weight`], d.H),
        down: await read([`${p}mlp.down_proj.weight`], d.I),
      });
    }
    const finalNorm = head ? await read(["model.norm.weight"]) : null;
    const lmHead = head ? (c.tieWordEmbeddings ? embedTable : await read(["lm_head.weight"], d.H)) : null;
    return new LlamaModel(
      gpu,
      c,
      d,
      wt,
      normType,
      types,
      layers,
      embedTable,
      lw,
      finalNorm,
      lmHead,
      gpuBytes,
      embed,
    );
  }

  /** Whether this stage ends in the head and sampler. */
  get hasHead(): boolean {
    return this.lmHead !== null;
  }

  /** Starts a sequence (one request): its KV cache for `maxSeq` positions and working buffers. */
  newSequence(opts: { maxSeq: number; sampling: SamplingOptions; maxChunk?: number }): LlamaSequence {
    return new LlamaSequence(this, opts);
  }

  destroy(): void {
    const bufs = new Set<GPUBuffer>();
    for (const b of [this.embedTable, this.finalNorm, this.lmHead]) if (b) bufs.add(b);
    for (const l of this.layers) for (const b of Object.values(l)) bufs.add(b);
    for (const b of bufs) b.destroy();
  }
}

/** What a program ends with: nothing (hidden state stays in `x`), sampled token, or logits of every row. */
export type ProgramOutput = "hidden" | "sample" | "logits";

/** One request's state on one stage: KV cache, activations, the token buffer, and cached programs. */
export class LlamaSequence {
  readonly maxSeq: number;
  /** Largest number of tokens per prefill step. */
  readonly maxChunk: number;
  /** Token ids by position (the sampler writes position p + 1's token while computing position p). */
  readonly tokens: GPUBuffer;
  /** The step uniform (pos0, T, tok_out). */
  readonly step: GPUBuffer;
  /** Hidden state [maxChunk, H]: a stage's input when it does not embed, its output when it has no head. */
  readonly x: GPUBuffer;
  /** Logits [maxChunk, V] (row 0 only when sampling). */
  readonly logits: GPUBuffer | null;
  /** Bytes of this sequence's KV cache. */
  readonly kvBytes: number;
  private readonly buffers: GPUBuffer[] = [];
  private readonly kv: { k: GPUBuffer; v: GPUBuffer }[] = [];
  private readonly act: Record<"xn" | "qkv" | "att" | "gu" | "a", GPUBuffer>;
  private readonly ropeTable: GPUBuffer;
  private readonly programs = new Map<string, KernelCall[]>();
  private destroyed = false;

  constructor(
    readonly model: LlamaModel,
    private readonly opts: { maxSeq: number; sampling: SamplingOptions; maxChunk?: number },
  ) {
    const { gpu, dims: d, config: c } = model;
    if (!(Number.isInteger(opts.maxSeq) && opts.maxSeq >= 1)) {
      throw new RangeError(`maxSeq must be >= 1, got ${opts.maxSeq}`);
    }
    if (opts.maxSeq > c.maxPositionEmbeddings) {
      throw new RangeError(
        `context of ${opts.maxSeq} tokens exceeds the model's ${c.maxPositionEmbeddings} positions`,
      );
    }
    this.maxSeq = opts.maxSeq;
    const maxBinding = gpu.device.limits.maxStorageBufferBindingSize;
    const rowBytes = Math.max(d.V, 2 * d.I, d.qkvDim) * 4;
    this.maxChunk = Math.max(
      1,
      Math.min(opts.maxChunk ?? 128, opts.maxSeq, Math.floor(maxBinding / rowBytes)),
    );
    const C = this.maxChunk;
    const buf = (bytes: number, label: string) => {
      const b = storageBuffer(gpu, bytes, label);
      this.buffers.push(b);
      return b;
    };
    this.tokens = buf((this.maxSeq + 1) * 4, "tokens");
    this.step = createStepBuffer(gpu);
    this.x = buf(C * d.H * 4, "x");
    this.act = {
      xn: buf(C * d.H * 4, "xn"),
      qkv: buf(C * d.qkvDim * 4, "qkv"),
      att: buf(C * d.nH * d.hd * 4, "att"),
      gu: buf(C * 2 * d.I * 4, "gu"),
      a: buf(C * d.I * 4, "a"),
    };
    this.logits = model.hasHead ? buf(C * d.V * 4, "logits") : null;
    const kvLayer = d.nKV * this.maxSeq * d.hd * 4;
    for (let i = 0; i < model.layers.length; i++) {
      this.kv.push({ k: buf(kvLayer, "k"), v: buf(kvLayer, "v") });
    }
    this.kvBytes = 2 * kvLayer * model.layers.length;
    const inv = ropeInvFreqAsStored(c);
    this.ropeTable = uploadBuffer(gpu, ropeTable(inv, this.maxSeq), "rope");
    this.buffers.push(this.ropeTable);
  }

  /**
   * The kernel calls for a step of T tokens (built once per (T, output) and reused), ending as `output`
   * says: "sample" writes the next token into `tokens`; "logits" fills `logits` for all T rows;
   * "hidden" leaves the hidden state in `x` for the next stage.
   */
  program(T: number, output: ProgramOutput, opts: { embed?: boolean } = {}): KernelCall[] {
    if (this.destroyed) throw new Error("sequence was released");
    if (!(T >= 1 && T <= this.maxChunk)) {
      throw new RangeError(`step of ${T} tokens; at most ${this.maxChunk}`);
    }
    const embed = opts.embed ?? this.model.hasEmbed;
    const key = `${T}/${output}/${embed}`;
    let calls = this.programs.get(key);
    if (calls) return calls;
    const { gpu, dims: d, config: c, normType: normWeights } = this.model;
    // Each matrix's own storage (a quantised model keeps some in floats); norms in normWeights.
    const wt = (b: GPUBuffer) => this.model.typeOf(b);
    const { step, x, tokens } = this;
    const { xn, qkv, att, gu, a } = this.act;
    calls = [];
    if (embed) {
      if (!this.model.embedTable) throw new Error("this stage has no embedding");
      calls.push(
        embedCall(gpu, { step, tokens, table: this.model.embedTable, x }, {
          hidden: d.H,
          vocab: d.V,
          T,
          weights: wt(this.model.embedTable),
        }),
      );
    }
    const attnDims = { heads: d.nH, kvHeads: d.nKV, headDim: d.hd, maxSeq: this.maxSeq, T };
    const eps = c.rmsNormEps;
    // Decode-sized steps use the fused GEMVs (6 dispatches a layer); prefill and odd shapes the plain kernels.
    const fused = T <= GEMV_MAX_T && [d.H, d.nH * d.hd, d.I].every(gemvFusedFits);
    this.model.layers.forEach((l, i) => {
      const { k: kcache, v: vcache } = this.kv[i];
      // One token: RoPE, the KV write and attention in one dispatch (subgroups); else two.
      const attention = T === 1 && attentionDecodeFits(gpu, attnDims)
        ? [attentionDecodeCall(gpu, { step, table: this.ropeTable, qkv, kcache, vcache, out: att }, attnDims)]
        : [
          ropeKvCall(gpu, { step, table: this.ropeTable, qkv, kcache, vcache }, attnDims),
          attentionCall(gpu, { step, qkv, kcache, vcache, out: att }, attnDims),
        ];
      if (fused) {
        calls!.push(
          gemvFusedCall(gpu, { x, w: l.qkv, y: qkv, normWeight: l.inputNorm }, {
            K: d.H,
            N: d.qkvDim,
            T,
            weights: wt(l.qkv),
            normWeights,
            transform: "rmsnorm",
            eps,
          }),
          ...attention,
          gemvFusedCall(gpu, { x: att, w: l.o, y: x }, {
            K: d.nH * d.hd,
            N: d.H,
            T,
            accumulate: true,
            weights: wt(l.o),
          }),
          gemvFusedCall(gpu, { x, w: l.gateUp, y: gu, normWeight: l.postNorm }, {
            K: d.H,
            N: 2 * d.I,
            T,
            weights: wt(l.gateUp),
            normWeights,
            transform: "rmsnorm",
            eps,
          }),
          gemvFusedCall(gpu, { x: gu, w: l.down, y: x }, {
            K: d.I,
            N: d.H,
            T,
            accumulate: true,
            weights: wt(l.down),
            transform: "silu_mul",
          }),
        );
        return;
      }
      calls!.push(
        rmsnormCall(gpu, { x, w: l.inputNorm, y: xn }, { hidden: d.H, rows: T, eps, weights: normWeights }),
        matmulCall(gpu, { x: xn, w: l.qkv, y: qkv }, { K: d.H, N: d.qkvDim, T, weights: wt(l.qkv) }),
        ...attention,
        matmulCall(gpu, { x: att, w: l.o, y: x }, {
          K: d.nH * d.hd,
          N: d.H,
          T,
          accumulate: true,
          weights: wt(l.o),
        }),
        rmsnormCall(gpu, { x, w: l.postNorm, y: xn }, { hidden: d.H, rows: T, eps, weights: normWeights }),
        matmulCall(gpu, { x: xn, w: l.gateUp, y: gu }, { K: d.H, N: 2 * d.I, T, weights: wt(l.gateUp) }),
        siluMulCall(gpu, { gu, a }, { intermediate: d.I, T }),
        matmulCall(gpu, { x: a, w: l.down, y: x }, {
          K: d.I,
          N: d.H,
          T,
          accumulate: true,
          weights: wt(l.down),
        }),
      );
    });
    if (output !== "hidden") {
      const { finalNorm, lmHead } = this.model;
      if (!finalNorm || !lmHead || !this.logits) throw new Error("this stage has no head");
      const rows = output === "logits" ? T : 1;
      const srcRow0 = output === "logits" ? 0 : T - 1;
      if (fused && rows <= GEMV_MAX_T) {
        calls.push(
          gemvFusedCall(gpu, { x, w: lmHead, y: this.logits, normWeight: finalNorm }, {
            K: d.H,
            N: d.V,
            T: rows,
            xRow0: srcRow0,
            weights: wt(lmHead),
            normWeights,
            transform: "rmsnorm",
            eps,
          }),
        );
      } else {
        calls.push(
          rmsnormCall(gpu, { x, w: finalNorm, y: xn }, {
            hidden: d.H,
            rows,
            eps,
            srcRow0,
            weights: normWeights,
          }),
          matmulCall(gpu, { x: xn, w: lmHead, y: this.logits }, {
            K: d.H,
            N: d.V,
            T: rows,
            weights: wt(lmHead),
          }),
        );
      }
      if (output === "sample") {
        calls.push(
          ...sampleCalls(gpu, { step, logits: this.logits, tokens }, { vocab: d.V, ...this.opts.sampling }),
        );
      }
    }
    this.programs.set(key, calls);
    return calls;
  }

  /** Frees the KV cache and working buffers (teardown). Safe to call twice. */
  destroy(): void {
    if (this.destroyed) return;
    this.destroyed = true;
    for (const b of this.buffers) b.destroy();
    for (const calls of this.programs.values()) releaseCalls(calls, this.step);
    this.step.destroy();
    this.programs.clear();
  }
}
