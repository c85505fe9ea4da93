// Speculative decoding, the model side (docs/SPECULATIVE.md): drafters that propose the next tokens cheaply,
// the acceptance rule that keeps a verified prefix of them, and the single-node loop. The chain's side
// (one verification step through every stage, several in flight) is in node/stage/ and uses the same rule.
//
// The acceptance rule. Our drafters are deterministic (a greedy draft model, n-gram lookup): the draft
// distribution q is a point mass on the drafted token d. The standard speculative-sampling rule (Leviathan
// et al. 2023, Chen et al. 2023) then accepts d with probability min(1, p(d) / q(d)) = p(d) and, on
// rejection, samples from max(0, p - q) normalised = p without d. Drawing b ~ p and keeping d iff b == d
// has exactly that law (P(keep) = p(d); given b != d, b ~ p restricted to tokens != d), so that is what
// `verifyRows` does, with b drawn exactly as the plain sampler draws it (kernels/sample.ts: the same
// temperature and top-p rule and the uniform number hashed from (seed, position)). So the output's
// distribution is the target's, and with a seed it is the very sequence plain sampling gives, up to the
// float rounding of a multi-token step against a one-token step; greedy (temperature 0) is argmax.
import { sampleRef } from "../kernels/sample.ts";
import type { Sampling, StageBackend } from "./backend.ts";
import { RequestError } from "./errors.ts";
import { SpeculationTuner } from "../planner/speculative.ts";

/** What the target decided for one verification step. */
export interface Verdict {
  /** How many of the drafted tokens it kept (a prefix). */
  accepted: number;
  /** The token after the kept prefix: the target's own (a correction, or the bonus after all k). */
  next: number;
}

/**
 * Verifies drafts against the logits of one step of T = drafts + 1 tokens at positions pos0 .. pos0 + T - 1
 * (the last committed token, then the drafts): row j is the target's next-token logits at position
 * pos0 + j, which decide position pos0 + j + 1. Keeps drafts[j] while the target's own token there equals
 * it; the first difference (or the row after the last draft) gives `next`.
 */
export function verifyRows(
  rows: Float32Array,
  vocab: number,
  drafts: readonly number[],
  sampling: Sampling,
  pos0: number,
): Verdict {
  if (rows.length < (drafts.length + 1) * vocab) {
    throw new RangeError(
      `verification needs ${drafts.length + 1} rows of ${vocab} logits, got ${rows.length}`,
    );
  }
  for (let j = 0; j <= drafts.length; j++) {
    const row = rows.subarray(j * vocab, (j + 1) * vocab);
    const b = targetToken(row, sampling, pos0 + j + 1);
    if (j === drafts.length || b !== drafts[j]) return { accepted: j, next: b };
  }
  throw new Error("unreachable");
}

/** The target's token for position `tokOut` from its logits: the plain sampler's rule, on the CPU. */
export function targetToken(row: Float32Array, sampling: Sampling, tokOut: number): number {
  let finite = true;
  for (let i = 0; i < row.length && finite; i++) finite = Number.isFinite(row[i]);
  if (!finite) {
    throw new Error(
      "the model produced non-finite logits (NaN or Inf) in a verification step: its weights or config.json " +
        "are likely corrupt",
    );
  }
  return sampleRef(row, { ...sampling, tokOut });
}

/** Greedy steps with an Engine read back k argmax ids (GPU-side), sampled ones every row's logits. */
type VerifyingBackend = StageBackend & {
  verify?(
    id: string,
    pos0: number,
    tokens: Uint32Array,
    output: "argmax",
  ): Promise<Uint32Array | Float32Array>;
};

async function verifyStep(
  backend: VerifyingBackend,
  id: string,
  pos0: number,
  tokens: Uint32Array,
  drafts: readonly number[],
  sampling: Sampling,
): Promise<Verdict> {
  if (sampling.temperature === 0 && backend.verify) {
    const best = await backend.verify(id, pos0, tokens, "argmax");
    let j = 0;
    while (j < drafts.length && best[j] === drafts[j]) j++;
    return { accepted: j, next: best[j] };
  }
  const rows = (await backend.run(id, { pos0, T: tokens.length, tokens, output: "logits" })).logits!;
  return verifyRows(rows, backend.model.vocab, drafts, sampling, pos0);
}

/** Proposes the tokens that follow a context. Deterministic for a given context (see the rule above). */
export interface Drafter {
  /** Short name for reports ("ngram", "model", ...). */
  readonly kind: string;
  /** Up to `k` tokens to follow `context` (the prompt and every token so far, plus assumed ones). */
  draft(context: readonly number[], k: number): Promise<number[]>;
  /**
   * For a drafter that reads the target's hidden states (models/mtp.ts): the single-node loop calls it after
   * every target step of request `request`, which decided positions pos0 .. pos0 + next.length - 1 (the
   * step's first rows) and the tokens `next` that follow them, before the target's next step.
   */
  observe?(request: string, pos0: number, next: readonly number[]): Promise<void>;
  /** Frees what the drafter holds (a draft model's sequence). */
  close(): void;
}

