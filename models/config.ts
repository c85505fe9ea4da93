// A checkpoint's config.json as the engine reads it: the fields every decoder-only family shares, and each
// layer described by the blocks it runs (its attention and its feed-forward part). A family
// (models/families/) turns its own config.json into this shape, with transformers' defaults for the keys a
// config leaves out, so a config means here what it means there. Nothing here knows a family by name.
import { join } from "node:path";
import type { Llama3RopeScaling, MoeRouting, RopeScaling } from "../kernels/mod.ts";
import { CheckpointError } from "./errors.ts";

/** Grouped-query attention (Llama, Qwen2, Qwen3, Mixtral): q, k, v, o projections and a K/V cache. */
export interface GqaAttention {
  kind: "gqa";
  heads: number;
  kvHeads: number;
  headDim: number;
  /** Biases on q_proj, k_proj and v_proj (Qwen2 always; Llama and Qwen3 with attention_bias). */
  qkvBias: boolean;
  /** A bias on o_proj (Llama and Qwen3 with attention_bias). */
  oBias: boolean;
  /** RMSNorm over each head's q and k before RoPE, weights q_norm / k_norm [head_dim] (Qwen3). */
  qkNorm: boolean;
}

/**
 * Multi-head latent attention (DeepSeek-V3, Kimi K2): q through an optional low-rank pair, K and V through a
 * shared latent c [kvLoraRank] (plus one roped key part shared by every head), cached compressed.
 */
export interface MlaAttention {
  kind: "mla";
  heads: number;
  /** q_lora_rank: q = q_b(rmsnorm(q_a(x))); null: q = q_proj(x). */
  qLoraRank: number | null;
  kvLoraRank: number;
  qkNopeHeadDim: number;
  qkRopeHeadDim: number;
  vHeadDim: number;
  /** rope_interleave: RoPE rotates interleaved pairs (transformers' default for DeepSeek-V3). */
  interleaved: boolean;
  /** The softmax scale: qk_head_dim^-0.5, times yarn's mscale(factor, mscale_all_dim)^2 when set. */
  scale: number;
}

/** A gated MLP: down(silu(gate(x)) * up(x)). `prefix`: where its tensors are (default "mlp."). */
export interface DenseMlp {
  kind: "mlp";
  intermediate: number;
}

/**
 * A mixture-of-experts FFN: a router picks topK of `experts` gated MLPs per token (routing says how), their
 * outputs are summed with the router's weights, plus `shared` always-on experts of sharedIntermediate.
 * Tensor names differ by family, so the spec carries them.
 */
export interface MoeFfn {
  kind: "moe";
  routing: MoeRouting;
  /** Each routed expert's intermediate size. */
  intermediate: number;
  /** The shared expert's intermediate size (n_shared_experts * moe_intermediate_size); 0: none. */
  sharedIntermediate: number;
  names: MoeNames;
}

/** Where a MoE block's tensors are, relative to the layer prefix. */
export interface MoeNames {
  /** The router's weight [E, H], e.g. "mlp.gate.weight". */
  router: string;
  /** e_score_correction_bias [E] (sigmoid routing with bias), else null. */
  bias: string | null;
  /** Expert e's gate, up and down weights. */
  expert(e: number): { gate: string; up: string; down: string };
  /** The shared expert's prefix, e.g. "mlp.shared_experts." (then gate_proj / up_proj / down_proj), or null. */
  shared: string | null;
}

export type AttentionSpec = GqaAttention | MlaAttention;
export type FfnSpec = DenseMlp | MoeFfn;

/** What one decoder layer runs: pre-norm attention, then pre-norm feed-forward, each with a residual. */
export interface LayerSpec {
  attention: AttentionSpec;
  ffn: FfnSpec;
}

export interface RopeConfig {
  theta: number;
  /** null: plain RoPE (no `rope_scaling`, or `rope_type: "default"`). */
  scaling: RopeScaling | null;
}

