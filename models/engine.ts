// The decode engine: the one way any model part runs on a GPU, for a single node and for every stage of
// a chain. It holds one Model (a whole network or a layer range) and one Sequence (KV cache) per request.
// A step is one submit and one readback of its result (hidden state, sampled token, or logits); a part
// that embeds and has the head also runs the GPU-resident decode loop (`generate`).
//
// How the loop keeps the GPU busy, given how Deno's WebGPU maps buffers (ext/webgpu/buffer.rs, FACTS.md):
// `mapAsync` polls the device with a *blocking* wait for all submitted work, then sleeps 10 ms before it
// resolves. So calling it blocks this thread until the GPU is idle. The loop therefore always holds the
// next batch already encoded (command buffer finished, not submitted): right after a map call returns it
// submits that batch, so the GPU idles only for the submit, and encodes the one after while the GPU
// runs. Encoding (CPU) and compute (GPU) then overlap instead of adding up. The tokens themselves are read
// as soon as the map call returns (kernels/readback.ts), or, where that is off, several maps stay in flight
// so their 10 ms sleeps overlap compute. Steps computed past an eos are discarded: output is exact.
// Those reads settle as microtasks, so after each batch of tokens it delivers the loop gives the event loop a
// turn (a server streams them and steps its other requests; the next batch runs on the GPU meanwhile).
// Tokens come back in batches (1, 2, 4, ... up to maxBatch): the sampler writes each token where the next
// step's embedding reads it, so the loop never waits for the GPU per token.
//
// Multi-token steps (speculative verification): `verify(id, pos0, tokens)` runs k = tokens.length tokens
// at positions pos0 .. pos0 + k - 1 in one step (the k rows share each weight read: kernels/gemv_multi.ts;
// attention is causal among them) and returns, for every position i, the greedy next token (the argmax of
// its logits row) or the logits [k, vocab]. `truncate(id, n)` drops positions n.. of the request: the next
// step starts at n and overwrites them. `length(id)` is the positions the request holds (run, verify and
// generate advance it). A rejected draft is thus: verify, accept a prefix, truncate to it, continue.
// A long prompt is best prefilled with `run` ("hidden" chunks, the last one "sample"): verify computes the
// head for every row it is given.
//
// Prefill runs in chunks of at most `maxChunk` tokens, one submit each; between chunks the engine waits
// for the GPU and yields to the event loop, so a long prompt never holds the process (its membership,
// its control API, Ctrl-C) for longer than one chunk's GPU time. The next chunk is encoded while one runs
// and submitted as soon as the wait returns, so the waits cost the GPU no idle time.
import { setImmediate } from "node:timers";
import type {
  ExpertLoader,
  LoopOptions,
  LoopResult,
  ModelFacts,
  ModelRef,
  OpenOptions,
  Sampling,
  StageBackend,
  StageInput,
  StageLoader,
  StageResult,
  StageRole,
  StageStats,
} from "./backend.ts";
import {
  advanceCall,
  argmaxRowsCalls,
  argmaxRowsRef,
  commandBuffer,
  deviceLost,
  encodeCalls,
  GEMV_MULTI_MAX_T,
  getGpu,
  type Gpu,
  GpuMemoryError,
  isKvType,
  isQuant,
  KeepWarm,
  keepWarmFor,
  keepWarmFromEnv,
  type KernelCall,
  KV_TYPES,
  type KvType,
  outOfMemoryErrors,
  outOfMemorySince,
  readBack,
  readStaging,
  releaseCalls,
  reserveStaging,
  storageBuffer,
  takeStaging,
  type WarmStats,
  writeBytes,
  writeStep,
  yieldToEventLoop,
} from "../kernels/mod.ts";
import { Checkpoint } from "./checkpoint.ts";
import { RequestError } from "./errors.ts";
import {
  type LoadOptions,
  Model,
  type ProgramOutput,
  reuseCapacity,
  type Sequence,
  type WeightsOption,
} from "./model.ts";
import { type ExpertFanout, ExpertHost } from "./experts.ts";

/**
 * Readbacks in flight at once. With early reads (kernels/readback.ts) each is done as its map call returns;
 * without, it resolves >= 10 ms after the GPU finished its batch, and with three the oldest has usually
 * resolved by the time the loop needs it. Tokens computed past an eos are at most the batches in flight,
 * and they are discarded.
 */
const MAX_IN_FLIGHT = 3;

/**
 * Released requests' sequences an engine keeps by default: a request whose shape one serves (Sequence.reopen)
 * takes it with its programs built, so its first token waits on no program build (15-50 ms of host time for a
 * new request's programs; docs/BENCHMARKS.md, the fiftieth session).
 */
export const SPARES = 2;

export interface GenerateOptions {
  /** Most tokens to generate (>= 1). */
  maxTokens: number;
  /** Generation stops after any of these ids (included in the output, as transformers does). */
  eosTokenIds?: readonly number[];
  /** Aborting stops the loop at the next batch boundary (or prefill chunk) and frees the request. */
  signal?: AbortSignal;
  /** Most tokens decoded per readback. Default 16. */
  maxBatch?: number;
  /** Called with each batch of new token ids as soon as it is read back (streaming). */
  onTokens?: (ids: number[]) => void;
}

export interface GenerateResult extends LoopResult {
  promptTokens: number;
  /** Milliseconds from start to the first generated token (prefill + one readback). */
  firstTokenMs: number;
  /** Decode rate after the first token, tokens per second (0 when only one token). */
  tokS: number;
  /**
   * GPU pipelines built from the request's start to its first token and the host ms that took (Gpu.builds; a
   * build blocks the host, so another request's builds meanwhile count too): a fresh process's first request
   * builds its programs' pipelines, later ones find them built. Where a request ran to its first token.
   */
  firstTokenBuilds?: { count: number; ms: number };
  /** KV cache bytes this request held (freed at the end). */
  kvBytes: number;
  /** Bytes of its other GPU buffers: activations, logits, token ids (Sequence.activationBytes). */
  activationBytes: number;
}

