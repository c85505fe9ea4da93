// A deterministic stand-in for a model, in plain integer arithmetic, so the chain logic (several requests,
// duplicates, cancellation, a stage dying) is tested fast and without a GPU. Every value stays a small
// integer (< 1021), exact in f16, so a chain's output equals the whole fake model's output exactly, and
// each layer keeps a per-request running state (its "KV cache"), so mixing requests up shows.
import type {
  LoopOptions,
  LoopResult,
  ModelFacts,
  OpenOptions,
  Sampling,
  StageBackend,
  StageInput,
  StageResult,
  StageRole,
  StageStats,
} from "./backend.ts";

export interface FakeBackendOptions {
  /** Hidden width (default 4). */
  hidden?: number;
  /** Vocabulary size (default 64). */
  vocab?: number;
  /** Most positions (default 4096). */
  maxPositions?: number;
  /** Default [vocab - 1]. */
  eosTokenIds?: number[];
  /** Waits this long in every run, to let requests interleave (default 0). */
  delayMs?: number;
  /** Most tokens per step (default 8, so prompts of tests span several chunks). */
  chunk?: number;
  /**
   * Offer the decode loop (`generate`) as the engine does for a whole model, reporting tokens in batches
   * of this size (default 0: no loop, so a one-stage chain runs step by step).
   */
  loopBatch?: number;
}

const M = 1021;

interface Seq {
  maxSeq: number;
  sampling: Sampling;
  /** Per layer, the running state [hidden]. */
  kv: Int32Array[];
}

export class FakeBackend implements StageBackend {
  readonly model: ModelFacts;
  readonly #seqs = new Map<string, Seq>();
  readonly #o: Required<FakeBackendOptions>;
  /** Every run, for tests: request id and step input. */
  readonly runs: { id: string; pos0: number; T: number; output: string }[] = [];

  constructor(readonly role: StageRole, opts: FakeBackendOptions = {}) {
    const vocab = opts.vocab ?? 64;
    this.#o = {
      hidden: opts.hidden ?? 4,
      vocab,
      maxPositions: opts.maxPositions ?? 4096,
      eosTokenIds: opts.eosTokenIds ?? [vocab - 1],
      delayMs: opts.delayMs ?? 0,
      chunk: opts.chunk ?? 8,
      loopBatch: opts.loopBatch ?? 0,
    };
    if (this.#o.loopBatch > 0) this.generate = (id, prompt, o) => this.#loop(id, prompt, o);
    this.model = {
      hidden: this.#o.hidden,
      vocab,
      maxPositions: this.#o.maxPositions,
      eosTokenIds: this.#o.eosTokenIds,
    };
  }

