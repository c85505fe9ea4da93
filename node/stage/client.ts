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
  wallMs,
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
  /** The chain's activations between stages for requests that name none (`up --wire`); absent: f16. */
  wire?: WireDtype;
}

/** The activations a request on `chain` sends: its own `wire`, else the chain's (`up --wire`), else f16. */
export function requestWire(chain: Pick<Chain, "wire">, wire?: WireDtype): WireDtype {
  return wire ?? chain.wire ?? "f16";
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
  /** Activations between stages; default the chain's (requestWire). */
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
  /** Each time the request lost a stage and resumed on another chain. */
  recoveries?: RecoveryRecord[];
  /** The activations between stages it ran with (requestWire). */
  wire: WireDtype;
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
  /** What failed, when known: the stage and its node, and whether a newer Plan is needed to go on. */
  readonly loss?: ChainLoss;
  constructor(message: string, loss?: ChainLoss) {
    super(message);
    this.loss = loss;
  }
}

/** Why an attempt of a request ended without its result: what a resume needs to know. */
export interface ChainLoss {
  /** The Plan version the attempt ran on. */
  version: number;
  stage?: number;
  node?: string;
  /** "died", "left", "stalled", "stale" (a stage of another Plan version refused it), "error", "unreachable". */
  reason: string;
  /** True when the node is gone (membership): only a newer Plan can go on. */
  gone: boolean;
  /** The nodes of the chain the attempt ran on (stage order). */
  nodes?: string[];
}

/** One resume of a request on a newer (or re-checked) chain, as `--json` and the trace report it. */
export interface RecoveryRecord {
  stage: number | null;
  node: string | null;
  reason: string;
  /** From the failure's detection to the first token after the resume, ms. */
  ms: number;
  /** From the last message of the lost attempt (or the request's start) to that token: what the user waited. */
  gap_ms: number;
  /** The Plan versions before and after. */
  from: number;
  to: number;
  /** Tokens generated before the loss (re-sent with the prompt so the stages rebuild their KV). */
  at_token: number;
  /** When decoding went on again: epoch ms (the trace's clock). */
  at: number;
}

/**
 * Finds the chain to resume on after a loss (a ready chain, newer when `loss.gone`), and what was lost when
 * it knows better than the loss did (a failed hop names the stage that could not send; membership names
 * the node that is gone); rejects to give up.
 */
export type ResumeChain = (
  loss: ChainLoss,
  signal?: AbortSignal,
) => Promise<{ chain: Chain; lost?: { stage: number; node: string; reason: string } }>;

