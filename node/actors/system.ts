// The actor runtime: spawns named local actors, and sends/calls actors by name on any node. Names resolve
// through the registry; requests carry a request_id; every call ends (reply, remote error, timeout,
// cancellation, or the peer's death), never hangs. Replies to unknown request ids are dropped.
import { type Clock, SystemClock } from "../clock.ts";
import type { Channel, PeerAddr, PeerId, Transport } from "../transport/transport.ts";
import { type ActorMessage, decodeActorMessage, encodeActorMessage, WireError } from "../wire/mod.ts";
import { ActorErrorCode, CONTROL_MAX_BYTES } from "../wire/mod.ts";
import { Actor, type Behavior, type Envelope } from "./actor.ts";
import { ActorFailedError, ActorNotFoundError, CallTimeoutError, PeerUnreachableError } from "./errors.ts";

/** Finds the node hosting a name (the registry implements it). */
export interface Resolver {
  resolve(name: string): PeerId | undefined;
}

/** Finds a node's addresses (membership implements it through its member table). */
export interface PeerBook {
  addressOf(id: PeerId): PeerAddr | undefined;
}

/** Where spawned names are announced (the registry implements it). */
export interface Registrar {
  register(name: string): void;
  unregister(name: string): unknown;
}

export interface ActorSystemOptions {
  /** Sends actor messages; incoming ones are handed to `receive` (by the node's demux). */
  transport: Transport;
  resolver: Resolver;
  peers: PeerBook;
  /** Default: names are not announced. */
  registrar?: Registrar;
  /** Default: the system clock. */
  clock?: Clock;
  /** Default call timeout (default 30 000 ms). */
  defaultTimeoutMs?: number;
}

export interface CallOptions {
  /** Fail with CallTimeoutError after this long (default: the system's defaultTimeoutMs). */
  timeoutMs?: number;
  /** Aborting rejects the call with the signal's reason and tells the remote actor. */
  signal?: AbortSignal;
  /** Default: "control" for bodies up to 64 KiB, "data" above. */
  channel?: Channel;
}

export interface ActorRef {
  readonly name: string;
  /** Stops the actor (see Actor.stop) and unregisters its name. */
  stop(): Promise<void>;
}

interface Pending {
  peer: PeerId;
  name: string;
  resolve: (b: Uint8Array) => void;
  reject: (e: unknown) => void;
}

const SMALL_BYTES = 64 * 1024;

export class ActorSystem {
  /** Replies and errors for request ids nobody waits for (late, duplicate or forged). */
  droppedReplies = 0;
  /** Incoming actor messages that failed to decode. */
  malformed = 0;
  #actors = new Map<string, Actor>();
  #pending = new Map<number, Pending>();
  /** Running remote calls, by caller and request id, so a cancel can abort them. */
  #inbound = new Map<string, AbortController>();
  #nextId = 1;
  #clock: Clock;
  #o: ActorSystemOptions;

  constructor(opts: ActorSystemOptions) {
    this.#o = opts;
    this.#clock = opts.clock ?? new SystemClock();
  }

  get self(): PeerId {
    return this.#o.transport.self.id;
  }

