// The one interface between the node and the model runtime: a stage backend runs a contiguous part of the
// chain (embedding, a layer range, head) for many requests at once, each with its own KV cache. The node
// (node/stage/) never branches on the model family: the decode engine (models/engine.ts) implements this
// for every family, and node/stage/fake_backend.ts implements it with plain integer arithmetic for the
// node tests. models/ does not import node/; node/ imports this file.

import type { ExpertFanout, ExpertInput } from "./experts.ts";

export type { ExpertFanout, ExpertInput };

/** Routed experts held on this node for other nodes' stages (expert parallelism): models/experts.ts. */
export interface ExpertService {
  /** The model's hidden size (rows of the activations it takes and returns). */
  readonly hidden: number;
  /** Layer -> the expert ids held (ascending). */
  held(): Map<number, number[]>;
  /** The weighted sum of the chosen experts held here, [T, H]. */
  compute(layer: number, input: ExpertInput): Promise<Float32Array>;
  readonly weightBytes: number;
  close(): void;
}

/** Loads the experts a node holds (what the Plan gives it). */
export type ExpertLoader = (
  hold: Map<number, number[]>,
  opts: { model: ModelRef },
) => Promise<ExpertService>;

/** What one stage of the chain computes (from the Plan). */
export interface StageRole {
  /** Position in the chain, 0-based. */
  index: number;
  /** Number of stages in the chain. */
  stages: number;
  /** Layers [start, end); may be empty for a stage that only embeds or only runs the head. */
  layers: [number, number];
  /** Embeds token ids (the first stage). */
  embeds: boolean;
  /** Applies the final norm and head and samples (the last stage). */
  head: boolean;
}

/** Sampling parameters, applied by the stage with the head (temperature 0: greedy). */
export interface Sampling {
  temperature: number;
  topP: number;
  seed: number;
}

/** What a step ends with: the hidden state for the next stage, a sampled token, or logits of every row. */
export type StageOutput = "hidden" | "sample" | "logits";

export interface StageInput {
  /** Position of the step's first token. */
  pos0: number;
  /** Tokens in this step (a prefill chunk, or 1 when decoding). */
  T: number;
  /** Token ids at positions pos0..pos0+T (stages that embed). */
  tokens?: Uint32Array;
  /** Hidden state [T, hidden] f32 (stages that do not embed). */
  hidden?: Float32Array;
  /** "sample" and "logits" only on the stage with the head. */
  output: StageOutput;
}

export interface StageResult {
  /** [T, hidden] when output is "hidden". */
  hidden?: Float32Array;
  /** The token sampled for position pos0 + T, when output is "sample". */
  token?: number;
  /** [T, vocab] when output is "logits". */
  logits?: Float32Array;
}

export interface LoopOptions {
  maxTokens: number;
  /** Generation stops after any of these ids (included in the output). */
  eos: readonly number[];
  /** Called with each batch of new token ids as soon as it is read back. */
  onTokens?: (ids: number[]) => void;
}

export interface LoopResult {
  /** Generated ids only. */
  tokens: number[];
  stopReason: "eos" | "max_tokens" | "aborted";
}

export interface StageStats {
  /** Requests holding a sequence (KV cache) on this stage. */
  active: number;
  /** KV cache bytes those requests hold. */
  kvBytes: number;
  /** Weight bytes this stage holds. */
  weightBytes: number;
  /** GPU bytes of released requests' sequences kept for reuse (models/engine.ts SPARES), where any. */
  spareBytes?: number;
  /** Requests that took such a sequence instead of building their own, since the stage loaded. */
  reuses?: number;
}

/** The model facts the chain logic needs (to size requests and check their token ids). */
export interface ModelFacts {
  hidden: number;
  vocab: number;
  /** Most positions a sequence may hold. */
  maxPositions: number;
  eosTokenIds: number[];
}

/** A request's sequence on a stage (StageBackend.open). */
export interface OpenOptions {
  maxSeq: number;
  sampling: Sampling;
  /**
   * Most rows a "logits" step of this request fills (models/model.ts SequenceOptions.logitsRows): default
   * verification's (LOGITS_ROWS); a request for teacher-forced logits asks for its chunk.
   */
  logitsRows?: number;
  /**
   * The prompt's length where the opener knows it (SequenceOptions.prompt): the request's activations are
   * sized for it rather than for a whole chunk, and its steps (`chunk`) are cut at the power of two at or
   * above max(prompt, 32) tokens.
   */
  prompt?: number;
}

export interface StageBackend {
  readonly role: StageRole;
  readonly model: ModelFacts;
  /**
   * Starts request `id`'s sequence; RangeError when maxSeq exceeds the model; TypeError if id is open.
   * Returns the most tokens one step may carry (prefill is cut into chunks of that size).
   */
  open(id: string, opts: OpenOptions): { chunk: number };
  /** Runs one step of request `id` (steps of one request are run one at a time, in order). */
  run(id: string, input: StageInput): Promise<StageResult>;
  /**
   * A backend that embeds and has the head (the whole model) may offer the GPU-resident decode loop:
   * prefill `prompt`, then decode up to `maxTokens`, reporting tokens in batches as they are read back.
   * A one-stage chain uses it instead of one step (and one message) per token. Stops at an eos id
   * (included), at maxTokens, or when the request is released.
   */
  generate?(id: string, prompt: readonly number[], opts: LoopOptions): Promise<LoopResult>;
  /** Frees request `id`'s sequence (teardown); false when it held none. */
  release(id: string): boolean;
  stats(): StageStats;
  /** Releases every sequence and the weights. */
  close(): void;
}

/** Loads the backend for a role; what a node is given to run stages of some model family. */
export type StageLoader = (
  role: StageRole,
  opts: {
    model: ModelRef;
    onProgress?: (done: number, total: number) => void;
    /**
     * Expert parallelism: the MoE layers of this role whose routed experts are held by expert hosts, and
     * how to run them there (one call per layer and step; the node sends to the hosts).
     */
    experts?: { remote: number[]; fanout: ExpertFanout };
  },
) => Promise<StageBackend>;

/** Which model the chain runs and how (travels with the Plan). */
export interface ModelRef {
  /** Checkpoint folder, the same path on every node (or given to `join --model`). */
  dir: string;
  /** Weight storage on the GPU ("f32" | "f16" | "q8" | "q4", or "auto": f16 where the GPU has shader-f16). */
  weights: string;
  /**
   * The KV cache's element type ("f32" | "f16" | "q8"; absent or "auto": each node's default, f16 beside
   * f16 / q8 / q4 weights where the GPU has shader-f16: models/model.ts kvCacheType).
   */
  kv?: string;
}
