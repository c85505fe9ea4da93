import assert from "node:assert/strict";
import { parseLlamaConfig } from "../../models/config.ts";
import { isNormTensor, llamaTensorShapes } from "../../models/llama_tensors.ts";

Deno.test("llamaTensorShapes: GQA shapes, explicit head_dim, lm_head only when untied", () => {
  const base = {
    model_type: "llama",
    vocab_size: 10,
    hidden_size: 8,
    intermediate_size: 12,
    num_hidden_layers: 2,
    num_attention_heads: 4,
    num_key_value_heads: 2,
    head_dim: 6,
  };
  const untied = llamaTensorShapes(parseLlamaConfig(base, "x"));
  assert.equal(untied.size, 1 + 2 * 9 + 2);
  assert.deepEqual(untied.get("model.layers.1.self_attn.q_proj.weight"), [24, 8]);
  assert.deepEqual(untied.get("model.layers.1.self_attn.k_proj.weight"), [12, 8]);
  assert.deepEqual(untied.get("model.layers.0.self_attn.o_proj.weight"), [8, 24]);
  assert.deepEqual(untied.get("model.layers.0.mlp.down_proj.weight"), [8, 12]);
  assert.deepEqual(untied.get("lm_head.weight"), [10, 8]);
  const tied = llamaTensorShapes(parseLlamaConfig({ ...base, tie_word_embeddings: true }, "x"));
  assert.equal(tied.has("lm_head.weight"), false);
  assert.deepEqual([...tied.keys()].filter(isNormTensor), [
    "model.layers.0.input_layernorm.weight",
    "model.layers.0.post_attention_layernorm.weight",
    "model.layers.1.input_layernorm.weight",
    "model.layers.1.post_attention_layernorm.weight",
    "model.norm.weight",
  ]);
});