/** A model produced NaN or infinite logits (bad weights or config): the sampler found no token. */
export class NonFiniteLogitsError extends Error {
  override name = "NonFiniteLogitsError";
  constructor(token: number, vocab: number) {
    super(
      `the model produced non-finite logits (NaN or Inf; the sampler returned ${token}, outside the ` +
        `vocabulary [0, ${vocab})): its weights or config.json are likely corrupt (NaN/Inf weights, a zero ` +
        `or negative rms_norm_eps, overflowing f16 weights)`,
    );
  }
}

/** Checks ids against the vocabulary: a RequestError names the first bad one. */
export function checkTokenIds(ids: readonly number[], vocab: number): void {
  if (ids.length === 0) throw new RequestError("the prompt has no tokens");
  ids.forEach((id, i) => {
    if (!Number.isInteger(id) || id < 0 || id >= vocab) {
      throw new RequestError(`token id ${id} at index ${i} is outside the vocabulary [0, ${vocab})`);
    }
  });
}

/** Encodes `calls` in one compute pass and submits it. */
export function submit(gpu: Gpu, calls: readonly KernelCall[]): void {
  gpu.device.queue.submit([commandBuffer(gpu, calls)]);
}

/**
 * Where a prefill's host time goes, summed over this process's prefills (the prefill benchmark prints the
 * differences over its timed runs): `prefills`; `preSubmitMs`, from a prefill's start to the return of its
 * first submit (host work the GPU waits for: the first chunk's program build, its encode, the submit);
 * `encodeMs`, building and encoding every chunk (most of it overlaps the GPU); `submits` and `submitMs` (in
 * queue.submit); `afterMs`, from the last chunk's submit to the first token read (the GPU's last chunk, the
 * readback: generate only).
 */
export const prefillStats = { prefills: 0, preSubmitMs: 0, encodeMs: 0, submits: 0, submitMs: 0, afterMs: 0 };

/**
 * The decode loops' batches in this process (benchmarks read differences): `batches` read, and how many of
 * their map calls `blocked` waiting for the GPU (the others found it idle: the host was late).
 */
export const decodeStats = { batches: 0, blocked: 0 };

/**
 * A map call that took longer than this waited for the GPU (decodeStats.blocked); one that found the GPU idle
 * returns in a few microseconds.
 */
const BLOCKED_MS = 0.05;

/**
 * After how many layers of a fresh first-chunk program its calls so far are submitted (gpu.tuning
 * prefillEarlySubmit): 1, 2, 4, 8, ... (gpu.tuning.prefillEarlyLayers replaces them). The GPU starts after one
 * layer's build (H200, pp512: 1.1-1.6 ms into the prefill instead of 3.1-3.9 after four; 12.7k -> 13.2-13.5k
 * tok/s with f32 multiplies, docs/BENCHMARKS.md), and each submit holds as many layers as were submitted
 * before it: a layer's GPU time is about twice its build on the H200 (1.9 against 0.7-0.8 ms at 512 tokens),
 * so the GPU is not left waiting for the next batch as it was with a submit every 4 layers after the first.
 */
function earlyLayers(tuned: readonly number[] | undefined): Set<number> {
  if (tuned) return new Set(tuned);
  const marks = new Set<number>();
  for (let n = 1; n <= 1 << 20; n *= 2) marks.add(n);
  return marks;
}

/**
 * Builds (on first use) and submits a step's program of T rows so that the GPU starts before the host has
 * encoded all of it: a program built now goes in as it is built, after layers 1, 2, 4, 8, ...
 * (gpu.tuning.prefillEarlySubmit, prefillEarlyLayers), and one built before (a reused sequence's) in growing
 * pieces of its calls, 1/32, 1/16, ... half (prefillEarlyCached). `send` encodes and submits a piece.
 */
function submitEarly(
  gpu: Gpu,
  seq: Sequence,
  T: number,
  output: ProgramOutput,
  keys: number,
  send: (calls: readonly KernelCall[]) => void,
): void {
  const early = gpu.tuning.prefillEarlySubmit ?? true;
  const marks = earlyLayers(gpu.tuning.prefillEarlyLayers);
  let done = 0, layers = 0;
  const calls = seq.program(T, output, {
    keys,
    onLayer: (sofar) => {
      if (!early || !marks.has(++layers)) return;
      send(sofar.slice(done));
      done = sofar.length;
    },
  });
  if (early && done === 0 && gpu.tuning.prefillEarlyCached !== false) {
    for (let end = Math.ceil(calls.length / 32); end < calls.length; end *= 2) {
      send(calls.slice(done, end));
      done = end;
    }
  }
  send(calls.slice(done));
}

interface Open {
  seq: Sequence;
  /** Calls of this request in progress (run, verify, generate): a busy request's sequence is not reused. */
  busy: number;
  /** Aborted when the request is released while its loop runs. */
  abort: AbortController;
  /** Positions 0..length-1 hold this request's tokens (KV written); steps past it are refused. */
  length: number;
  /** verify's argmax output [maxChunk] u32 and its kernel calls by k, made on first use. */
  argmax?: { out: GPUBuffer; calls: Map<number, KernelCall[]> };
  /** The next one-token run step's commands, encoded once the last one returned (KernelTuning.encodeAhead). */
  ahead?: { calls: readonly KernelCall[]; cmd: GPUCommandBuffer };
  /** The out-of-memory error scope around the sequence's allocation, until the request's first call. */
  memory?: Promise<GPUError | null>;
  /** The device's uncaptured out-of-memory errors when the request opened (#checkDevice). */
  oomSeen: number;
}

/** The whole model's role: one stage that embeds, runs every layer and samples. */
export function wholeModel(numLayers: number): StageRole {
  return { index: 0, stages: 1, layers: [0, numLayers], embeds: true, head: true };
}

/** Engines made in this process (each a kind of step for the GPU's KeepWarm). */
let engines = 0;

