// Writes a checkpoint of any supported family with the given config and deterministic random bf16 weights
// (the demo model's generator), for benchmarks at real model shapes without downloading weights.
import { join } from "node:path";
import { demoTensor } from "../../models/demo.ts";
import { parseModelConfig } from "../../models/family.ts";
import { tensorShapes } from "../../models/tensors.ts";
import { writeSafetensors } from "../../models/safetensors.ts";

/** Llama 3.2 1B's config.json (public), used by the decode benchmark. */
export const LLAMA_3_2_1B = {
  architectures: ["LlamaForCausalLM"],
  model_type: "llama",
  vocab_size: 128256,
  hidden_size: 2048,
  intermediate_size: 8192,
  num_hidden_layers: 16,
  num_attention_heads: 32,
  num_key_value_heads: 8,
  head_dim: 64,
  hidden_act: "silu",
  max_position_embeddings: 131072,
  rms_norm_eps: 1e-5,
  rope_theta: 500000.0,
  rope_scaling: {
    factor: 32.0,
    high_freq_factor: 4.0,
    low_freq_factor: 1.0,
    original_max_position_embeddings: 8192,
    rope_type: "llama3",
  },
  tie_word_embeddings: true,
  attention_bias: false,
  mlp_bias: false,
  bos_token_id: 128000,
  eos_token_id: [128001, 128008, 128009],
  torch_dtype: "bfloat16",
};

/**
 * A llama-micro-shaped config (hidden 64, 4 heads, a 512-token vocabulary) with `layers` layers and f32
 * weights: the speculative decoding benchmarks' chain model, one layer per stage.
 */
export function llamaMicroShaped(layers: number): Record<string, unknown> {
  return {
    architectures: ["LlamaForCausalLM"],
    model_type: "llama",
    vocab_size: 512,
    hidden_size: 64,
    intermediate_size: 160,
    num_hidden_layers: layers,
    num_attention_heads: 4,
    num_key_value_heads: 4,
    hidden_act: "silu",
    max_position_embeddings: 4096,
    rms_norm_eps: 1e-6,
    rope_theta: 10000.0,
    tie_word_embeddings: false,
    bos_token_id: 1,
    eos_token_id: 2,
    torch_dtype: "float32",
  };
}

/** The llamaMicroShaped(layers) checkpoint in $TMPDIR (written the first time); returns its folder. */
export async function llamaMicroShapedCheckpoint(layers: number): Promise<string> {
  const dir = join(Deno.env.get("TMPDIR") ?? "/tmp", `swactor-spec-bench-${layers}`);
  await ensureRandomCheckpoint(dir, llamaMicroShaped(layers));
  return dir;
}

/** Writes config.json + model.safetensors into `dir` unless they are there already. */
export async function ensureRandomCheckpoint(
  dir: string,
  configJson: Record<string, unknown>,
): Promise<void> {
  try {
    await Deno.stat(join(dir, "model.safetensors"));
    return;
  } catch { /* not there yet */ }
  await Deno.mkdir(dir, { recursive: true });
  const config = parseModelConfig(configJson, "benchmark config");
  const tensors = [...tensorShapes(config)].map(([name, shape]) => demoTensor(name, shape));
  await writeSafetensors(join(dir, "model.safetensors"), tensors, { format: "pt" });
  await Deno.writeTextFile(join(dir, "config.json"), JSON.stringify(configJson, null, 2));
}

/** Qwen3-30B-A3B's config.json (public), and DeepSeek-V2-Lite's dimensions as a deepseek_v3 config. */
export const MOE_SHAPES: Record<string, Record<string, unknown>> = {
  "qwen3-30b-a3b": {
    architectures: ["Qwen3MoeForCausalLM"],
    model_type: "qwen3_moe",
    vocab_size: 151936,
    hidden_size: 2048,
    intermediate_size: 6144,
    moe_intermediate_size: 768,
    num_hidden_layers: 48,
    num_attention_heads: 32,
    num_key_value_heads: 4,
    head_dim: 128,
    num_experts: 128,
    num_experts_per_tok: 8,
    norm_topk_prob: true,
    decoder_sparse_step: 1,
    mlp_only_layers: [],
    max_position_embeddings: 40960,
    rms_norm_eps: 1e-6,
    rope_theta: 1000000.0,
    tie_word_embeddings: false,
    torch_dtype: "bfloat16",
    bos_token_id: 151643,
    eos_token_id: 151645,
    hidden_act: "silu",
  },
  "deepseek-v2-lite": {
    architectures: ["DeepseekV3ForCausalLM"],
    model_type: "deepseek_v3",
    vocab_size: 102400,
    hidden_size: 2048,
    intermediate_size: 10944,
    moe_intermediate_size: 1408,
    num_hidden_layers: 27,
    num_attention_heads: 16,
    num_key_value_heads: 16,
    kv_lora_rank: 512,
    q_lora_rank: null,
    qk_rope_head_dim: 64,
    qk_nope_head_dim: 128,
    v_head_dim: 128,
    n_routed_experts: 64,
    num_experts_per_tok: 6,
    n_shared_experts: 2,
    n_group: 1,
    topk_group: 1,
    first_k_dense_replace: 1,
    moe_layer_freq: 1,
    norm_topk_prob: false,
    routed_scaling_factor: 1.0,
    topk_method: "noaux_tc",
    scoring_func: "sigmoid",
    max_position_embeddings: 163840,
    rms_norm_eps: 1e-6,
    rope_theta: 10000.0,
    tie_word_embeddings: false,
    torch_dtype: "bfloat16",
    bos_token_id: 100000,
    eos_token_id: 100001,
    hidden_act: "silu",
  },
};