  open(id: string, opts: OpenOptions): { chunk: number } {
    if (this.#seqs.has(id)) throw new TypeError(`request ${id} is already open on this stage`);
    if (opts.maxSeq > this.#o.maxPositions) {
      throw new RangeError(
        `context of ${opts.maxSeq} tokens exceeds the model's ${this.#o.maxPositions} positions`,
      );
    }
    const layers = this.role.layers[1] - this.role.layers[0];
    this.#seqs.set(id, {
      maxSeq: opts.maxSeq,
      sampling: opts.sampling,
      kv: Array.from({ length: layers }, () => new Int32Array(this.#o.hidden)),
    });
    return { chunk: this.#o.chunk };
  }

  async run(id: string, input: StageInput): Promise<StageResult> {
    const seq = this.#seqs.get(id);
    if (!seq) throw new Error(`request ${id} is not open on stage ${this.role.index}`);
    if (this.#o.delayMs > 0) await new Promise((r) => setTimeout(r, this.#o.delayMs));
    if (!this.#seqs.has(id)) throw new Error(`request ${id} was released during its step`);
    this.runs.push({ id, pos0: input.pos0, T: input.T, output: input.output });
    const H = this.#o.hidden;
    const { T } = input;
    if (input.pos0 + T > seq.maxSeq) throw new RangeError(`position ${input.pos0 + T} beyond ${seq.maxSeq}`);
    const x = new Int32Array(T * H);
    if (this.role.embeds) {
      if (!input.tokens || input.tokens.length !== T) {
        throw new TypeError("embedding stage needs T token ids");
      }
      for (let t = 0; t < T; t++) {
        for (let j = 0; j < H; j++) x[t * H + j] = (input.tokens[t] * 7 + j * 13) % M;
      }
    } else {
      if (!input.hidden || input.hidden.length !== T * H) {
        throw new TypeError("stage needs [T, hidden] input");
      }
      for (let i = 0; i < T * H; i++) x[i] = Math.round(input.hidden[i]);
    }
    for (let li = 0; li < seq.kv.length; li++) {
      const l = this.role.layers[0] + li;
      const kv = seq.kv[li];
      for (let t = 0; t < T; t++) {
        for (let j = 0; j < H; j++) {
          const v = (x[t * H + j] * 3 + kv[j] + l + j) % M;
          x[t * H + j] = v;
          kv[j] = (kv[j] + v) % M;
        }
      }
    }
    if (input.output === "hidden") return { hidden: Float32Array.from(x) };
    if (!this.role.head) throw new Error("this stage has no head");
    const V = this.#o.vocab;
    const score = (t: number) => {
      let s = 0;
      for (let j = 0; j < H; j++) s += x[t * H + j] * (j + 1);
      return s;
    };
    if (input.output === "logits") {
      const logits = new Float32Array(T * V);
      for (let t = 0; t < T; t++) for (let v = 0; v < V; v++) logits[t * V + v] = (score(t) + v * 31) % 97;
      return { logits };
    }
    const base = score(T - 1);
    const tokOut = input.pos0 + T;
    const token = seq.sampling.temperature <= 0 ? base % V : (base + seq.sampling.seed + tokOut) % V;
    return { token };
  }

  generate?: (id: string, prompt: readonly number[], opts: LoopOptions) => Promise<LoopResult>;

  /** The loop as the engine runs it: prefill, then tokens reported in batches; stops when released. */
  async #loop(id: string, prompt: readonly number[], o: LoopOptions): Promise<LoopResult> {
    let token = -1;
    for (let p = 0; p < prompt.length; p += this.#o.chunk) {
      const T = Math.min(this.#o.chunk, prompt.length - p);
      const last = p + T >= prompt.length;
      const tokens = Uint32Array.from(prompt.slice(p, p + T));
      const r = await this.run(id, { pos0: p, T, tokens, output: last ? "sample" : "hidden" });
      if (last) token = r.token!;
    }
    const out = [token];
    let batch = [token];
    while (out.length < o.maxTokens && !o.eos.includes(token)) {
      if (!this.#seqs.has(id)) return { tokens: out, stopReason: "aborted" };
      if (batch.length >= this.#o.loopBatch) {
        o.onTokens?.(batch);
        batch = [];
      }
      const pos = prompt.length + out.length - 1;
      token = (await this.run(id, { pos0: pos, T: 1, tokens: Uint32Array.of(token), output: "sample" }))
        .token!;
      out.push(token);
      batch.push(token);
    }
    o.onTokens?.(batch);
    return { tokens: out, stopReason: o.eos.includes(token) ? "eos" : "max_tokens" };
  }

  release(id: string): boolean {
    return this.#seqs.delete(id);
  }

  stats(): StageStats {
    let kvBytes = 0;
    for (const s of this.#seqs.values()) kvBytes += s.kv.length * s.maxSeq * this.#o.hidden * 8;
    return { active: this.#seqs.size, kvBytes, weightBytes: 0 };
  }

  close(): void {
    this.#seqs.clear();
  }
}

/** The fake model's output run whole on one stage (what any chain of fake stages must reproduce). */
export async function fakeReference(
  prompt: number[],
  opts: { layers: number; maxTokens: number; sampling?: Sampling } & FakeBackendOptions,
): Promise<number[]> {
  const b = new FakeBackend(
    { index: 0, stages: 1, layers: [0, opts.layers], embeds: true, head: true },
    opts,
  );
  const sampling = opts.sampling ?? { temperature: 0, topP: 1, seed: 0 };
  const maxSeq = prompt.length + opts.maxTokens;
  const { chunk } = b.open("ref", { maxSeq, sampling });
  let token = -1;
  for (let p = 0; p < prompt.length; p += chunk) {
    const T = Math.min(chunk, prompt.length - p);
    const last = p + T >= prompt.length;
    const r = await b.run("ref", {
      pos0: p,
      T,
      tokens: Uint32Array.from(prompt.slice(p, p + T)),
      output: last ? "sample" : "hidden",
    });
    if (last) token = r.token!;
  }
  const out = [token];
  while (out.length < opts.maxTokens && !b.model.eosTokenIds.includes(token)) {
    const pos = prompt.length + out.length - 1;
    token = (await b.run("ref", { pos0: pos, T: 1, tokens: Uint32Array.of(token), output: "sample" })).token!;
    out.push(token);
  }
  return out;
}
