// The model runtime on a thread of its own: a node's stages and expert hosts run in one Worker per process
// (models/gpu_worker.ts), behind the same StageBackend and ExpertService interfaces as in-thread ones.
//
// Why: Deno's WebGPU holds the calling thread for a program's first pipeline compiles (createComputePipeline
// is synchronous, tens of ms each) and for every GPU wait (mapAsync and onSubmittedWorkDone block until all
// submitted work is done: kernels/readback.ts). On the node's thread that is time membership cannot answer
// probes in, and a hold past the suspicion timeout gets a live node declared dead (docs/RECOVERY.md, "Known
// limits"; node/loop_lag.ts measures it). Here the holds fall on the worker; the node's thread only posts
// messages. The cost is a message each way a call (and a copy of the hidden state going in).
//
// The sync parts of StageBackend are answered here without a round trip: `open` checks the positions and
// computes the step chunk from the limits the worker reported at load (model.ts stepChunk, the function the
// worker's Sequence uses), then posts the open; an open that fails there fails the request's next call.
// `release` and `stats` use this side's record of the open requests (KV bytes as the worker reported them).
import type {
  ExpertFanout,
  ExpertInput,
  ExpertLoader,
  ExpertService,
  LoopOptions,
  LoopResult,
  ModelFacts,
  ModelRef,
  OpenOptions,
  StageBackend,
  StageInput,
  StageLoader,
  StageResult,
  StageRole,
  StageStats,
} from "./backend.ts";
import { CheckpointError, RequestError } from "./errors.ts";
import { checkMaxSeq, type ChunkLimits, stepChunk } from "./model.ts";

/** A call to the GPU thread. */
export type GpuRequest =
  | { op: "stage"; role: StageRole; model: ModelRef; remote?: number[]; fanout: boolean }
  | { op: "open"; handle: number; id: string; opts: OpenOptions }
  | { op: "run"; handle: number; id: string; input: StageInput }
  | { op: "generate"; handle: number; id: string; prompt: number[]; opts: Omit<LoopOptions, "onTokens"> }
  | { op: "abort"; handle: number; id: string }
  | { op: "release"; handle: number; id: string }
  | { op: "closeStage"; handle: number }
  | { op: "experts"; hold: [number, number[]][]; model: ModelRef }
  | { op: "compute"; handle: number; layer: number; input: ExpertInput }
  | { op: "closeExperts"; handle: number };

/** A stage's remote experts, asked for by the GPU thread mid-step. */
export interface GpuCallback {
  handle: number;
  layer: number;
  input: ExpertInput;
}

/** An error as it crosses the thread: rebuilt on this side with its class where the node tells them apart. */
export interface WireError {
  name: string;
  message: string;
  stack?: string;
}

/** What a loaded stage tells the node's side. */
export interface StageFacts {
  handle: number;
  model: ModelFacts;
  weightBytes: number;
  chunk: ChunkLimits;
}

export type GpuMessage =
  | { kind: "request"; id: number; request: GpuRequest }
  | { kind: "reply"; id: number; ok: true; value: unknown }
  | { kind: "reply"; id: number; ok: false; error: WireError }
  | { kind: "event"; id: number; event: { progress?: [number, number]; tokens?: number[] } }
  | { kind: "callback"; cb: number; call: GpuCallback }
  | { kind: "answer"; cb: number; ok: true; value: Float32Array }
  | { kind: "answer"; cb: number; ok: false; error: WireError };

function rebuild(e: WireError): Error {
  const make = e.name === "RequestError"
    ? RequestError
    : e.name === "CheckpointError"
    ? CheckpointError
    : e.name === "TypeError"
    ? TypeError
    : e.name === "RangeError"
    ? RangeError
    : Error;
  const err = new make(e.message);
  if (make === Error && e.name !== "Error") err.name = e.name;
  return err;
}

interface Pending {
  resolve: (v: unknown) => void;
  reject: (e: Error) => void;
  onEvent?: (event: { progress?: [number, number]; tokens?: number[] }) => void;
}

/**
 * The process's GPU thread: started with its first object, ended when the last one closes (so a process
 * that holds nothing on the GPU has no worker keeping it alive).
 */
export class GpuThread {
  #worker: Worker | undefined;
  #next = 1;
  #pending = new Map<number, Pending>();
  #fanouts = new Map<number, ExpertFanout>();
  #objects = 0;
  /** Counts the thread's stops: an object held before the last stop is gone with that thread. */
  #generation = 0;