export interface ModelConfig {
  /** The family that read it (models/families/), e.g. "qwen3". */
  family: string;
  /** `model_type` as written. */
  modelType: string;
  architectures: string[];
  vocabSize: number;
  hiddenSize: number;
  numLayers: number;
  /**
   * Multi-token-prediction modules the checkpoint ships after its decoder layers (DeepSeek-V3's
   * `num_nextn_predict_layers`; 0 for other families): stored as layers numLayers .. numLayers + mtpLayers
   * - 1, which `layer(i)` also describes (models/mtp.ts). The forward pass never runs them.
   */
  mtpLayers: number;
  rmsNormEps: number;
  rope: RopeConfig;
  maxPositionEmbeddings: number;
  tieWordEmbeddings: boolean;
  bosTokenId: number | null;
  eosTokenIds: number[];
  /** `torch_dtype` (or transformers 5's `dtype`) as written: the dtype the weights were saved in. */
  torchDtype: string | null;
  /** `quantization_config`: how quantised weights are stored, or null for plain F32 / F16 / BF16. */
  weightQuant: WeightQuant | null;
  /** Layer i's blocks (a function, so an absurd layer count builds nothing before it is checked). */
  layer(i: number): LayerSpec;
}

/**
 * Weights stored quantised (`quantization_config`): fp8 (E4M3) codes in blocks of [rows, columns], each block
 * with an f32 scale in the tensor `<name>_scale_inv` that the codes are multiplied by (DeepSeek-V3, Kimi K2
 * and Qwen3's FP8 checkpoints as released). Read by Checkpoint.read, which dequantises them (models/fp8.ts).
 */
export interface WeightQuant {
  method: "fp8";
  block: [number, number];
}

/** The largest layer count, width or vocabulary a config may state before it is called absurd. */
const MAX_DIM = 2 ** 24;

/**
 * Reads typed values out of a parsed config.json, each error naming the source, the key, what was found
 * and what was expected. Families build their ModelConfig with it.
 */
export class ConfigReader {
  readonly c: Record<string, unknown>;

  constructor(json: unknown, readonly source: string) {
    if (typeof json !== "object" || json === null || Array.isArray(json)) {
      throw this.fail("config is not a JSON object");
    }
    this.c = json as Record<string, unknown>;
  }

  fail(what: string): CheckpointError {
    return new CheckpointError(`${this.source}: ${what}`);
  }

  /** Whether the key is present and not null. */
  has(key: string): boolean {
    return this.c[key] !== undefined && this.c[key] !== null;
  }

  /** A positive integer (at most 2^24: larger is no real model's size), else `fallback` when absent. */
  int(key: string, fallback?: number): number {
    const v = this.c[key] ?? fallback;
    if (v === undefined) throw this.fail(`missing ${key} (expected a positive integer)`);
    if (typeof v !== "number" || !Number.isSafeInteger(v) || v <= 0) {
      throw this.fail(`${key} must be a positive integer, got ${JSON.stringify(v)}`);
    }
    if (v > MAX_DIM) throw this.fail(`${key} = ${v} is absurd (at most ${MAX_DIM})`);
    return v;
  }

  /**
   * The key transformers also reads under other names (attribute_map aliases, e.g. num_local_experts for
   * Qwen3-MoE's num_experts, which transformers 5 writes under the former): the first of `keys` present,
   * else undefined; several present and different is an error.
   */
  alias(keys: readonly string[]): string | undefined {
    const present = keys.filter((k) => this.has(k));
    this.agree(
      present.map((k) => [k, this.c[k]]),
      (differ) => `${present[0]} and ${differ} name the same setting but differ`,
    );
    return present[0];
  }

  /**
   * The value that `found` (where a setting was read, and what: absent or null entries ignored) gives it,
   * or undefined; two different values are an error, `what` (given the second place) heading the list.
   */
  private agree(
    found: readonly (readonly [string, unknown])[],
    what: (differ: string) => string,
  ): unknown {
    const given = found.filter(([, v]) => v !== undefined && v !== null);
    const differ = given.find(([, v]) => v !== given[0][1]);
    if (differ !== undefined) {
      throw this.fail(
        `${what(differ[0])}: ${given.map(([k, v]) => `${k} = ${JSON.stringify(v)}`).join(", ")}`,
      );
    }
    return given[0]?.[1];
  }

