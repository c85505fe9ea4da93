// A model family: how to read its config.json into the engine's ModelConfig (models/config.ts). What a
// family's layers run follows from that description: the tensor names and shapes (models/tensors.ts), the
// kernels each block runs (models/blocks/), the KV-cache layout and bytes per token (the attention block),
// and the planner's bytes and FLOPs per layer (planner/hf_config.ts). The registry picks the family by
// `model_type`, with `architectures` as a cross-check.
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

/** Reads and parses `dir/config.json`; a missing or unparsable file is a CheckpointError. */
export async function readModelConfig(dir: string): Promise<ModelConfig> {
  const path = configPath(dir);
  return parseModelConfig(await readJsonFile(path), path);
}
