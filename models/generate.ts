// Running a model: prefill then incremental decode with the KV cache, and teacher-forced logits.
// The decode loop never waits for the GPU per token: the sampler writes each token where the next
// step's embedding reads it, and tokens come back in batches (1, 2, 4, ... up to maxBatch).
//
// How the loop keeps the GPU busy, given how Deno's WebGPU maps buffers (ext/webgpu/buffer.rs, FACTS.md):
// `mapAsync` polls the device with a *blocking* wait for all submitted work, then sleeps 10 ms before it
// resolves. So calling it blocks this thread until the GPU is idle. The loop therefore always holds the
// next batch already encoded (command buffer finished, not submitted): right after a map call returns it
// submits that batch, so the GPU idles only for the submit, and encodes the one after while the GPU
// runs. Encoding (CPU) and compute (GPU) then overlap instead of adding up. The tokens themselves are read
// as soon as the map call returns (kernels/readback.ts), or, where that is off, several maps stay in flight
// so their 10 ms sleeps overlap compute. Steps computed past an eos are discarded: output is exact.
import {
  advanceCall,
  encodeCalls,
  type Gpu,
  type KernelCall,
  readBack,
  readStaging,
  reserveStaging,
  type SamplingOptions,
  takeStaging,
  writeBytes,
  writeStep,
} from "../kernels/mod.ts";
import type { LlamaModel, LlamaSequence } from "./llama.ts";

/**
 * Readbacks in flight at once. With early reads (kernels/readback.ts) each is done as its map call returns;
 * without, it resolves >= 10 ms after the GPU finished its batch, and with three the oldest has usually
 * resolved by the time the loop needs it. Tokens computed past an eos are at most the batches in flight,
 * and they are discarded.
 */
const MAX_IN_FLIGHT = 3;

export interface GenerateOptions {
  /** Most tokens to generate (>= 1). */
  maxTokens: number;
  sampling: SamplingOptions;
  /** Generation stops after any of these ids (included in the output, as transformers does). */
  eosTokenIds?: number[];
  /** Aborting stops the loop at the next batch boundary and frees the request's GPU memory. */
  signal?: AbortSignal;
  /** Most tokens decoded per readback. Default 16. */
  maxBatch?: number;
  /** Called with each batch of new token ids as soon as it is read back (streaming). */
  onTokens?: (ids: number[]) => void;
}

export interface GenerateResult {
  /** Generated ids only. */
  tokens: number[];
  promptTokens: number;
  stopReason: "eos" | "max_tokens" | "aborted";
  /** Milliseconds from start to the first generated token (prefill + one readback). */
  firstTokenMs: number;
  /** Decode rate after the first token, tokens per second (0 when only one token). */
  tokS: number;
  /** KV cache bytes this request held (freed at the end). */
  kvBytes: number;
}

/** Checks ids against the vocabulary: a RangeError names the first bad one. */
export function checkTokenIds(ids: readonly number[], vocab: number): void {
  if (ids.length === 0) throw new RangeError("the prompt has no tokens");
  ids.forEach((id, i) => {
    if (!Number.isInteger(id) || id < 0 || id >= vocab) {
      throw new RangeError(`token id ${id} at index ${i} is outside the vocabulary [0, ${vocab})`);
    }
  });
}

function submit(gpu: Gpu, calls: readonly KernelCall[], extra?: (enc: GPUCommandEncoder) => void): void {
  const enc = gpu.device.createCommandEncoder();
  const pass = enc.beginComputePass();
  encodeCalls(pass, calls);
  pass.end();
  extra?.(enc);
  gpu.device.queue.submit([enc.finish()]);
}

/** Runs the prompt through the model in chunks; the last chunk ends as `last` says. */
function prefill(seq: LlamaSequence, prompt: readonly number[], last: "sample" | "logits" | "hidden"): void {
  const gpu = seq.model.gpu;
  writeBytes(gpu, seq.tokens, 0, Uint32Array.from(prompt));
  for (let pos0 = 0; pos0 < prompt.length; pos0 += seq.maxChunk) {
    const T = Math.min(seq.maxChunk, prompt.length - pos0);
    const isLast = pos0 + T >= prompt.length;
    writeStep(gpu, seq.step, { pos0, T, tokOut: prompt.length });
    submit(gpu, seq.program(T, isLast ? last : "hidden"));
  }
}