  /** A non-negative integer, else `fallback` when absent. */
  count(key: string, fallback: number): number {
    const v = this.c[key] ?? fallback;
    if (typeof v !== "number" || !Number.isSafeInteger(v) || v < 0 || v > MAX_DIM) {
      throw this.fail(`${key} must be a non-negative integer, got ${JSON.stringify(v)}`);
    }
    return v;
  }

  /** A positive finite number, else `fallback` when absent. */
  num(key: string, fallback?: number): number {
    const v = this.c[key] ?? fallback;
    if (v === undefined) throw this.fail(`missing ${key} (expected a positive number)`);
    if (typeof v !== "number" || !Number.isFinite(v) || v <= 0) {
      throw this.fail(`${key} must be a positive number, got ${JSON.stringify(v)}`);
    }
    return v;
  }

  /** A boolean, else `fallback` when absent; null reads as false, as transformers' `if config.key:` does. */
  bool(key: string, fallback: boolean): boolean {
    const v = this.c[key] === null ? false : this.c[key] ?? fallback;
    if (typeof v !== "boolean") throw this.fail(`${key} must be true or false, got ${JSON.stringify(v)}`);
    return v;
  }

  /** Rejects a key whose value is not one of `allowed` (absent or null counts as `allowed[0]`). */
  oneOf<T>(key: string, allowed: readonly T[]): T {
    const v = (this.c[key] ?? allowed[0]) as T;
    if (!allowed.includes(v)) {
      throw this.fail(
        `unsupported ${key}=${JSON.stringify(v)}: supported: ${allowed.join(", ")}`,
      );
    }
    return v;
  }

  tokenId(key: string, v: unknown): number {
    if (typeof v !== "number" || !Number.isSafeInteger(v) || v < 0) {
      throw this.fail(`${key} must be a non-negative integer token id, got ${JSON.stringify(v)}`);
    }
    return v;
  }

  /**
   * The GQA attention block: heads, KV heads and head_dim with their checks (`headDim` the family's default
   * when absent), and the family's biases and q/k norm (none unless given).
   */
  gqa(
    defaults: { kvHeads?: number; headDim?: number } = {},
    extra: Partial<Pick<GqaAttention, "qkvBias" | "oBias" | "qkNorm">> = {},
  ): GqaAttention {
    const heads = this.int("num_attention_heads");
    // null: multi-head attention (transformers sets num_key_value_heads = num_attention_heads for None).
    const kvHeads = this.c.num_key_value_heads === null
      ? heads
      : this.int("num_key_value_heads", defaults.kvHeads ?? heads);
    if (heads % kvHeads !== 0) {
      throw this.fail(
        `num_attention_heads (${heads}) must be a multiple of num_key_value_heads (${kvHeads})`,
      );
    }
    let headDim: number;
    if (this.has("head_dim")) headDim = this.int("head_dim");
    else if (defaults.headDim !== undefined) headDim = defaults.headDim;
    else {
      const hidden = this.int("hidden_size");
      if (hidden % heads !== 0) {
        throw this.fail(`hidden_size (${hidden}) must be a multiple of num_attention_heads (${heads})`);
      }
      headDim = hidden / heads;
    }
    if (headDim % 2 !== 0) throw this.fail(`head_dim must be even for RoPE, got ${headDim}`);
    return { kind: "gqa", heads, kvHeads, headDim, qkvBias: false, oBias: false, qkNorm: false, ...extra };
  }

