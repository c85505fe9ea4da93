// The behavior of actor `stage-{i}`: runs its part of every request's steps on its backend and passes the
// result on. Stage 0 embeds (START from the client, then one TOKEN per step from the last stage); a middle
// stage runs FORWARDs and forwards; the last stage applies the head, sends each token to the client and to
// stage 0 (closing the decode loop across the chain), and knows when to stop (eos, max tokens). Duplicates
// are dropped by step counter; a request's sequence is freed on RELEASE, on failure, when its client's
// node dies, or when the actor stops.
import type { ActorContext, Behavior } from "../actors/mod.ts";
import type { StageBackend, StageInput } from "./backend.ts";
import {
  decodePipe,
  encodePipe,
  type HopTrace,
  type OpenParams,
  type PipeMessage,
  type VerifyStep,
  wallMs,
  type WireDtype,
} from "./messages.ts";
import { packHidden, unpackHidden } from "./wire_dtype.ts";
import { verifyRows } from "../../models/speculative.ts";

export interface StageActorOptions {
  backend: StageBackend;
  /** Sends to an actor by name (ActorSystem.send on the data channel, so messages keep their order). */
  send(name: string, body: Uint8Array): Promise<void>;
  /** The Plan version this stage serves (reported by STATS). */
  planVersion: number;
  /** Whether the names this stage sends to resolve yet (reported by STATS as `routes`). Default: yes. */
  routesKnown?: () => boolean;
  /** Expert parallelism: takes what this stage sent to expert hosts for a request since the last call. */
  fanoutTrace?: (id: string) => Pick<HopTrace, "x" | "xp" | "xc"> | undefined;
  /** Default: warnings to stderr. */
  log?: (msg: string) => void;
}

interface Request {
  open: OpenParams;
  chunk: number;
  /** Next FORWARD step expected (stages > 0). */
  nextStep: number;
  /** Out-of-order FORWARDs, by step. */
  held: Map<number, Extract<PipeMessage, { type: "forward" }>>;
  /** Stage 0: the step whose token it waits for, and the next step number to use. */
  awaitStep: number;
  step: number;
  /** The head: traces of the prefill chunks so far, sent with the first token (at most MAX_PREFILL_TRACES). */
  prefill?: HopTrace[][];
  /** Stage 0, speculating: the next VERIFY chunk expected (older ones are duplicates). */
  nextChunk: number;
  /**
   * The head, speculating: where the sequence stands, the position of its last decided token and that
   * token (its KV not yet computed). A verification chunk that does not start there is stale.
   */
  decided?: { pos: number; token: number };
  /** Speculating: verification chunks numbered below this are void (the client dropped them): skip them. */
  voidBefore: number;
}

/** Prefill chunk traces a head keeps for the first token (a 128k-token prompt in 128-token chunks). */
const MAX_PREFILL_TRACES = 1024;

/** Name of stage i's actor in the registry. */
export function stageName(i: number): string {
  return `stage-${i}`;
}

const RELEASED_MEMORY = 4096;

export class StageActor implements Behavior {
  #o: StageActorOptions;
  #requests = new Map<string, Request>();
  /** Recently released ids: late messages for them must not reopen a sequence. */
  #released = new Set<string>();
  /** Per request, its steps in order (see receive). */
  #queues = new Map<string, Promise<void>>();
  #log: (msg: string) => void;
  /** Verification steps this stage skipped because the client cancelled them (speculative decoding). */
  cancelledSteps = 0;
  #stopping = false;
  /** Backend work in flight (a step's compute, a one-stage chain's decode loop). */
  #computing = new Set<Promise<unknown>>();
  /** Set when a newer Plan keeps this stage's backend for its own actor: stopping then frees only requests. */
  #handedOver = false;

  constructor(opts: StageActorOptions) {
    this.#o = opts;
    this.#log = opts.log ?? ((m) => console.error(`swactor: ${m}`));
  }

  get backend(): StageBackend {
    return this.#o.backend;
  }

