// What generate and logits share: finding the model (a directory, or the built-in demo), opening it,
// and putting its weights on the GPU with a progress bar.
import { getGpu, type QuantType, type WeightType } from "../kernels/mod.ts";
import { Checkpoint } from "../models/checkpoint.ts";
import { ensureDemoModel } from "../models/demo.ts";
import { LlamaModel } from "../models/llama.ts";
import { loadTokenizer, type TextTokenizer } from "../models/tokenizer.ts";
import { progressBar } from "./progress.ts";
import { UsageError } from "./command.ts";

export const WEIGHTS_HELP =
  "  --weights f32|f16|q8|q4  weights on the GPU: f32 (exact, default), f16 (half the memory, faster),\n" +
  "                        q8 / q4 (8 / 4-bit groups of 32, quantised at load; see docs/KERNELS.md)";

export type WeightsFlag = WeightType | QuantType;

export function parseWeights(v: string | undefined): WeightsFlag {
  if (v === undefined || v === "f32" || v === "f16" || v === "q8" || v === "q4") return v ?? "f32";
  throw new UsageError(`--weights expects f32, f16, q8 or q4, got "${v}"`);
}

export interface LoadedModel {
  model: LlamaModel;
  tokenizer: TextTokenizer | null;
  dir: string;
}

/** Opens `dir` (or the demo model when undefined) and loads it onto this process's GPU. */
export async function loadModel(
  dir: string | undefined,
  opts: { weights: WeightsFlag; tokenizer?: boolean },
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
  const ckpt = await Checkpoint.open(dir);
  const gpu = await getGpu();
  if (gpu.isSoftware) console.error(`swactor: GPU: ${gpu.adapterName} (software adapter: correct but slow)`);
  let bar: ReturnType<typeof progressBar> | undefined;
  const model = await LlamaModel.load(gpu, ckpt, {
    weights: opts.weights,
    onProgress: (done, total) => {
      bar ??= progressBar(`loading weights (${opts.weights})`, total);
      bar.update(done);
    },
  });
  bar?.stop();
  const tokenizer = opts.tokenizer === false ? null : await loadTokenizer(dir, ckpt.config);
  return { model, tokenizer, dir };
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
