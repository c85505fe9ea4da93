// What generate and logits share on one node: finding the model (a directory, or the built-in demo) and
// putting its opened checkpoint's weights on the GPU with a progress bar.
import { getGpu, isKvType, KV_TYPES, type KvType } from "../kernels/mod.ts";
import { ensureDemoModel } from "../models/demo.ts";
import { type Engine, loadEngine } from "../models/engine.ts";
import type { Checkpoint } from "../models/checkpoint.ts";
import type { WeightsOption } from "../models/model.ts";
import { progressBar } from "./progress.ts";
import { UsageError } from "./command.ts";

export const WEIGHTS_HELP =
  "  --weights auto|f32|f16|q8|q4  weights on the GPU: auto (default: f16 where the GPU has shader-f16,\n" +
  "                        else f32), f32 (exact against transformers), f16 (half the memory, faster),\n" +
  "                        q8 / q4 (8 / 4-bit groups of 32, quantised at load; see docs/KERNELS.md)";

export const KV_HELP =
  "  --kv auto|f32|f16|q8  the KV cache: auto (default: f16 beside f16 / q8 / q4 weights where the GPU has\n" +
  "                        shader-f16, else f32), q8 (int8 rows with a scale each: about half f16's memory,\n" +
  "                        so about twice the context; GQA layers, MLA's keep f16; see docs/KERNELS.md)";

/** What --kv says: a KV cache type, or "auto" (each node's default: models/model.ts kvCacheType). */
export type KvFlag = KvType | "auto";

export function parseKv(v: string | undefined): KvFlag {
  if (v === undefined) return "auto";
  if (v === "auto" || isKvType(v)) return v;
  throw new UsageError(`--kv expects auto, ${KV_TYPES.join(", ")}, got "${v}"`);
}

/** What --weights says: a storage, or "auto" (each GPU's default: f16 with shader-f16, else f32). */
export type WeightsFlag = WeightsOption | "auto";

export function parseWeights(v: string | undefined): WeightsFlag {
  if (v === undefined) return "auto";
  if (v === "auto" || v === "f32" || v === "f16" || v === "q8" || v === "q4") return v;
  throw new UsageError(`--weights expects auto, f32, f16, q8 or q4, got "${v}"`);
}

/** `dir`, or the built-in demo model's (made once, with a progress bar) when undefined, saying which. */
export async function modelDirOrDemo(dir: string | undefined): Promise<string> {
  if (dir !== undefined) return dir;
  console.error(
    "swactor: no --model given: using the built-in demo model (Llama architecture, Llama 3 vocabulary, RANDOM weights: its text is gibberish)",
  );
  let bar: ReturnType<typeof progressBar> | undefined;
  const demo = await ensureDemoModel({
    onProgress: (done, total) => {
      bar ??= progressBar("generating demo weights (once)", total);
      bar.update(done);
    },
  });
  bar?.stop();
  return demo;
}

/**
 * What `generate` and `logits` say about a software adapter. Without Mesa's Vulkan driver (lavapipe) Deno's
 * WebGPU falls back to llvmpipe through OpenGL, which compiled the demo model's kernels for 55 s on a first
 * run (Mesa's shader cache empty) against 1.9 s, and decoded it at 5 tok/s (f32: no shader-f16) against
 * 20 (2026-12-07, 2 cores): worth one line telling how to get the Vulkan one.
 */
export function softwareAdapterNote(adapterName: string, vulkan: boolean): string {
  const line = `swactor: GPU: ${adapterName} (software adapter: correct but slow)`;
  return vulkan ? line : `${line}
swactor: this is llvmpipe through OpenGL (no Vulkan software driver found): a first run compiles kernels for about
  a minute and decoding is ~4x slower than on Vulkan's; install it with \`apt-get install mesa-vulkan-drivers\``;
}

/**
 * Whether Linux's Vulkan loader can find Mesa's software driver (lavapipe): its manifest in a standard ICD
 * folder, or a driver list the user set (VK_ICD_FILENAMES / VK_DRIVER_FILES: theirs to know). True elsewhere
 * (other systems have no such fallback to warn about).
 */
export function hasVulkanSoftwareDriver(): boolean {
  if (Deno.build.os !== "linux") return true;
  if (Deno.env.get("VK_ICD_FILENAMES") || Deno.env.get("VK_DRIVER_FILES")) return true;
  for (const dir of ["/usr/share/vulkan/icd.d", "/usr/local/share/vulkan/icd.d", "/etc/vulkan/icd.d"]) {
    try {
      for (const e of Deno.readDirSync(dir)) if (e.name.startsWith("lvp_icd")) return true;
    } catch {
      // no such folder
    }
  }
  return false;
}

/** What a load took: the checkpoint's bytes read and the wall time from the GPU open to the model ready. */
export interface LoadStats {
  bytes: number;
  ms: number;
}

/** "2.47 GB of weights read in 1.86 s (1.33 GB/s)" (MB below a GB). */
export function loadLine(s: LoadStats): string {
  const amount = s.bytes >= 1e9 ? `${(s.bytes / 1e9).toFixed(2)} GB` : `${(s.bytes / 1e6).toFixed(1)} MB`;
  const rate = s.ms > 0 ? ` (${(s.bytes / 1e6 / s.ms).toFixed(2)} GB/s)` : "";
  return `${amount} of weights read in ${(s.ms / 1e3).toFixed(2)} s${rate}`;
}

/**
 * Loads an opened checkpoint onto this process's GPU, with a progress bar and a line saying how long it took
 * (open it, and check the request against it, first: cli/pipeline_generate.ts prepareRequest).
 */
export async function loadModel(
  checkpoint: Checkpoint,
  weights: WeightsFlag,
  kv: KvFlag = "auto",
): Promise<{ engine: Engine; load: LoadStats }> {
  const gpu = await getGpu();
  const started = performance.now();
  if (gpu.isSoftware) console.error(softwareAdapterNote(gpu.adapterName, hasVulkanSoftwareDriver()));
  if (weights === "auto" && checkpoint.config.weightQuant) {
    const as = gpu.hasF16 ? "f16, twice" : "f32, four times";
    console.error(`swactor: fp8 weights: stored as ${as} their size (--weights q8 keeps about their size)`);
  }
  let bar: ReturnType<typeof progressBar> | undefined;
  let bytes = 0;
  const engine = await loadEngine(checkpoint, {
    gpu,
    weights: weights === "auto" ? undefined : weights,
    kv: kv === "auto" ? undefined : kv,
    onProgress: (done, total) => {
      bar ??= progressBar(`loading weights (${weights})`, total);
      bar.update(done);
      bytes = done;
    },
  });
  bar?.stop();
  const load = { bytes, ms: performance.now() - started };
  console.error(`swactor: ${loadLine(load)}`);
  return { engine, load };
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
