// Compiles a Hugging Face config.json into a ModelGraph with exact parameter counts, for the Llama
// (llama, mistral, qwen2, qwen3), Mixtral, Qwen-MoE (qwen2_moe, qwen3_moe) and DeepSeek-V3 / Kimi K2
// families. Counts follow the checkpoints' tensors one by one (see the comments), so that the totals
// match what the published models store.
import type { AttentionOp, DTypeBytes, Layer, ModelGraph, MoeOp, Op } from "./model_graph.ts";

type Json = Record<string, unknown>;

export interface CompileOptions {
  /** The graph's name; default: the config's `_name_or_path`, else its model_type. */
  name?: string;
  /** Overrides of bytes per element; defaults come from `torch_dtype` and `quantization_config`. */
  dtype?: Partial<DTypeBytes>;
}

const FAMILIES: Record<string, string> = {
  llama: "llama",
  mistral: "llama",
  qwen2: "llama",
  qwen3: "llama",
  mixtral: "mixtral",
  qwen2_moe: "qwen_moe",
  qwen3_moe: "qwen_moe",
  deepseek_v3: "deepseek_v3",
  kimi_k2: "deepseek_v3",
};

function int(cfg: Json, key: string, fallback?: number): number {
  const v = cfg[key] ?? fallback;
  if (typeof v !== "number" || !Number.isInteger(v) || v < 0) {
    throw new TypeError(`config.json: "${key}" must be a non-negative integer, got ${JSON.stringify(v)}`);
  }
  return v;
}

/** `key`, or its transformers alias where only that is written (models/config.ts ConfigReader.alias). */
function alias(cfg: Json, key: string, other: string): string {
  return cfg[key] === undefined || cfg[key] === null ? other : key;
}

function dtypeBytesOf(name: unknown): number {
  switch (name) {
    case "float32":
      return 4;
    case "float16":
    case "bfloat16":
    case undefined:
    case null:
      return 2;
    case "float8_e4m3fn":
      return 1;
    default:
      throw new TypeError(`config.json: unknown torch_dtype ${JSON.stringify(name)}`);
  }
}

/** Default bytes per element: torch_dtype everywhere, with fp8 / int-N quantization of linear weights. */
function defaultDtype(cfg: Json): DTypeBytes {
  const base = dtypeBytesOf(cfg.torch_dtype ?? cfg.dtype);
  const d: DTypeBytes = { dense: base, experts: base, embed: base, kv: base, activation: base };
  const q = cfg.quantization_config as Json | undefined;
  if (q && q.quant_method === "fp8") {
    d.dense = 1;
    d.experts = 1;
  }
  return d;
}

/** Attention of the Llama family: q, k, v, o projections (+ qkv biases for qwen2, q/k norms for qwen3). */
function gqaAttention(cfg: Json, type: string): AttentionOp {
  const h = int(cfg, "hidden_size");
  const heads = int(cfg, "num_attention_heads");
  const kvHeads = int(cfg, "num_key_value_heads", heads);
  const hd = int(cfg, "head_dim", Math.floor(h / heads));
  let params = h * heads * hd + 2 * h * kvHeads * hd + heads * hd * h;
  if (cfg.attention_bias === true || type === "qwen2" || type === "qwen2_moe") {
    params += heads * hd + 2 * kvHeads * hd;
  }
  if (type === "qwen3" || type === "qwen3_moe") params += 2 * hd; // q_norm, k_norm
  return {
    kind: "attention",
    variant: kvHeads === heads ? "mha" : "gqa",
    params,
    kvPerToken: 2 * kvHeads * hd,
    flops: 2 * params,
    ctxFlops: 4 * heads * hd,
  };
}

/** DeepSeek-V3 multi-head latent attention; decode FLOPs per context token assume absorbed projections. */
function mlaAttention(cfg: Json): AttentionOp {
  const h = int(cfg, "hidden_size");
  const heads = int(cfg, "num_attention_heads");
  const qLora = cfg.q_lora_rank == null ? 0 : int(cfg, "q_lora_rank");
  const kvLora = int(cfg, "kv_lora_rank");
  const rope = int(cfg, "qk_rope_head_dim");
  const nope = int(cfg, "qk_nope_head_dim");
  const vDim = int(cfg, "v_head_dim");
  const qkDim = rope + nope;
  const q = qLora > 0
    ? h * qLora + qLora + qLora * heads * qkDim // q_a_proj, q_a_layernorm, q_b_proj
    : h * heads * qkDim; // q_proj
  const kv = h * (kvLora + rope) + kvLora + kvLora * heads * (nope + vDim); // kv_a_proj_with_mqa, norm, kv_b_proj
  const o = heads * vDim * h;
  const params = q + kv + o;
  return {
    kind: "attention",
    variant: "mla",
    params,
    kvPerToken: kvLora + rope,
    flops: 2 * params,
    ctxFlops: 2 * heads * (kvLora + rope) + 2 * heads * kvLora,
  };
}

