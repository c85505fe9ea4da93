// SWIM with the Lifeguard extensions, after hashicorp/memberlist. The protocol steps are plain methods
// (probe, gossip, pushPull, reconnect); start() only schedules them on the Clock. State changes go
// through the pure apply() of state.ts; this file turns their results into effects.
import { type Cancel, type Clock, SystemClock } from "../clock.ts";
import { shuffle } from "../random.ts";
import type { Channel, PeerAddr, PeerId, Transport } from "../transport/transport.ts";
import { Awareness } from "./awareness.ts";
import { BroadcastQueue } from "./broadcast.ts";
import { lan, type MembershipConfig, membershipConfig } from "./config.ts";
import {
  decodePacket,
  encodeMessage,
  framedSize,
  fromBase64,
  type Message,
  PACKET_HEADER_BYTES,
  packPacket,
  type PushPullMsg,
  toBase64,
} from "./messages.ts";
import {
  apply,
  type ApplyResult,
  eventFromRemote,
  forget,
  liveCount,
  type Member,
  type MemberEvent,
  type MemberState,
  type MemberTable,
  type NodeDescriptor,
  setSelf,
} from "./state.ts";
import { Suspicion, suspicionTimeouts } from "./suspicion.ts";

/** A component whose messages ride on membership's gossip (memberlist's Delegate), e.g. the registry. */
export interface GossipDelegate {
  /** Full local state, sent in every push-pull; undefined sends nothing. */
  localState(join: boolean): Uint8Array | undefined;
  /** A peer's full state from a push-pull. */
  mergeRemoteState(state: Uint8Array, from: PeerId, join: boolean): void;
  /** A broadcast queued by `broadcast` on some node. */
  notifyMsg(payload: Uint8Array, from: PeerId): void;
}

/** What a registered delegate gets back: its way to broadcast, and to detach. */
export interface DelegateHandle {
  /** Gossips `payload` to every member; a later broadcast with the same key replaces a queued one. */
  broadcast(key: string, payload: Uint8Array): void;
  /**
   * Sends `payload` at once, directly, to every alive member (one message each, delivered like a
   * broadcast). For rare news that every member needs soon: gossip alone leaves a tail (a member that
   * every retransmit missed) that waits for its next push-pull.
   */
  sendToMembers(payload: Uint8Array): void;
  /** Stops delivering to the delegate. */
  remove(): void;
}

/** A member's state changed (joined, suspected, refuted, died, left, new metadata). */
export interface MemberChange {
  member: Member;
  /** Undefined when the member is new to us. */
  previous?: MemberState;
}

/** Counters, for status and the simulations. */
export interface MembershipStats {
  probes: number;
  probeFailures: number;
  /** Suspicions this node raised. */
  suspected: number;
  /** Times this node refuted a suspicion about itself. */
  refuted: number;
  /** Members this node declared dead itself (its suspicion timer ran out). */
  declaredDead: number;
  /** Packets or messages dropped as malformed. */
  malformed: number;
  /** Sends that resolved false or failed. */
  sendFailed: number;
  /** Push-pulls started because a packet came from a member this node did not know. */
  strangerPulls: number;
}

export interface MembershipOptions {
  /** Carries the packets; Membership calls send/forget and, unless `listen` is false, onMessage. */
  transport: Transport;
  /** This node's descriptor (shared with the cluster). */
  meta: NodeDescriptor;
  /** Default: the system clock. */
  clock?: Clock;
  /** Default: the `lan` preset. Fill with membershipConfig(overrides, preset). */
  config?: MembershipConfig;
  /** Random source for probe order and gossip targets. Default Math.random. */
  random?: () => number;
  /**
   * Register as the transport's message handler. Default true. Set false when something else
   * demultiplexes the transport (it then calls `receive` for packets where isMembershipPacket is true).
   */
  listen?: boolean;
  /** Transport channel used. Default "control". */
  channel?: Channel;
  /** Starting incarnation (e.g. persisted, or the wall clock in seconds after a restart). Default 0. */
  incarnation?: number;
}

