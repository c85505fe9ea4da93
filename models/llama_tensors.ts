// The tensors a Llama checkpoint holds, by their Hugging Face names, with the shapes config.json
// implies. The demo model is written from this list, tests check real checkpoints against it, and a
// loader can pass each shape to Checkpoint.read as the expected one.
import type { LlamaConfig } from "./config.ts";

/** Norm weights: initialised to 1 in a fresh model, unlike the projections. */
export function isNormTensor(name: string): boolean {
  return name.endsWith("layernorm.weight") || name === "model.norm.weight";
}

/**
 * Every tensor name of a Llama model with its shape ([out, in] for projections, as torch stores
 * nn.Linear), in the order transformers writes them: embeddings, each layer, final norm, then
 * `lm_head.weight` unless the embeddings are tied.
 */
export function llamaTensorShapes(config: LlamaConfig): Map<string, number[]> {
  const { vocabSize: v, hiddenSize: h, intermediateSize: f, numHeads, numKvHeads, headDim } = config;
  const shapes = new Map<string, number[]>();
  shapes.set("model.embed_tokens.weight", [v, h]);
  for (let i = 0; i < config.numLayers; i++) {
    const p = `model.layers.${i}.`;
    shapes.set(p + "input_layernorm.weight", [h]);
    shapes.set(p + "self_attn.q_proj.weight", [numHeads * headDim, h]);
    shapes.set(p + "self_attn.k_proj.weight", [numKvHeads * headDim, h]);
    shapes.set(p + "self_attn.v_proj.weight", [numKvHeads * headDim, h]);
    shapes.set(p + "self_attn.o_proj.weight", [h, numHeads * headDim]);
    shapes.set(p + "post_attention_layernorm.weight", [h]);
    shapes.set(p + "mlp.gate_proj.weight", [f, h]);
    shapes.set(p + "mlp.up_proj.weight", [f, h]);
    shapes.set(p + "mlp.down_proj.weight", [h, f]);
  }
  shapes.set("model.norm.weight", [h]);
  if (!config.tieWordEmbeddings) shapes.set("lm_head.weight", [v, h]);
  return shapes;
}
