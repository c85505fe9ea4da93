// The model graph: what the planner knows about a model. A chain of layers; each layer is a chain of
// operators; a `moe` operator is a fan-out to `topK` of its `experts` (plus `shared` experts that every
// token runs) and a fan-in that sums their outputs. Parameter counts are exact counts (not bytes) so that a
// quantization setting (`dtype`) can change the bytes without recompiling the graph.

/** Bytes per stored element for each part of the model. 0.5 is 4-bit; 0.5625 is 4-bit with group-32 scales. */
export interface DTypeBytes {
  /** Dense linear weights: attention, dense MLPs, shared experts, routers, norms. */
  dense: number;
  /** Routed MoE experts (the bulk of a MoE model; usually quantized hardest). */
  experts: number;
  /** Token embedding and LM head. */
  embed: number;
  /** One element of the KV cache. */
  kv: number;
  /** One element of an activation sent between nodes (hidden state on the wire). */
  activation: number;
}

export type AttentionVariant = "mha" | "gqa" | "mla";

export interface AttentionOp {
  kind: "attention";
  variant: AttentionVariant;
  /** Parameters of all projections and internal norms (and biases). */
  params: number;
  /** KV-cache elements stored per token of context (K and V, or MLA's compressed latent + rope key). */
  kvPerToken: number;
  /** GQA / MHA: values of one K or V cache row (head_dim); absent for MLA (and where not known). */
  headDim?: number;
  /** FLOPs per token of new input, excluding the part that grows with the context. */
  flops: number;
  /** FLOPs per token of new input per token of context (scores and weighted sum). */
  ctxFlops: number;
}

export interface MlpOp {
  kind: "mlp";
  params: number;
  flops: number;
}

export interface NormOp {
  kind: "norm";
  params: number;
}

export interface MoeOp {
  kind: "moe";
  /** Routed experts in this layer. */
  experts: number;
  /** Routed experts each token runs. */
  topK: number;
  /** Parameters of one routed expert. */
  expertParams: number;
  /** Router (gate) parameters, including any score-correction bias. */
  routerParams: number;
  /** Shared experts (every token runs them; they live with the layer's stage). */
  shared: number;
  /** Parameters of one shared expert (including its gate, if any). */
  sharedParams: number;
  /** FLOPs per token: router + topK routed experts + shared experts. */
  flops: number;
}

export type Op = AttentionOp | MlpOp | NormOp | MoeOp;

export interface Layer {
  ops: Op[];
}

export interface ModelGraph {
  name: string;
  /** The family the graph came from ("llama", "mixtral", "qwen3_moe", "deepseek_v3", ...). */
  family: string;
  hidden: number;
  vocab: number;
  dtype: DTypeBytes;
  /** Token-embedding parameters (vocab x hidden); they live on the first stage. */
  embedParams: number;
  /** LM-head parameters plus the final norm; they live on the last stage. */
  headParams: number;
  /** True when the head shares the embedding's weights (one copy when first and last stage coincide). */
  tied: boolean;
  layers: Layer[];
}

/** Parameters of one layer, all routed experts included. */
export function layerParams(layer: Layer): number {
  let n = 0;
  for (const op of layer.ops) {
    if (op.kind === "moe") n += op.experts * op.expertParams + op.routerParams + op.shared * op.sharedParams;
    else n += op.params;
  }
  return n;
}

/** Parameters one token touches in a layer (topK routed experts). */
export function layerActiveParams(layer: Layer): number {
  let n = 0;
  for (const op of layer.ops) {
    if (op.kind === "moe") n += op.topK * op.expertParams + op.routerParams + op.shared * op.sharedParams;
    else n += op.params;
  }
  return n;
}

/** The layer's MoE operator, if any. */
export function moeOf(layer: Layer): MoeOp | undefined {
  return layer.ops.find((op): op is MoeOp => op.kind === "moe");
}

/** Stored parameters of the whole model (a tied head counted once, as the checkpoint stores it). */
export function totalParams(model: ModelGraph): number {
  let n = model.embedParams + model.headParams - (model.tied ? model.vocab * model.hidden : 0);
  for (const l of model.layers) n += layerParams(l);
  return n;
}

/** Parameters one token uses (embedding and head included, as the usual "active" count does). */
export function activeParams(model: ModelGraph): number {
  let n = model.embedParams + model.headParams - (model.tied ? model.vocab * model.hidden : 0);
  for (const l of model.layers) n += layerActiveParams(l);
  return n;
}

/** Weight bytes of one layer under the model's dtype, split into routed experts and the rest. */
export function layerWeightBytes(layer: Layer, dtype: DTypeBytes): { dense: number; experts: number } {
  let dense = 0, experts = 0;
  for (const op of layer.ops) {
    if (op.kind === "moe") {
      experts += op.experts * op.expertParams * dtype.experts;
      dense += (op.routerParams + op.shared * op.sharedParams) * dtype.dense;
    } else dense += op.params * dtype.dense;
  }
  return { dense, experts };
}
