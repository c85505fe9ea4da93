// A small Llama config.json as the planner reads it: for planner tests, and for node tests whose stages are
// fakes (node/stage's FakeBackend uses only the layer split).
import { join } from "node:path";

export function tinyLlamaConfig(layers: number, vocab = 512): Record<string, unknown> {
  return {
    model_type: "llama",
    architectures: ["LlamaForCausalLM"],
    vocab_size: vocab,
    hidden_size: 64,
    intermediate_size: 160,
    num_hidden_layers: layers,
    num_attention_heads: 4,
    num_key_value_heads: 4,
    max_position_embeddings: 4096,
    torch_dtype: "float32",
  };
}

/** A temporary folder holding that config.json alone (no weights: for fake backends). */
export async function tinyLlamaDir(layers: number, vocab = 512): Promise<string> {
  const dir = await Deno.makeTempDir({ prefix: "swactor-tiny-llama-" });
  await Deno.writeTextFile(join(dir, "config.json"), JSON.stringify(tinyLlamaConfig(layers, vocab)));
  return dir;
}