  /**
   * The fields every decoder family shares, with the family's defaults for absent keys (transformers'
   * config class defaults). `layer` describes layer i.
   */
  common(
    family: string,
    architectures: readonly string[],
    defaults: { maxPositions: number; rmsNormEps: number; ropeTheta: number; tie: boolean },
    layer: (i: number) => LayerSpec,
    extra: { mtpLayers?: number } = {},
  ): ModelConfig {
    const c = this.c;
    let archs: string[] = [architectures[0]];
    if (this.has("architectures")) {
      const a = c.architectures;
      if (!Array.isArray(a) || !a.every((x) => typeof x === "string")) {
        throw this.fail(`architectures must be a list of strings, got ${JSON.stringify(a)}`);
      }
      const other = a.find((x) => !architectures.includes(x));
      if (other !== undefined) {
        throw new CheckpointError(
          `unsupported architecture '${other}' (architectures) in ${this.source} for model_type ${
            JSON.stringify(c.model_type)
          }: supported: ${architectures.join(", ")}`,
        );
      }
      if (a.length > 0) archs = [...a];
    }
    this.oneOf("hidden_act", ["silu", "swish"]); // the same function in transformers' ACT2FN
    const bos = c.bos_token_id;
    const eos = c.eos_token_id;
    const dtype = c.torch_dtype ?? c.dtype ?? null;
    if (dtype !== null && typeof dtype !== "string") {
      throw this.fail(`torch_dtype must be a string, got ${JSON.stringify(dtype)}`);
    }
    const numLayers = this.int("num_hidden_layers");
    const mtpLayers = extra.mtpLayers ?? 0;
    const config: ModelConfig = {
      family,
      modelType: String(c.model_type),
      architectures: archs,
      vocabSize: this.int("vocab_size"),
      hiddenSize: this.int("hidden_size"),
      numLayers,
      mtpLayers,
      rmsNormEps: this.num("rms_norm_eps", defaults.rmsNormEps),
      rope: { theta: this.ropeTheta(defaults.ropeTheta), scaling: this.ropeScaling() },
      maxPositionEmbeddings: this.int("max_position_embeddings", defaults.maxPositions),
      tieWordEmbeddings: this.bool("tie_word_embeddings", defaults.tie),
      bosTokenId: bos === undefined || bos === null ? null : this.tokenId("bos_token_id", bos),
      eosTokenIds: eos === undefined || eos === null
        ? []
        : Array.isArray(eos)
        ? eos.map((e) => this.tokenId("eos_token_id", e))
        : [this.tokenId("eos_token_id", eos)],
      torchDtype: dtype,
      weightQuant: this.weightQuant(),
      layer: (i) => {
        if (!(Number.isInteger(i) && i >= 0 && i < numLayers + mtpLayers)) {
          throw new RangeError(
            `layer ${i} is outside the model's ${numLayers} layers` +
              (mtpLayers ? ` and ${mtpLayers} multi-token-prediction modules` : ""),
          );
        }
        return layer(i);
      },
    };
    layer(0); // validates the layer description once, now, rather than at load
    return config;
  }

  /**
   * `rope_theta` at the top level (hub configs), inside `rope_parameters` (transformers 5) or inside
   * `rope_scaling` (transformers 5 reads it there too); where two of them disagree, transformers' versions
   * do not agree on which wins, so that is an error.
   */
  ropeTheta(fallback: number): number {
    const inner = (k: string) => {
      const o = this.c[k];
      return typeof o === "object" && o !== null ? (o as Record<string, unknown>).rope_theta : undefined;
    };
    const v = this.agree([
      ["rope_theta", this.c.rope_theta],
      ["rope_parameters.rope_theta", inner("rope_parameters")],
      ["rope_scaling.rope_theta", inner("rope_scaling")],
    ], () => "rope_theta is given twice and differently") ?? fallback;
    if (typeof v !== "number" || !Number.isFinite(v) || v <= 0) {
      throw this.fail(`rope_theta must be a positive number, got ${JSON.stringify(v)}`);
    }
    return v;
  }

  /**
   * llama3 / yarn's `original_max_position_embeddings`: in `rope_scaling`, else at the top level, else
   * max_position_embeddings (transformers' fallback). Both given and different is an error (transformers 4
   * reads the first, 5 the second).
   */
  private originalMaxPositions(r: Record<string, unknown>): number {
    const v = this.agree([
      ["rope_scaling.original_max_position_embeddings", r.original_max_position_embeddings],
      ["original_max_position_embeddings", this.c.original_max_position_embeddings],
    ], () => "original_max_position_embeddings is given twice and differently") ??
      this.c.max_position_embeddings;
    if (typeof v !== "number" || !Number.isFinite(v) || v <= 0) {
      throw this.fail(
        `rope_scaling.original_max_position_embeddings must be a positive number, got ${JSON.stringify(v)}`,
      );
    }
    return v;
  }

