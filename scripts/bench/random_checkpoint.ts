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