/** Generates up to maxTokens after `prompt` on a model that embeds and samples (a whole model). */
export async function generate(
  model: LlamaModel,
  prompt: readonly number[],
  opts: GenerateOptions,
): Promise<GenerateResult> {
  const { gpu, config } = model;
  checkTokenIds(prompt, config.vocabSize);
  if (!(Number.isInteger(opts.maxTokens) && opts.maxTokens >= 1)) {
    throw new RangeError(`max tokens must be an integer >= 1, got ${opts.maxTokens}`);
  }
  if (!model.hasEmbed || !model.hasHead) throw new Error("generate needs a model with embedding and head");
  const maxSeq = prompt.length + opts.maxTokens;
  if (maxSeq > config.maxPositionEmbeddings) {
    throw new RangeError(
      `prompt (${prompt.length}) + max tokens (${opts.maxTokens}) exceeds the model's ${config.maxPositionEmbeddings} positions`,
    );
  }
  const eos = new Set(opts.eosTokenIds ?? []);
  const maxBatch = opts.maxBatch ?? 16;
  const P = prompt.length;
  const t0 = performance.now();
  const seq = model.newSequence({ maxSeq, sampling: opts.sampling });
  const pending: Promise<number[]>[] = [];
  // A batch encoded ahead and not yet submitted (its staging buffer is freed if it never is).
  let next: Batch | undefined;
  try {
    // Primed staging buffers for the batches in flight: a buffer returns to the pool ~10 ms after its read,
    // and the first small batches come faster than that (free after the first request: kernels/readback.ts).
    const reserved = reserveStaging(gpu, maxBatch * 4, 8);
    prefill(seq, prompt, "sample");
    await reserved;
    // One decode step, then the GPU moves the step record on: k tokens are k copies in one submit.
    const decode = [...seq.program(1, "sample"), advanceCall(gpu, seq.step)];
    const encodeBatch = (from: number, steps: number): Batch => {
      const enc = gpu.device.createCommandEncoder();
      if (steps > 0) {
        const pass = enc.beginComputePass();
        for (let i = 0; i < steps; i++) encodeCalls(pass, decode);
        pass.end();
      }
      // Tokens [from, from + n): a batch's own steps write positions from+1 .. from+steps, and the first
      // batch (no steps) reads the token the prefill sampled.
      const n = Math.max(steps, 1);
      const first = steps > 0 ? from + 1 : from;
      const staging = takeStaging(gpu, n * 4);
      enc.copyBufferToBuffer(seq.tokens, (P + first) * 4, staging, 0, n * 4);
      return { cmd: enc.finish(), staging, tokens: n };
    };
    // Batch sizes: the prefill's token alone (first token as soon as possible), then 1, 2, 4 ... maxBatch.
    let planned = 1;
    let size = 1;
    const plan = (): Batch | undefined => {
      if (planned >= opts.maxTokens) return undefined;
      const k = Math.min(size, opts.maxTokens - planned);
      const b = encodeBatch(planned - 1, k);
      planned += k;
      size = Math.min(size * 2, maxBatch);
      return b;
    };
    let current: Batch | undefined = encodeBatch(0, 0);
    writeStep(gpu, seq.step, { pos0: P, T: 1, tokOut: P + 1 });
    gpu.device.queue.submit([current.cmd]);
    next = plan();
    const out: number[] = [];
    let stopReason: GenerateResult["stopReason"] = "max_tokens";
    let firstAt = 0, lastAt = 0;
    while (current || pending.length > 0) {
      if (current) {
        // Blocks (in Deno) until the GPU has run `current`; the next batch goes in at once.
        pending.push(readBatch(gpu, current));
        current = undefined;
        if (next && !opts.signal?.aborted) {
          gpu.device.queue.submit([next.cmd]);
          current = next;
          next = plan();
        }
        if (current && pending.length < MAX_IN_FLIGHT) continue;
      }
      const ids = await pending.shift()!;
      const now = performance.now();
      if (out.length === 0) firstAt = now;
      lastAt = now;
      let fresh = ids;
      const stop = ids.findIndex((id) => eos.has(id));
      if (stop >= 0) fresh = ids.slice(0, stop + 1);
      out.push(...fresh);
      opts.onTokens?.(fresh);
      if (stop >= 0) {
        stopReason = "eos";
        break;
      }
      if (opts.signal?.aborted) {
        stopReason = "aborted";
        break;
      }
    }
    const decodeMs = lastAt - firstAt;
    return {
      tokens: out,
      promptTokens: P,
      stopReason,
      firstTokenMs: firstAt - t0,
      tokS: out.length > 1 && decodeMs > 0 ? ((out.length - 1) / decodeMs) * 1000 : 0,
      kvBytes: seq.kvBytes,
    };
  } finally {
    next?.staging.destroy();
    await Promise.allSettled(pending);
    seq.destroy();
  }
}

/** A batch of decode steps encoded ahead: its command buffer and where its tokens are copied for reading. */
interface Batch {
  cmd: GPUCommandBuffer;
  staging: GPUBuffer;
  tokens: number;
}

/** Maps a submitted batch's tokens to the CPU; its staging buffer goes back to the pool. */
async function readBatch(gpu: Gpu, b: Batch): Promise<number[]> {
  return Array.from(new Uint32Array(await readStaging(gpu, b.staging, b.tokens * 4)));
}

/** Teacher-forced logits [T, V] for `tokens` (row t: next-token logits after tokens[0..t]). */
export async function teacherForcedLogits(
  model: LlamaModel,
  tokens: readonly number[],
): Promise<Float32Array> {
  const { gpu, config } = model;
  checkTokenIds(tokens, config.vocabSize);
  if (!model.hasEmbed || !model.hasHead) throw new Error("logits needs a model with embedding and head");
  if (tokens.length > config.maxPositionEmbeddings) {
    throw new RangeError(
      `${tokens.length} tokens exceed the model's ${config.maxPositionEmbeddings} positions`,
    );
  }
  const V = config.vocabSize;
  const seq = model.newSequence({ maxSeq: tokens.length, sampling: { temperature: 0, topP: 1, seed: 0 } });
  try {
    const out = new Float32Array(tokens.length * V);
    writeBytes(gpu, seq.tokens, 0, Uint32Array.from(tokens));
    for (let pos0 = 0; pos0 < tokens.length; pos0 += seq.maxChunk) {
      const T = Math.min(seq.maxChunk, tokens.length - pos0);
      writeStep(gpu, seq.step, { pos0, T, tokOut: tokens.length });
      submit(gpu, seq.program(T, "logits"));
      out.set(new Float32Array(await readBack(gpu, seq.logits!, T * V * 4)), pos0 * V);
    }
    return out;
  } finally {
    seq.destroy();
  }
}
