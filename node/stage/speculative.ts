// Speculative decoding across the chain, the requesting side (docs/SPECULATIVE.md). The client drafts on
// its own node and keeps up to `depth` verification chunks in flight: each chunk is the token the sequence
// stands on (or, pipelined, the drafter's guess of the previous chunk's next token) followed by k drafts,
// run as one multi-token step through every stage; the head keeps the agreeing prefix plus its own next
// token and answers with a VERDICT. A chunk behind one that was cut short no longer continues the sequence:
// the client forgets it at once (the head drops it on arrival) and drafts again from what was decided.
import type { Drafter } from "../../models/speculative.ts";
import { clipTokens } from "../../models/speculative.ts";
import type { HopTrace, PipeMessage } from "./messages.ts";
import { SpeculationTuner } from "../../planner/speculative.ts";

export interface SpeculateOptions {
  drafter: Drafter;
  /** Drafted tokens per chunk (>= 1). */
  k: number;
  /** Verification chunks in flight at once (default 1: draft again only after each verdict). */
  depth?: number;
  /**
   * Choose k (up to 16, starting at `k`) and the depth (up to `depth`) for each new chunk from what this
   * request measured so far: acceptance, trip time, drafting time, a verification step's cost per token
   * (planner/speculative.ts chooseSpeculation). Default false: k and depth as given.
   */
  auto?: boolean;
}

/** A node's drafters for the requests it originates (`up --model DIR --draft ...`). */
export interface SpeculationSource {
  /** A fresh drafter for one request of at most `maxSeq` positions (closed when the request ends). */
  drafter(maxSeq: number): Drafter;
  /** What drafts: "ngram", or the draft model's folder (absolute). */
  draft: string;
  /** Drafted tokens per chunk when a request does not say. */
  k: number;
  /** Chunks in flight (with `auto`, the most). */
  depth: number;
  /** Choose k and depth per chunk from the request's measurements (`--speculate auto`). */
  auto?: boolean;
}

/** One verification pass through the chain, for the trace and the report. */
export interface Trip {
  chunk: number;
  pos0: number;
  /** Drafted tokens in the chunk (its first token is not a draft unless pipelined). */
  drafted: number;
  /** Drafts kept; -1 for a chunk dropped because an earlier one was cut short. */
  accepted: number;
  /** Chunks allowed in flight when this one was sent (`auto` changes it). */
  depth: number;
  /** When drafting started (epoch ms) and how long it took. */
  draftAt: number;
  draftMs: number;
  /** The verdict's per-stage record (absent for a chunk the client gave up before its verdict). */
  trace?: HopTrace[];
}

interface Chunk {
  chunk: number;
  pos0: number;
  tokens: number[];
  trip: Trip;
}

/** The client's state for one speculative request; the client feeds it messages and sends what it asks. */
export class Speculation {
  readonly trips: Trip[] = [];
  /** Passes that decided tokens (the prefill's included), drafts sent and kept, chunks dropped. */
  stats = { trips: 0, drafted: 0, acceptedDrafts: 0, rejections: 0, cancelled: 0 };
  #o: Required<SpeculateOptions>;
  /** k and depth for the next chunk (the options', or chosen as the request goes when `auto`). */
  #k: number;
  #depth: number;
  /** `auto`: what the request measured, and when each chunk was sent. */
  #tuner: SpeculationTuner | undefined;
  #sentAt = new Map<number, number>();
  /** The prompt and every token decided so far. */
  #decided: number[];
  /** `decided` plus the tokens of the chunks in flight (drafted, not yet verified). */
  #assumed: number[] = [];
  #inflight: Chunk[] = [];
  #nextChunk = 0;
  /** Bumped whenever the chunks in flight are given up, so a draft made meanwhile is not sent. */
  #epoch = 0;
  #drafting: Promise<void> = Promise.resolve();
  #finished = false;
  #generated = 0;
  #end: { maxTokens: number; eos: ReadonlySet<number> };
  #prompt: number;

  constructor(
    prompt: readonly number[],
    opts: SpeculateOptions & { maxTokens: number; eos: readonly number[] },
    private readonly io: {
      /** Sends a VERIFY to stage 0. */
      send(m: Extract<PipeMessage, { type: "verify" }>): void;
      /** Tells every stage that the chunks numbered below `before` still in flight are void. */
      cancel?(before: number): void;
      /** Newly decided tokens, with the trace of the pass that decided them. */
      emit(tokens: number[], trace: HopTrace[], done?: "eos" | "max_tokens"): void;
      fail(e: Error): void;
    },
  ) {
    if (!(Number.isInteger(opts.k) && opts.k >= 1)) {
      throw new RangeError(`speculate k must be >= 1, got ${opts.k}`);
    }
    const depth = opts.depth ?? 1;
    if (!(Number.isInteger(depth) && depth >= 1)) throw new RangeError(`depth must be >= 1, got ${depth}`);
    this.#o = { drafter: opts.drafter, k: opts.k, depth, auto: opts.auto ?? false };
    this.#k = opts.k;
    this.#depth = opts.auto ? 1 : depth;
    if (opts.auto) this.#tuner = new SpeculationTuner({ maxDepth: depth });
    this.#decided = [...prompt];
    this.#prompt = prompt.length;
    this.#end = { maxTokens: opts.maxTokens, eos: new Set(opts.eos) };
  }