  /**
   * Calls `request` on the GPU thread; `onEvent` gets its progress and token events. `generation` (an
   * object's, from hold): a call for an object of a stopped thread fails without starting a new one. The
   * request's arrays are copied, not transferred: the caller may still use them.
   */
  call<T>(request: GpuRequest, onEvent?: Pending["onEvent"], generation?: number): Promise<T> {
    if (generation !== undefined && generation !== this.#generation) {
      return Promise.reject(new Error("the GPU thread was stopped"));
    }
    const worker = this.#start();
    const id = this.#next++;
    return new Promise<T>((resolve, reject) => {
      this.#pending.set(id, { resolve: resolve as (v: unknown) => void, reject, onEvent });
      worker.postMessage({ kind: "request", id, request } satisfies GpuMessage);
    });
  }

  /** Whether the worker is running (it starts with the first object and ends with the last). */
  get running(): boolean {
    return this.#worker !== undefined;
  }

  /** Counts an object held on the thread (a stage, an expert host, or one being loaded): its generation. */
  hold(): number {
    this.#objects++;
    return this.#generation;
  }

  /** Where a stage's callbacks for its remote experts go. */
  fanout(handle: number, fanout: ExpertFanout): void {
    this.#fanouts.set(handle, fanout);
  }

  /** An object closed (or failed to load): the thread ends with the last one, once `closing` settles. */
  drop(closing: Promise<unknown>, generation: number, handle?: number): void {
    if (generation !== this.#generation) return; // its thread was stopped, with its count
    if (handle !== undefined) this.#fanouts.delete(handle);
    if (--this.#objects > 0) return;
    closing.finally(() => {
      if (this.#objects === 0) this.#stop(new Error("the GPU thread was stopped"));
    });
  }

  /** Stops the thread now (objects still held fail their calls). */
  terminate(): void {
    this.#objects = 0;
    this.#fanouts.clear();
    this.#stop(new Error("the GPU thread was stopped"));
  }

  #start(): Worker {
    if (this.#worker) return this.#worker;
    const w = new Worker(new URL("./gpu_worker.ts", import.meta.url).href, { type: "module" });
    w.onmessage = (e: MessageEvent<GpuMessage>) => this.#onMessage(e.data);
    w.onerror = (e) => {
      e.preventDefault();
      this.#stop(new Error(`the GPU thread failed: ${e.message}`));
    };
    this.#worker = w;
    return w;
  }

  #stop(why: Error): void {
    if (this.#worker) this.#generation++;
    this.#worker?.terminate();
    this.#worker = undefined;
    const pending = [...this.#pending.values()];
    this.#pending.clear();
    for (const p of pending) p.reject(why);
  }

  #onMessage(m: GpuMessage): void {
    if (m.kind === "callback") {
      const fanout = this.#fanouts.get(m.call.handle);
      const answer = (msg: GpuMessage) => this.#worker?.postMessage(msg);
      if (!fanout) {
        answer({
          kind: "answer",
          cb: m.cb,
          ok: false,
          error: { name: "Error", message: "no fanout for this stage" },
        });
        return;
      }
      fanout(m.call.layer, m.call.input).then(
        (value) => answer({ kind: "answer", cb: m.cb, ok: true, value }),
        (e) => answer({ kind: "answer", cb: m.cb, ok: false, error: { name: e.name, message: e.message } }),
      );
      return;
    }
    const p = "id" in m ? this.#pending.get(m.id) : undefined;
    if (!p) return;
    if (m.kind === "event") {
      p.onEvent?.(m.event);
      return;
    }
    if (m.kind !== "reply") return;
    this.#pending.delete(m.id);
    if (m.ok) p.resolve(m.value);
    else p.reject(rebuild(m.error));
  }
}

let shared: GpuThread | undefined;
/** This process's GPU thread. */
export function gpuThread(): GpuThread {
  return shared ??= new GpuThread();
}

/** A stage loaded on the GPU thread. */
class ThreadStage implements StageBackend {
  readonly model: ModelFacts;
  #open = new Map<string, { kvBytes: number; failed?: Error; opened: Promise<void> }>();
  #closed = false;

  constructor(
    readonly role: StageRole,
    private readonly thread: GpuThread,
    private readonly generation: number,
    private readonly facts: StageFacts,
  ) {
    this.model = facts.model;
  }

  open(id: string, opts: OpenOptions): { chunk: number } {
    if (this.#open.has(id)) throw new TypeError(`request ${id} is already open on this stage`);
    checkMaxSeq(opts.maxSeq, this.model.maxPositions);
    const chunk = stepChunk(opts.maxSeq, this.facts.chunk, opts.prompt);
    const entry: { kvBytes: number; failed?: Error; opened: Promise<void> } = {
      kvBytes: 0,
      opened: Promise.resolve(),
    };
    entry.opened = this.#call<{ chunk: number; kvBytes: number }>({
      op: "open",
      handle: this.facts.handle,
      id,
      opts,
    }).then(
      (r) => {
        entry.kvBytes = r.kvBytes;
        if (r.chunk !== chunk) {
          entry.failed = new Error(`stage chunk ${r.chunk} on the GPU thread, ${chunk} here`);
        }
      },
      (e) => {
        entry.failed = e;
      },
    );
    this.#open.set(id, entry);
    return { chunk };
  }

  async #ready(id: string): Promise<void> {
    const o = this.#open.get(id);
    if (!o) throw new Error(`request ${id} is not open on stage ${this.role.index}`);
    await o.opened;
    if (o.failed) throw o.failed;
  }

  async run(id: string, input: StageInput): Promise<StageResult> {
    await this.#ready(id);
    return await this.#call<StageResult>({ op: "run", handle: this.facts.handle, id, input });
  }

  async generate(
    id: string,
    prompt: readonly number[],
    opts: LoopOptions & { signal?: AbortSignal },
  ): Promise<LoopResult> {
    await this.#ready(id);
    const { onTokens, signal, ...rest } = opts;
    const abort = () => void this.#call({ op: "abort", handle: this.facts.handle, id }).catch(() => {});
    signal?.addEventListener("abort", abort, { once: true });
    try {
      return await this.#call<LoopResult>(
        { op: "generate", handle: this.facts.handle, id, prompt: [...prompt], opts: rest },
        (ev) => ev.tokens && onTokens?.(ev.tokens),
      );
    } finally {
      signal?.removeEventListener("abort", abort);
    }
  }

