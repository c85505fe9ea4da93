// The Llama family behind the node's StageBackend interface (node/stage/backend.ts): one LlamaModel holds
// the stage's weights (only its tensors are read), one LlamaSequence per request holds that request's KV
// cache. A step is one submit and one readback of its result (hidden state, the sampled token, or logits).
import {
  encodeCalls,
  getGpu,
  type Gpu,
  type QuantType,
  readBack,
  type WeightType,
  writeBytes,
  writeStep,
} from "../kernels/mod.ts";
import type {
  ModelFacts,
  Sampling,
  StageBackend,
  StageInput,
  StageLoader,
  StageResult,
  StageRole,
  StageStats,
} from "../node/stage/backend.ts";
import { Checkpoint } from "./checkpoint.ts";
import { LlamaModel, type LlamaSequence } from "./llama.ts";

export class LlamaStage implements StageBackend {
  readonly model: ModelFacts;
  #seqs = new Map<string, LlamaSequence>();

  constructor(readonly role: StageRole, readonly llama: LlamaModel) {
    const c = llama.config;
    this.model = {
      hidden: c.hiddenSize,
      vocab: c.vocabSize,
      maxPositions: c.maxPositionEmbeddings,
      eosTokenIds: c.eosTokenIds,
    };
  }

  open(id: string, opts: { maxSeq: number; sampling: Sampling }): { chunk: number } {
    if (this.#seqs.has(id)) throw new TypeError(`request ${id} is already open on this stage`);
    const seq = this.llama.newSequence(opts);
    this.#seqs.set(id, seq);
    return { chunk: seq.maxChunk };
  }

  async run(id: string, input: StageInput): Promise<StageResult> {
    const seq = this.#seqs.get(id);
    if (!seq) throw new Error(`request ${id} is not open on stage ${this.role.index}`);
    const gpu = this.llama.gpu;
    const { pos0, T, output } = input;
    const H = this.model.hidden;
    if (pos0 + T > seq.maxSeq) {
      throw new RangeError(`positions up to ${pos0 + T} exceed the request's ${seq.maxSeq}`);
    }
    if (this.role.embeds) {
      if (!input.tokens || input.tokens.length !== T) {
        throw new TypeError(`stage ${this.role.index} needs ${T} token ids`);
      }
      for (const t of input.tokens) {
        if (t >= this.model.vocab) {
          throw new RangeError(`token id ${t} is outside the vocabulary [0, ${this.model.vocab})`);
        }
      }
      writeBytes(gpu, seq.tokens, pos0 * 4, input.tokens);
    } else {
      if (!input.hidden || input.hidden.length !== T * H) {
        throw new TypeError(`stage ${this.role.index} needs a hidden state of ${T} x ${H}`);
      }
      writeBytes(gpu, seq.x, 0, input.hidden);
    }
    writeStep(gpu, seq.step, { pos0, T, tokOut: pos0 + T });
    submit(gpu, seq.program(T, output));
    if (output === "hidden") return { hidden: new Float32Array(await readBack(gpu, seq.x, T * H * 4)) };
    if (output === "sample") {
      return { token: new Uint32Array(await readBack(gpu, seq.tokens, 4, (pos0 + T) * 4))[0] };
    }
    return { logits: new Float32Array(await readBack(gpu, seq.logits!, T * this.model.vocab * 4)) };
  }

  release(id: string): boolean {
    const seq = this.#seqs.get(id);
    if (!seq) return false;
    this.#seqs.delete(id);
    seq.destroy();
    return true;
  }

  stats(): StageStats {
    let kvBytes = 0;
    for (const s of this.#seqs.values()) kvBytes += s.kvBytes;
    return { active: this.#seqs.size, kvBytes, weightBytes: this.llama.weightBytes };
  }

  close(): void {
    for (const id of [...this.#seqs.keys()]) this.release(id);
    this.llama.destroy();
  }
}

function submit(gpu: Gpu, calls: Parameters<typeof encodeCalls>[1]): void {
  const enc = gpu.device.createCommandEncoder();
  const pass = enc.beginComputePass();
  encodeCalls(pass, calls);
  pass.end();
  gpu.device.queue.submit([enc.finish()]);
}

/** The StageLoader for Llama checkpoints: reads only the role's tensors onto this process's GPU. */
export const loadLlamaStage: StageLoader = async (role, opts) => {
  const ckpt = await Checkpoint.open(opts.model.dir);
  const weights = opts.model.weights as WeightType | QuantType;
  if (!["f32", "f16", "q8", "q4"].includes(weights)) {
    throw new TypeError(`weights must be f32, f16, q8 or q4, got "${weights}"`);
  }
  const llama = await LlamaModel.load(await getGpu(), ckpt, {
    weights,
    layers: role.layers,
    embed: role.embeds,
    head: role.head,
    onProgress: opts.onProgress,
  });
  return new LlamaStage(role, llama);
};
