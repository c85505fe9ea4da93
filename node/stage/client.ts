// The requesting side of the chain: sends START to stage 0, receives each token (or logits chunk) from the
// last stage on its own actor `client-{node}`, streams them, and on completion, cancellation or failure
// tells every stage to release the request. A request never hangs: a stage's ERROR, the death of a stage's
// node (peerGone), or `stallMs` without a message all end it with a clear error.
import type { Behavior } from "../actors/mod.ts";
import type { Sampling } from "./backend.ts";
import {
  decodePipe,
  encodePipe,
  type HopTrace,
  type OpenParams,
  type PipeMessage,
  type WireDtype,
} from "./messages.ts";
import { stageName } from "./stage_actor.ts";
import { type PrefillTimings, prefillTimings, type TokenTimings, tokenTimings } from "./timings.ts";
import { type SpeculateOptions, Speculation, type Trip } from "./speculative.ts";

/** The chain a request runs on. */
export interface Chain {
  /** Plan version. */
  version: number;
  /** Node id of each stage, in order. */
  nodes: string[];
}

/** What the client needs from the actor system. */
export interface ClientActors {
  spawn(name: string, behavior: Behavior): { stop(): Promise<void> };
  send(name: string, body: Uint8Array, opts?: { channel?: "control" | "data" }): Promise<void>;
}

export interface TokenEvent {
  /** 0-based index of the generated token. */
  index: number;
  token: number;
  /** Milliseconds since the request started. */
  atMs: number;
  timings: TokenTimings;
  /** The raw per-stage record of the step that made this token (for --trace). */
  trace: HopTrace[];
  /** The first token of a chain of several stages: the prompt's prefill, chunk by chunk, averaged. */
  prefill?: PrefillTimings;
}

export interface RequestOptions {
  /** Default 64. */
  maxTokens?: number;
  /** Default greedy. */
  sampling?: Sampling;
  /** Default: none (generation stops at maxTokens). */
  eos?: number[];
  /** Activations on the wire, default "f16". */
  wire?: WireDtype;
  signal?: AbortSignal;
  onToken?: (e: TokenEvent) => void;
}

export interface GenerateOutcome {
  tokens: number[];
  stopReason: "eos" | "max_tokens";
  events: TokenEvent[];
  /** From START to the first token, ms. */
  firstTokenMs: number;
  /** Decode rate after the first token (0 with one token). */
  tokS: number;
}

/** A speculative generation: the outcome, and what speculation did. */
export interface SpeculateOutcome extends GenerateOutcome {
  /** Passes that decided tokens (the prefill's included), drafts sent and kept, chunks dropped. */
  stats: Speculation["stats"];
  /** Every verification chunk sent, in order. */
  trips: Trip[];
}

/** The chain failed (a stage's error, a stage's node died, or nothing came for too long). */
export class PipelineError extends Error {
  override name = "PipelineError";
}

interface Pending {
  id: string;
  chain: Chain;
  started: number;
  last: number;
  onMessage(m: PipeMessage): void;
  fail(e: Error): void;
}

/** Names of client actors (plumbing every node runs to receive its requests' tokens, not a role). */
export const CLIENT_PREFIX = "client-";

export class PipelineClient {
  readonly name: string;
  #actors: ClientActors;
  #self: string;
  #stallMs: number;
  #pending = new Map<string, Pending>();
  #ref: { stop(): Promise<void> };
  #next = 1;
  #timer: ReturnType<typeof setInterval>;