function mlp(h: number, inter: number): Op {
  const params = 3 * h * inter; // gate_proj, up_proj, down_proj
  return { kind: "mlp", params, flops: 2 * params };
}

function moe(
  experts: number,
  topK: number,
  expertParams: number,
  routerParams: number,
  shared: number,
  sharedParams: number,
): MoeOp {
  const flops = 2 * (topK * expertParams + routerParams + shared * sharedParams);
  return { kind: "moe", experts, topK, expertParams, routerParams, shared, sharedParams, flops };
}

function ffnOf(cfg: Json, family: string, type: string, i: number): Op {
  const h = int(cfg, "hidden_size");
  if (family === "mixtral") {
    const n = int(cfg, alias(cfg, "num_local_experts", "num_experts"));
    return moe(n, int(cfg, "num_experts_per_tok"), 3 * h * int(cfg, "intermediate_size"), n * h, 0, 0);
  }
  if (family === "qwen_moe") {
    const n = int(cfg, alias(cfg, "num_experts", "num_local_experts"), 0);
    const step = int(cfg, "decoder_sparse_step", 1);
    const mlpOnly = (cfg.mlp_only_layers as number[] | undefined) ?? [];
    if (n > 0 && !mlpOnly.includes(i) && (i + 1) % step === 0) {
      const sharedInter = type === "qwen2_moe" ? int(cfg, "shared_expert_intermediate_size", 0) : 0;
      // qwen2_moe's shared expert has a scalar gate: shared_expert_gate [1, hidden].
      const shared = sharedInter > 0 ? 1 : 0;
      return moe(
        n,
        int(cfg, "num_experts_per_tok"),
        3 * h * int(cfg, "moe_intermediate_size"),
        n * h,
        shared,
        shared ? 3 * h * sharedInter + h : 0,
      );
    }
    return mlp(h, int(cfg, "intermediate_size"));
  }
  if (family === "deepseek_v3") {
    const n = int(cfg, alias(cfg, "n_routed_experts", "num_local_experts"), 0);
    // Every layer from first_k_dense_replace on is MoE: transformers ignores moe_layer_freq, and so does the
    // runtime (models/families/deepseek_v3.ts), so the plan must too.
    if (n > 0 && i >= int(cfg, "first_k_dense_replace", 0)) {
      const inter = int(cfg, "moe_intermediate_size");
      const bias = cfg.topk_method === "noaux_tc" ? n : 0; // e_score_correction_bias
      const shared = int(cfg, "n_shared_experts", 0);
      return moe(n, int(cfg, "num_experts_per_tok"), 3 * h * inter, n * h + bias, shared, 3 * h * inter);
    }
    return mlp(h, int(cfg, "intermediate_size"));
  }
  return mlp(h, int(cfg, "intermediate_size"));
}

/** Compiles a parsed config.json object into a ModelGraph; throws TypeError for unsupported or bad configs. */
export function compileHfConfig(json: unknown, opts: CompileOptions = {}): ModelGraph {
  if (typeof json !== "object" || json === null || Array.isArray(json)) {
    throw new TypeError("config.json: expected a JSON object");
  }
  const cfg = json as Json;
  const type = String(cfg.model_type ?? "");
  const family = FAMILIES[type];
  if (!family) {
    throw new TypeError(
      `config.json: unsupported model_type ${JSON.stringify(cfg.model_type)} (expected one of ${
        Object.keys(FAMILIES).join(", ")
      })`,
    );
  }
  const h = int(cfg, "hidden_size");
  const vocab = int(cfg, "vocab_size");
  const n = int(cfg, "num_hidden_layers");
  const tied = cfg.tie_word_embeddings === true;
  const layers: Layer[] = [];
  for (let i = 0; i < n; i++) {
    const attn = family === "deepseek_v3" ? mlaAttention(cfg) : gqaAttention(cfg, type);
    // input_layernorm + post_attention_layernorm
    layers.push({ ops: [{ kind: "norm", params: 2 * h }, attn, ffnOf(cfg, family, type, i)] });
  }
  return {
    name: opts.name ?? String(cfg._name_or_path ?? type),
    family: type,
    hidden: h,
    vocab,
    dtype: { ...defaultDtype(cfg), ...opts.dtype },
    embedParams: vocab * h,
    headParams: vocab * h + h, // lm_head (or the tied embedding) + final norm
    tied,
    layers,
  };
}