  /** Ids of the requests holding a sequence here. */
  requests(): string[] {
    return [...this.#requests.keys()];
  }

  /** The activations request `id` sends on the wire (its `open`), if it is open here. */
  wireOf(id: string): WireDtype | undefined {
    return this.#requests.get(id)?.open.wire;
  }

  stats(): Record<string, unknown> {
    const role = this.#o.backend.role;
    return {
      index: role.index,
      layers: role.layers,
      embeds: role.embeds,
      head: role.head,
      planVersion: this.#o.planVersion,
      routes: this.#o.routesKnown?.() ?? true,
      requests: this.requests(),
      ...this.#o.backend.stats(),
    };
  }

  receive(body: Uint8Array, ctx: ActorContext): Uint8Array | void {
    let m: PipeMessage;
    try {
      m = decodePipe(body);
    } catch (e) {
      this.#log(`stage ${this.#o.backend.role.index}: dropped a malformed message: ${(e as Error).message}`);
      return;
    }
    // When the message reached this node's actor (its mailbox), the end of the hop's wire time.
    const arrived = ctx.receivedAt || wallMs();
    switch (m.type) {
      case "stats":
        return new TextEncoder().encode(JSON.stringify(this.stats()));
      case "release":
        this.release(m.id);
        return;
      case "cancel": { // at once, off the request's queue: steps queued behind it see it
        const r = this.#requests.get(m.id);
        if (r) r.voidBefore = Math.max(r.voidBefore, m.before);
        return;
      }
      // A request's steps run in order on its own queue, off the mailbox: STATS and RELEASE are answered
      // at once even while a long prefill computes, and requests do not wait for each other's steps.
      case "start":
        return this.#enqueue(m.id, () => this.#onStart(m, arrived));
      case "token":
        return this.#enqueue(m.id, () => this.#onToken(m, arrived));
      case "forward":
        return this.#enqueue(m.id, () => this.#onForward(m, arrived));
      case "verify":
        return this.#enqueue(m.id, () => this.#onVerify(m, arrived));
      default:
        return;
    }
  }

  /** Runs `f` after the request's earlier steps; the queue entry goes when it is the last. */
  #enqueue(id: string, f: () => Promise<void>): void {
    const prev = this.#queues.get(id) ?? Promise.resolve();
    const next = prev.then(f).catch((e) => this.#log(`stage: request ${id}: ${(e as Error).message}`));
    this.#queues.set(id, next);
    next.then(() => {
      if (this.#queues.get(id) === next) this.#queues.delete(id);
    });
  }

  /** Resolves when every queued step has run (tests, and a stopping actor). */
  async idle(): Promise<void> {
    while (this.#queues.size > 0) await Promise.all(this.#queues.values());
  }

  /** Frees `id`'s sequence; true when it held one. */
  release(id: string): boolean {
    this.#remember(id);
    const had = this.#requests.delete(id);
    return this.#o.backend.release(id) || had;
  }

  /** Frees every request whose client ran on `node` (it died or left). */
  releaseClientsOf(node: string): string[] {
    const gone = [...this.#requests].filter(([, r]) => r.open.clientNode === node).map(([id]) => id);
    for (const id of gone) this.release(id);
    return gone;
  }

  /** Frees every request (the chain broke: another stage died). */
  releaseAll(): string[] {
    const ids = this.requests();
    for (const id of ids) this.release(id);
    return ids;
  }

  /**
   * Gives the backend (weights loaded) to the actor of a newer Plan that keeps this stage's role: stopping
   * this actor then frees its requests but not the weights. Returns the backend.
   */
  handOver(): StageBackend {
    this.#handedOver = true;
    return this.#o.backend;
  }

  async onStop(): Promise<void> {
    this.#stopping = true; // steps still queued open nothing now
    this.releaseAll();
    // Steps computing see their requests released and end; steps past their compute may still be sending
    // to a node that hangs (SIGSTOP: a send can wait until it comes back), and are not waited for: they no
    // longer touch the backend, and a re-plan must not wait for a stopped node (docs/RECOVERY.md).
    while (this.#computing.size > 0) await Promise.allSettled([...this.#computing]);
    if (!this.#handedOver) this.#o.backend.close();
  }

  /** Runs backend work, tracked so that stopping waits for it (and for nothing else). */
  async #compute<T>(f: () => Promise<T>): Promise<T> {
    const p = f();
    this.#computing.add(p);
    try {
      return await p;
    } finally {
      this.#computing.delete(p);
    }
  }

  #remember(id: string): void {
    this.#released.add(id);
    if (this.#released.size > RELEASED_MEMORY) {
      this.#released.delete(this.#released.values().next().value!);
    }
  }

  /**
   * Opens `id`'s sequence; undefined when the id was released, or when the request runs on another Plan
   * version than this stage's (the fence: the client hears of it as a stale stage and re-routes).
   */
  #openRequest(id: string, open: OpenParams): Request | undefined {
    if (this.#released.has(id) || this.#stopping) return undefined;
    if (open.version !== undefined && open.version !== this.#o.planVersion) {
      const index = this.#o.backend.role.index;
      this.#log(
        `stage ${index}: refused request ${id} of Plan v${open.version} (this stage serves v${this.#o.planVersion})`,
      );
      this.#remember(id);
      const message = `stage ${index} serves Plan v${this.#o.planVersion}, not v${open.version}`;
      this.#o.send(open.client, encodePipe({ type: "error", id, stage: index, message, stale: true }))
        .catch(() => {});
      return undefined;
    }
    const { chunk } = this.#o.backend.open(id, {
      maxSeq: open.maxSeq,
      sampling: open.sampling,
      prompt: open.prompt,
      // A logits request's steps end in logits for every row of its chunks.
      ...(open.mode === "logits" ? { logitsRows: open.maxSeq } : {}),
    });
    const r: Request = {
      open,
      chunk,
      nextStep: 0,
      held: new Map(),
      awaitStep: -1,
      step: 0,
      nextChunk: 0,
      voidBefore: 0,
    };
    this.#requests.set(id, r);
    return r;
  }

  async #onStart(m: Extract<PipeMessage, { type: "start" }>, arrived: number): Promise<void> {
    if (!this.#o.backend.role.embeds) {
      return this.#fail(m.id, m.open, "START sent to a stage that does not embed");
    }
    if (this.#requests.has(m.id)) return; // duplicate
    let r: Request | undefined;
    try {
      r = this.#openRequest(m.id, m.open);
    } catch (e) {
      return this.#fail(m.id, m.open, (e as Error).message);
    }
    if (!r) return;
    const P = m.prompt.length;
    const be = this.#o.backend;
    if (be.generate && be.role.embeds && be.role.head && m.open.mode === "generate") {
      // Not awaited: the mailbox stays free for RELEASE (which stops the loop) and STATS meanwhile.
      void this.#loop(m, r, arrived);
      return;
    }
    // The prompt in chunks; a resumed request's generated tokens one per step, as they were first made.
    const replayFrom = Math.min(P, m.open.replayFrom ?? P);
    for (let pos0 = 0, T = 0; pos0 < P; pos0 += T) {
      T = pos0 < replayFrom ? Math.min(r.chunk, replayFrom - pos0) : 1;
      const last = pos0 + T >= P;
      const step = r.step++;
      if (last) r.awaitStep = step;
      const ok = await this.#run(m.id, r, {
        step,
        pos0,
        T,
        last,
        tokens: m.prompt.subarray(pos0, pos0 + T),
        trace: [],
        arrived: pos0 === 0 ? arrived : wallMs(),
      });
      if (!ok) return;
    }
  }

  /**
   * A one-stage chain (this stage embeds and samples): the backend's GPU-resident decode loop, the same
   * one a single node runs, instead of one step and one message per token. Tokens go to the client as each
   * batch is read back; a batch's compute is shared evenly among its tokens in their traces.
   */
  async #loop(m: Extract<PipeMessage, { type: "start" }>, r: Request, arrived: number): Promise<void> {
    const { open } = r;
    const P = m.prompt.length;
    let generated = 0;
    let from = arrived;
    let sending = Promise.resolve();
    const send = (body: Uint8Array) => {
      sending = sending.then(() => this.#o.send(open.client, body));
    };
    try {
      await this.#compute(() =>
        this.#o.backend.generate!(m.id, Array.from(m.prompt), {
          maxTokens: open.maxTokens,
          eos: open.eos,
          onTokens: (ids) => {
            const now = wallMs();
            const c = (now - from) / ids.length;
            for (const token of ids) {
              const pos = P + generated;
              generated++;
              const done = open.eos.includes(token)
                ? "eos" as const
                : generated >= open.maxTokens || pos + 1 >= open.maxSeq
                ? "max_tokens" as const
                : undefined;
              const trace = [{ s: 0, in: from, c, out: now, b: 0 }];
              send(encodePipe({ type: "token", id: m.id, step: generated - 1, pos, token, done, trace }));
            }
            from = now;
          },
        })
      );
      await sending;
    } catch (e) {
      await this.#fail(m.id, open, (e as Error).message);
    }
  }

  async #onToken(m: Extract<PipeMessage, { type: "token" }>, arrived: number): Promise<void> {
    const r = this.#requests.get(m.id);
    if (!r || m.step !== r.awaitStep || m.done) return; // unknown, duplicate, or finished
    const step = r.step++;
    r.awaitStep = step;
    const back = m.trace.at(-1);
    await this.#run(m.id, r, {
      step,
      pos0: m.pos,
      T: 1,
      last: true,
      tokens: Uint32Array.of(m.token),
      trace: [],
      arrived,
      returnMs: back ? arrived - back.out : undefined,
    });
  }

  /**
   * Stage 0, speculating: one verification step of the drafts (T = 1 + drafts tokens) through the chain,
   * as one multi-token step at every stage; the head answers the client with a VERDICT.
   */
  async #onVerify(m: Extract<PipeMessage, { type: "verify" }>, arrived: number): Promise<void> {
    const r = this.#requests.get(m.id);
    if (!r || r.open.mode !== "speculate" || m.chunk < r.nextChunk) return; // unknown, or a duplicate
    r.nextChunk = m.chunk + 1;
    if (m.chunk < r.voidBefore) return void this.cancelledSteps++; // dropped by the client: never started
    const T = m.tokens.length;
    if (T < 1 || T > r.chunk) {
      return this.#fail(m.id, r.open, `a verification step of ${T} tokens; this chain takes 1 to ${r.chunk}`);
    }
    await this.#run(m.id, r, {
      step: r.step++,
      pos0: m.pos0,
      T,
      last: true,
      tokens: m.tokens,
      trace: [],
      arrived,
      verify: { chunk: m.chunk, tokens: Array.from(m.tokens) },
    });
  }

  async #onForward(m: Extract<PipeMessage, { type: "forward" }>, arrived: number): Promise<void> {
    let r = this.#requests.get(m.id);
    if (!r) {
      if (m.step !== 0 || !m.open) return; // a late message of a released request, or out of order
      try {
        r = this.#openRequest(m.id, m.open);
      } catch (e) {
        return this.#fail(m.id, m.open, (e as Error).message);
      }
      if (!r) return;
    }
    if (m.step < r.nextStep) return; // duplicate
    if (m.step > r.nextStep) {
      r.held.set(m.step, m);
      return;
    }
    let next: typeof m | undefined = m;
    while (next) {
      r.nextStep++;
      if (next.void || (next.verify && next.verify.chunk < r.voidBefore)) {
        // A cancelled verification step: not computed; passed on (uncomputed) to keep the step order.
        if (!next.void) this.cancelledSteps++;
        if (!this.#o.backend.role.head) {
          const { hidden: _, ...rest } = next;
          try {
            await this.#o.send(
              stageName(this.#o.backend.role.index + 1),
              encodePipe({ ...rest, void: true, hidden: new Uint8Array(0) }),
            );
          } catch (e) {
            return this.#fail(next.id, r.open, `cannot pass the result on: ${(e as Error).message}`);
          }
        }
        next = r.held.get(r.nextStep);
        r.held.delete(r.nextStep);
        continue;
      }
      let hidden: Float32Array;
      try {
        hidden = unpackHidden(next.hidden, next.dtype, next.T * this.#o.backend.model.hidden);
      } catch (e) {
        return this.#fail(next.id, r.open, (e as Error).message);
      }
      const ok = await this.#run(next.id, r, { ...next, hidden, arrived: next === m ? arrived : wallMs() });
      if (!ok || !this.#requests.has(m.id)) return;
      next = r.held.get(r.nextStep);
      r.held.delete(r.nextStep);
    }
  }

  /** Runs one step and sends its result on; false when the request failed here. */
  async #run(
    id: string,
    r: Request,
    s: {
      step: number;
      pos0: number;
      T: number;
      last: boolean;
      tokens?: Uint32Array;
      hidden?: Float32Array;
      trace: HopTrace[];
      arrived: number;
      returnMs?: number;
      verify?: VerifyStep;
    },
  ): Promise<boolean> {
    const role = this.#o.backend.role;
    const { open } = r;
    const output: StageInput["output"] = !role.head
      ? "hidden"
      : open.mode === "logits" || s.verify
      ? "logits"
      : s.last
      ? "sample"
      : "hidden";
    // The step may have waited here since it arrived, behind the request's earlier steps.
    const waited = wallMs() - s.arrived;
    const t0 = performance.now();
    let out;
    try {
      out = await this.#compute(() =>
        this.#o.backend.run(id, {
          pos0: s.pos0,
          T: s.T,
          tokens: s.tokens,
          hidden: s.hidden,
          output,
        })
      );
    } catch (e) {
      await this.#fail(id, open, (e as Error).message);
      return false;
    }
    if (!this.#requests.has(id)) return false; // released while computing
    const c = performance.now() - t0;
    const fanout = this.#o.fanoutTrace?.(id);
    const hop = (b: number): HopTrace => {
      const h: HopTrace = { s: role.index, in: s.arrived, c, out: wallMs(), b };
      if (s.returnMs !== undefined) h.r = s.returnMs;
      if (fanout) Object.assign(h, fanout);
      if (waited >= 0.001) h.w = Math.round(waited * 1000) / 1000;
      return h;
    };
    try {
      if (!role.head) {
        const hidden = packHidden(out.hidden!, open.wire);
        await this.#o.send(
          stageName(role.index + 1),
          encodePipe({
            type: "forward",
            id,
            step: s.step,
            pos0: s.pos0,
            T: s.T,
            last: s.last,
            open: s.step === 0 ? open : undefined,
            verify: s.verify,
            dtype: open.wire,
            trace: [...s.trace, hop(hidden.length)],
            hidden,
          }),
        );
        return true;
      }
      if (s.verify) return await this.#verdict(id, r, s.pos0, s.verify, out.logits!, [...s.trace, hop(0)]);
      if (output === "logits") {
        const data = new Uint8Array(out.logits!.buffer, out.logits!.byteOffset, out.logits!.byteLength);
        await this.#o.send(
          open.client,
          encodePipe({
            type: "logits",
            id,
            step: s.step,
            pos0: s.pos0,
            T: s.T,
            done: s.last,
            trace: [...s.trace, hop(data.length)],
            data,
          }),
        );
        return true;
      }
      if (output !== "sample") {
        // A prefill chunk before the last: the KV cache is filled; its trace goes with the first token.
        if ((r.prefill ??= []).length < MAX_PREFILL_TRACES) r.prefill.push([...s.trace, hop(0)]);
        return true;
      }
      const pos = s.pos0 + s.T;
      const token = out.token!;
      const generated = pos - open.prompt + 1;
      const done = open.eos.includes(token)
        ? "eos" as const
        : generated >= open.maxTokens || pos + 1 >= open.maxSeq
        ? "max_tokens" as const
        : undefined;
      const prefill = r.prefill;
      r.prefill = undefined;
      const msg = (b: number) =>
        encodePipe({
          type: "token",
          id,
          step: s.step,
          pos,
          token,
          done,
          trace: [...s.trace, hop(b)],
          prefill,
        });
      const size = msg(0).length;
      if (open.mode === "speculate") r.decided = { pos, token }; // the client drafts from here
      // The loop closes here: stage 0 starts the next step as soon as the token arrives.
      else if (!done) await this.#o.send(stageName(0), msg(size));
      await this.#o.send(open.client, msg(size));
      return true;
    } catch (e) {
      await this.#fail(id, open, `cannot pass the result on: ${(e as Error).message}`);
      return false;
    }
  }

  /**
   * The head, speculating: keeps the drafts the target agrees with (models/speculative.ts verifyRows) and
   * tells the client. A chunk that does not continue the decided sequence (an earlier chunk in flight was
   * cut short, so this one was drafted on a wrong guess) is dropped; later chunks overwrite its positions.
   */
  async #verdict(
    id: string,
    r: Request,
    pos0: number,
    v: VerifyStep,
    logits: Float32Array,
    trace: HopTrace[],
  ): Promise<boolean> {
    const d = r.decided;
    const base = { type: "verdict" as const, id, chunk: v.chunk, pos0, trace };
    if (!d || d.pos !== pos0 || d.token !== v.tokens[0]) {
      await this.#o.send(r.open.client, encodePipe({ ...base, accepted: 0, tokens: [], stale: true }));
      return true;
    }
    const drafts = v.tokens.slice(1);
    const { accepted, next } = verifyRows(logits, this.#o.backend.model.vocab, drafts, r.open.sampling, pos0);
    r.decided = { pos: pos0 + accepted + 1, token: next };
    const tokens = [...drafts.slice(0, accepted), next];
    await this.#o.send(r.open.client, encodePipe({ ...base, accepted, tokens }));
    return true;
  }

  async #fail(id: string, open: OpenParams, message: string): Promise<void> {
    const index = this.#o.backend.role.index;
    this.#log(`stage ${index}: request ${id} failed: ${message}`);
    this.release(id);
    await this.#o.send(open.client, encodePipe({ type: "error", id, stage: index, message })).catch(() => {});
  }
}