interface Probe {
  target: PeerId;
  acked: boolean;
  nacks: number;
  expectedNacks: number;
  /** For a ping sent on behalf of another node: where to forward the ack/nack. */
  relay?: { to: PeerAddr; seq: number; nack: boolean };
  onAck?: () => void;
  /** Clock time the direct ping left, for the round trip its ack measures. */
  sentAt: number;
}

export class Membership {
  readonly config: MembershipConfig;
  readonly stats: MembershipStats = {
    probes: 0,
    probeFailures: 0,
    suspected: 0,
    refuted: 0,
    declaredDead: 0,
    malformed: 0,
    sendFailed: 0,
    strangerPulls: 0,
  };
  readonly awareness: Awareness;
  #t: Transport;
  #clock: Clock;
  #random: () => number;
  #channel: Channel;
  #self: PeerAddr;
  #table: MemberTable;
  #queue: BroadcastQueue;
  /** Unknown senders we pulled state from, and when (see #learnFromStranger). */
  #strangers = new Map<string, number>();
  #suspicions = new Map<PeerId, Suspicion>();
  #probes = new Map<number, Probe>();
  #seq = 0;
  #probeOrder: PeerId[] = [];
  #listeners = new Set<(c: MemberChange) => void>();
  #rttListeners = new Set<(peer: PeerId, ms: number) => void>();
  #delegates = new Map<string, GossipDelegate>();
  #timers: Cancel[] = [];
  #running = false;
  #leaving = false;
  #joinWaiters = new Map<PeerId, () => void>();