  /** The prefill's token (the head's TOKEN): the first decided token; drafting starts. */
  onToken(m: Extract<PipeMessage, { type: "token" }>): void {
    if (this.#generated > 0 || this.#finished) return;
    this.stats.trips++;
    if (this.#decide([m.token], m.trace)) this.#reset();
  }

  onVerdict(m: Extract<PipeMessage, { type: "verdict" }>): void {
    const c = this.#inflight[0];
    if (this.#finished || !c || c.chunk !== m.chunk) return; // given up already, or a duplicate
    this.#inflight.shift();
    c.trip.trace = m.trace;
    if (m.stale) { // the head saw a chunk not continuing the sequence (the client would have dropped it)
      c.trip.accepted = -1;
      this.stats.cancelled++;
      return this.#reset();
    }
    c.trip.accepted = m.accepted;
    this.stats.trips++;
    this.stats.drafted += c.trip.drafted;
    this.stats.acceptedDrafts += m.accepted;
    if (m.accepted < c.trip.drafted) this.stats.rejections++;
    if (this.#tuner) this.#measure(c, m);
    if (!this.#decide(m.tokens, m.trace)) return;
    const next = this.#inflight[0];
    const at = this.#decided.length - 1;
    if (next && !(next.pos0 === at && next.tokens[0] === this.#decided[at])) {
      for (const g of this.#inflight) g.trip.accepted = -1;
      this.stats.cancelled += this.#inflight.length;
      return this.#reset();
    }
    if (!next) { // nothing behind: draft on from the decided tokens (a draft under way is redone)
      this.#epoch++;
      this.#assumed = [...this.#decided];
    }
    this.#refill();
  }

  /** `auto`: records a verdict's costs (planner/speculative.ts SpeculationTuner); picks k and depth. */
  #measure(c: Chunk, m: Extract<PipeMessage, { type: "verdict" }>): void {
    const sent = this.#sentAt.get(c.chunk);
    this.#sentAt.delete(c.chunk);
    if (sent === undefined) return;
    this.#tuner!.verified({
      T: c.tokens.length,
      computeMs: m.trace.reduce((a, h) => a + h.c, 0),
      roundTripMs: performance.now() - sent,
      kept: m.accepted,
      rejected: m.accepted < c.trip.drafted,
    });
    ({ k: this.#k, depth: this.#depth } = this.#tuner!.choose());
  }

  /** Stops drafting (the request ended). */
  stop(): void {
    this.#finished = true;
  }

  /** Appends decided tokens (clipped at eos / max tokens); false once the request is finished. */
  #decide(tokens: number[], trace: HopTrace[]): boolean {
    const { keep, done } = clipTokens(tokens, this.#generated, this.#end);
    this.#generated += keep.length;
    this.#decided.push(...keep);
    if (done) this.#finished = true;
    this.io.emit(keep, trace, done);
    return !done;
  }

  /** Forgets every chunk in flight and drafts again from the decided tokens. */
  #reset(): void {
    this.#epoch++;
    // The stages skip the dropped chunks they have not run yet (CANCEL: every chunk before the next one).
    if (this.#inflight.length > 0) this.io.cancel?.(this.#nextChunk);
    this.#inflight.length = 0;
    this.#assumed = [...this.#decided];
    this.#refill();
  }

  #refill(): void {
    this.#drafting = this.#drafting.then(() => this.#fill()).catch((e) => {
      this.#finished = true;
      this.io.fail(e as Error);
    });
  }

  /** Drafts and sends chunks until `depth` are in flight. */
  async #fill(): Promise<void> {
    const { drafter } = this.#o;
    while (!this.#finished && this.#inflight.length < this.#depth) {
      const k = this.#k;
      const epoch = this.#epoch;
      const last = this.#inflight.at(-1);
      const pos0 = last ? last.pos0 + last.tokens.length : this.#decided.length - 1;
      // A chunk's last row decides the token after it: none past the request's last token.
      const room = this.#prompt + this.#end.maxTokens - 1 - pos0;
      const T = Math.min(k + 1, room);
      if (T < 1) return;
      const need = pos0 + T - this.#assumed.length;
      const draftAt = performance.timeOrigin + performance.now();
      const t0 = performance.now();
      const drafts = need > 0 ? (await drafter.draft(this.#assumed, need)).slice(0, need) : [];
      const draftMs = performance.now() - t0;
      if (epoch !== this.#epoch || this.#finished) continue; // a verdict cut the chunks short meanwhile
      this.#assumed.push(...drafts);
      const tokens = this.#assumed.slice(pos0, pos0 + T);
      if (tokens.length === 0) return; // pipelined, and the drafter has no guess: wait for the verdict
      const chunk = this.#nextChunk++;
      const trip: Trip = {
        chunk,
        pos0,
        drafted: tokens.length - 1,
        accepted: -1,
        depth: this.#depth,
        draftAt,
        draftMs,
      };
      this.trips.push(trip);
      this.#inflight.push({ chunk, pos0, tokens, trip });
      this.#sentAt.set(chunk, performance.now());
      this.#tuner?.drafted(drafts.length, draftMs);
      this.io.send({ type: "verify", id: "", chunk, pos0, tokens: Uint32Array.from(tokens) });
      if (tokens.length < T) return; // the drafter ran out: nothing to pipeline behind this chunk
    }
  }
}
