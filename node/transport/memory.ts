// An in-process network implementing Transport, for deterministic tests and simulations of many nodes.
// Everything (loss, delay, jitter, partitions, slow nodes) is driven by a Clock and a seeded PRNG, so a
// run with the same seed and the same calls replays exactly.
//
// Semantics, chosen to be at least as harsh as the real iroh transport:
// - send() resolves false at once when the sender is closed, the receiver is unknown/closed, or the two
//   sit on different sides of a partition (a real dial would fail).
// - Otherwise it resolves true and the message is lost with the link's loss probability (a real QUIC
//   stream does not lose bytes, but a connection can drop; this exercises the same code paths harder),
//   or delivered after delay + jitter (+ the sender's slowness). Per (sender, receiver, channel) delivery
//   stays in order, as the Transport interface promises.
import type { Clock } from "../clock.ts";
import { seededRandom } from "../random.ts";
import { PeerUnreachableError } from "./errors.ts";
import type { Channel, PeerAddr, PeerId, Transport } from "./transport.ts";

/** How one direction of a link behaves. */
export interface LinkOptions {
  /** Probability in [0, 1] that a message is dropped. Default 0. */
  loss?: number;
  /** Base one-way delay in ms. Default 1. */
  delayMs?: number;
  /** Extra uniform random delay in [0, jitterMs). Default 0. */
  jitterMs?: number;
}

/** A node whose outgoing messages are intermittently late (GC pauses, an overloaded CPU). */
export interface SlowOptions {
  /** Probability in [0, 1] that a given outgoing message is held back. */
  probability: number;
  /** Extra delay of a held message: uniform in [minMs, maxMs). */
  minMs: number;
  maxMs: number;
}

export interface MemoryNetworkOptions {
  /** Seed of the PRNG behind loss and jitter. Default 1. */
  seed?: number;
  /** Link behaviour for every pair without an explicit setLink. Default {loss 0, delayMs 1, jitterMs 0}. */
  link?: LinkOptions;
  /** Largest message accepted by send(). Default 1 MiB. */
  maxMessageBytes?: number;
}

/** Counters for a whole network, for reports. */
export interface NetworkStats {
  sent: number;
  delivered: number;
  dropped: number;
  refused: number;
  bytes: number;
}

type Handler = (from: PeerAddr, msg: Uint8Array, channel: Channel) => void;

/** The shared medium; create one per test, then one transport per node with `connect`. */
export class MemoryNetwork {
  readonly clock: Clock;
  readonly random: () => number;
  readonly maxMessageBytes: number;
  readonly stats: NetworkStats = { sent: 0, delivered: 0, dropped: 0, refused: 0, bytes: 0 };
  #default: Required<LinkOptions>;
  #links = new Map<string, Required<LinkOptions>>();
  #nodes = new Map<PeerId, MemoryTransport>();
  #group = new Map<PeerId, number>();
  #slow = new Map<PeerId, SlowOptions>();
  #lastDelivery = new Map<string, number>();

  constructor(clock: Clock, opts: MemoryNetworkOptions = {}) {
    this.clock = clock;
    this.random = seededRandom(opts.seed ?? 1);
    this.maxMessageBytes = opts.maxMessageBytes ?? 1 << 20;
    this.#default = fill(opts.link ?? {});
  }

  /** Creates (or replaces, e.g. for a restart) the transport of node `id` with direct address `addr`. */
  connect(id: PeerId, addrs: string[] = [`mem:${id}`]): MemoryTransport {
    const t = new MemoryTransport(this, { id, addrs });
    this.#nodes.set(id, t);
    return t;
  }

  /** Sets the behaviour of the link from `a` to `b` (and `b` to `a` unless `oneWay`). */
  setLink(a: PeerId, b: PeerId, link: LinkOptions, opts: { oneWay?: boolean } = {}): void {
    this.#links.set(`${a}\n${b}`, fill(link, this.#default));
    if (!opts.oneWay) this.#links.set(`${b}\n${a}`, fill(link, this.#default));
  }

  /** Sets the default link behaviour (for pairs without setLink). */
  setDefaultLink(link: LinkOptions): void {
    this.#default = fill(link, this.#default);
  }

