// The tensors a checkpoint holds, by their Hugging Face names, with the shapes its config implies. Each
// block kind names its own tensors; the loader reads a stage's subset by these names, checking each shape,
// and the demo model is written from this table.
import type { AttentionSpec, FfnSpec, ModelConfig } from "./config.ts";
import { mlaTensors } from "./blocks/mla.ts";
import { moeTensors } from "./blocks/moe.ts";

/** Norm weights: initialised to 1 in a fresh model, unlike the projections (and biases: 0 is fine too). */
export function isNormTensor(name: string): boolean {
  return name.endsWith("layernorm.weight") || name.endsWith("norm.weight");
}

/** A layer's tensor-name prefix. */
export function layerPrefix(i: number): string {
  return `model.layers.${i}.`;
}

/** The attention block's tensors ([out, in] for projections, as torch stores nn.Linear). */
export function attentionTensors(a: AttentionSpec, hidden: number, p: string): [string, number[]][] {
  if (a.kind === "mla") return mlaTensors(a, hidden, p);
  const q = a.heads * a.headDim;
  const kv = a.kvHeads * a.headDim;
  const t: [string, number[]][] = [
    [p + "self_attn.q_proj.weight", [q, hidden]],
    [p + "self_attn.k_proj.weight", [kv, hidden]],
    [p + "self_attn.v_proj.weight", [kv, hidden]],
    [p + "self_attn.o_proj.weight", [hidden, q]],
  ];
  if (a.qkvBias) {
    t.push(
      [p + "self_attn.q_proj.bias", [q]],
      [p + "self_attn.k_proj.bias", [kv]],
      [p + "self_attn.v_proj.bias", [kv]],
    );
  }
  if (a.oBias) t.push([p + "self_attn.o_proj.bias", [hidden]]);
  if (a.qkNorm) {
    t.push([p + "self_attn.q_norm.weight", [a.headDim]], [p + "self_attn.k_norm.weight", [a.headDim]]);
  }
  return t;
}

/** The feed-forward block's tensors. */
export function ffnTensors(f: FfnSpec, hidden: number, p: string, routed = true): [string, number[]][] {
  if (f.kind === "moe") return moeTensors(f, hidden, p, routed);
  return [
    [p + "mlp.gate_proj.weight", [f.intermediate, hidden]],
    [p + "mlp.up_proj.weight", [f.intermediate, hidden]],
    [p + "mlp.down_proj.weight", [hidden, f.intermediate]],
  ];
}

/** Layer i's tensors, in the order transformers writes them (without routed experts if not `routed`). */
export function layerTensors(c: ModelConfig, i: number, routed = true): [string, number[]][] {
  const p = layerPrefix(i);
  const spec = c.layer(i);
  return [
    [p + "input_layernorm.weight", [c.hiddenSize]],
    ...attentionTensors(spec.attention, c.hiddenSize, p),
    [p + "post_attention_layernorm.weight", [c.hiddenSize]],
    ...ffnTensors(spec.ffn, c.hiddenSize, p, routed),
  ];
}

/**
 * Multi-token-prediction module m's own tensors (DeepSeek-V3; models/mtp.ts), besides its decoder layer
 * (layer numLayers + m, named as any layer): the norms of the token's embedding and of the target's hidden
 * state, the projection of their concatenation [hidden, 2 * hidden], and its head's norm and matrix where the
 * checkpoint ships them (`own`; otherwise the model's final norm and lm_head serve).
 */
export function mtpTensors(
  c: ModelConfig,
  m: number,
  own: { norm: boolean; head: boolean },
): [string, number[]][] {
  const p = layerPrefix(c.numLayers + m), h = c.hiddenSize;
  const t: [string, number[]][] = [
    [p + "enorm.weight", [h]],
    [p + "hnorm.weight", [h]],
    [p + "eh_proj.weight", [h, 2 * h]],
  ];
  if (own.norm) t.push([p + "shared_head.norm.weight", [h]]);
  if (own.head) t.push([p + "shared_head.head.weight", [c.vocabSize, h]]);
  return t;
}

/** What a part of the model holds: a layer range, with or without the embedding and the head. */
export interface ModelPart {
  layers: [number, number];
  embed: boolean;
  head: boolean;
  /** MoE layers whose routed experts are held by expert hosts, not here (expert parallelism). */
  remoteExperts?: ReadonlySet<number>;
  /** The part is the first multi-token-prediction module (layers = [numLayers, numLayers + 1]). */
  mtp?: boolean;
}

/**
 * The tensors `part` needs (all of them by default), in checkpoint order: embeddings, each layer, final
 * norm, then `lm_head.weight` unless the embeddings are tied (a tied head reads the embedding table).
 */
export function tensorShapes(c: ModelConfig, part?: ModelPart): Map<string, number[]> {
  const { layers, embed, head } = part ?? { layers: [0, c.numLayers], embed: true, head: true };
  const v = c.vocabSize, h = c.hiddenSize;
  const shapes = new Map<string, number[]>();
  if (embed || (head && c.tieWordEmbeddings)) shapes.set("model.embed_tokens.weight", [v, h]);
  for (let i = layers[0]; i < layers[1]; i++) {
    for (const [n, s] of layerTensors(c, i, !part?.remoteExperts?.has(i))) shapes.set(n, s);
  }
  if (head) {
    shapes.set("model.norm.weight", [h]);
    if (!c.tieWordEmbeddings) shapes.set("lm_head.weight", [v, h]);
  }
  return shapes;
}