  constructor(opts: MembershipOptions) {
    this.config = opts.config ?? membershipConfig({}, lan);
    this.#t = opts.transport;
    this.#clock = opts.clock ?? new SystemClock();
    this.#random = opts.random ?? Math.random;
    this.#channel = opts.channel ?? "control";
    this.#self = opts.transport.self;
    this.awareness = new Awareness(this.config.awarenessMaxMultiplier);
    this.#queue = new BroadcastQueue(this.config.retransmitMult);
    const self: Member = {
      id: this.#self.id,
      addrs: [...this.#self.addrs],
      incarnation: opts.incarnation ?? 0,
      state: "alive",
      meta: opts.meta,
      since: this.#clock.now(),
    };
    this.#table = new Map([[self.id, self]]);
    if (opts.listen ?? true) this.#t.onMessage((from, msg) => this.receive(from, msg));
  }

  // ---- public API -------------------------------------------------------------------------------

  /** This node's id. */
  get id(): PeerId {
    return this.#self.id;
  }

  /** Snapshot of every known member (this node included; dead and left tombstones too). */
  members(): Member[] {
    return [...this.#table.values()];
  }

  /** The membership clock's time, ms (the system clock, or a simulation's fake one). */
  now(): number {
    return this.#clock.now();
  }

  /** One member by id. */
  member(id: PeerId): Member | undefined {
    return this.#table.get(id);
  }

  /** Alive and suspect members, this node included (the N of the log N formulas). */
  numLive(): number {
    return liveCount(this.#table);
  }

  /** Calls `cb` on every member change; returns an unsubscribe function. */
  onChange(cb: (c: MemberChange) => void): () => void {
    this.#listeners.add(cb);
    return () => this.#listeners.delete(cb);
  }

  /**
   * Calls `cb` with the round trip, in ms, of every direct ping this node sends that its target answers
   * itself (its own probes and those it makes for others): link timing at no cost in packets.
   */
  onRtt(cb: (peer: PeerId, ms: number) => void): () => void {
    this.#rttListeners.add(cb);
    return () => this.#rttListeners.delete(cb);
  }

  /** Changes this node's descriptor and tells the cluster (a new incarnation). */
  setMetadata(meta: NodeDescriptor): void {
    const me = this.#table.get(this.id)!;
    this.#setSelf({ ...me, meta, incarnation: me.incarnation + 1 });
  }

  /** Attaches a delegate under a unique `name`; its broadcasts and state ride on gossip and push-pull. */
  addDelegate(name: string, d: GossipDelegate): DelegateHandle {
    if (this.#delegates.has(name)) throw new TypeError(`membership delegate "${name}" is already registered`);
    this.#delegates.set(name, d);
    return {
      broadcast: (key, payload) =>
        this.#queue.queue(
          `u:${name}:${key}`,
          encodeMessage({ t: "user", ch: name, data: toBase64(payload) }),
        ),
      sendToMembers: (payload) => {
        const packet = packPacket([encodeMessage({ t: "user", ch: name, data: toBase64(payload) })]);
        for (const m of this.#table.values()) {
          if (m.id !== this.id && m.state === "alive") this.#sendRaw(m, packet);
        }
      },
      remove: () => this.#delegates.delete(name),
    };
  }

  /** Starts the periodic protocol (probe, gossip, push-pull, reconnect), each with a random phase. */
  start(): void {
    if (this.#running) return;
    this.#running = true;
    const c = this.config;
    this.#every(() => this.awareness.scale(c.probeIntervalMs), () => this.probe());
    this.#every(() => c.gossipIntervalMs, () => this.gossip());
    if (c.pushPullIntervalMs > 0) this.#every(() => c.pushPullIntervalMs, () => this.pushPull());
    if (c.reconnectIntervalMs > 0) this.#every(() => c.reconnectIntervalMs, () => this.reconnect());
  }

  /** Stops every timer; no goodbye (see leave). The transport is left open. */
  stop(): void {
    this.#running = false;
    for (const cancel of this.#timers) cancel();
    this.#timers = [];
    for (const s of this.#suspicions.values()) s.cancel();
    this.#suspicions.clear();
  }

  /**
   * Starts, then sends a join push-pull to each seed. Resolves with the number of seeds that answered
   * within `timeoutMs` (default 5 probe intervals).
   */
  join(seeds: PeerAddr[], opts: { timeoutMs?: number } = {}): Promise<number> {
    this.start();
    const timeout = opts.timeoutMs ?? 5 * this.config.probeIntervalMs;
    const waits = seeds.filter((s) => s.id !== this.id).map((seed) =>
      new Promise<boolean>((resolve) => {
        const cancel = this.#clock.schedule(() => {
          this.#joinWaiters.delete(seed.id);
          resolve(false);
        }, timeout);
        this.#joinWaiters.set(seed.id, () => {
          cancel();
          resolve(true);
        });
        this.#sendPushPull(seed, true, false);
      })
    );
    return Promise.all(waits).then((r) => r.filter(Boolean).length);
  }

  /**
   * Leaves gracefully: marks this node left (a higher incarnation), tells every live member directly and
   * by gossip, keeps gossiping for `propagateMs` (default 3 gossip intervals), then stops.
   */
  leave(opts: { propagateMs?: number } = {}): Promise<void> {
    const me = this.#table.get(this.id)!;
    this.#leaving = true;
    const left: Member = { ...me, incarnation: me.incarnation + 1, state: "left", since: this.#clock.now() };
    this.#table = setSelf(this.#table, left);
    const msg = encodeMessage({ t: "leave", id: this.id, inc: left.incarnation });
    this.#queue.queue(this.id, msg);
    for (const m of this.#table.values()) {
      if (m.id !== this.id && (m.state === "alive" || m.state === "suspect")) this.#send(m, [msg]);
    }
    this.#emit({ member: left, previous: me.state });
    return new Promise((resolve) => {
      this.#clock.schedule(() => {
        this.stop();
        resolve();
      }, opts.propagateMs ?? 3 * this.config.gossipIntervalMs);
    });
  }

  // ---- protocol steps ---------------------------------------------------------------------------

  /** One failure-detection round: ping the next member; ping-req through k others if no ack in time. */
  probe(): void {
    if (this.#leaving) return;
    const target = this.#nextProbeTarget();
    if (!target) return;
    this.stats.probes++;
    const c = this.config;
    const seq = ++this.#seq;
    const p: Probe = {
      target: target.id,
      acked: false,
      nacks: 0,
      expectedNacks: 0,
      sentAt: this.#clock.now(),
    };
    this.#probes.set(seq, p);
    const ping = [encodeMessage({ t: "ping", seq, target: target.id })];
    if (target.state === "suspect") {
      // Lifeguard's buddy system: tell the suspect directly, so it can refute even if gossip missed it.
      ping.push(encodeMessage({ t: "suspect", id: target.id, inc: target.incarnation, from: this.id }));
    }
    this.#send(target, ping);
    const interval = this.awareness.scale(c.probeIntervalMs);
    this.#clock.schedule(() => {
      if (p.acked) {
        this.awareness.applyDelta(-1);
        return;
      }
      const helpers = this.#randomMembers(c.indirectChecks, (m) => m.state === "alive" && m.id !== target.id);
      for (const h of helpers) {
        if (c.lifeguard) p.expectedNacks++;
        this.#send(h, [
          encodeMessage({ t: "pingReq", seq, target: target.id, addrs: target.addrs, nack: c.lifeguard }),
        ]);
      }
    }, this.awareness.scale(c.probeTimeoutMs));
    this.#clock.schedule(() => {
      this.#probes.delete(seq);
      if (p.acked || this.#leaving) return;
      this.stats.probeFailures++;
      // Missing nacks mean our own network or process is the problem (Lifeguard); without helpers to
      // tell, any failed probe counts against our health.
      this.awareness.applyDelta(p.expectedNacks > 0 ? p.expectedNacks - p.nacks : 1);
      const m = this.#table.get(target.id);
      if (m && (m.state === "alive" || m.state === "suspect")) {
        // On a member already suspected, our own failed probe is an independent confirmation.
        if (m.state === "alive") this.stats.suspected++;
        this.#applyEvent({ type: "suspect", id: m.id, incarnation: m.incarnation, from: this.id });
      }
    }, interval);
  }

  /** One gossip round: queued broadcasts to `gossipNodes` random members. */
  gossip(): void {
    if (this.#queue.length === 0) return;
    const now = this.#clock.now();
    const targets = this.#randomMembers(
      this.config.gossipNodes,
      (m) =>
        m.state === "alive" || m.state === "suspect" ||
        (m.state === "dead" && now - m.since < this.config.gossipToTheDeadMs),
    );
    for (const t of targets) {
      const parts = this.#queue.take(this.config.packetBytes - PACKET_HEADER_BYTES, 4, this.numLive());
      if (parts.length === 0) break;
      // Not #sendPacket: its piggyback would take the same broadcasts again into this packet, spending
      // their transmits on one member (memberlist's gossip sends the taken batch as is, too).
      this.#sendRaw(t, packPacket(parts));
    }
  }

  /** Full-state exchange with one random live member (or `peer`). */
  pushPull(peer?: PeerAddr): void {
    const target = peer ?? this.#randomMembers(1, (m) => m.state === "alive")[0];
    if (target) this.#sendPushPull(target, false, false);
  }

  /**
   * Tombstone upkeep: forgets dead/left members older than tombstoneTimeoutMs, then sends a push-pull to
   * one random dead member. If it is back (a partition healed, a node restarted), the exchange makes
   * both sides refute and the groups merge.
   */
  reconnect(): void {
    const now = this.#clock.now();
    for (const m of this.#table.values()) {
      if ((m.state === "dead" || m.state === "left") && now - m.since >= this.config.tombstoneTimeoutMs) {
        this.#table = forget(this.#table, m.id);
      }
    }
    const dead = this.#randomMembers(1, (m) => m.state === "dead");
    if (dead[0]) this.#sendPushPull(dead[0], false, false);
  }

  /** Handles one packet from the transport. Never throws; malformed input is counted in stats.malformed. */
  receive(from: PeerAddr, bytes: Uint8Array): void {
    try {
      const { messages, malformed } = decodePacket(bytes);
      this.stats.malformed += malformed;
      for (const m of messages) this.#handle(from, m);
    } catch {
      this.stats.malformed++;
    }
  }

  // ---- message handling -------------------------------------------------------------------------

  #handle(from: PeerAddr, m: Message): void {
    if (this.#leaving && m.t !== "pushPull") return;
    this.#learnFromStranger(from, m);
    switch (m.t) {
      case "ping":
        if (m.target === this.id) this.#sendPacket(from, [encodeMessage({ t: "ack", seq: m.seq })]);
        return;
      case "pingReq":
        return this.#relayPing(from, m.seq, { id: m.target, addrs: m.addrs }, m.nack);
      case "ack": {
        const p = this.#probes.get(m.seq);
        if (!p || p.acked) return;
        p.acked = true;
        // An ack that comes through a helper (our ping-req) timed two links, not this one.
        if (from.id === p.target) this.#emitRtt(p.target, this.#clock.now() - p.sentAt);
        if (p.relay) {
          this.#probes.delete(m.seq);
          this.#sendPacket(p.relay.to, [encodeMessage({ t: "ack", seq: p.relay.seq })]);
        }
        return;
      }
      case "nack": {
        const p = this.#probes.get(m.seq);
        if (p) p.nacks++;
        return;
      }
      case "alive":
        return this.#applyEvent({
          type: "alive",
          id: m.id,
          incarnation: m.inc,
          addrs: m.addrs,
          meta: m.meta,
        });
      case "suspect":
        return this.#applyEvent({ type: "suspect", id: m.id, incarnation: m.inc, from: m.from }, from);
      case "dead":
        return this.#applyEvent({ type: "dead", id: m.id, incarnation: m.inc, from: m.from }, from);
      case "leave":
        return this.#applyEvent({ type: "leave", id: m.id, incarnation: m.inc });
      case "pushPull":
        return this.#mergePushPull(from, m);
      case "user": {
        const d = this.#delegates.get(m.ch);
        const data = fromBase64(m.data);
        if (!data) this.stats.malformed++;
        else if (d) this.#callDelegate(() => d.notifyMsg(data, from.id));
        return;
      }
    }
  }

  #relayPing(requester: PeerAddr, seq: number, target: PeerAddr, nack: boolean): void {
    const local = ++this.#seq;
    const p: Probe = {
      target: target.id,
      acked: false,
      nacks: 0,
      expectedNacks: 0,
      relay: { to: requester, seq, nack },
      sentAt: this.#clock.now(),
    };
    this.#probes.set(local, p);
    this.#sendPacket(target, [encodeMessage({ t: "ping", seq: local, target: target.id })]);
    this.#clock.schedule(() => {
      this.#probes.delete(local);
      if (!p.acked && nack) this.#sendPacket(requester, [encodeMessage({ t: "nack", seq })]);
    }, this.config.probeTimeoutMs);
  }

  #mergePushPull(from: PeerAddr, m: PushPullMsg): void {
    if (this.#leaving) {
      // Still answer, so the peer learns we left.
      if (!m.reply) this.#sendPushPull(from, m.join, true);
      return;
    }
    for (const r of m.members) {
      // A stale accusation in a reply is corrected directly (a request gets our full state back anyway).
      this.#applyEvent(eventFromRemote({ ...r, since: 0 }, from.id), m.reply ? from : undefined);
    }
    for (const [name, b64] of Object.entries(m.user)) {
      const d = this.#delegates.get(name);
      const data = fromBase64(b64);
      if (!data) this.stats.malformed++;
      else if (d) this.#callDelegate(() => d.mergeRemoteState(data, from.id, m.join));
    }
    if (!m.reply) this.#sendPushPull(from, m.join, true);
    else this.#joinWaiters.get(from.id)?.();
  }

  /**
   * A packet from a member we do not know (the transport already checked it holds the cluster secret)
   * means we missed its alive broadcasts, which are probabilistic: a node that joined while we were
   * unlucky would otherwise stay unknown to us until the next periodic push-pull (30 s on lan). Pull
   * its state at once, at most once per stranger per probe interval. Tombstoned ids are not strangers.
   */
  #learnFromStranger(from: PeerAddr, m: Message): void {
    if (m.t === "pushPull" || from.id === this.id || this.#table.has(from.id)) return;
    const now = this.#clock.now();
    if (now - (this.#strangers.get(from.id) ?? -Infinity) < this.config.probeIntervalMs) return;
    this.#strangers.set(from.id, now);
    if (this.#strangers.size > 1024) this.#strangers.delete(this.#strangers.keys().next().value!);
    this.stats.strangerPulls++;
    this.#sendPushPull(from, false, false);
  }

  /** Applies an event; `sender` (the packet's sender) gets a correction if the event is stale news. */
  #applyEvent(e: MemberEvent, sender?: PeerAddr): void {
    if (sender && (e.type === "suspect" || e.type === "dead")) this.#correctStale(e, sender);
    const r: ApplyResult = apply(this.#table, e, {
      self: this.id,
      now: this.#clock.now(),
      deadNodeReclaimMs: this.config.deadNodeReclaimMs,
    });
    if (r.refute !== undefined) return this.#refute(r.refute);
    if (r.confirm && e.type === "suspect") {
      const s = this.#suspicions.get(e.id);
      if (s?.confirm(e.from)) this.#queue.queue(e.id, encodeMessage(toWire(e)));
      return;
    }
    if (!r.change) return;
    this.#table = r.table;
    const { before, after } = r.change;
    if (after.state !== "suspect") {
      this.#suspicions.get(after.id)?.cancel();
      this.#suspicions.delete(after.id);
    } else if (before?.state !== "suspect") {
      this.#startSuspicion(after, e.type === "suspect" ? e.from : this.id);
      // Probe a new suspect next: it either confirms the failure or, through the buddy-system ping,
      // lets the suspect refute (or correct our stale incarnation).
      if (e.type === "suspect" && e.from !== this.id) this.#probeOrder.push(after.id);
    }
    if (r.rebroadcast) this.#queue.queue(after.id, encodeMessage(toWire(e)));
    if ((after.state === "dead" || after.state === "left") && before?.state !== after.state) {
      this.#t.forget(after.id);
    }
    if (
      before?.state !== after.state || before.incarnation !== after.incarnation || before.meta !== after.meta
    ) {
      this.#emit({ member: after, previous: before?.state });
    }
  }

  /**
   * An accusation at an incarnation older than the one we know means the sender missed the member's
   * refutation (broadcasts are probabilistic and lossy): send it the current alive directly, so a lone
   * stale view does not wait for a push-pull and, meanwhile, declare a live member dead.
   */
  #correctStale(e: MemberEvent, sender: PeerAddr): void {
    const m = this.#table.get(e.id);
    if (!m || m.state !== "alive" || e.incarnation >= m.incarnation || sender.id === e.id) return;
    this.#sendPacket(sender, [
      encodeMessage({ t: "alive", id: m.id, inc: m.incarnation, addrs: m.addrs, meta: m.meta }),
    ]);
  }

  #startSuspicion(m: Member, from: PeerId): void {
    const timeouts = suspicionTimeouts(this.numLive(), this.config);
    const s = new Suspicion(from, timeouts, this.#clock, () => {
      this.#suspicions.delete(m.id);
      const cur = this.#table.get(m.id);
      if (!cur || cur.state !== "suspect") return;
      this.stats.declaredDead++;
      this.#applyEvent({ type: "dead", id: m.id, incarnation: cur.incarnation, from: this.id });
    });
    this.#suspicions.set(m.id, s);
  }

  #refute(accused: number): void {
    if (this.#leaving) return;
    const me = this.#table.get(this.id)!;
    this.stats.refuted++;
    this.awareness.applyDelta(1);
    this.#setSelf({ ...me, incarnation: Math.max(me.incarnation, accused) + 1, state: "alive" });
  }

  #setSelf(me: Member): void {
    const before = this.#table.get(this.id)!;
    this.#table = setSelf(this.#table, me);
    this.#queue.queue(
      this.id,
      encodeMessage({ t: "alive", id: me.id, inc: me.incarnation, addrs: me.addrs, meta: me.meta }),
    );
    this.#emit({ member: me, previous: before.state });
  }

  // ---- helpers ----------------------------------------------------------------------------------

  #nextProbeTarget(): Member | undefined {
    for (let tries = 0; tries < 2; tries++) {
      while (this.#probeOrder.length > 0) {
        const m = this.#table.get(this.#probeOrder.pop()!);
        if (m && m.id !== this.id && (m.state === "alive" || m.state === "suspect")) return m;
      }
      this.#probeOrder = shuffle([...this.#table.keys()], this.#random);
    }
    return undefined;
  }

  #randomMembers(k: number, ok: (m: Member) => boolean): Member[] {
    const pool: Member[] = [];
    for (const m of this.#table.values()) if (m.id !== this.id && ok(m)) pool.push(m);
    return shuffle(pool, this.#random).slice(0, k);
  }

  #sendPushPull(to: PeerAddr, join: boolean, reply: boolean): void {
    const user: Record<string, string> = {};
    for (const [name, d] of this.#delegates) {
      const s = this.#callDelegate(() => d.localState(join));
      if (s) user[name] = toBase64(s);
    }
    const members = [...this.#table.values()].map(({ since: _, ...m }) => m);
    this.#sendRaw(to, packPacket([encodeMessage({ t: "pushPull", join, reply, members, user })]));
  }

  /** Sends `parts` plus as many piggybacked broadcasts as fit in packetBytes. */
  #send(to: PeerAddr, parts: Uint8Array[]): void {
    this.#sendPacket(to, parts);
  }

  #sendPacket(to: PeerAddr, parts: Uint8Array[]): void {
    let used = PACKET_HEADER_BYTES;
    for (const p of parts) used += framedSize(p);
    const extra = this.#queue.take(this.config.packetBytes - used, 4, this.numLive());
    this.#sendRaw(to, packPacket(extra.length ? [...parts, ...extra] : parts));
  }

  #sendRaw(to: PeerAddr, packet: Uint8Array): void {
    // A false or a rejection is a lost packet: the protocol's timeouts and retransmits cover it.
    let p: Promise<boolean>;
    try {
      p = this.#t.send({ id: to.id, addrs: to.addrs }, packet, this.#channel);
    } catch {
      this.stats.sendFailed++;
      return;
    }
    p.then((ok) => {
      if (!ok) this.stats.sendFailed++;
    }, () => this.stats.sendFailed++);
  }

  #emit(c: MemberChange): void {
    for (const cb of this.#listeners) {
      try {
        cb(c);
      } catch {
        // A listener's bug must not break the protocol.
      }
    }
  }

  #emitRtt(peer: PeerId, ms: number): void {
    for (const cb of this.#rttListeners) {
      try {
        cb(peer, ms);
      } catch {
        // A listener's bug must not break the protocol.
      }
    }
  }

  #callDelegate<T>(fn: () => T): T | undefined {
    try {
      return fn();
    } catch {
      return undefined;
    }
  }

  /** Runs `step` repeatedly, the first time after a random fraction of the period. */
  #every(period: () => number, step: () => void): void {
    const slot = this.#timers.length;
    const tick = () => {
      if (!this.#running) return;
      step();
      this.#timers[slot] = this.#clock.schedule(tick, period());
    };
    this.#timers.push(this.#clock.schedule(tick, this.#random() * period()));
  }
}

function toWire(e: MemberEvent): Message {
  switch (e.type) {
    case "alive":
      return { t: "alive", id: e.id, inc: e.incarnation, addrs: e.addrs, meta: e.meta };
    case "suspect":
      return { t: "suspect", id: e.id, inc: e.incarnation, from: e.from };
    case "dead":
      return { t: "dead", id: e.id, inc: e.incarnation, from: e.from };
    case "leave":
      return { t: "leave", id: e.id, inc: e.incarnation };
  }
}