/** Runs a Model (one part of a network, or all of it) for many requests; the node's StageBackend. */
export class Engine implements StageBackend {
  readonly model: ModelFacts;
  #open = new Map<string, Open>();
  #next = 0;

  #fanout: ExpertFanout | undefined;
  /** Holds the GPU's clock between this stage's steps (kernels/keep_warm.ts), where on. */
  #warm: KeepWarm | undefined;
  /** This engine's steps' kind for it (engines on one GPU share its KeepWarm). */
  #warmKind = `engine ${engines++}`;
  /** Released requests' sequences, newest last, kept for the next requests (programs and buffers built). */
  #spares: Sequence[] = [];
  readonly #maxSpares: number;
  /** Requests that took a released sequence (StageStats.reuses). */
  #reuses = 0;

  /**
   * `opts.fanout` runs the remote experts of the model's split layers (Model.load's remoteExperts).
   * `opts.spares` (default SPARES): how many released requests' sequences are kept for reuse.
   * `opts.keepWarm` queues filler work between `run` steps (a chain stage's; the GPU's, kept on close).
   */
  constructor(
    readonly role: StageRole,
    readonly weights: Model,
    opts: { fanout?: ExpertFanout; spares?: number; keepWarm?: KeepWarm } = {},
  ) {
    this.#fanout = opts.fanout;
    this.#warm = opts.keepWarm;
    this.#maxSpares = opts.spares ?? SPARES;
    if (weights.part.remoteExperts?.size && !opts.fanout) {
      throw new TypeError("a model part with remote experts needs a fanout to run them");
    }
    const c = weights.config;
    this.model = {
      hidden: c.hiddenSize,
      vocab: c.vocabSize,
      maxPositions: c.maxPositionEmbeddings,
      eosTokenIds: c.eosTokenIds,
    };
  }

  get gpu(): Gpu {
    return this.weights.gpu;
  }

  open(
    id: string,
    opts: OpenOptions & { maxChunk?: number; prefillChunk?: number },
  ): { chunk: number; prefillChunk: number } {
    if (this.#open.has(id)) throw new TypeError(`request ${id} is already open on this stage`);
    // A buffer the GPU cannot allocate is invalid, not an exception: the request's first call (#busy) learns
    // of it from this scope and fails, rather than compute garbage on a KV cache that is not there.
    const device = this.gpu.device;
    device.pushErrorScope("out-of-memory");
    let seq: Sequence, memory: Promise<GPUError | null>;
    try {
      seq = this.#reuse(opts) ??
        this.weights.newSequence(
          this.#maxSpares > 0
            ? { ...opts, capacity: reuseCapacity(opts.maxSeq, this.model.maxPositions) }
            : opts,
        );
    } finally {
      memory = device.popErrorScope();
    }
    const oomSeen = outOfMemoryErrors(this.gpu);
    this.#open.set(id, { seq, busy: 0, abort: new AbortController(), length: 0, memory, oomSeen });
    return { chunk: seq.maxChunk, prefillChunk: seq.prefillChunk };
  }

  /**
   * A released request's sequence that serves `opts` exactly as a new one would (Sequence.reopen), newest
   * first; where none does, the spares are freed first, so the new sequence's buffers never sit beside them.
   */
  #reuse(opts: OpenOptions & { maxChunk?: number; prefillChunk?: number }): Sequence | undefined {
    for (let i = this.#spares.length - 1; i >= 0; i--) {
      const seq = this.#spares[i];
      if (seq.reopen(opts)) {
        this.#spares.splice(i, 1);
        this.#reuses++;
        return seq;
      }
    }
    this.#dropSpares();
    return undefined;
  }

  #dropSpares(): void {
    for (const seq of this.#spares) seq.destroy();
    this.#spares = [];
  }