/**
 * Prompt lookup (n-gram matching): the token that followed the latest earlier occurrence of the context's
 * longest suffix of at most `maxN` tokens, repeated for each drafted token. Needs no model; pays off on
 * text that repeats its context (code edits, quoting, extraction, loops). Drafts nothing when nothing
 * matches.
 */
export class NgramDrafter implements Drafter {
  readonly kind = "ngram";
  constructor(readonly maxN = 3) {
    if (!(Number.isInteger(maxN) && maxN >= 1)) {
      throw new RangeError(`n-gram length must be >= 1, got ${maxN}`);
    }
  }

  draft(context: readonly number[], k: number): Promise<number[]> {
    const seq = [...context];
    const out: number[] = [];
    while (out.length < k) {
      const t = lookup(seq, this.maxN);
      if (t === undefined) break;
      seq.push(t);
      out.push(t);
    }
    return Promise.resolve(out);
  }

  close(): void {}
}

/** The token after the latest earlier occurrence of `seq`'s longest matching suffix (n = maxN .. 1). */
function lookup(seq: readonly number[], maxN: number): number | undefined {
  const L = seq.length;
  for (let n = Math.min(maxN, L - 1); n >= 1; n--) {
    for (let end = L - 1; end >= n; end--) { // candidate match seq[end - n .. end), followed by seq[end]
      let i = 0;
      while (i < n && seq[end - n + i] === seq[L - n + i]) i++;
      if (i === n) return seq[end];
    }
  }
  return undefined;
}

/**
 * A draft model (any family the engine runs, whole on this node) decoding greedily in its own sequence.
 * It keeps the KV of the context it has seen and recomputes only from where a new context differs (after
 * a rejection). The target itself works too (its own perfect draft: every draft accepted).
 */
export class ModelDrafter implements Drafter {
  readonly kind = "model";
  #backend: StageBackend;
  #id: string;
  #chunk: number;
  /** Tokens whose KV the draft sequence holds, by position. */
  #fed: number[] = [];
  #maxSeq: number;

  /** Opens a sequence of `maxSeq` positions on `backend` (a whole model: it embeds and has the head). */
  constructor(backend: StageBackend, opts: { maxSeq: number; vocab: number }) {
    if (!backend.role.embeds || !backend.role.head) throw new TypeError("a draft model must be whole");
    if (backend.model.vocab !== opts.vocab) {
      throw new RequestError(
        `the draft model's vocabulary has ${backend.model.vocab} tokens, the target's ${opts.vocab}: ` +
          `a draft model must share the target's vocabulary`,
      );
    }
    if (opts.maxSeq > backend.model.maxPositions) {
      throw new RequestError(
        `the draft model holds ${backend.model.maxPositions} positions; this request needs ${opts.maxSeq}`,
      );
    }
    this.#backend = backend;
    this.#maxSeq = opts.maxSeq;
    this.#id = `draft-${crypto.randomUUID().slice(0, 8)}`;
    this.#chunk = backend.open(this.#id, {
      maxSeq: opts.maxSeq,
      sampling: { temperature: 0, topP: 1, seed: 0 },
    }).chunk;
  }

  async draft(context: readonly number[], k: number): Promise<number[]> {
    if (k <= 0 || context.length === 0) return [];
    let L = 0;
    while (L < this.#fed.length && L < context.length - 1 && this.#fed[L] === context[L]) L++;
    this.#fed.length = L;
    const out: number[] = [];
    let next = -1;
    for (let pos0 = L; pos0 < context.length; pos0 += this.#chunk) { // catch up on the new context
      const T = Math.min(this.#chunk, context.length - pos0);
      const last = pos0 + T >= context.length;
      const tokens = Uint32Array.from(context.slice(pos0, pos0 + T));
      const r = await this.#backend.run(this.#id, { pos0, T, tokens, output: last ? "sample" : "hidden" });
      this.#fed.push(...tokens);
      if (last) next = r.token!;
    }
    out.push(next);
    while (out.length < k && this.#fed.length + 1 < this.#maxSeq) {
      const pos0 = this.#fed.length;
      const r = await this.#backend.run(this.#id, {
        pos0,
        T: 1,
        tokens: Uint32Array.of(next),
        output: "sample",
      });
      this.#fed.push(next);
      next = r.token!;
      out.push(next);
    }
    return out;
  }

  close(): void {
    this.#backend.release(this.#id);
  }
}

