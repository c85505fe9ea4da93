// Compiles a Hugging Face config.json into a ModelGraph with exact parameter counts, for every family the
// runtime runs (models/families/): the config is read by the runtime's own parser (the same defaults,
// aliases and checks) and each layer's parameters are the tensors the runtime loads for it (models/
// tensors.ts), so a plan sizes exactly what the stages will hold.
import type { AttentionOp, DTypeBytes, Layer, ModelGraph, MoeOp, Op } from "./model_graph.ts";
import type { AttentionSpec, FfnSpec } from "../models/config.ts";
import { CheckpointError } from "../models/errors.ts";
import { parseModelConfig } from "../models/family.ts";
import { attentionTensors, ffnTensors } from "../models/tensors.ts";

type Json = Record<string, unknown>;

export interface CompileOptions {
  /** The graph's name; default: the config's `_name_or_path`, else its model_type. */
  name?: string;
  /** Overrides of bytes per element; defaults come from `torch_dtype` and `quantization_config`. */
  dtype?: Partial<DTypeBytes>;
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

/** Elements in a list of tensors. */
function elements(t: [string, number[]][]): number {
  return t.reduce((n, [, shape]) => n + shape.reduce((a, b) => a * b, 1), 0);
}

/** The attention op: its tensors' parameters, KV elements per token and FLOPs (MLA's with absorbed projections). */
function attentionOp(a: AttentionSpec, hidden: number): AttentionOp {
  const params = elements(attentionTensors(a, hidden, ""));
  if (a.kind === "mla") {
    const latent = a.kvLoraRank + a.qkRopeHeadDim;
    return {
      kind: "attention",
      variant: "mla",
      params,
      kvPerToken: latent,
      flops: 2 * params,
      ctxFlops: 2 * a.heads * latent + 2 * a.heads * a.kvLoraRank,
    };
  }
  return {
    kind: "attention",
    variant: a.kvHeads === a.heads ? "mha" : "gqa",
    params,
    kvPerToken: 2 * a.kvHeads * a.headDim,
    headDim: a.headDim,
    flops: 2 * params,
    ctxFlops: 4 * a.heads * a.headDim,
  };
}

/** The feed-forward op: a dense MLP, or MoE with its router (and score bias) and shared experts. */
function ffnOp(f: FfnSpec, hidden: number): Op {
  if (f.kind === "mlp") {
    const params = elements(ffnTensors(f, hidden, ""));
    return { kind: "mlp", params, flops: 2 * params };
  }
  const { experts, topK } = f.routing;
  const expertParams = 3 * hidden * f.intermediate;
  const routerParams = experts * hidden + (f.names.bias ? experts : 0);
  // Shared experts are stored as one MLP of n x moe_intermediate_size (DeepSeek-V3): n experts of one size.
  const shared = f.sharedIntermediate > 0
    ? Math.max(1, Math.round(f.sharedIntermediate / f.intermediate))
    : 0;
  const sharedParams = shared ? (3 * hidden * f.sharedIntermediate) / shared : 0;
  const flops = 2 * (topK * expertParams + routerParams + shared * sharedParams);
  const op: MoeOp = { kind: "moe", experts, topK, expertParams, routerParams, shared, sharedParams, flops };
  return op;
}

/**
 * Compiles a parsed config.json object into a ModelGraph; throws TypeError for unsupported or bad configs
 * (the runtime parser's message, naming the key).
 */
export function compileHfConfig(json: unknown, opts: CompileOptions = {}): ModelGraph {
  if (typeof json !== "object" || json === null || Array.isArray(json)) {
    throw new TypeError("config.json: expected a JSON object");
  }
  const cfg = json as Json;
  let c;
  try {
    c = parseModelConfig(json, "config.json");
  } catch (e) {
    if (e instanceof CheckpointError) throw new TypeError(e.message);
    throw e;
  }
  const h = c.hiddenSize, vocab = c.vocabSize;
  const layers: Layer[] = [];
  for (let i = 0; i < c.numLayers; i++) {
    const spec = c.layer(i);
    // input_layernorm + post_attention_layernorm
    layers.push({
      ops: [{ kind: "norm", params: 2 * h }, attentionOp(spec.attention, h), ffnOp(spec.ffn, h)],
    });
  }
  return {
    name: opts.name ?? String(cfg._name_or_path ?? c.modelType),
    family: c.modelType,
    hidden: h,
    vocab,
    dtype: { ...defaultDtype(cfg), ...opts.dtype },
    embedParams: vocab * h,
    headParams: vocab * h + h, // lm_head (or the tied embedding) + final norm
    tied: c.tieWordEmbeddings,
    layers,
  };
}
