// The model families swactor runs, keyed by config.json's `model_type`. Adding a family: a file here that
// parses its config into ModelConfig (models/config.ts), and one line below (docs/ARCHITECTURE.md).
import type { ModelFamily } from "../family.ts";
import { llama } from "./llama.ts";
import { qwen2 } from "./qwen2.ts";
import { qwen3 } from "./qwen3.ts";

export const FAMILIES: readonly ModelFamily[] = [llama, qwen2, qwen3];