/** Resumes a request at most this many times. */
const MAX_RESUMES = 8;

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
  #resume: ResumeChain | undefined;
  #closed = false;

  /**
   * Spawns `client-{first 16 characters of self}`. `stallMs` (default 30 000): fail a request after this long
   * without a message. `resume` (default none: a lost stage fails the request): where a generation goes on
   * after a loss; the client re-sends the prompt and the tokens generated so far, and the stages rebuild KV.
   */
  constructor(actors: ClientActors, self: string, opts: { stallMs?: number; resume?: ResumeChain } = {}) {
    this.#actors = actors;
    this.#self = self;
    this.#stallMs = opts.stallMs ?? 30_000;
    this.#resume = opts.resume;
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
    const recoveries: RecoveryRecord[] = [];
    const resume = { generated: () => tokens, recoveries };
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
          recoveries,
          wire: requestWire(chain, opts.wire),
        });
      }
    }, resume);
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
              wire: requestWire(chain, opts.wire),
            });
          },
          fail: (e) => p.fail(e),
        });
        if (m.type === "token") spec.onToken(m);
        else if (m.type === "verdict") spec.onVerdict(m);
      },
    ).finally(() => spec?.stop());
  }

  /**
   * Teacher-forced logits [T, vocab] of `tokens` on `chain`. A chain lost or re-planned mid-request runs the
   * request again from the start on the chain the client's `resume` gives (as generate resumes): logits
   * have no state to carry over, so the new attempt's rows replace the old ones.
   */
  logits(
    chain: Chain,
    tokens: number[],
    opts: { vocab: number; signal?: AbortSignal; wire?: WireDtype },
  ): Promise<{ logits: Float32Array; traces: HopTrace[][] }> {
    const out = new Float32Array(tokens.length * opts.vocab);
    const traces: HopTrace[][] = [];
    const seen = new Set<number>();
    let attempt = "";
    const resume = { generated: () => [], recoveries: [] };
    return this.#request(chain, tokens, { ...opts, maxTokens: 1, mode: "logits" }, (m, p, done) => {
      if (m.type !== "logits") return;
      if (p.id !== attempt) {
        // A new attempt (the first, or a resumed one) sends every chunk again, perhaps cut differently.
        attempt = p.id;
        seen.clear();
        traces.length = 0;
      }
      if (seen.has(m.step)) return;
      seen.add(m.step);
      const rows = new Float32Array(m.data.slice().buffer);
      if (rows.length !== m.T * opts.vocab) {
        throw new PipelineError(`logits chunk of ${rows.length} values; expected ${m.T} x ${opts.vocab}`);
      }
      out.set(rows, m.pos0 * opts.vocab);
      traces.push(m.trace);
      if (m.done) done({ logits: out, traces });
    }, resume);
  }

  /** Fails every request running through `node` (membership saw it die or leave; `reason` is "died" or "left"). */
  peerGone(node: string, why = "died", reason = "died"): void {
    for (const p of [...this.#pending.values()]) {
      const i = p.chain.nodes.indexOf(node);
      if (i >= 0) {
        const loss = { version: p.chain.version, stage: i, node, reason, gone: true };
        p.fail(new PipelineError(`stage ${i} (node ${node.slice(0, 10)}) ${why}; the request is lost`, loss));
      }
    }
  }

  /** A newer Plan was adopted: requests running on an older chain resume (or fail) now, not at a timeout. */
  planChanged(version: number): void {
    for (const p of [...this.#pending.values()]) {
      if (p.chain.version < version) {
        p.fail(
          new PipelineError(`the chain was re-planned (Plan v${version})`, {
            version: p.chain.version,
            reason: "replanned",
            gone: false,
          }),
        );
      }
    }
  }

  async close(): Promise<void> {
    this.#closed = true;
    clearInterval(this.#timer);
    for (const p of [...this.#pending.values()]) p.fail(new PipelineError("the client closed"));
    await this.#ref.stop();
  }

  #request<T>(
    chain: Chain,
    prompt: number[],
    opts: RequestOptions & { maxTokens: number; mode: OpenParams["mode"] },
    handle: (m: PipeMessage, p: Pending, done: (v: T) => void) => void,
    resumable?: { generated: () => number[]; recoveries: RecoveryRecord[] },
  ): Promise<T> {
    if (chain.nodes.length === 0) return Promise.reject(new TypeError("the chain has no stages"));
    if (opts.signal?.aborted) return Promise.reject(opts.signal.reason);
    const base = `${this.#self.slice(0, 8)}-${this.#next++}-${crypto.randomUUID().slice(0, 8)}`;
    // Fixed for the request: a resumed attempt sends what the first one did, whatever chain it runs on.
    const wire = requestWire(chain, opts.wire);
    const started = performance.now();
    return new Promise<T>((resolve, reject) => {
      let settled = false;
      let current: { id: string; chain: Chain } | undefined;
      let recovering: AbortController | undefined;
      const settle = (f: () => void) => {
        if (settled) return;
        settled = true;
        opts.signal?.removeEventListener("abort", onAbort);
        f();
      };
      /**
       * Ends the running attempt (only `only`, when given: a late failure of an earlier attempt must not end
       * the one that replaced it): every stage of its chain frees it. False when it had ended already.
       */
      const endAttempt = (reason: string, only?: string): boolean => {
        if (!current || (only !== undefined && only !== current.id)) return false;
        if (!this.#pending.delete(current.id)) return false;
        const { id, chain } = current;
        for (let i = 0; i < chain.nodes.length; i++) {
          this.#actors.send(stageName(i), encodePipe({ type: "release", id, reason })).catch(() => {});
        }
        return true;
      };
      const onAbort = () => {
        endAttempt("cancelled");
        recovering?.abort(opts.signal!.reason);
        settle(() => reject(opts.signal!.reason));
      };
      opts.signal?.addEventListener("abort", onAbort, { once: true });

      const run = (
        chain: Chain,
        attempt: number,
        lastSeen: number,
        resumed?: Omit<RecoveryRecord, "ms" | "gap_ms" | "at"> & { lostAt: number; lastAt: number },
      ) => {
        const id = attempt === 0 ? base : `${base}~${attempt}`;
        const before = resumable?.generated() ?? [];
        const ids = before.length ? [...prompt, ...before] : prompt;
        const maxTokens = opts.maxTokens - before.length;
        const open: OpenParams = {
          maxSeq: ids.length + (opts.mode === "logits" ? 0 : maxTokens),
          sampling: opts.sampling ?? { temperature: 0, topP: 1, seed: 0 },
          mode: opts.mode,
          maxTokens,
          prompt: ids.length,
          eos: opts.eos ?? [],
          client: this.name,
          clientNode: this.#self,
          wire,
          version: chain.version,
          ...(before.length ? { replayFrom: prompt.length } : {}),
        };
        current = { id, chain };
        const p: Pending = {
          id,
          chain,
          started,
          last: performance.now(),
          onMessage: (m) => {
            p.last = performance.now();
            if (m.type === "error") {
              const loss: ChainLoss = {
                version: chain.version,
                stage: m.stage,
                node: chain.nodes[m.stage],
                reason: m.stale ? "stale" : "error",
                gone: false,
              };
              return p.fail(new PipelineError(`stage ${m.stage} failed: ${m.message}`, loss));
            }
            if (resumed && m.type === "token") {
              const now = performance.now();
              resumable!.recoveries.push({
                stage: resumed.stage,
                node: resumed.node,
                reason: resumed.reason,
                ms: Math.round(now - resumed.lostAt),
                gap_ms: Math.round(now - resumed.lastAt),
                from: resumed.from,
                to: resumed.to,
                at_token: resumed.at_token,
                at: wallMs(),
              });
              resumed = undefined;
            }
            try {
              handle(m, p, (v) => {
                endAttempt("done", id);
                settle(() => resolve(v));
              });
            } catch (e) {
              p.fail(e as Error);
            }
          },
          fail: (e) => {
            if (!endAttempt("failed", id)) return;
            const loss = e instanceof PipelineError ? e.loss : undefined;
            if (!loss || !resumable || !this.#resume || attempt >= MAX_RESUMES || this.#closed) {
              return settle(() => reject(e));
            }
            const lostAt = performance.now();
            const lastAt = Math.max(p.last, lastSeen);
            recovering = new AbortController();
            const signal = opts.signal
              ? AbortSignal.any([opts.signal, recovering.signal])
              : recovering.signal;
            this.#resume({ ...loss, nodes: chain.nodes }, signal).then(
              ({ chain: next, lost }) => {
                if (settled) return;
                run(next, attempt + 1, lastAt, {
                  stage: lost?.stage ?? loss.stage ?? null,
                  node: lost?.node ?? loss.node ?? null,
                  reason: lost?.reason ?? loss.reason,
                  from: loss.version,
                  to: next.version,
                  at_token: resumable.generated().length,
                  lostAt: resumed?.lostAt ?? lostAt,
                  lastAt: resumed?.lastAt ?? lastAt,
                });
              },
              (why) =>
                settle(() =>
                  reject(
                    opts.signal?.aborted ? opts.signal.reason : new PipelineError(
                      `${e.message}; no chain to resume on: ${(why as Error).message}`,
                      loss,
                    ),
                  )
                ),
            );
          },
        };
        this.#pending.set(id, p);
        this.#actors.send(
          stageName(0),
          encodePipe({ type: "start", id, open, prompt: Uint32Array.from(ids) }),
          { channel: "data" },
        ).catch((e) =>
          p.fail(
            new PipelineError(`cannot reach stage 0: ${(e as Error).message}`, {
              version: chain.version,
              stage: 0,
              node: chain.nodes[0],
              reason: "unreachable",
              gone: false,
            }),
          )
        );
      };
      run(chain, 0, started);
    });
  }

  #checkStalls(): void {
    const now = performance.now();
    for (const p of [...this.#pending.values()]) {
      if (now - p.last > this.#stallMs) {
        p.fail(
          new PipelineError(`no answer from the chain for ${Math.round((now - p.last) / 1000)} s`, {
            version: p.chain.version,
            reason: "stalled",
            gone: false,
          }),
        );
      }
    }
  }
}
