// A model family: how to read its config.json into the engine's ModelConfig (models/config.ts). What a
// family's layers run follows from that description: the tensor names and shapes (models/tensors.ts), the
// kernels each block runs (models/blocks/), the KV-cache layout and bytes per token (the attention block),
// and the planner's bytes and FLOPs per layer (planner/hf_config.ts). The registry picks the family by
// `model_type`, with `architectures` as a cross-check.
import { join } from "node:path";
import { CheckpointError } from "./errors.ts";
import { configPath, type ModelConfig, readJsonFile } from "./config.ts";
import { FAMILIES } from "./families/mod.ts";

export interface ModelFamily {
  /** Its name in messages and docs, e.g. "qwen3". */
  readonly name: string;
  /** The `model_type` values it reads. */
  readonly modelTypes: readonly string[];
  /** The `architectures` entries it accepts. */
  readonly architectures: readonly string[];
  /** Validates a parsed config.json (CheckpointError naming `source` and the key on bad or unsupported values). */
  parseConfig(json: unknown, source: string): ModelConfig;
}

/** Every `model_type` some family reads. */
export function supportedModelTypes(): string[] {
  return FAMILIES.flatMap((f) => [...f.modelTypes]);
}

/** The family for a parsed config.json; CheckpointError naming the model_type and the supported list. */
export function familyOf(json: unknown, source: string): ModelFamily {
  const type = (json as Record<string, unknown> | null)?.model_type;
  const family = FAMILIES.find((f) => f.modelTypes.includes(type as string));
  if (!family) {
    throw new CheckpointError(
      `unsupported architecture '${String(type)}' (model_type) in ${source}: supported: ${
        supportedModelTypes().join(", ")
      }`,
    );
  }
  return family;
}

/** Parses a config.json object with its family. */
export function parseModelConfig(json: unknown, source: string): ModelConfig {
  if (typeof json !== "object" || json === null || Array.isArray(json)) {
    throw new CheckpointError(`${source}: config is not a JSON object`);
  }
  return familyOf(json, source).parseConfig(json, source);
}

/**
 * Reads and parses `dir/config.json`; a missing or unparsable file is a CheckpointError. Where the folder has
 * a `generation_config.json` naming end-of-sequence tokens, those are the model's (transformers' generate()
 * stops at them, not at config.json's: chat checkpoints list their end-of-turn token there, e.g. the first
 * Llama 3 8B Instruct, whose config.json named only <|end_of_text|> and its generation_config.json <|eot_id|>
 * too).
 */
export async function readModelConfig(dir: string): Promise<ModelConfig> {
  const path = configPath(dir);
  const config = parseModelConfig(await readJsonFile(path), path);
  const eos = await generationEos(dir, config.vocabSize);
  return eos === undefined ? config : { ...config, eosTokenIds: eos };
}

/**
 * `eos_token_id` of `dir/generation_config.json` (a token id or a list of them), or undefined where the file
 * or the key is absent or null (config.json's then stand).
 */
async function generationEos(dir: string, vocab: number): Promise<number[] | undefined> {
  const path = join(dir, "generation_config.json");
  const json = await readJsonFile(path, { optional: true });
  if (json === undefined) return undefined;
  if (typeof json !== "object" || json === null || Array.isArray(json)) {
    throw new CheckpointError(`${path}: not a JSON object`);
  }
  const v = (json as Record<string, unknown>).eos_token_id;
  if (v === undefined || v === null) return undefined;
  const ids = Array.isArray(v) ? v : [v];
  for (const id of ids) {
    if (typeof id !== "number" || !Number.isSafeInteger(id) || id < 0 || id >= vocab) {
      throw new CheckpointError(
        `${path}: eos_token_id must be a token id or a list of them below the vocabulary's ${vocab}, got ${
          JSON.stringify(v)
        }`,
      );
    }
  }
  return ids as number[];
}