/**
 * Replaces each drafted token, with probability `p`, by another token (seeded): a draft whose agreement
 * with the target is controlled, for tests and benchmarks (`--draft-noise P`). Acceptance then is at most
 * (1 - p) per token.
 */
export class NoisyDrafter implements Drafter {
  readonly kind: string;
  #n = 0;
  constructor(
    readonly inner: Drafter,
    readonly p: number,
    readonly opts: { vocab: number; seed: number },
  ) {
    if (!(p >= 0 && p <= 1)) throw new RangeError(`draft noise must be in [0, 1], got ${p}`);
    this.kind = `${inner.kind}+noise ${p}`;
  }

  observe(request: string, pos0: number, next: readonly number[]): Promise<void> {
    return this.inner.observe?.(request, pos0, next) ?? Promise.resolve();
  }

  async draft(context: readonly number[], k: number): Promise<number[]> {
    const d = await this.inner.draft(context, k);
    return d.map((t) => {
      if (uniform(this.opts.seed, this.#n++) >= this.p) return t;
      return (t + 1 + Math.floor(uniform(this.opts.seed ^ 0x5bd1e995, this.#n) * (this.opts.vocab - 1))) %
        this.opts.vocab;
    });
  }

  close(): void {
    this.inner.close();
  }
}

/** A uniform number in [0, 1) from (seed, i): a PCG hash, as the sampler's. */
export function uniform(seed: number, i: number): number {
  const pcg = (v: number) => {
    const state = (Math.imul(v >>> 0, 747796405) + 2891336453) >>> 0;
    const word = Math.imul(((state >>> ((state >>> 28) + 4)) ^ state) >>> 0, 277803737) >>> 0;
    return ((word >>> 22) ^ word) >>> 0;
  };
  return (pcg(pcg(seed >>> 0) ^ pcg((i + 0x7f4a7c15) >>> 0)) >>> 8) / 16777216;
}

/** What speculation did for one request. */
export interface SpeculationStats {
  /** Passes through the model (the chain): the prefill's, then one per verification step. */
  trips: number;
  /** Drafted tokens sent for verification, and how many of them were kept. */
  drafted: number;
  acceptedDrafts: number;
  /** Verification steps that rejected a draft (the others kept all theirs). */
  rejections: number;
}

/**
 * The per-token acceptance rate: the probability that a draft is kept given the ones before it were, as
 * the cost model uses it (planner/speculative.ts), estimated as kept / (kept + rejections) (each step
 * keeps a prefix, ended by at most one rejection). Lower than kept / drafted, which also counts the drafts
 * behind a rejection that were never judged.
 */
export function acceptanceRate(s: SpeculationStats): number | null {
  const judged = s.acceptedDrafts + s.rejections;
  return judged > 0 ? s.acceptedDrafts / judged : null;
}

/** Speculation's figures as `--json` reports them. */
export function speculationJson(s: SpeculationStats, generated: number, drafter: string, k: number | "auto") {
  return {
    draft: drafter,
    speculate: k,
    trips: s.trips,
    accepted_per_trip: s.trips > 0 ? round(generated / s.trips) : 0,
    drafted: s.drafted,
    accepted_drafts: s.acceptedDrafts,
    acceptance: acceptanceRate(s) === null ? null : round(acceptanceRate(s)!),
  };
}

const round = (x: number) => Math.round(x * 1000) / 1000;

/**
 * Clips newly decided tokens to a request's end: after an eos id (kept) or at `maxTokens` in all.
 * Returns the tokens to keep and whether the request is finished.
 */
export function clipTokens(
  fresh: readonly number[],
  sofar: number,
  o: { maxTokens: number; eos: ReadonlySet<number> | readonly number[] },
): { keep: number[]; done?: "eos" | "max_tokens" } {
  const eos = o.eos instanceof Set ? o.eos : new Set(o.eos as readonly number[]);
  const keep: number[] = [];
  for (const t of fresh) {
    if (sofar + keep.length >= o.maxTokens) return { keep, done: "max_tokens" };
    keep.push(t);
    if (eos.has(t)) return { keep, done: "eos" };
  }
  return { keep, done: sofar + keep.length >= o.maxTokens ? "max_tokens" : undefined };
}

export interface SpeculativeOptions {
  /** Drafted tokens per verification step (>= 1; with `auto`, the first step's). */
  k: number;
  /** Choose k for each step from what this request measured (planner/speculative.ts SpeculationTuner). */
  auto?: boolean;
  maxTokens: number;
  eos: readonly number[];
  sampling: Sampling;
  signal?: AbortSignal;
  /** Called with each step's new tokens as soon as they are decided. */
  onTokens?: (ids: number[]) => void;
  /** Called after each verification step (for the trace): drafting and verifying ms, drafted, kept. */
  onTrip?: (t: { draftMs: number; verifyMs: number; drafted: number; accepted: number }) => void;
}

export interface SpeculativeResult extends SpeculationStats {
  tokens: number[];
  stopReason: "eos" | "max_tokens" | "aborted";
  promptTokens: number;
  firstTokenMs: number;
  tokS: number;
}

/**
 * One node: prefill, then draft k tokens, verify them in one step of k + 1 tokens (output: every row's
 * logits), keep the agreeing prefix plus the target's next token, drop the rejected positions, repeat.
 * `backend` must be whole (embeds and has the head) and position-indexed (Engine: truncate).
 */
export async function speculativeGenerate(
  backend: StageBackend & { truncate(id: string, length: number): void },
  drafter: Drafter,
  prompt: readonly number[],
  o: SpeculativeOptions,
): Promise<SpeculativeResult> {
  const P = prompt.length;
  const V = backend.model.vocab;
  const id = `spec-${crypto.randomUUID().slice(0, 8)}`;
  const t0 = performance.now();
  const { chunk } = backend.open(id, { maxSeq: P + o.maxTokens, sampling: o.sampling, prompt: P });
  let k = Math.min(o.k, chunk - 1);
  if (k < 1) throw new RequestError(`a verification step of ${o.k + 1} tokens exceeds this model's steps`);
  const tuner = o.auto ? new SpeculationTuner({ maxK: Math.min(16, chunk - 1), maxDepth: 1 }) : undefined;
  const stats: SpeculationStats = { trips: 1, drafted: 0, acceptedDrafts: 0, rejections: 0 };
  try {
    let first = -1;
    for (let pos0 = 0; pos0 < P; pos0 += chunk) {
      if (o.signal?.aborted) return result([], "aborted", t0, t0, t0);
      const T = Math.min(chunk, P - pos0);
      const last = pos0 + T >= P;
      const tokens = Uint32Array.from(prompt.slice(pos0, pos0 + T));
      const r = await backend.run(id, { pos0, T, tokens, output: last ? "sample" : "hidden" });
      if (last) first = r.token!;
      await drafter.observe?.(id, pos0, [
        ...prompt.slice(pos0 + 1, pos0 + T),
        last ? first : prompt[pos0 + T],
      ]);
    }
    if (first >= V) throw new RangeError(`the sampler returned ${first}: non-finite logits`);
    const firstAt = performance.now();
    const context = [...prompt];
    const out: number[] = [];
    let fresh = [first];
    let lastAt = firstAt;
    while (true) {
      const c = clipTokens(fresh, out.length, { maxTokens: o.maxTokens, eos: o.eos });
      out.push(...c.keep);
      context.push(...c.keep);
      if (c.keep.length) o.onTokens?.(c.keep);
      lastAt = performance.now();
      if (c.done) return result(out, c.done, t0, firstAt, lastAt);
      if (o.signal?.aborted) return result(out, "aborted", t0, firstAt, lastAt);
      const tDraft = performance.now();
      const want = Math.min(k, o.maxTokens - out.length - 1);
      const drafts = want > 0 ? (await drafter.draft(context, want)).slice(0, want) : [];
      const tVerify = performance.now();
      const pos0 = context.length - 1;
      const tokens = Uint32Array.from([context[pos0], ...drafts]);
      const v = await verifyStep(backend, id, pos0, tokens, drafts, o.sampling);
      backend.truncate(id, pos0 + v.accepted + 1); // the rejected drafts' positions
      await drafter.observe?.(id, pos0, [...drafts.slice(0, v.accepted), v.next]);
      stats.trips++;
      stats.drafted += drafts.length;
      stats.acceptedDrafts += v.accepted;
      if (v.accepted < drafts.length) stats.rejections++;
      const verifyMs = performance.now() - tVerify;
      o.onTrip?.({ draftMs: tVerify - tDraft, verifyMs, drafted: drafts.length, accepted: v.accepted });
      if (tuner) { // one node: the step is the whole trip
        tuner.drafted(drafts.length, tVerify - tDraft);
        tuner.verified({
          T: tokens.length,
          computeMs: verifyMs,
          roundTripMs: verifyMs,
          kept: v.accepted,
          rejected: v.accepted < drafts.length,
        });
        k = tuner.choose().k;
      }
      fresh = [...drafts.slice(0, v.accepted), v.next];
    }
  } finally {
    backend.release(id);
  }

  function result(
    tokens: number[],
    stopReason: SpeculativeResult["stopReason"],
    start: number,
    firstAt: number,
    lastAt: number,
  ): SpeculativeResult {
    const span = lastAt - firstAt;
    return {
      tokens,
      stopReason,
      promptTokens: P,
      firstTokenMs: firstAt - start,
      tokS: tokens.length > 1 && span > 0 ? ((tokens.length - 1) / span) * 1000 : 0,
      ...stats,
    };
  }
}
