// The built-in demo model: Llama 3.2's architecture in miniature with the real Llama 3 vocabulary and
// deterministic random weights, so `swactor generate "..."` works on a fresh machine with no download.
// Its output is random-weight gibberish, which the CLI says on stderr. Generated on first use (~34 MB,
// about a second) into the user's cache directory, then reused; it ships no tokenizer.json because
// the built-in Llama 3 tokenizer (llama3-tokenizer-js) serves its vocabulary.
import { join } from "node:path";
import type { ModelConfig } from "./config.ts";
import { parseModelConfig } from "./family.ts";
import { f32ToBf16 } from "./dtype.ts";
import { isNormTensor, tensorShapes } from "./tensors.ts";
import { numel, type TensorData, writeSafetensors } from "./safetensors.ts";

/** Bump when the config or the weight generator changes: it names the cache folder. */
export const DEMO_VERSION = "demo-v1";

/** The demo model's config.json, hub style. */
export const DEMO_CONFIG_JSON = {
  architectures: ["LlamaForCausalLM"],
  model_type: "llama",
  vocab_size: 128256,
  hidden_size: 128,
  intermediate_size: 384,
  num_hidden_layers: 4,
  num_attention_heads: 4,
  num_key_value_heads: 2,
  head_dim: 32,
  hidden_act: "silu",
  max_position_embeddings: 131072,
  rms_norm_eps: 1e-5,
  rope_theta: 500000.0,
  rope_scaling: {
    rope_type: "llama3",
    factor: 32.0,
    low_freq_factor: 1.0,
    high_freq_factor: 4.0,
    original_max_position_embeddings: 8192,
  },
  tie_word_embeddings: true,
  attention_bias: false,
  mlp_bias: false,
  bos_token_id: 128000,
  eos_token_id: [128001, 128008, 128009],
  torch_dtype: "bfloat16",
  initializer_range: 0.02,
} as const;

/** The demo model's config, parsed. */
export const DEMO_CONFIG: ModelConfig = parseModelConfig(DEMO_CONFIG_JSON, "built-in demo config");

const SEED = 0x5eed_0001;
const STD = 0.02;

/** mulberry32: a tiny 32-bit PRNG, integer arithmetic only, so the weights are the same everywhere. */
function mulberry32(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = Math.imul(a ^ (a >>> 15), a | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return (t ^ (t >>> 14)) >>> 0;
  };
}

/** FNV-1a of a tensor name: each tensor gets its own stream, independent of the order of generation. */
function hashName(name: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < name.length; i++) h = Math.imul(h ^ name.charCodeAt(i), 0x01000193);
  return h >>> 0;
}

/**
 * `n` values, approximately normal with standard deviation `std`: the sum of four uniforms, centred
 * and scaled (Irwin-Hall). Unlike Box-Muller it needs no libm, whose last bits may differ by platform.
 */
function normals(n: number, std: number, seed: number): Float32Array {
  const next = mulberry32(seed);
  const out = new Float32Array(n);
  const scale = (std * Math.sqrt(3)) / 2 ** 32; // the sum of 4 U(0,1) has variance 4/12
  for (let i = 0; i < n; i++) out[i] = (next() + next() + next() + next() - 2 * 2 ** 32) * scale;
  return out;
}

/** One demo tensor (bf16): norms are ones, everything else random from a stream seeded by its name. */
export function demoTensor(name: string, shape: number[]): TensorData {
  const n = numel(shape);
  const values = isNormTensor(name) ? new Float32Array(n).fill(1) : normals(n, STD, SEED ^ hashName(name));
  return { name, dtype: "BF16", shape, data: new Uint8Array(f32ToBf16(values).buffer) };
}

/** `$XDG_CACHE_HOME/swactor`, else `~/.cache/swactor`. */
export function defaultCacheDir(): string {
  const xdg = Deno.env.get("XDG_CACHE_HOME");
  if (xdg) return join(xdg, "swactor");
  const home = Deno.env.get("HOME") ?? Deno.env.get("USERPROFILE");
  if (!home) throw new Error("cannot find a cache directory: neither XDG_CACHE_HOME nor HOME is set");
  return join(home, ".cache", "swactor");
}

async function isComplete(dir: string): Promise<boolean> {
  try {
    await Deno.stat(join(dir, "config.json"));
    await Deno.stat(join(dir, "model.safetensors"));
    return true;
  } catch (e) {
    if (e instanceof Deno.errors.NotFound) return false;
    throw e;
  }
}

export interface DemoOptions {
  /** Folder that holds `demo-v1/`. Default: `defaultCacheDir()` (`$XDG_CACHE_HOME/swactor` or `~/.cache/swactor`). */
  cacheDir?: string;
  /** Called while generating (not when the cache is reused): steps done of `total` (a tensor each, then the write). */
  onProgress?: (done: number, total: number) => void;
}

/**
 * The demo model's directory (config.json + model.safetensors), generated on first use. Generation
 * writes into a temporary folder beside the final one and renames it into place, so a crash or a
 * concurrent run never leaves a half-written model where the next run would find it.
 */
export async function ensureDemoModel(opts: DemoOptions = {}): Promise<string> {
  const root = opts.cacheDir ?? defaultCacheDir();
  const dir = join(root, DEMO_VERSION);
  if (await isComplete(dir)) return dir;
  await Deno.mkdir(root, { recursive: true });
  const tmp = join(root, `${DEMO_VERSION}.tmp-${Deno.pid}-${crypto.randomUUID().slice(0, 8)}`);
  await Deno.mkdir(tmp);
  try {
    await Deno.writeTextFile(join(tmp, "config.json"), JSON.stringify(DEMO_CONFIG_JSON, null, 2) + "\n");
    const shapes = [...tensorShapes(DEMO_CONFIG)];
    const total = shapes.length + 1; // + 1 for writing the file
    const tensors: TensorData[] = [];
    for (const [name, shape] of shapes) {
      opts.onProgress?.(tensors.length, total);
      tensors.push(demoTensor(name, shape));
    }
    opts.onProgress?.(shapes.length, total);
    await writeSafetensors(join(tmp, "model.safetensors"), tensors, {
      format: "pt",
      swactor: `${DEMO_VERSION}: random weights (seeded), not a trained model`,
    });
    opts.onProgress?.(total, total);
    // A leftover incomplete folder (from before atomic writes, or edited by hand) is replaced.
    if (!(await isComplete(dir))) await Deno.remove(dir, { recursive: true }).catch(() => {});
    try {
      await Deno.rename(tmp, dir);
    } catch (e) {
      // Another process finished first: its model is identical, use it.
      if (!(await isComplete(dir))) throw e;
    }
  } finally {
    await Deno.remove(tmp, { recursive: true }).catch(() => {});
  }
  return dir;
}