  /**
   * `quantization_config`: absent or null for plain weights; `quant_method` "fp8" (E4M3 codes, `fmt` "e4m3"
   * when given) with `weight_block_size` [rows, columns] (default [128, 128]) for block-scaled fp8 weights.
   * Any other method is refused, naming it. `activation_scheme` is not read: the weights are dequantised at
   * load, so activations are never fp8 here (transformers' reference for this is its `dequantize: true`).
   */
  weightQuant(): WeightQuant | null {
    const q = this.c.quantization_config;
    if (q === undefined || q === null) return null;
    if (typeof q !== "object" || Array.isArray(q)) {
      throw this.fail(`quantization_config must be an object, got ${JSON.stringify(q)}`);
    }
    const { quant_method: method, fmt, weight_block_size: size } = q as Record<string, unknown>;
    if (method !== "fp8") {
      throw this.fail(
        `quantization_config.quant_method ${
          JSON.stringify(method)
        } is not supported: fp8 (block-scaled, as ` +
          `DeepSeek-V3 and Kimi K2 ship) is, or weights stored as F32, F16 or BF16`,
      );
    }
    if (fmt !== undefined && fmt !== null && fmt !== "e4m3") {
      throw this.fail(`quantization_config.fmt must be "e4m3", got ${JSON.stringify(fmt)}`);
    }
    const block = size ?? [128, 128];
    if (
      !Array.isArray(block) || block.length !== 2 ||
      !block.every((b) => Number.isSafeInteger(b) && b > 0 && b <= MAX_DIM)
    ) {
      throw this.fail(
        `quantization_config.weight_block_size must be [rows, columns] of positive integers, got ${
          JSON.stringify(size)
        } (per-tensor fp8 scales are not supported)`,
      );
    }
    return { method: "fp8", block: [block[0], block[1]] };
  }

  ropeScaling(): RopeScaling | null {
    const v = this.c.rope_scaling ?? this.c.rope_parameters;
    if (v === undefined || v === null) return null;
    if (typeof v !== "object" || Array.isArray(v)) {
      throw this.fail(`rope_scaling must be an object or null, got ${JSON.stringify(v)}`);
    }
    const r = v as Record<string, unknown>;
    const type = r.rope_type ?? r.type;
    if (type === "default" || type === undefined) return null;
    const pos = (key: string): number => {
      const x = r[key];
      if (typeof x !== "number" || !Number.isFinite(x) || x <= 0) {
        throw this.fail(`rope_scaling.${key} must be a positive number, got ${JSON.stringify(x)}`);
      }
      return x;
    };
    const optional = (key: string): number | undefined => {
      const x = r[key];
      if (x === undefined || x === null) return undefined;
      if (typeof x !== "number" || !Number.isFinite(x) || x < 0) {
        throw this.fail(`rope_scaling.${key} must be a non-negative number, got ${JSON.stringify(x)}`);
      }
      return x;
    };
    if (type === "yarn") {
      const truncate = r.truncate;
      if (truncate !== undefined && truncate !== null && typeof truncate !== "boolean") {
        throw this.fail(`rope_scaling.truncate must be true or false, got ${JSON.stringify(truncate)}`);
      }
      const original = this.originalMaxPositions(r);
      return {
        type: "yarn",
        factor: pos("factor"),
        originalMaxPositionEmbeddings: original,
        betaFast: optional("beta_fast"),
        betaSlow: optional("beta_slow"),
        mscale: optional("mscale"),
        mscaleAllDim: optional("mscale_all_dim"),
        attentionFactor: optional("attention_factor"),
        truncate: (truncate as boolean | undefined | null) ?? undefined,
      };
    }
    // linear: positions divided by factor (transformers' inv_freq / factor).
    if (type === "linear") return { type: "linear", factor: pos("factor") };
    // dynamic NTK changes the base only past max_position_embeddings, which the engine never goes beyond
    // (models/model.ts refuses longer contexts): within it, plain RoPE.
    if (type === "dynamic") {
      pos("factor");
      return null;
    }
    if (type !== "llama3") {
      throw this.fail(
        `unsupported rope_scaling type ${
          JSON.stringify(type)
        }: supported: llama3, yarn, linear, dynamic, default, none`,
      );
    }
    const scaling: Llama3RopeScaling = {
      type: "llama3",
      factor: pos("factor"),
      lowFreqFactor: pos("low_freq_factor"),
      highFreqFactor: pos("high_freq_factor"),
      originalMaxPositionEmbeddings: this.originalMaxPositions(r),
    };
    if (scaling.highFreqFactor <= scaling.lowFreqFactor) {
      // llama3 scaling divides by (high - low): equal factors would make every band a division by zero.
      throw this.fail(
        `rope_scaling.high_freq_factor (${scaling.highFreqFactor}) must exceed low_freq_factor (${scaling.lowFreqFactor})`,
      );
    }
    return scaling;
  }