  /** Spawns `client-{first 16 characters of self}`. `stallMs` (default 30 000): fail a request after this long without a message. */
  constructor(actors: ClientActors, self: string, opts: { stallMs?: number } = {}) {
    this.#actors = actors;
    this.#self = self;
    this.#stallMs = opts.stallMs ?? 30_000;
    this.name = `${CLIENT_PREFIX}${self.slice(0, 16)}`;
    this.#ref = actors.spawn(this.name, {
      receive: (body) => {
        let m: PipeMessage;
        try {
          m = decodePipe(body);
        } catch {
          return;
        }
        if ("id" in m) this.#pending.get(m.id)?.onMessage(m);
      },
    });
    this.#timer = setInterval(() => this.#checkStalls(), Math.min(1000, this.#stallMs));
  }

  /** Requests in flight. */
  get active(): number {
    return this.#pending.size;
  }

  /** Generates after `prompt` on `chain`; rejects with PipelineError, or the signal's reason when aborted. */
  generate(chain: Chain, prompt: number[], opts: RequestOptions = {}): Promise<GenerateOutcome> {
    const maxTokens = opts.maxTokens ?? 64;
    const tokens: number[] = [];
    const events: TokenEvent[] = [];
    const seen = new Set<number>();
    return this.#request(chain, prompt, { ...opts, maxTokens, mode: "generate" }, (m, p, done) => {
      if (m.type !== "token" || seen.has(m.pos)) return;
      seen.add(m.pos);
      const e: TokenEvent = {
        index: tokens.length,
        token: m.token,
        atMs: performance.now() - p.started,
        timings: tokenTimings(m.trace),
        trace: m.trace,
      };
      if (m.prefill) e.prefill = prefillTimings([...m.prefill, m.trace]);
      tokens.push(m.token);
      events.push(e);
      opts.onToken?.(e);
      if (m.done) {
        const first = events[0].atMs;
        const span = events.at(-1)!.atMs - first;
        done({
          tokens,
          stopReason: m.done,
          events,
          firstTokenMs: first,
          tokS: tokens.length > 1 && span > 0 ? ((tokens.length - 1) / span) * 1000 : 0,
        });
      }
    });
  }

  /**
   * Generates after `prompt` with speculative decoding (node/stage/speculative.ts): the drafter runs here,
   * and every verification chunk is one multi-token step through the chain.
   */
  speculate(
    chain: Chain,
    prompt: number[],
    opts: RequestOptions & SpeculateOptions,
  ): Promise<SpeculateOutcome> {
    const maxTokens = opts.maxTokens ?? 64;
    const tokens: number[] = [];
    const events: TokenEvent[] = [];
    let spec: Speculation | undefined;
    return this.#request<SpeculateOutcome>(
      chain,
      prompt,
      { ...opts, maxTokens, mode: "speculate" },
      (m, p, done) => {
        spec ??= new Speculation(prompt, { ...opts, maxTokens, eos: opts.eos ?? [] }, {
          send: (v) => {
            this.#actors.send(stageName(0), encodePipe({ ...v, id: p.id }), { channel: "data" })
              .catch((e) => p.fail(new PipelineError(`cannot reach stage 0: ${(e as Error).message}`)));
          },
          cancel: (before) => {
            for (let i = 0; i < p.chain.nodes.length; i++) {
              this.#actors.send(stageName(i), encodePipe({ type: "cancel", id: p.id, before })).catch(
                () => {},
              );
            }
          },
          emit: (fresh, trace, end) => {
            const atMs = performance.now() - p.started;
            for (const token of fresh) {
              const e: TokenEvent = {
                index: tokens.length,
                token,
                atMs,
                timings: tokenTimings(trace),
                trace,
              };
              if (tokens.length === 0 && m.type === "token" && m.prefill) {
                e.prefill = prefillTimings([...m.prefill, m.trace]);
              }
              tokens.push(token);
              events.push(e);
              opts.onToken?.(e);
            }
            if (!end) return;
            spec!.stop();
            const first = events[0].atMs;
            const span = events.at(-1)!.atMs - first;
            done({
              tokens,
              stopReason: end,
              events,
              firstTokenMs: first,
              tokS: tokens.length > 1 && span > 0 ? ((tokens.length - 1) / span) * 1000 : 0,
              stats: spec!.stats,
              trips: spec!.trips,
            });
          },
          fail: (e) => p.fail(e),
        });
        if (m.type === "token") spec.onToken(m);
        else if (m.type === "verdict") spec.onVerdict(m);
      },
    ).finally(() => spec?.stop());
  }

  /** Teacher-forced logits [T, vocab] of `tokens` on `chain`. */
  logits(
    chain: Chain,
    tokens: number[],
    opts: { vocab: number; signal?: AbortSignal; wire?: WireDtype },
  ): Promise<{ logits: Float32Array; traces: HopTrace[][] }> {
    const out = new Float32Array(tokens.length * opts.vocab);
    const traces: HopTrace[][] = [];
    const seen = new Set<number>();
    return this.#request(chain, tokens, { ...opts, maxTokens: 1, mode: "logits" }, (m, _p, done) => {
      if (m.type !== "logits" || seen.has(m.step)) return;
      seen.add(m.step);
      const rows = new Float32Array(m.data.slice().buffer);
      if (rows.length !== m.T * opts.vocab) {
        throw new PipelineError(`logits chunk of ${rows.length} values; expected ${m.T} x ${opts.vocab}`);
      }
      out.set(rows, m.pos0 * opts.vocab);
      traces.push(m.trace);
      if (m.done) done({ logits: out, traces });
    });
  }

  /** Fails every request running through `node` (membership saw it die or leave). */
  peerGone(node: string, why = "died"): void {
    for (const p of [...this.#pending.values()]) {
      const i = p.chain.nodes.indexOf(node);
      if (i >= 0) {
        p.fail(new PipelineError(`stage ${i} (node ${node.slice(0, 10)}) ${why}; the request is lost`));
      }
    }
  }

  async close(): Promise<void> {
    clearInterval(this.#timer);
    for (const p of [...this.#pending.values()]) p.fail(new PipelineError("the client closed"));
    await this.#ref.stop();
  }

  #request<T>(
    chain: Chain,
    prompt: number[],
    opts: RequestOptions & { maxTokens: number; mode: OpenParams["mode"] },
    handle: (m: PipeMessage, p: Pending, done: (v: T) => void) => void,
  ): Promise<T> {
    if (chain.nodes.length === 0) return Promise.reject(new TypeError("the chain has no stages"));
    if (opts.signal?.aborted) return Promise.reject(opts.signal.reason);
    const id = `${this.#self.slice(0, 8)}-${this.#next++}-${crypto.randomUUID().slice(0, 8)}`;
    const open: OpenParams = {
      maxSeq: prompt.length + (opts.mode === "logits" ? 0 : opts.maxTokens),
      sampling: opts.sampling ?? { temperature: 0, topP: 1, seed: 0 },
      mode: opts.mode,
      maxTokens: opts.maxTokens,
      prompt: prompt.length,
      eos: opts.eos ?? [],
      client: this.name,
      clientNode: this.#self,
      wire: opts.wire ?? "f16",
    };
    return new Promise<T>((resolve, reject) => {
      const finish = (f: () => void, reason: string) => {
        if (!this.#pending.delete(id)) return;
        opts.signal?.removeEventListener("abort", onAbort);
        for (let i = 0; i < chain.nodes.length; i++) {
          this.#actors.send(stageName(i), encodePipe({ type: "release", id, reason })).catch(() => {});
        }
        f();
      };
      const onAbort = () => finish(() => reject(opts.signal!.reason), "cancelled");
      opts.signal?.addEventListener("abort", onAbort, { once: true });
      const p: Pending = {
        id,
        chain,
        started: performance.now(),
        last: performance.now(),
        onMessage: (m) => {
          p.last = performance.now();
          if (m.type === "error") {
            return p.fail(new PipelineError(`stage ${m.stage} failed: ${m.message}`));
          }
          try {
            handle(m, p, (v) => finish(() => resolve(v), "done"));
          } catch (e) {
            p.fail(e as Error);
          }
        },
        fail: (e) => finish(() => reject(e), "failed"),
      };
      this.#pending.set(id, p);
      this.#actors.send(
        stageName(0),
        encodePipe({ type: "start", id, open, prompt: Uint32Array.from(prompt) }),
        { channel: "data" },
      ).catch((e) => p.fail(new PipelineError(`cannot reach stage 0: ${(e as Error).message}`)));
    });
  }

  #checkStalls(): void {
    const now = performance.now();
    for (const p of [...this.#pending.values()]) {
      if (now - p.last > this.#stallMs) {
        p.fail(new PipelineError(`no answer from the chain for ${Math.round((now - p.last) / 1000)} s`));
      }
    }
  }
}