  /** Runs `f` with request `open` marked busy (once its buffers are known to be there: Open.memory). */
  async #busy<T>(open: Open, f: () => Promise<T>): Promise<T> {
    open.busy++;
    try {
      if (open.memory) await this.#checkMemory(open);
      return await f();
    } finally {
      open.busy--;
    }
  }

  /** Throws GpuMemoryError, dropping the request and its sequence, when its buffers could not be allocated. */
  async #checkMemory(open: Open): Promise<void> {
    const error = await open.memory;
    open.memory = undefined;
    if (!error) return;
    this.#drop(open);
    const mib = (b: number) => Math.round(b / 2 ** 20);
    const sizes = `KV cache ${mib(open.seq.kvBytes)} MiB, other buffers ${mib(open.seq.activationBytes)} MiB`;
    throw new GpuMemoryError(
      `${this.gpu.adapterName} ran out of memory for a request of ${open.seq.maxSeq} positions (${sizes}; ` +
        `${error.message}): ask for fewer tokens, or serve the model over more nodes`,
    );
  }

  /**
   * Throws GpuMemoryError, dropping request `open`, when since it opened the GPU ran out of memory where no
   * error scope was (a program's uniform buffers, made on the request's first steps; another load) or lost
   * its device: the work on an invalid buffer is skipped, so what was just read back may be garbage. Called
   * after each read, before its result goes anywhere.
   */
  #checkDevice(open: Open): void {
    const gpu = this.gpu;
    const lost = deviceLost(gpu);
    const oom = outOfMemorySince(gpu, open.oomSeen);
    if (lost === undefined && oom === undefined) return;
    this.#drop(open);
    throw new GpuMemoryError(
      lost !== undefined
        ? `${gpu.adapterName}'s device was lost during a request (${lost})`
        : `${gpu.adapterName} ran out of memory during a request (${oom}), so its results cannot be trusted: ` +
          "ask for fewer tokens, or serve the model over more nodes",
    );
  }

  /** Forgets request `open` and frees its sequence (not kept as a spare: some of its buffers may be invalid). */
  #drop(open: Open): void {
    for (const [id, o] of this.#open) if (o === open) this.#open.delete(id);
    open.abort.abort();
    open.seq.destroy();
  }

  #get(id: string): Open {
    const o = this.#open.get(id);
    if (!o) throw new Error(`request ${id} is not open on stage ${this.role.index}`);
    return o;
  }

  run(id: string, input: StageInput): Promise<StageResult> {
    const open = this.#get(id);
    return this.#busy(
      open,
      () => KeepWarm.around(this.#warm, this.#warmKind, input.T, () => this.#run(id, open, input)),
    );
  }

  async #run(id: string, open: Open, input: StageInput): Promise<StageResult> {
    const { seq } = open;
    const gpu = this.gpu;
    const { pos0, T, output } = input;
    const H = this.model.hidden;
    if (pos0 + T > seq.maxSeq) {
      throw new RequestError(`positions up to ${pos0 + T} exceed the request's ${seq.maxSeq}`);
    }
    open.length = pos0 + T;
    if (this.role.embeds) {
      if (!input.tokens || input.tokens.length !== T) {
        throw new TypeError(`stage ${this.role.index} needs ${T} token ids`);
      }
      checkTokenIds(Array.from(input.tokens), this.model.vocab);
      writeBytes(gpu, seq.tokens, pos0 * 4, input.tokens);
    } else {
      if (!input.hidden || input.hidden.length !== T * H) {
        throw new TypeError(`stage ${this.role.index} needs a hidden state of ${T} x ${H}`);
      }
      writeBytes(gpu, seq.x, 0, input.hidden);
    }
    writeStep(gpu, seq.step, { pos0, T, tokOut: pos0 + T });
    if (this.weights.part.remoteExperts?.size) await this.#runSegments(id, seq, T, output, pos0 + T);
    // A prompt's chunk goes in early; a decode or k-token step (speculative verification) in one submit.
    else if (T > GEMV_MULTI_MAX_T) submitEarly(gpu, seq, T, output, pos0 + T, (calls) => submit(gpu, calls));
    else {
      const calls = seq.program(T, output, { keys: pos0 + T });
      const ahead = open.ahead?.calls === calls ? open.ahead.cmd : undefined;
      open.ahead = undefined;
      gpu.device.queue.submit([ahead ?? commandBuffer(gpu, calls)]);
    }
    const result = await this.#read(seq, input);
    this.#checkDevice(open);
    const oneStep = T === 1 && !this.weights.part.remoteExperts?.size && pos0 + 2 <= seq.maxSeq;
    if (oneStep && gpu.tuning.encodeAhead !== false) this.#encodeAhead(id, open, output, pos0 + 2);
    return result;
  }

  /** A step's result from the GPU: its hidden state, its sampled token or its logits. */
  async #read(seq: Sequence, { pos0, T, output }: StageInput): Promise<StageResult> {
    const gpu = this.gpu;
    if (output === "hidden") {
      return { hidden: new Float32Array(await readBack(gpu, seq.x, T * this.model.hidden * 4)) };
    }
    if (output === "sample") {
      const token = new Uint32Array(await readBack(gpu, seq.tokens, 4, (pos0 + T) * 4))[0];
      if (token >= this.model.vocab) throw new NonFiniteLogitsError(token, this.model.vocab);
      return { token };
    }
    return { logits: new Float32Array(await readBack(gpu, seq.logits!, T * this.model.vocab * 4)) };
  }

  /**
   * Encodes open request `id`'s likely next step, one token attending to `keys` keys, once this step has
   * returned (setImmediate: after its caller has sent the result on), so that it is ready when that step
   * comes: in a chain the gap before it (the other stages, the links) is idle time on this host, and a
   * stage's step otherwise encodes its dispatches (~60 for 14 of Llama-1B's layers) before the GPU starts.
   * `#run` submits it if its program is the one the step needs, else encodes afresh.
   */
  #encodeAhead(id: string, open: Open, output: StageInput["output"], keys: number): void {
    setImmediate(() => {
      if (this.#open.get(id) !== open || open.busy > 0 || open.ahead) return;
      const calls = open.seq.program(1, output, { keys });
      open.ahead = { calls, cmd: commandBuffer(this.gpu, calls) };
    });
  }

  /**
   * Runs `tokens` (k of them, 1 <= k <= the request's chunk; <= 16 is the cheap multi-token step) at
   * positions pos0 .. pos0 + k - 1 of open request `id` in one step, writing their KV, and returns for each
   * position i the next token after tokens[0..i] (given the request's earlier positions): "argmax" gives
   * k greedy ids (Uint32Array, computed on the GPU: only k ids are read back), "logits" the rows
   * [k, vocab] (Float32Array). pos0 may be at most length(id): a step may overwrite positions (after a
   * rejected draft), never leave a gap. Afterwards length(id) is pos0 + k. Needs embedding and head.
   */
  verify(
    id: string,
    pos0: number,
    tokens: readonly number[] | Uint32Array,
    output: "argmax" | "logits" = "argmax",
  ): Promise<Uint32Array | Float32Array> {
    const open = this.#get(id);
    return this.#busy(open, () => this.#verify(id, open, pos0, tokens, output));
  }

  async #verify(
    id: string,
    open: Open,
    pos0: number,
    tokens: readonly number[] | Uint32Array,
    output: "argmax" | "logits",
  ): Promise<Uint32Array | Float32Array> {
    const { seq } = open;
    if (!this.role.embeds || !this.role.head) throw new Error("verify needs a part with embedding and head");
    const k = tokens.length;
    if (!(k >= 1 && k <= seq.maxChunk)) {
      throw new RequestError(`a verify step takes 1..${seq.maxChunk} tokens, got ${k}`);
    }
    if (!(Number.isInteger(pos0) && pos0 >= 0 && pos0 <= open.length)) {
      throw new RequestError(
        `verify at position ${pos0}: the request holds ${open.length} positions (a step may not leave a gap)`,
      );
    }
    const ids = Uint32Array.from(tokens);
    const V = this.model.vocab;
    if (output === "logits" || this.weights.part.remoteExperts?.size) {
      const logits = (await this.run(id, { pos0, T: k, tokens: ids, output: "logits" })).logits!;
      return output === "logits" ? logits : argmaxRowsRef(logits, V);
    }
    const gpu = this.gpu;
    if (pos0 + k > seq.maxSeq) {
      throw new RequestError(`positions up to ${pos0 + k} exceed the request's ${seq.maxSeq}`);
    }
    checkTokenIds(Array.from(ids), V);
    open.argmax ??= { out: storageBuffer(gpu, seq.maxChunk * 4, "verify argmax"), calls: new Map() };
    let tail = open.argmax.calls.get(k);
    if (!tail) {
      tail = argmaxRowsCalls(gpu, { logits: seq.logits!, out: open.argmax.out }, { vocab: V, T: k });
      open.argmax.calls.set(k, tail);
    }
    writeBytes(gpu, seq.tokens, pos0 * 4, ids);
    writeStep(gpu, seq.step, { pos0, T: k, tokOut: pos0 + k });
    submit(gpu, [...seq.program(k, "logits", { keys: pos0 + k }), ...tail]);
    open.length = pos0 + k;
    const best = new Uint32Array(await readBack(gpu, open.argmax.out, k * 4));
    this.#checkDevice(open);
    const bad = best.find((t) => t >= V);
    if (bad !== undefined) throw new NonFiniteLogitsError(bad, V);
    return best;
  }

  /**
   * Open request `id`'s hidden states of its last step on the GPU: rows 0..T-1 of `buffer` (after the last
   * layer, before the final norm, on a part with the head), valid until its next step; and the most rows a
   * step has (`chunk`). What an MTP drafter reads (models/mtp.ts), without a readback.
   */
  hiddenStates(id: string): { buffer: GPUBuffer; chunk: number } {
    const { seq } = this.#get(id);
    return { buffer: seq.x, chunk: seq.maxChunk };
  }

  /** Positions open request `id` holds (its KV cache is valid for 0..length-1). */
  length(id: string): number {
    return this.#get(id).length;
  }

  /**
   * Drops positions n.. of open request `id` (0 <= n <= length(id)): the next step starts at n and
   * overwrites them; nothing on the GPU changes now (attention reads only positions below a step's own).
   */
  truncate(id: string, n: number): void {
    const open = this.#get(id);
    if (!(Number.isInteger(n) && n >= 0 && n <= open.length)) {
      throw new RequestError(`truncate to ${n}: the request holds ${open.length} positions`);
    }
    open.length = n;
  }

  /**
   * A step of a part whose MoE layers' routed experts are remote: run each segment; at a split layer read
   * back the layer's normalised input and the router's choice, have the experts run where they are held
   * (the fanout: one message per host), and write their sum where the next segment adds it in.
   */
  async #runSegments(
    id: string,
    seq: Sequence,
    T: number,
    output: StageInput["output"],
    keys: number,
  ): Promise<void> {
    const gpu = this.gpu;
    const H = this.model.hidden;
    for (const s of seq.segments(T, output, { keys })) {
      submit(gpu, s.calls);
      if (s.split === undefined) continue;
      const ffn = this.weights.config.layer(s.split).ffn;
      if (ffn.kind !== "moe") throw new Error(`layer ${s.split} is split but has no experts`);
      const k = ffn.routing.topK;
      const r = seq.routing!;
      const t0 = performance.now();
      const xn = new Float32Array(await readBack(gpu, seq.normed, T * H * 4));
      const ids = new Uint32Array(await readBack(gpu, r.ids, T * k * 4));
      const weights = new Float32Array(await readBack(gpu, r.weights, T * k * 4));
      const readbackMs = performance.now() - t0;
      const sum = await this.#fanout!(s.split, { request: id, T, xn, ids, weights, readbackMs });
      if (sum.length !== T * H) {
        throw new Error(`layer ${s.split}: the experts returned ${sum.length} values`);
      }
      writeBytes(gpu, seq.expertSum!, 0, sum);
    }
  }

  /** Decodes one token a step: for a part whose experts are remote (no GPU-resident loop then). */
  async #stepLoop(
    id: string,
    prompt: readonly number[],
    opts: LoopOptions & Omit<GenerateOptions, "eosTokenIds">,
    signal: AbortSignal,
  ): Promise<GenerateResult> {
    const { seq } = this.#get(id);
    const P = prompt.length;
    const t0 = performance.now();
    let token = -1;
    for (let pos0 = 0; pos0 < P; pos0 += seq.maxChunk) {
      if (signal.aborted) return this.#result([], "aborted", P, t0, t0, t0, seq);
      const T = Math.min(seq.maxChunk, P - pos0);
      const last = pos0 + T >= P;
      const tokens = Uint32Array.from(prompt.slice(pos0, pos0 + T));
      const r = await this.run(id, { pos0, T, tokens, output: last ? "sample" : "hidden" });
      if (last) token = r.token!;
    }
    const out = [token];
    const firstAt = performance.now();
    opts.onTokens?.([token]);
    const eos = new Set(opts.eos);
    while (out.length < opts.maxTokens && !eos.has(token)) {
      if (signal.aborted) return this.#result(out, "aborted", P, t0, firstAt, performance.now(), seq);
      const pos0 = P + out.length - 1;
      token = (await this.run(id, { pos0, T: 1, tokens: Uint32Array.of(token), output: "sample" })).token!;
      out.push(token);
      opts.onTokens?.([token]);
    }
    return this.#result(out, eos.has(token) ? "eos" : "max_tokens", P, t0, firstAt, performance.now(), seq);
  }

  /**
   * Prefill then the GPU-resident decode loop for open request `id` (this part must embed and sample).
   * Returns at eos, maxTokens, or when aborted / released.
   */
  async generate(
    id: string,
    prompt: readonly number[],
    opts: LoopOptions & Omit<GenerateOptions, "eosTokenIds">,
  ): Promise<GenerateResult> {
    const open = this.#get(id);
    const result = await this.#busy(open, () => this.#generate(open, id, prompt, opts));
    // The last token sampled is not in the KV cache yet: the request holds the prompt and the rest.
    open.length = prompt.length + Math.max(0, result.tokens.length - 1);
    return result;
  }

  async #generate(
    open: Open,
    id: string,
    prompt: readonly number[],
    opts: LoopOptions & Omit<GenerateOptions, "eosTokenIds">,
  ): Promise<GenerateResult> {
    const { seq } = open;
    const gpu = this.gpu;
    const signal = opts.signal ? AbortSignal.any([opts.signal, open.abort.signal]) : open.abort.signal;
    if (!this.role.embeds || !this.role.head) {
      throw new Error("generate needs a part with embedding and head");
    }
    checkTokenIds(prompt, this.model.vocab);
    if (!(Number.isInteger(opts.maxTokens) && opts.maxTokens >= 1)) {
      throw new RequestError(`max tokens must be an integer >= 1, got ${opts.maxTokens}`);
    }
    const P = prompt.length;
    if (P + opts.maxTokens > seq.maxSeq) {
      throw new RequestError(
        `prompt (${P}) + max tokens (${opts.maxTokens}) exceeds the request's ${seq.maxSeq} positions`,
      );
    }
    if (this.weights.part.remoteExperts?.size) return await this.#stepLoop(id, prompt, opts, signal);
    const eos = new Set(opts.eos);
    const maxBatch = opts.maxBatch ?? 16;
    const vocab = this.model.vocab;
    const t0 = performance.now();
    const built = { ...gpu.builds };
    let firstBuilds: GenerateResult["firstTokenBuilds"];
    const pending: Promise<number[]>[] = [];
    let next: Batch | undefined;
    try {
      // Primed staging buffers for the batches in flight: a buffer returns to the pool only when its map
      // promise settles, and the first small batches come faster than that. Asked for before the prefill
      // submits anything: priming's map calls wait for the GPU's queued work (kernels/readback.ts).
      const reserved = reserveStaging(gpu, maxBatch * 4, 8);
      if (!(await this.#prefill(seq, prompt, "sample", signal))) {
        return this.#result([], "aborted", P, t0, t0, t0, seq);
      }
      const submitted = performance.now();
      await reserved;
      // Released meanwhile: its sequence is gone (nothing of the decode may be built on it).
      if (signal.aborted) return this.#result([], "aborted", P, t0, t0, t0, seq);
      // One decode step, then the GPU moves the step record on: k tokens are k copies in one submit. The
      // step at position p attends to p + 1 keys; its program may depend on that (StepOptions.keys: a
      // program per cache-length bucket: a long request's first 1,024 tokens without attention splits).
      const advance = advanceCall(gpu, seq.step);
      const decodes = new Map<KernelCall[], KernelCall[]>();
      const decodeAt = (pos: number) => {
        const calls = seq.program(1, "sample", { keys: pos + 1 });
        let step = decodes.get(calls);
        if (!step) decodes.set(calls, step = [...calls, advance]);
        return step;
      };
      const encodeBatch = (from: number, steps: number): Batch => {
        const enc = gpu.device.createCommandEncoder();
        if (steps > 0) {
          const pass = enc.beginComputePass();
          // Step i of the batch is at position P + from + i.
          for (let i = 0; i < steps; i++) encodeCalls(pass, decodeAt(P + from + i));
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
      let stopReason: LoopResult["stopReason"] = "max_tokens";
      let firstAt = 0, lastAt = 0;
      while (current || pending.length > 0) {
        if (current) {
          // Blocks (in Deno) until the GPU has run `current`; the next batch goes in at once.
          const called = performance.now();
          pending.push(readBatch(gpu, current));
          const returned = performance.now();
          decodeStats.batches++;
          if (returned - called > BLOCKED_MS) decodeStats.blocked++;
          current = undefined;
          if (next && !signal.aborted) {
            gpu.device.queue.submit([next.cmd]);
            current = next;
            next = plan();
          }
          // Up to MAX_IN_FLIGHT batches are read ahead of their tokens' delivery, but not the first token's:
          // it goes out as soon as it is read, while the first decode batch runs.
          const firstNow = out.length === 0 && gpu.tuning.firstTokenAtOnce !== false;
          if (current && pending.length < MAX_IN_FLIGHT && !firstNow) continue;
        }
        const ids = await pending.shift()!;
        this.#checkDevice(open);
        const now = performance.now();
        if (out.length === 0) {
          firstAt = now;
          prefillStats.afterMs += now - submitted;
          firstBuilds = { count: gpu.builds.count - built.count, ms: gpu.builds.ms - built.ms };
        }
        lastAt = now;
        const bad = ids.find((id) => id >= vocab);
        if (bad !== undefined) throw new NonFiniteLogitsError(bad, vocab);
        let fresh = ids;
        const stop = ids.findIndex((id) => eos.has(id));
        if (stop >= 0) fresh = ids.slice(0, stop + 1);
        out.push(...fresh);
        opts.onTokens?.(fresh);
        if (stop >= 0) {
          stopReason = "eos";
          break;
        }
        // The loop's map calls block this thread and its reads settle as microtasks, so without a turn here
        // the whole generation would be one task of the event loop: a server could not send these tokens
        // until the last, nor step its other requests or answer its peers meanwhile. The batch in flight runs
        // on the GPU during the turn.
        await yieldToEventLoop();
        if (signal.aborted) {
          stopReason = "aborted";
          break;
        }
      }
      return { ...this.#result(out, stopReason, P, t0, firstAt, lastAt, seq), firstTokenBuilds: firstBuilds };
    } finally {
      next?.staging.destroy();
      await Promise.allSettled(pending);
    }
  }

  #result(
    tokens: number[],
    stopReason: LoopResult["stopReason"],
    P: number,
    t0: number,
    firstAt: number,
    lastAt: number,
    seq: Sequence,
  ): GenerateResult {
    const decodeMs = lastAt - firstAt;
    return {
      tokens,
      promptTokens: P,
      stopReason,
      firstTokenMs: firstAt - t0,
      tokS: tokens.length > 1 && decodeMs > 0 ? ((tokens.length - 1) / decodeMs) * 1000 : 0,
      kvBytes: seq.kvBytes,
      activationBytes: seq.activationBytes,
    };
  }

  /**
   * Runs the prompt in chunks; the last chunk ends as `last` says. Waits for the GPU and yields to the
   * event loop between chunks, but never leaves the GPU idle for it: chunk k + 1 is encoded (its program
   * built on first use) while chunk k runs, submitted the moment the wait for k returns, and the yield
   * happens while it runs. (Encoding after the wait and yielding before the submit left the GPU idle for the
   * encode, a ~2 ms setTimeout and, on the last chunk, the "sample" program's build: ~6 ms of host time.)
   * False when aborted before the end (a chunk already submitted still runs).
   */
  async #prefill(
    seq: Sequence,
    prompt: readonly number[],
    last: "sample" | "hidden",
    signal: AbortSignal,
  ): Promise<boolean> {
    const gpu = this.gpu;
    const P = prompt.length;
    const start = performance.now();
    prefillStats.prefills++;
    const commands = (calls: readonly KernelCall[]): GPUCommandBuffer => {
      const enc = gpu.device.createCommandEncoder();
      const pass = enc.beginComputePass();
      encodeCalls(pass, calls);
      pass.end();
      return enc.finish();
    };
    let first = true;
    let submitMs = 0;
    const submitNow = (cmd: GPUCommandBuffer) => {
      const t = performance.now();
      gpu.device.queue.submit([cmd]);
      const now = performance.now();
      submitMs += now - t;
      prefillStats.submits++;
      if (first) prefillStats.preSubmitMs += now - start;
      first = false;
    };
    const output = (pos0: number, T: number) => (pos0 + T >= P ? last : "hidden");
    const encode = (pos0: number): GPUCommandBuffer => {
      const t = performance.now();
      const T = Math.min(seq.prefillChunk, P - pos0);
      const cmd = commands(seq.program(T, output(pos0, T), { keys: pos0 + T }));
      prefillStats.encodeMs += performance.now() - t;
      return cmd;
    };
    const overlap = gpu.tuning.prefillOverlap ?? true;
    writeBytes(gpu, seq.tokens, 0, Uint32Array.from(prompt));
    if (signal.aborted) return false;
    // The first chunk: where its program is built fresh (a new request's), its first layers are submitted
    // as they are built, so the GPU starts while the host builds the rest (gpu.tuning.prefillEarlySubmit).
    const T0 = Math.min(seq.prefillChunk, P);
    writeStep(gpu, seq.step, { pos0: 0, T: T0, tokOut: P });
    const t = performance.now();
    submitEarly(gpu, seq, T0, output(0, T0), T0, (calls) => submitNow(commands(calls)));
    prefillStats.encodeMs += performance.now() - t - submitMs;
    for (let pos0 = T0; pos0 < P; pos0 += seq.prefillChunk) {
      const T = Math.min(seq.prefillChunk, P - pos0);
      let next: GPUCommandBuffer;
      if (overlap) {
        next = encode(pos0);
        await yieldToEventLoop(); // the previous chunk runs meanwhile
        if (signal.aborted) return false; // released: its buffers are gone (the chunk in flight still finishes)
        await readBack(gpu, seq.tokens, 4); // it is done (a bounded wait: nothing else is queued)
      } else {
        await readBack(gpu, seq.tokens, 4);
        await yieldToEventLoop();
        if (signal.aborted) return false;
        next = encode(pos0);
      }
      if (signal.aborted) return false;
      // The step record is written in queue order: after the previous chunk's commands, before this one's.
      writeStep(gpu, seq.step, { pos0, T, tokOut: P });
      submitNow(next);
    }
    prefillStats.submitMs += submitMs;
    return true;
  }

  /** Teacher-forced logits [T, V] of `tokens` (row t: next-token logits after tokens[0..t]). */
  async logits(tokens: readonly number[], opts: { signal?: AbortSignal } = {}): Promise<Float32Array> {
    if (!this.role.embeds || !this.role.head) throw new Error("logits needs a part with embedding and head");
    checkTokenIds(tokens, this.model.vocab);
    if (tokens.length > this.model.maxPositions) {
      throw new RequestError(
        `${tokens.length} tokens exceed the model's ${this.model.maxPositions} positions`,
      );
    }
    const V = this.model.vocab;
    const id = `logits-${this.#next++}`;
    this.open(id, {
      maxSeq: tokens.length,
      sampling: { temperature: 0, topP: 1, seed: 0 },
      logitsRows: tokens.length,
    });
    const { seq } = this.#get(id);
    try {
      const out = new Float32Array(tokens.length * V);
      for (let pos0 = 0; pos0 < tokens.length; pos0 += seq.maxChunk) {
        opts.signal?.throwIfAborted();
        const T = Math.min(seq.maxChunk, tokens.length - pos0);
        const step = Uint32Array.from(tokens.slice(pos0, pos0 + T));
        out.set((await this.run(id, { pos0, T, tokens: step, output: "logits" })).logits!, pos0 * V);
        await yieldToEventLoop();
      }
      return out;
    } finally {
      this.release(id);
    }
  }

  release(id: string): boolean {
    const o = this.#open.get(id);
    if (!o) return false;
    this.#open.delete(id);
    o.abort.abort();
    // A busy request's calls may still touch its buffers (they stop at the abort): never handed on.
    if (o.busy === 0 && this.#maxSpares > 0) {
      this.#spares.push(o.seq);
      if (this.#spares.length > this.#maxSpares) this.#spares.shift()!.destroy();
    } else o.seq.destroy();
    if (o.argmax) {
      for (const calls of o.argmax.calls.values()) releaseCalls(calls);
      o.argmax.out.destroy();
    }
    return true;
  }

  /** What the keep-warm filler did on this stage (kernels/keep_warm.ts); undefined where it is off. */
  warmStats(): WarmStats | undefined {
    return this.#warm && { ...this.#warm.stats };
  }

  stats(): StageStats {
    let kvBytes = 0;
    for (const o of this.#open.values()) kvBytes += o.seq.kvBytes;
    const spareBytes = this.#spares.reduce((n, s) => n + s.kvBytes + s.activationBytes, 0);
    return {
      active: this.#open.size,
      kvBytes,
      weightBytes: this.weights.weightBytes,
      spareBytes,
      reuses: this.#reuses,
    };
  }

  close(): void {
    for (const id of [...this.#open.keys()]) this.release(id);
    this.#dropSpares();
    this.weights.destroy();
  }
}

/**
 * Opens a request, generates after `prompt` and frees the request: the single-node path. The model must
 * be whole (it embeds and samples).
 */
export async function generate(
  engine: Engine,
  prompt: readonly number[],
  opts: GenerateOptions & {
    sampling: Sampling;
    /**
     * Positions the request holds past prompt + maxTokens (default 0): the benchmarks' stand-in for an API
     * request whose max_tokens goes unused (a step's program may depend on the cache's capacity).
     */
    room?: number;
  },
): Promise<GenerateResult> {
  checkTokenIds(prompt, engine.model.vocab);
  if (!(Number.isInteger(opts.maxTokens) && opts.maxTokens >= 1)) {
    throw new RequestError(`max tokens must be an integer >= 1, got ${opts.maxTokens}`);
  }
  const room = opts.room ?? 0;
  if (!(Number.isInteger(room) && room >= 0)) {
    throw new RequestError(`room must be an integer >= 0, got ${room}`);
  }
  const maxSeq = prompt.length + opts.maxTokens + room;
  if (maxSeq > engine.model.maxPositions) {
    throw new RequestError(
      `prompt (${prompt.length}) + max tokens (${opts.maxTokens})${
        room ? ` + room (${room})` : ""
      } exceeds the model's ${engine.model.maxPositions} positions`,
    );
  }
  const id = `local-${crypto.randomUUID().slice(0, 8)}`;
  engine.open(id, { maxSeq, sampling: opts.sampling, prompt: prompt.length });
  try {
    return await engine.generate(id, prompt, { ...opts, eos: opts.eosTokenIds ?? [] });
  } finally {
    engine.release(id);
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

/** Parses a weights option: f32, f16, q8, q4, or "auto" / undefined (the GPU's default). */
export function weightsOption(v: string | undefined): WeightsOption | undefined {
  if (v === undefined || v === "auto") return undefined;
  if (v === "f32" || v === "f16" || isQuant(v)) return v;
  throw new RequestError(`weights must be auto, f32, f16, q8 or q4, got "${v}"`);
}

/** Parses a KV cache option: f32, f16, q8, or "auto" / undefined (the node's default: kvCacheType). */
export function kvOption(v: string | undefined): KvType | undefined {
  if (v === undefined || v === "auto") return undefined;
  if (isKvType(v)) return v;
  throw new RequestError(`kv must be auto, ${KV_TYPES.join(", ")}, got "${v}"`);
}

/** What a ModelRef (the Plan's model) asks of a load: the weights' storage and the KV cache's type. */
export function servedForm(m: ModelRef): { weights?: WeightsOption; kv?: KvType } {
  return { weights: weightsOption(m.weights), kv: kvOption(m.kv) };
}

/** The ExpertLoader: reads the held experts of each layer onto this process's GPU. */
export const loadExpertHost: ExpertLoader = async (hold, opts) => {
  const gpu = await getGpu();
  const host = await ExpertHost.load(gpu, await Checkpoint.open(opts.model.dir), hold, {
    weights: weightsOption(opts.model.weights),
  });
  // Timed right after loading, while the GPU's clock is still up.
  host.keepWarm = await keepWarmFor(gpu, keepWarmFromEnv());
  return host;
};

/** Opens a checkpoint and loads `role`'s part of it onto this process's GPU. */
export async function loadEngine(
  /** A model directory, or its checkpoint opened already (a caller that checked it before opening the GPU). */
  src: string | Checkpoint,
  opts: Omit<LoadOptions, "layers" | "embed" | "head"> & {
    role?: StageRole;
    gpu?: Gpu;
    /** Runs the routed experts of `remoteExperts` layers where they are held. */
    fanout?: ExpertFanout;
    /** Released requests' sequences kept for reuse (default SPARES). */
    spares?: number;
    /** Hold the GPU's clock between `run` steps (kernels/keep_warm.ts); "auto" on hardware GPUs. Default false. */
    keepWarm?: boolean | "auto";
  } = {},
): Promise<Engine> {
  const ckpt = typeof src === "string" ? await Checkpoint.open(src) : src;
  const role = opts.role ?? wholeModel(ckpt.config.numLayers);
  const gpu = opts.gpu ?? await getGpu();
  const model = await Model.load(gpu, ckpt, {
    weights: opts.weights,
    kv: opts.kv,
    layers: role.layers,
    embed: role.embeds,
    head: role.head,
    onProgress: opts.onProgress,
    remoteExperts: opts.remoteExperts,
  });
  // Timed right after loading, while the GPU's clock is still up.
  const keepWarm = await keepWarmFor(gpu, opts.keepWarm ?? false);
  return new Engine(role, model, { fanout: opts.fanout, spares: opts.spares, keepWarm });
}

/** The StageLoader for every family: reads only the role's tensors onto this process's GPU. */
export const loadStage: StageLoader = (role, opts) =>
  loadEngine(opts.model.dir, {
    role,
    ...servedForm(opts.model),
    onProgress: opts.onProgress,
    remoteExperts: opts.experts?.remote,
    fanout: opts.experts?.fanout,
    keepWarm: keepWarmFromEnv(),
  });
