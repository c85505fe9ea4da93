// A model's weights made from its config.json alone, on the GPU: deterministic random bf16 values for
// benchmarks at sizes no disk holds (a Qwen3-30B-A3B-shaped checkpoint is 61 GB). kernels/convert.ts
// generates each upload in place of reading it, then stores it as asked (f16, q8, q4), so the loader runs
// its ordinary path. Values: projections uniform with transformers' init std (0.02, its
// `initializer_range`), norms 1, biases 0, so activations stay in range at any depth (rmsnorm before
// every block). A tensor read on the CPU (readF32) gets the same values (randomBf16).
import type { ModelConfig } from "./config.ts";
import { bf16ToF32 } from "./dtype.ts";
import { parseModelConfig } from "./family.ts";
import { isNormTensor, tensorShapes } from "./tensors.ts";
import type { DType } from "./safetensors.ts";
import { CheckpointError } from "./errors.ts";
import { randomBf16, type RandomFill } from "../kernels/mod.ts";
import type { WeightSource } from "./upload.ts";

/** transformers' default init std for these families (config `initializer_range`). */
const INIT_STD = 0.02;

/** FNV-1a of a tensor name: its random stream. */
function streamOf(name: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < name.length; i++) h = Math.imul(h ^ name.charCodeAt(i), 0x01000193) >>> 0;
  return h;
}

export class RandomWeights implements WeightSource {
  readonly config: ModelConfig;
  readonly #shapes: Map<string, number[]>;
  readonly #at = new Map<string, number>();

  /** `configJson` as config.json holds it; `seed` picks the weights. */
  constructor(configJson: Record<string, unknown>, readonly seed = 1, readonly dir = "(random weights)") {
    this.config = parseModelConfig(configJson, dir);
    this.#shapes = tensorShapes(this.config);
    let at = 0;
    for (const [name, shape] of this.#shapes) {
      this.#at.set(name, at);
      at += shape.reduce((a, b) => a * b, 1) * 2;
    }
  }

  layersStored(): number {
    return this.config.numLayers;
  }

  info(name: string): { dtype: DType; shape: number[]; begin: number; end: number } {
    const shape = this.#shapes.get(name);
    if (!shape) throw new CheckpointError(`${this.dir}: the config has no tensor ${name}`);
    const begin = this.#at.get(name)!;
    return { dtype: "BF16", shape, begin, end: begin + shape.reduce((a, b) => a * b, 1) * 2 };
  }

  /** The fill of an upload whose first tensor is `name` (one stream for the concatenation). */
  random(name: string): RandomFill {
    if (isNormTensor(name)) return { seed: this.seed, stream: 0, scale: 0, offset: 1 };
    if (name.endsWith("bias")) return { seed: this.seed, stream: 0, scale: 0, offset: 0 };
    return { seed: this.seed, stream: streamOf(name), scale: INIT_STD * Math.sqrt(3) };
  }

  read(name: string): Promise<{ dtype: DType; shape: number[]; bytes: Uint8Array }> {
    const { shape } = this.info(name);
    const bits = randomBf16(shape.reduce((a, b) => a * b, 1), this.random(name));
    return Promise.resolve({ dtype: "BF16", shape, bytes: new Uint8Array(bits.buffer) });
  }

  async readF32(name: string): Promise<Float32Array> {
    const { bytes } = await this.read(name);
    return bf16ToF32(new Uint16Array(bytes.buffer));
  }
}