  /** Starts a local actor under `name` and announces it; throws TypeError if the name is taken here. */
  spawn(name: string, behavior: Behavior): ActorRef {
    if (this.#actors.has(name)) throw new TypeError(`an actor named "${name}" already runs on this node`);
    const actor = new Actor(name, behavior);
    this.#actors.set(name, actor);
    this.#o.registrar?.register(name);
    return {
      name,
      stop: async () => {
        if (this.#actors.get(name) === actor) {
          this.#actors.delete(name);
          this.#o.registrar?.unregister(name);
        }
        await actor.stop();
      },
    };
  }

  /** Names of the actors running on this node. */
  localNames(): string[] {
    return [...this.#actors.keys()].sort();
  }

  /** One-way message. Throws ActorNotFoundError (unknown name) or PeerUnreachableError. */
  async send(name: string, body: Uint8Array, opts: { channel?: Channel } = {}): Promise<void> {
    const local = this.#actors.get(name);
    if (local) {
      local.deliver({ body, from: this.self, abort: new AbortController() });
      return;
    }
    const peer = this.#route(name);
    const ok = await this.#o.transport.send(
      peer,
      encodeActorMessage({ type: "send", to: name, body }),
      channelFor(body, opts.channel),
    );
    if (!ok) throw new PeerUnreachableError(`cannot reach ${peer.id.slice(0, 10)}, which hosts "${name}"`);
  }

  /** Request/response. Rejects with ActorNotFoundError, PeerUnreachableError, ActorFailedError, CallTimeoutError or the abort reason. */
  call(name: string, body: Uint8Array, opts: CallOptions = {}): Promise<Uint8Array> {
    const timeoutMs = opts.timeoutMs ?? this.#o.defaultTimeoutMs ?? 30_000;
    if (opts.signal?.aborted) return Promise.reject(opts.signal.reason);
    const local = this.#actors.get(name);
    return new Promise<Uint8Array>((resolve, reject) => {
      const cleanup: Array<() => void> = [];
      let done = false;
      const finish = (f: () => void) => {
        if (done) return;
        done = true;
        for (const c of cleanup) c();
        f();
      };
      const ok = (b: Uint8Array) => finish(() => resolve(b));
      const fail = (e: unknown) => finish(() => reject(e));
      let cancel = (_reason: unknown) => {};
      cleanup.push(this.#clock.schedule(() => {
        cancel(new CallTimeoutError(`call to "${name}" got no reply within ${timeoutMs} ms`));
      }, timeoutMs));
      if (opts.signal) {
        const onAbort = () => cancel(opts.signal!.reason);
        opts.signal.addEventListener("abort", onAbort, { once: true });
        cleanup.push(() => opts.signal!.removeEventListener("abort", onAbort));
      }
      if (local) {
        const abort = new AbortController();
        cancel = (reason) => {
          abort.abort(reason);
          fail(reason);
        };
        local.deliver({
          body,
          from: this.self,
          abort,
          reply: (r) => ("ok" in r ? ok(r.ok) : fail(localError(name, r))),
        });
        return;
      }
      let peer: PeerAddr;
      try {
        peer = this.#route(name);
      } catch (e) {
        fail(e);
        return;
      }
      const requestId = this.#nextId++;
      this.#pending.set(requestId, { peer: peer.id, name, resolve: ok, reject: fail });
      cleanup.push(() => this.#pending.delete(requestId));
      const channel = channelFor(body, opts.channel);
      cancel = (reason) => {
        fail(reason);
        this.#o.transport.send(peer, encodeActorMessage({ type: "cancel", requestId }), "control").catch(
          () => {},
        );
      };
      this.#o.transport.send(
        peer,
        encodeActorMessage({ type: "call", requestId, to: name, timeoutMs, body }),
        channel,
      )
        .then(
          (sent) => {
            if (!sent) {
              fail(new PeerUnreachableError(`cannot reach ${peer.id.slice(0, 10)}, which hosts "${name}"`));
            }
          },
          fail,
        );
    });
  }

  /** Fails every call waiting on `peer` (membership declared it dead or left). */
  peerDown(peer: PeerId): void {
    for (const [id, p] of [...this.#pending]) {
      if (p.peer !== peer) continue;
      this.#pending.delete(id);
      p.reject(new PeerUnreachableError(`node ${peer.slice(0, 10)} hosting "${p.name}" is gone`));
    }
  }

  /** Handles one incoming actor message (routed here by the node's demux). Never throws. */
  receive(from: PeerAddr, bytes: Uint8Array, channel: Channel): void {
    let m: ActorMessage;
    try {
      m = decodeActorMessage(bytes);
    } catch (e) {
      if (!(e instanceof WireError)) throw e;
      this.malformed++;
      return;
    }
    switch (m.type) {
      case "send": {
        this.#actors.get(m.to)?.deliver({ body: m.body, from: from.id, abort: new AbortController() });
        return;
      }
      case "call":
        return this.#onCall(from, m, channel);
      case "cancel":
        this.#inbound.get(`${from.id}:${m.requestId}`)?.abort(new Error("cancelled by caller"));
        return;
      case "reply":
      case "error": {
        const p = this.#pending.get(m.requestId);
        if (!p || p.peer !== from.id) {
          this.droppedReplies++;
          return;
        }
        if (m.type === "reply") p.resolve(m.body);
        else p.reject(remoteError(p.name, m.code, m.message));
        return;
      }
    }
  }

  /** Stops every local actor and fails every pending call. */
  async close(): Promise<void> {
    for (const [id, p] of [...this.#pending]) {
      this.#pending.delete(id);
      p.reject(new PeerUnreachableError(`actor system closed while calling "${p.name}"`));
    }
    const actors = [...this.#actors.values()];
    this.#actors.clear();
    await Promise.all(actors.map((a) => a.stop()));
  }

  #onCall(from: PeerAddr, m: Extract<ActorMessage, { type: "call" }>, channel: Channel): void {
    const respond = (msg: ActorMessage) => {
      this.#o.transport.send(
        from,
        encodeActorMessage(msg),
        msg.type === "reply" ? channelFor(msg.body, channel) : "control",
      )
        .catch(() => {});
    };
    const actor = this.#actors.get(m.to);
    if (!actor) {
      respond({
        type: "error",
        requestId: m.requestId,
        code: ActorErrorCode.NOT_FOUND,
        message: `no actor "${m.to}" on ${this.self.slice(0, 10)}`,
      });
      return;
    }
    const key = `${from.id}:${m.requestId}`;
    const abort = new AbortController();
    this.#inbound.set(key, abort);
    const stopTimer = this.#clock.schedule(
      () => abort.abort(new Error("caller's timeout passed")),
      m.timeoutMs,
    );
    const env: Envelope = {
      body: m.body,
      from: from.id,
      abort,
      reply: (r) => {
        stopTimer();
        this.#inbound.delete(key);
        if (abort.signal.aborted) return; // the caller has given up; nobody waits for this reply
        if ("ok" in r) {
          if (r.ok.length > CONTROL_MAX_BYTES && channel === "control") channel = "data";
          respond({ type: "reply", requestId: m.requestId, body: r.ok });
        } else {
          const code = r.stopped ? ActorErrorCode.STOPPED : ActorErrorCode.FAILED;
          respond({ type: "error", requestId: m.requestId, code, message: errorText(r.error) });
        }
      },
    };
    if (!actor.deliver(env)) env.reply!({ error: new Error("actor stopped"), stopped: true });
  }

  #route(name: string): PeerAddr {
    const owner = this.#o.resolver.resolve(name);
    if (owner === undefined) throw new ActorNotFoundError(`no actor named "${name}" is registered`);
    if (owner === this.self) {
      throw new ActorNotFoundError(`"${name}" is registered to this node but not running`);
    }
    const addr = this.#o.peers.addressOf(owner);
    if (!addr) {
      throw new PeerUnreachableError(
        `"${name}" is hosted by ${owner.slice(0, 10)}, which is not a live member`,
      );
    }
    return addr;
  }
}

function channelFor(body: Uint8Array, channel: Channel | undefined): Channel {
  if (channel === "control" && body.length > CONTROL_MAX_BYTES) return "data";
  return channel ?? (body.length <= SMALL_BYTES ? "control" : "data");
}

function errorText(e: unknown): string {
  return e instanceof Error ? `${e.name}: ${e.message}` : String(e);
}

function localError(name: string, r: { error: unknown; stopped?: boolean }): Error {
  if (r.stopped) return new ActorNotFoundError(`actor "${name}" stopped before handling the call`);
  return new ActorFailedError(`actor "${name}" failed: ${errorText(r.error)}`, { cause: r.error });
}

function remoteError(name: string, code: ActorErrorCode, message: string): Error {
  if (code === ActorErrorCode.NOT_FOUND) {
    return new ActorNotFoundError(`actor "${name}" not found: ${message}`);
  }
  if (code === ActorErrorCode.STOPPED) {
    return new ActorNotFoundError(`actor "${name}" stopped before handling the call`);
  }
  return new ActorFailedError(`actor "${name}" failed: ${message}`);
}
