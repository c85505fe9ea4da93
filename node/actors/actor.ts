// One local actor: a name, a behavior, and a mailbox processed one message at a time (so the behavior
// needs no locks). Stopping fails whatever is still queued, waits for the message in hand, then runs onStop.

/** What a handler learns about the message it handles. */
export interface ActorContext {
  /** The actor's own name. */
  name: string;
  /** The sending node's id. */
  from: string;
  /** Aborted when the caller cancels or times out, or when the actor stops. */
  signal: AbortSignal;
  /** When the message reached the mailbox, ms since the epoch (it may have waited behind others since). */
  receivedAt: number;
}

export interface Behavior {
  /** Handles one message. For a call, the returned bytes are the reply (nothing: an empty reply). */
  receive(body: Uint8Array, ctx: ActorContext): Uint8Array | void | Promise<Uint8Array | void>;
  /** Releases what the actor holds (buffers, GPU memory, files); runs once, after the last message. */
  onStop?(): void | Promise<void>;
}

export interface Envelope {
  body: Uint8Array;
  from: string;
  abort: AbortController;
  /** Set for calls: gets the result or the error. */
  reply?: (result: { ok: Uint8Array } | { error: unknown; stopped?: boolean }) => void;
  /** Set by `deliver`: when the message reached the mailbox, ms since the epoch. */
  at?: number;
}

export class Actor {
  #queue: Envelope[] = [];
  #running = false;
  #stopped = false;
  #idle: Promise<void> = Promise.resolve();
  #wake: (() => void) | undefined;

  constructor(readonly name: string, readonly behavior: Behavior) {}

  get stopped(): boolean {
    return this.#stopped;
  }

  /** Queues a message; false when the actor has stopped. */
  deliver(env: Envelope): boolean {
    if (this.#stopped) return false;
    env.at = performance.timeOrigin + performance.now();
    this.#queue.push(env);
    if (!this.#running) this.#run();
    return true;
  }

  /** Stops: queued calls fail as stopped, the current message finishes, then onStop runs. */
  async stop(): Promise<void> {
    if (this.#stopped) return this.#idle;
    this.#stopped = true;
    for (const env of this.#queue.splice(0)) {
      env.reply?.({ error: new Error("actor stopped"), stopped: true });
    }
    if (this.#running) await new Promise<void>((r) => (this.#wake = r));
    this.#idle = Promise.resolve(this.behavior.onStop?.()).then(() => {});
    return this.#idle;
  }

  async #run(): Promise<void> {
    this.#running = true;
    while (this.#queue.length > 0) {
      const env = this.#queue.shift()!;
      if (env.abort.signal.aborted) continue;
      try {
        const out = await this.behavior.receive(env.body, {
          name: this.name,
          from: env.from,
          signal: env.abort.signal,
          receivedAt: env.at!,
        });
        env.reply?.({ ok: out instanceof Uint8Array ? out : new Uint8Array(0) });
      } catch (error) {
        env.reply?.({ error });
      }
      if (this.#stopped) break;
    }
    this.#running = false;
    this.#wake?.();
  }
}
