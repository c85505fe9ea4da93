// config.json of a Llama-family checkpoint, as the Hugging Face hub ships it, parsed into one
// camelCase shape the forward pass reads. Defaults follow transformers' LlamaConfig, so a config that
// leaves a field out means here what it means there.
import { join } from "node:path";
import { CheckpointError } from "./errors.ts";

/** `rope_scaling` of type llama3 (Llama 3.1 / 3.2): frequencies are rescaled by wavelength band. */
export interface Llama3RopeScaling {
  type: "llama3";
  factor: number;
  lowFreqFactor: number;
  highFreqFactor: number;
  originalMaxPositionEmbeddings: number;
}

export interface LlamaConfig {
  modelType: "llama";
  architectures: string[];
  vocabSize: number;
  hiddenSize: number;
  intermediateSize: number;
  numLayers: number;
  numHeads: number;
  numKvHeads: number;
  headDim: number;
  rmsNormEps: number;
  ropeTheta: number;
  /** null: plain RoPE (no `rope_scaling`, or `rope_type: "default"`). */
  ropeScaling: null | Llama3RopeScaling;
  maxPositionEmbeddings: number;
  tieWordEmbeddings: boolean;
  bosTokenId: number | null;
  eosTokenIds: number[];
  /** `torch_dtype` (or transformers 5's `dtype`) as written: the dtype the weights were saved in. */
  torchDtype: string | null;
  hiddenAct: "silu";
}

const SUPPORTED_ARCHITECTURES = ["LlamaForCausalLM"];

/**
 * Validates a parsed config.json and returns it as a LlamaConfig. `source` (usually the file's path)
 * is named in every error. Throws CheckpointError for another architecture, a missing or non-positive
 * size, heads that do not divide, an unsupported rope scaling, activation or bias.
 */
export function parseLlamaConfig(json: unknown, source: string): LlamaConfig {
  const fail = (what: string) => new CheckpointError(`${source}: ${what}`);
  if (typeof json !== "object" || json === null || Array.isArray(json)) {
    throw fail("config is not a JSON object");
  }
  const c = json as Record<string, unknown>;
  const modelType = c.model_type;
  if (modelType !== "llama") {
    throw new CheckpointError(
      `unsupported architecture '${String(modelType)}' (model_type) in ${source}: supported: llama`,
    );
  }
  let architectures: string[] = ["LlamaForCausalLM"];
  if (c.architectures !== undefined && c.architectures !== null) {
    if (!Array.isArray(c.architectures) || !c.architectures.every((a) => typeof a === "string")) {
      throw fail(`architectures must be a list of strings, got ${JSON.stringify(c.architectures)}`);
    }
    const other = c.architectures.find((a) => !SUPPORTED_ARCHITECTURES.includes(a));
    if (other !== undefined) {
      throw new CheckpointError(
        `unsupported architecture '${other}' (architectures) in ${source}: supported: ${
          SUPPORTED_ARCHITECTURES.join(", ")
        }`,
      );
    }
    if (c.architectures.length > 0) architectures = [...c.architectures];
  }

  const int = (key: string, fallback?: number): number => {
    const v = c[key] ?? fallback;
    if (v === undefined) throw fail(`missing ${key} (expected a positive integer)`);
    if (typeof v !== "number" || !Number.isSafeInteger(v) || v <= 0) {
      throw fail(`${key} must be a positive integer, got ${JSON.stringify(v)}`);
    }
    return v;
  };
  const num = (key: string, fallback?: number): number => {
    const v = c[key] ?? fallback;
    if (v === undefined) throw fail(`missing ${key} (expected a positive number)`);
    if (typeof v !== "number" || !Number.isFinite(v) || v <= 0) {
      throw fail(`${key} must be a positive number, got ${JSON.stringify(v)}`);
    }
    return v;
  };
  const tokenId = (key: string, v: unknown): number => {
    if (typeof v !== "number" || !Number.isSafeInteger(v) || v < 0) {
      throw fail(`${key} must be a non-negative integer token id, got ${JSON.stringify(v)}`);
    }
    return v;
  };

  const vocabSize = int("vocab_size");
  const hiddenSize = int("hidden_size");
  const intermediateSize = int("intermediate_size");
  const numLayers = int("num_hidden_layers");
  const numHeads = int("num_attention_heads");
  const numKvHeads = int("num_key_value_heads", numHeads);
  if (numHeads % numKvHeads !== 0) {
    throw fail(
      `num_attention_heads (${numHeads}) must be a multiple of num_key_value_heads (${numKvHeads})`,
    );
  }
  let headDim: number;
  if (c.head_dim === undefined || c.head_dim === null) {
    if (hiddenSize % numHeads !== 0) {
      throw fail(`hidden_size (${hiddenSize}) must be a multiple of num_attention_heads (${numHeads})`);
    }
    headDim = hiddenSize / numHeads;
  } else {
    headDim = int("head_dim");
  }
  if (headDim % 2 !== 0) throw fail(`head_dim must be even for RoPE, got ${headDim}`);

  const hiddenAct = c.hidden_act ?? "silu";
  if (hiddenAct !== "silu") {
    throw fail(`unsupported hidden_act ${JSON.stringify(hiddenAct)}: supported: silu`);
  }
  for (const key of ["attention_bias", "mlp_bias"]) {
    if (c[key] !== undefined && c[key] !== null && c[key] !== false) {
      throw fail(`unsupported ${key}=${JSON.stringify(c[key])}: supported: false`);
    }
  }
  const tie = c.tie_word_embeddings ?? false;
  if (typeof tie !== "boolean") {
    throw fail(`tie_word_embeddings must be true or false, got ${JSON.stringify(tie)}`);
  }

  const bos = c.bos_token_id;
  const bosTokenId = bos === undefined || bos === null ? null : tokenId("bos_token_id", bos);
  const eos = c.eos_token_id;
  const eosTokenIds = eos === undefined || eos === null
    ? []
    : Array.isArray(eos)
    ? eos.map((e) => tokenId("eos_token_id", e))
    : [tokenId("eos_token_id", eos)];

  const dtype = c.torch_dtype ?? c.dtype ?? null;
  if (dtype !== null && typeof dtype !== "string") {
    throw fail(`torch_dtype must be a string, got ${JSON.stringify(dtype)}`);
  }

  return {
    modelType: "llama",
    architectures,
    vocabSize,
    hiddenSize,
    intermediateSize,
    numLayers,
    numHeads,
    numKvHeads,
    headDim,
    rmsNormEps: num("rms_norm_eps", 1e-6),
    ropeTheta: ropeTheta(c, source),
    ropeScaling: parseRopeScaling(c.rope_scaling ?? c.rope_parameters, source),
    maxPositionEmbeddings: int("max_position_embeddings", 2048),
    tieWordEmbeddings: tie,
    bosTokenId,
    eosTokenIds,
    torchDtype: dtype,
    hiddenAct: "silu",
  };
}

