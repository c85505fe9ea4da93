import assert from "node:assert/strict";
import { parseModelConfig } from "../../models/family.ts";
import { isNormTensor, tensorShapes } from "../../models/tensors.ts";

Deno.test("tensorShapes: GQA shapes, explicit head_dim, lm_head only when untied", () => {
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
  const untied = tensorShapes(parseModelConfig(base, "x"));
  assert.equal(untied.size, 1 + 2 * 9 + 2);
  assert.deepEqual(untied.get("model.layers.1.self_attn.q_proj.weight"), [24, 8]);
  assert.deepEqual(untied.get("model.layers.1.self_attn.k_proj.weight"), [12, 8]);
  assert.deepEqual(untied.get("model.layers.0.self_attn.o_proj.weight"), [8, 24]);
  assert.deepEqual(untied.get("model.layers.0.mlp.down_proj.weight"), [8, 12]);
  assert.deepEqual(untied.get("lm_head.weight"), [10, 8]);
  const tied = tensorShapes(parseModelConfig({ ...base, tie_word_embeddings: true }, "x"));
  assert.equal(tied.has("lm_head.weight"), false);
  assert.deepEqual([...tied.keys()].filter(isNormTensor), [
    "model.layers.0.input_layernorm.weight",
    "model.layers.0.post_attention_layernorm.weight",
    "model.layers.1.input_layernorm.weight",
    "model.layers.1.post_attention_layernorm.weight",
    "model.norm.weight",
  ]);
});

Deno.test("tensorShapes: a part holds its layers, the embedding on the first and the head on the last", () => {
  const c = parseModelConfig({
    model_type: "qwen3",
    vocab_size: 10,
    hidden_size: 8,
    intermediate_size: 12,
    num_hidden_layers: 3,
    num_attention_heads: 2,
    num_key_value_heads: 1,
    head_dim: 6,
    tie_word_embeddings: true,
  }, "x");
  const mid = tensorShapes(c, { layers: [1, 2], embed: false, head: false });
  assert.ok([...mid.keys()].every((n) => n.startsWith("model.layers.1.")));
  assert.deepEqual(mid.get("model.layers.1.self_attn.k_norm.weight"), [6]);
  const last = tensorShapes(c, { layers: [2, 3], embed: false, head: true });
  assert.ok(last.has("model.embed_tokens.weight"), "a tied head reads the embedding table");
  assert.ok(last.has("model.norm.weight") && !last.has("lm_head.weight"));
});
