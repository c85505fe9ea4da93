// What generate and logits share: finding the model (a directory, or the built-in demo), opening it,
// and putting its weights on the GPU with a progress bar.
import { getGpu } from "../kernels/mod.ts";
import { ensureDemoModel } from "../models/demo.ts";
import { type Engine, loadEngine } from "../models/engine.ts";
import { Checkpoint } from "../models/checkpoint.ts";
import type { WeightsOption } from "../models/model.ts";
import { loadTokenizer, type TextTokenizer } from "../models/tokenizer.ts";
import { progressBar } from "./progress.ts";
import { UsageError } from "./command.ts";

export const WEIGHTS_HELP =
  "  --weights auto|f32|f16|q8|q4  weights on the GPU: auto (default: f16 where the GPU has shader-f16,\n" +
  "                        else f32), f32 (exact against transformers), f16 (half the memory, faster),\n" +
  "                        q8 / q4 (8 / 4-bit groups of 32, quantised at load; see docs/KERNELS.md)";

/** What --weights says: a storage, or "auto" (each GPU's default: f16 with shader-f16, else f32). */
export type WeightsFlag = WeightsOption | "auto";

export function parseWeights(v: string | undefined): WeightsFlag {
  if (v === undefined) return "auto";
  if (v === "auto" || v === "f32" || v === "f16" || v === "q8" || v === "q4") return v;
  throw new UsageError(`--weights expects auto, f32, f16, q8 or q4, got "${v}"`);
}

export interface LoadedModel {
  engine: Engine;
  tokenizer: TextTokenizer | null;
  dir: string;
}

/** Opens `dir` (or the demo model when undefined) and loads it onto this process's GPU. */
export async function loadModel(
  dir: string | undefined,
  /**
   * tokenizer: false to skip it; "required" (a text prompt) fails before any weight loads when the model has
   * none.
   */
  opts: { weights: WeightsFlag; tokenizer?: boolean | "required" },
): Promise<LoadedModel> {
  if (dir === undefined) {
    console.error(
      "swactor: no --model given: using the built-in demo model (Llama architecture, Llama 3 vocabulary, RANDOM weights: its text is gibberish)",
    );
    let bar: ReturnType<typeof progressBar> | undefined;
    dir = await ensureDemoModel({
      onProgress: (done, total) => {
        bar ??= progressBar("generating demo weights (once)", total);
        bar.update(done);
      },
    });
    bar?.stop();
  }
  // A missing directory, a config that does not read, a broken shard or a missing tokenizer fails here,
  // before the GPU opens.
  const checkpoint = await Checkpoint.open(dir);
  const tokenizer = opts.tokenizer === false ? null : await loadTokenizer(dir, checkpoint.config);
  if (!tokenizer && opts.tokenizer === "required") {
    throw new UsageError(`the model at ${dir} has no tokenizer: give the prompt with --tokens`);
  }
  const gpu = await getGpu();
  if (gpu.isSoftware) console.error(`swactor: GPU: ${gpu.adapterName} (software adapter: correct but slow)`);
  if (opts.weights === "auto" && checkpoint.config.weightQuant) {
    const as = gpu.hasF16 ? "f16, twice" : "f32, four times";
    console.error(`swactor: fp8 weights: stored as ${as} their size (--weights q8 keeps about their size)`);
  }
  let bar: ReturnType<typeof progressBar> | undefined;
  const engine = await loadEngine(checkpoint, {
    gpu,
    weights: opts.weights === "auto" ? undefined : opts.weights,
    onProgress: (done, total) => {
      bar ??= progressBar(`loading weights (${opts.weights})`, total);
      bar.update(done);
    },
  });
  bar?.stop();
  return { engine, tokenizer, dir };
}

/** Parses "1,2,3" into token ids; UsageError naming the bad entry otherwise. */
export function parseTokenList(s: string): number[] {
  const parts = s.split(",").map((p) => p.trim()).filter((p) => p !== "");
  if (parts.length === 0) throw new UsageError(`--tokens expects comma-separated token ids, got "${s}"`);
  return parts.map((p) => {
    const n = Number(p);
    if (!/^\d+$/.test(p) || !Number.isSafeInteger(n)) {
      throw new UsageError(`--tokens: "${p}" is not a token id`);
    }
    return n;
  });
}