  release(id: string): boolean {
    if (!this.#open.delete(id)) return false;
    // Also ends a generate of `id` on the thread (the engine's release aborts it).
    this.#call({ op: "release", handle: this.facts.handle, id }).catch(() => {});
    return true;
  }

  stats(): StageStats {
    let kvBytes = 0;
    for (const o of this.#open.values()) kvBytes += o.kvBytes;
    return { active: this.#open.size, kvBytes, weightBytes: this.facts.weightBytes };
  }

  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    this.#open.clear();
    const closing = this.thread.call(
      { op: "closeStage", handle: this.facts.handle },
      undefined,
      this.generation,
    )
      .catch(() => {});
    this.thread.drop(closing, this.generation, this.facts.handle);
  }

  #call<T>(r: GpuRequest, onEvent?: Pending["onEvent"]): Promise<T> {
    if (this.#closed) return Promise.reject(new Error(`stage ${this.role.index} is closed`));
    return this.thread.call<T>(r, onEvent, this.generation);
  }
}

/** Expert hosts loaded on the GPU thread. */
class ThreadExperts implements ExpertService {
  #closed = false;
  constructor(
    private readonly thread: GpuThread,
    private readonly generation: number,
    private readonly handle: number,
    readonly hidden: number,
    readonly weightBytes: number,
    private readonly holds: Map<number, number[]>,
  ) {}

  held(): Map<number, number[]> {
    return new Map(this.holds);
  }

  compute(layer: number, input: ExpertInput): Promise<Float32Array> {
    if (this.#closed) return Promise.reject(new Error("the expert host is closed"));
    return this.thread.call<Float32Array>(
      { op: "compute", handle: this.handle, layer, input },
      undefined,
      this.generation,
    );
  }

  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    const closing = this.thread.call({ op: "closeExperts", handle: this.handle }, undefined, this.generation)
      .catch(() => {});
    this.thread.drop(closing, this.generation);
  }
}

/** The StageLoader that loads onto the process's GPU thread (models/engine.ts loadStage, there). */
export const threadStageLoader: StageLoader = async (role, opts) => {
  const thread = gpuThread();
  const generation = thread.hold(); // the stage's, from here on
  try {
    const facts = await thread.call<StageFacts>(
      {
        op: "stage",
        role,
        model: { dir: opts.model.dir, weights: opts.model.weights, kv: opts.model.kv },
        remote: opts.experts?.remote,
        fanout: opts.experts !== undefined,
      },
      (ev) => ev.progress && opts.onProgress?.(...ev.progress),
      generation,
    );
    if (opts.experts) thread.fanout(facts.handle, opts.experts.fanout);
    return new ThreadStage(role, thread, generation, facts);
  } catch (e) {
    thread.drop(Promise.resolve(), generation);
    throw e;
  }
};

/** The ExpertLoader that loads onto the process's GPU thread (models/engine.ts loadExpertHost, there). */
export const threadExpertLoader: ExpertLoader = async (hold, opts) => {
  const thread = gpuThread();
  const generation = thread.hold(); // the host's, from here on
  try {
    const r = await thread.call<
      { handle: number; hidden: number; weightBytes: number; held: [number, number[]][] }
    >(
      { op: "experts", hold: [...hold], model: { dir: opts.model.dir, weights: opts.model.weights } },
      undefined,
      generation,
    );
    return new ThreadExperts(thread, generation, r.handle, r.hidden, r.weightBytes, new Map(r.held));
  } catch (e) {
    thread.drop(Promise.resolve(), generation);
    throw e;
  }
};
