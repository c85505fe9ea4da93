// The model families swactor runs, keyed by config.json's `model_type`. Adding a family: a file here that
// parses its config into ModelConfig (models/config.ts), and one line below (docs/ARCHITECTURE.md).
import type { ModelFamily } from "../family.ts";
import { deepseekV3 } from "./deepseek_v3.ts";
import { llama } from "./llama.ts";
import { mistral } from "./mistral.ts";
import { mixtral } from "./mixtral.ts";
import { qwen2 } from "./qwen2.ts";
import { qwen3 } from "./qwen3.ts";
import { qwen3Moe } from "./qwen3_moe.ts";

export const FAMILIES: readonly ModelFamily[] = [llama, mistral, qwen2, qwen3, mixtral, qwen3Moe, deepseekV3];