  /** Splits the network: nodes in different groups cannot reach each other; unlisted nodes form group 0. */
  partition(groups: PeerId[][]): void {
    this.#group.clear();
    groups.forEach((g, i) => g.forEach((id) => this.#group.set(id, i + 1)));
  }

  /** Removes every partition. */
  heal(): void {
    this.#group.clear();
  }

  /** Makes `id` slow (or normal again with undefined). */
  setSlow(id: PeerId, slow: SlowOptions | undefined): void {
    if (slow) this.#slow.set(id, slow);
    else this.#slow.delete(id);
  }

  /** Crashes node `id`: its transport stops sending and receiving, like kill -9. */
  kill(id: PeerId): void {
    this.#nodes.get(id)?.markClosed();
    this.#nodes.delete(id);
  }

  /** True when `a` can currently reach `b` (both up, same side of any partition). */
  reachable(a: PeerId, b: PeerId): boolean {
    return this.#nodes.has(a) && this.#nodes.has(b) &&
      (this.#group.get(a) ?? 0) === (this.#group.get(b) ?? 0);
  }

  /** Called by MemoryTransport.send. */
  route(from: MemoryTransport, to: PeerAddr, msg: Uint8Array, channel: Channel): boolean {
    this.stats.sent++;
    const a = from.self.id;
    const dest = this.#nodes.get(to.id);
    if (dest === undefined || this.#nodes.get(a) !== from || !this.reachable(a, to.id)) {
      this.stats.refused++;
      return false;
    }
    const link = this.#links.get(`${a}\n${to.id}`) ?? this.#default;
    if (link.loss > 0 && this.random() < link.loss) {
      this.stats.dropped++;
      return true;
    }
    let delay = link.delayMs + (link.jitterMs > 0 ? this.random() * link.jitterMs : 0);
    const slow = this.#slow.get(a);
    if (slow && this.random() < slow.probability) {
      delay += slow.minMs + this.random() * (slow.maxMs - slow.minMs);
    }
    // Keep per (sender, receiver, channel) order: never deliver before the previous message.
    const key = `${a}\n${to.id}\n${channel}`;
    const at = Math.max(this.clock.now() + delay, this.#lastDelivery.get(key) ?? 0);
    this.#lastDelivery.set(key, at);
    const copy = msg.slice();
    this.stats.bytes += copy.length;
    this.clock.schedule(() => {
      // The receiver may have crashed, restarted or been cut off while the message was in flight.
      if (this.#nodes.get(to.id) !== dest || !this.reachable(a, to.id)) {
        this.stats.dropped++;
        return;
      }
      this.stats.delivered++;
      dest.deliver(from.self, copy, channel);
    }, at - this.clock.now());
    return true;
  }
}

/** One node's endpoint on a MemoryNetwork. */
export class MemoryTransport implements Transport {
  readonly self: PeerAddr;
  readonly maxMessageBytes: number;
  #net: MemoryNetwork;
  #handler: Handler | undefined;
  #closed = false;
  /** Peers forgotten via forget(); kept only so tests can check membership calls it. */
  readonly forgotten: PeerId[] = [];

  constructor(net: MemoryNetwork, self: PeerAddr) {
    this.#net = net;
    this.self = { id: self.id, addrs: [...self.addrs] };
    this.maxMessageBytes = net.maxMessageBytes;
  }

  send(to: PeerAddr, msg: Uint8Array, channel: Channel = "control"): Promise<boolean> {
    if (msg.length > this.maxMessageBytes) {
      return Promise.reject(
        new RangeError(
          `send: message of ${msg.length} bytes exceeds maxMessageBytes ${this.maxMessageBytes}`,
        ),
      );
    }
    if (this.#closed) return Promise.resolve(false);
    return Promise.resolve(this.#net.route(this, to, msg, channel));
  }

  onMessage(handler: Handler): void {
    this.#handler = handler;
  }

  /** Throws PeerUnreachableError when `to` is down, unknown, or across a partition (no delay: no dial). */
  connect(to: PeerAddr): Promise<void> {
    if (this.#closed || !this.#net.reachable(this.self.id, to.id)) {
      return Promise.reject(
        new PeerUnreachableError(`cannot reach ${to.id}: not on this side of the network`),
      );
    }
    return Promise.resolve();
  }

  forget(peer: PeerId): void {
    this.forgotten.push(peer);
  }

  close(): Promise<void> {
    this.#net.kill(this.self.id);
    return Promise.resolve();
  }

  /** Called by the network. */
  deliver(from: PeerAddr, msg: Uint8Array, channel: Channel): void {
    if (!this.#closed) this.#handler?.(from, msg, channel);
  }

  /** Called by the network on kill(). */
  markClosed(): void {
    this.#closed = true;
  }
}

function fill(link: LinkOptions, base?: Required<LinkOptions>): Required<LinkOptions> {
  const out = {
    loss: link.loss ?? base?.loss ?? 0,
    delayMs: link.delayMs ?? base?.delayMs ?? 1,
    jitterMs: link.jitterMs ?? base?.jitterMs ?? 0,
  };
  if (!(out.loss >= 0 && out.loss <= 1)) throw new RangeError(`link loss must be in [0, 1], got ${out.loss}`);
  if (!(out.delayMs >= 0)) throw new RangeError(`link delayMs must be >= 0, got ${out.delayMs}`);
  if (!(out.jitterMs >= 0)) throw new RangeError(`link jitterMs must be >= 0, got ${out.jitterMs}`);
  return out;
}