/**
 * `rope_theta` at the top level (hub configs), else inside `rope_parameters` (how transformers 5 saves
 * it), else transformers' default 10000.
 */
function ropeTheta(c: Record<string, unknown>, source: string): number {
  const params = c.rope_parameters as Record<string, unknown> | undefined | null;
  const v = c.rope_theta ?? params?.rope_theta ?? 10000;
  if (typeof v !== "number" || !Number.isFinite(v) || v <= 0) {
    throw new CheckpointError(`${source}: rope_theta must be a positive number, got ${JSON.stringify(v)}`);
  }
  return v;
}

function parseRopeScaling(v: unknown, source: string): LlamaConfig["ropeScaling"] {
  if (v === undefined || v === null) return null;
  if (typeof v !== "object" || Array.isArray(v)) {
    throw new CheckpointError(`${source}: rope_scaling must be an object or null, got ${JSON.stringify(v)}`);
  }
  const r = v as Record<string, unknown>;
  const type = r.rope_type ?? r.type;
  if (type === "default") return null;
  if (type !== "llama3") {
    throw new CheckpointError(
      `${source}: unsupported rope_scaling type ${JSON.stringify(type)}: supported: llama3, default, none`,
    );
  }
  const pos = (key: string): number => {
    const x = r[key];
    if (typeof x !== "number" || !Number.isFinite(x) || x <= 0) {
      throw new CheckpointError(
        `${source}: rope_scaling.${key} must be a positive number, got ${JSON.stringify(x)}`,
      );
    }
    return x;
  };
  const scaling: Llama3RopeScaling = {
    type: "llama3",
    factor: pos("factor"),
    lowFreqFactor: pos("low_freq_factor"),
    highFreqFactor: pos("high_freq_factor"),
    originalMaxPositionEmbeddings: pos("original_max_position_embeddings"),
  };
  if (scaling.highFreqFactor <= scaling.lowFreqFactor) {
    // llama3 scaling divides by (high - low): equal factors would make every band a division by zero.
    throw new CheckpointError(
      `${source}: rope_scaling.high_freq_factor (${scaling.highFreqFactor}) must exceed low_freq_factor (${scaling.lowFreqFactor})`,
    );
  }
  return scaling;
}

/** Reads and parses `dir/config.json`; a missing or unparsable file is a CheckpointError. */
export async function readConfig(dir: string): Promise<LlamaConfig> {
  const path = join(dir, "config.json");
  return parseLlamaConfig(await readJsonFile(path), path);
}

/** Reads a JSON file, turning a missing file or bad JSON into CheckpointError naming the path. */
export async function readJsonFile(path: string): Promise<unknown> {
  let text: string;
  try {
    text = await Deno.readTextFile(path);
  } catch (e) {
    if (e instanceof Deno.errors.NotFound) throw new CheckpointError(`${path}: file not found`);
    throw e;
  }
  try {
    return JSON.parse(text);
  } catch (e) {
    throw new CheckpointError(`${path}: invalid JSON (${(e as Error).message})`);
  }
}