  /**
   * Qwen2 / Qwen3 sliding windows: layer i attends over the last `sliding_window` keys where `layer_types`
   * says "sliding_attention", or, without layer_types, where use_sliding_window is on and i >=
   * max_window_layers (transformers' default layer_types). Any such layer caps the context at the window,
   * within which sliding attention is exact (as Mixtral's and Mistral's windows do).
   */
  capSlidingWindow(config: ModelConfig): void {
    const n = config.numLayers;
    let sliding: boolean;
    if (this.has("layer_types")) {
      const t = this.c.layer_types;
      const kinds = ["full_attention", "sliding_attention"];
      if (!Array.isArray(t) || t.length !== n || !t.every((x) => kinds.includes(x))) {
        throw this.fail(
          `layer_types must list "full_attention" or "sliding_attention" for each of the ${n} layers, got ${
            JSON.stringify(t)
          }`,
        );
      }
      sliding = t.includes("sliding_attention");
    } else sliding = this.bool("use_sliding_window", false) && this.count("max_window_layers", 28) < n;
    if (sliding) this.capAtWindow(config, 4096);
  }

  /**
   * Caps the context at `sliding_window` (`absent` when the key is absent; none when it is null or `absent`
   * is null): within the window, sliding-window attention is full attention (transformers' mask keeps the
   * keys less than a window back), so the cap keeps it exact.
   */
  capAtWindow(config: ModelConfig, absent: number | null): void {
    const window = this.c.sliding_window === undefined
      ? absent
      : this.has("sliding_window")
      ? this.int("sliding_window")
      : null;
    if (window !== null) config.maxPositionEmbeddings = Math.min(config.maxPositionEmbeddings, window);
  }

  /** A list of non-negative integers (e.g. mlp_only_layers), else `fallback` when absent or null. */
  intList(key: string, fallback: number[]): number[] {
    const v = this.c[key] ?? fallback;
    if (!Array.isArray(v) || !v.every((x) => Number.isSafeInteger(x) && x >= 0)) {
      throw this.fail(`${key} must be a list of non-negative integers, got ${JSON.stringify(v)}`);
    }
    return v as number[];
  }

  /** A finite number (any sign), else `fallback` when absent or null. */
  finite(key: string, fallback: number): number {
    const v = this.c[key] ?? fallback;
    if (typeof v !== "number" || !Number.isFinite(v)) {
      throw this.fail(`${key} must be a finite number, got ${JSON.stringify(v)}`);
    }
    return v;
  }
}

/**
 * Reads a JSON file, turning a missing file (undefined instead with `optional`) or bad JSON into CheckpointError
 * naming the path.
 */
export async function readJsonFile(path: string, opts: { optional?: boolean } = {}): Promise<unknown> {
  let text: string;
  try {
    text = await Deno.readTextFile(path);
  } catch (e) {
    if (e instanceof Deno.errors.NotFound) {
      if (opts.optional) return undefined;
      throw new CheckpointError(`${path}: file not found`);
    }
    throw e;
  }
  try {
    return JSON.parse(text);
  } catch (e) {
    throw new CheckpointError(`${path}: invalid JSON (${(e as Error).message})`);
  }
}

/** `dir`'s config.json path. */
export function configPath(dir: string): string {
  return join(dir, "config.json");
}
