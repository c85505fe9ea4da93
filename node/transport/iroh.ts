// The iroh transport: one QUIC endpoint per node, one cached authenticated connection per peer, two
// long-lived channels per connection ("control" and "data"), length-framed messages, coalesced writes.
// The data channel takes the TLS path (node/transport/tls_path.ts: a direct TLS connection opened from the
// authenticated iroh connection, hundreds of MB/s) where the peer offers one and it can be reached, and the
// iroh connection's second stream otherwise (relayed or hole-punched peers). Nothing above the transport
// knows which.
// Offline by default (presetMinimal: no relay, no discovery; peers are dialed at their direct addresses);
// `preset: "n0"` adds n0's relays and discovery for use across the internet, `relayUrl` a relay of one's
// own. A relay that cannot be reached is reported once; the node works on direct addresses meanwhile.
import iroh from "@number0/iroh";
import type { Connection, Endpoint, Incoming } from "@number0/iroh";
import { CONTROL_MAX_BYTES, DATA_MAX_BYTES, encodeFrame, FrameKind } from "../wire/mod.ts";
import type { DataPath, TlsOffer } from "../wire/mod.ts";
import { importSecret } from "./handshake.ts";
import {
  acceptDataStream,
  acceptorHandshake,
  dialerHandshake,
  HandshakeError,
  openDataStream,
  readPath,
  sendPath,
} from "./iroh_handshake.ts";
import { FrameReader, irohSource } from "./frame_reader.ts";
import { BindError, PeerUnreachableError } from "./errors.ts";
import {
  type ChannelPipe,
  type Deliver,
  IrohLink,
  irohPipe,
  type LinkStreams,
  type Log,
  shortError,
  tlsPipe,
} from "./iroh_link.ts";
import {
  dialTlsPath,
  joinHostPort,
  type PendingOffer,
  splitHostPort,
  TlsPath,
  type TlsStream,
} from "./tls_path.ts";
import type { Channel, CloseOptions, PeerAddr, PeerId, Transport } from "./transport.ts";

export { BindError, PeerUnreachableError };

const { Endpoint: EndpointClass, EndpointAddr, EndpointId, presetMinimal, presetN0, RelayMode } = iroh;

/** The ALPN carries no version: a version mismatch is detected in the frame header with a clear error. */
export const ALPN = Array.from(new TextEncoder().encode("swactor"));

/** How long close({ exiting }) waits for iroh's own close when an unsettled connect holds it (see close). */
const ABANDONED_CLOSE_GRACE_MS = 200;

export interface IrohTransportOptions {
  /** The cluster secret from the ticket; peers must prove they hold it. Required. */
  secret: Uint8Array;
  /** Address to bind, "host:port" (default "127.0.0.1:0": loopback, any free port). */
  bindAddr?: string;
  /** "minimal" (default: offline, direct addresses only) or "n0" (n0 relays and discovery). */
  preset?: "minimal" | "n0";
  /** A relay of one's own (an iroh relay server's URL), with the minimal preset. Default: none. */
  relayUrl?: string;
  /** Report the relay unreachable when it is not up after this long (default 5000 ms). */
  relayTimeoutMs?: number;
  /** 32-byte iroh secret key for a stable identity across restarts (default: a fresh one). */
  secretKey?: Uint8Array;
  /** Give up dialing after this long (default 5000 ms). */
  dialTimeoutMs?: number;
  /** Give up on a handshake after this long (default 5000 ms). */
  handshakeTimeoutMs?: number;
  /**
   * The TLS data path's listen address, "host:port", or false for none (data then always stays on iroh,
   * and this node neither offers nor dials it). Default: the host and port of `bindAddr` (TCP beside iroh's
   * UDP: one number for a firewall; an error when that TCP port is taken); with port 0, the port number
   * iroh got when that TCP port is free, else any. None when the environment has SWACTOR_TLS=off.
   */
  tls?: string | false;
  /** Give up opening the TLS path to a peer after this long and keep its data on iroh (default 1500 ms). */
  tlsTimeoutMs?: number;
  /** Coalescer flush threshold (default 256 KiB). */
  flushBytes?: number;
  /** Log sink (default: warnings to stderr). */
  log?: Log;
  /**
   * Dial overrides, a test/bench hook (default: none): a peer direct address ("ip:port", as membership
   * gossips it) maps to the address dialed instead, e.g. a WAN-emulation relay in front of that peer
   * (docs/WAN.md). Keyed by address rather than peer id because ids exist only once the nodes have
   * started, while their addresses can be fixed beforehand. Addresses without an entry are dialed as given.
   */
  dialOverrides?: ReadonlyMap<string, string>;
}

export class IrohTransport implements Transport {
  readonly maxMessageBytes = DATA_MAX_BYTES;
  readonly self: PeerAddr;
  #links = new Map<PeerId, IrohLink>();
  #dialing = new Map<PeerId, Promise<IrohLink | undefined>>();
  /** Connects iroh has not settled yet (a dial gives one up at its timeout, but iroh cannot cancel it). */
  #connecting = new Set<Promise<unknown>>();
  #handler: Deliver = () => {};
  #closed = false;
  /** Set by quiesce(): no new dials. */
  #quiet = false;
  #relayTimer: ReturnType<typeof setTimeout> | undefined;
  readonly #boot = Array.from(crypto.getRandomValues(new Uint8Array(8)), (b) => b.toString(16)).join("");
  readonly #log: Log;

  constructor(
    readonly endpoint: Endpoint,
    readonly key: CryptoKey,
    readonly opts: IrohTransportOptions,
    /** The TLS data path's listener; undefined when `opts.tls` is false. */
    readonly tls?: TlsPath,
  ) {
    const id = endpoint.id().toString();
    // Only the family asked for is advertised (createIrohTransport pins the other one to loopback).
    const v6 = (opts.bindAddr ?? "").startsWith("[");
    const addrs = endpoint.addr().directAddresses();
    const asked = addrs.filter((a) => a.startsWith("[") === v6);
    this.self = { id, addrs: asked.length ? asked : addrs };
    if (opts.relayUrl) this.self = { ...this.self, relay: opts.relayUrl };
    this.#log = opts.log ?? defaultLog(id);
    this.#acceptLoop();
    if (opts.preset === "n0" || opts.relayUrl) this.#watchRelay(opts.relayUrl ?? "n0's relays");
  }

  send(to: PeerAddr, msg: Uint8Array, channel: Channel = "control"): Promise<boolean> {
    const limit = channel === "control" ? CONTROL_MAX_BYTES : DATA_MAX_BYTES;
    if (msg.length > limit) {
      throw new RangeError(`message of ${msg.length} bytes exceeds the ${channel} channel limit of ${limit}`);
    }
    if (this.#closed) return Promise.resolve(false);
    if (to.id === this.self.id) {
      queueMicrotask(() => this.#handler(this.self, msg.slice(), channel));
      return Promise.resolve(true);
    }
    const frame = encodeFrame(FrameKind.MESSAGE, msg);
    const link = this.#links.get(to.id);
    if (link && !link.closed) return link.send(channel, frame);
    if (this.#quiet && !this.#dialing.has(to.id)) return Promise.resolve(false);
    return this.#dial(to).then((l) => l ? l.send(channel, frame) : false);
  }

  onMessage(handler: Deliver): void {
    this.#handler = handler;
  }

  quiesce(): void {
    this.#quiet = true;
  }

  forget(peer: PeerId): void {
    this.#links.get(peer)?.close("forgotten");
    this.#links.delete(peer);
  }

  /** Dials (if needed) and completes the handshake; throws PeerUnreachableError saying why it failed. */
  async connect(to: PeerAddr): Promise<void> {
    const link = this.#links.get(to.id);
    if (link && !link.closed) return;
    const errors: string[] = [];
    const l = await this.#dial(to, errors);
    if (!l) {
      throw new PeerUnreachableError(`cannot reach ${to.id.slice(0, 10)}: ${errors[0] ?? "dial failed"}`);
    }
  }

  /** Peers with an open authenticated connection. */
  connectedPeers(): PeerId[] {
    return [...this.#links.entries()].filter(([, l]) => !l.closed).map(([id]) => id);
  }

  /** Which path the data channel to `peer` takes, while a link is open. */
  dataPath(peer: PeerId): DataPath | undefined {
    const l = this.#links.get(peer);
    return l && !l.closed ? l.dataPath : undefined;
  }

  async close(opts: CloseOptions = {}): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    clearTimeout(this.#relayTimer);
    for (const l of this.#links.values()) l.close("transport closed");
    this.#links.clear();
    this.tls?.close();
    const closing = this.endpoint.close().catch(() => {});
    if (!opts.exiting || this.#connecting.size === 0) return await closing;
    // iroh's close waits out an unsettled connect (~3 s measured after a dial to a gone peer timed out)
    // though no peer is on the other end of it: a process about to exit waits briefly, then goes.
    let timer: ReturnType<typeof setTimeout> | undefined;
    await Promise.race([closing, new Promise((r) => (timer = setTimeout(r, ABANDONED_CLOSE_GRACE_MS)))]);
    clearTimeout(timer);
  }

  #deliver: Deliver = (from, msg, channel) => this.#handler(from, msg, channel);

  #dial(to: PeerAddr, errors?: string[]): Promise<IrohLink | undefined> {
    const pending = this.#dialing.get(to.id);
    if (pending) return pending;
    const p = this.#doDial(to, errors).finally(() => this.#dialing.delete(to.id));
    this.#dialing.set(to.id, p);
    return p;
  }

  async #doDial(to: PeerAddr, errors: string[] = []): Promise<IrohLink | undefined> {
    let conn: Connection | undefined;
    try {
      // The peer's home relay where known (the ticket's), else ours: a cluster shares its relay.
      const relay = to.relay ?? this.opts.relayUrl ?? null;
      const addr = new EndpointAddr(EndpointId.fromString(to.id), relay, this.#dialAddrs(to));
      const connecting = this.endpoint.connect(addr, ALPN);
      this.#connecting.add(connecting);
      connecting.catch(() => {}).finally(() => this.#connecting.delete(connecting));
      conn = await withTimeout<Connection>(
        connecting,
        this.opts.dialTimeoutMs ?? 5000,
        "dial",
        (c) => c.close(0n, []),
      );
      const c = conn;
      const hs = await withTimeout(
        (async () => {
          const ctl = await c.openBi();
          return { ctl, ...await dialerHandshake(ctl, this.#ctx(to.id)) };
        })(),
        this.opts.handshakeTimeoutMs ?? 5000,
        "handshake",
      );
      hs.reader.messageMax = CONTROL_MAX_BYTES;
      const tls = hs.offer && this.tls ? await this.#openTls(c, to, hs.offer) : undefined;
      let data: ChannelPipe;
      try {
        data = await withTimeout(
          (async () => {
            await sendPath(hs.ctl, tls ? "tls" : "iroh");
            if (tls) return tlsPipe(tls);
            const stream = await openDataStream(c);
            return irohPipe(stream, new FrameReader(irohSource(stream.recv), DATA_MAX_BYTES));
          })(),
          this.opts.handshakeTimeoutMs ?? 5000,
          "data channel",
        );
      } catch (e) {
        tls?.conn.close();
        throw e;
      }
      const link = this.#makeLink(conn, to, hs.peerBoot, true, {
        control: irohPipe(hs.ctl, hs.reader),
        data,
      });
      return this.#adopt(link);
    } catch (e) {
      const why = shortError(e);
      errors.push(why);
      const refused = e instanceof HandshakeError;
      this.#log(
        refused ? "warn" : "info",
        `dial ${to.id.slice(0, 10)} (${this.#dialAddrs(to).join(",")}) failed: ${why}`,
      );
      try {
        conn?.close(1n, Array.from(new TextEncoder().encode(why.slice(0, 100))));
      } catch { /* closed */ }
      return undefined;
    }
  }

  /** Tries the peer's TLS offer; undefined (data stays on iroh) when it cannot be opened in time. */
  async #openTls(conn: Connection, to: PeerAddr, offer: TlsOffer): Promise<TlsStream | undefined> {
    const table = this.opts.dialOverrides;
    const addrs = offer.addrs.map((a) => table?.get(a) ?? a);
    // First the IP this iroh connection reached the peer at (the address most likely to work across
    // networks), unless a dial table reroutes this peer: then only the table says where it may be reached.
    let seen: string | undefined;
    try {
      seen = table ? undefined : conn.paths().find((p) => p.isSelected && p.isIp)?.remoteAddr;
    } catch { /* the connection is going away: the offered addresses will do */ }
    if (seen && addrs.length > 0) {
      try {
        addrs.unshift(joinHostPort(splitHostPort(seen).host, splitHostPort(offer.addrs[0]).port));
      } catch { /* not host:port */ }
    }
    try {
      const s = await dialTlsPath(
        this.#ctx(to.id),
        to.id,
        offer,
        [...new Set(addrs)],
        this.opts.tlsTimeoutMs ?? 1500,
      );
      this.#log("info", `data to ${to.id.slice(0, 10)} takes the TLS path (${s.conn.remote})`);
      return s;
    } catch (e) {
      // A warning: activations to this peer then move at the iroh stream's few MB/s (docs/WIRE.md).
      this.#log(
        "warn",
        `data to ${to.id.slice(0, 10)} stays on iroh (a few MB/s): the TLS path failed: ${shortError(e)}`,
      );
      return undefined;
    }
  }

  /**
   * Says once whether the relay came up in time; the node works on direct addresses either way. Polls the
   * endpoint's home relay: the binding's `online()` promise never settles offline and keeps the process
   * alive after close, and its `watchHomeRelay` panics (iroh-js 1.1.0).
   */
  #watchRelay(what: string): void {
    const limit = this.opts.relayTimeoutMs ?? 5000;
    const t0 = performance.now();
    let warned = false;
    const poll = () => {
      if (this.#closed) return;
      const home = this.endpoint.addr().relayUrl();
      const waited = performance.now() - t0;
      if (home) {
        return this.#log(warned ? "warn" : "info", `relay reachable${warned ? " now" : ""}: ${home}`);
      }
      if (!warned && waited >= limit) {
        warned = true;
        this.#log(
          "warn",
          `relay unreachable (${what}, not up after ${limit / 1000} s): working on direct addresses only ` +
            `(${this.self.addrs.join(", ") || "none"}); peers that cannot reach those cannot reach this node`,
        );
      }
      this.#relayTimer = setTimeout(poll, warned ? 2000 : Math.min(250, limit));
    };
    poll();
  }

  #dialAddrs(to: PeerAddr): string[] {
    const table = this.opts.dialOverrides;
    return table ? to.addrs.map((a) => table.get(a) ?? a) : to.addrs;
  }

  async #acceptLoop(): Promise<void> {
    while (!this.#closed) {
      let inc: Incoming | null;
      try {
        inc = await this.endpoint.acceptNext();
      } catch {
        break;
      }
      if (!inc) break;
      this.#accept(inc);
    }
  }

  async #accept(inc: Incoming): Promise<void> {
    let conn: Connection | undefined;
    let pending: PendingOffer | undefined;
    let who = "unknown peer";
    try {
      const remote = await inc.remoteAddr();
      who = remote.addr ?? remote.kind;
      const timeout = this.opts.handshakeTimeoutMs ?? 5000;
      conn = await withTimeout<Connection>(
        inc.accept().then((a) => a.connect()),
        timeout,
        "accept",
        (c) => c.close(0n, []),
      );
      const c = conn;
      const peer = c.remoteId().toString();
      who = `${peer} (${who})`;
      const hs = await withTimeout(
        (async () => {
          const ctl = await c.acceptBi();
          const r = await acceptorHandshake(ctl, this.#ctx(peer), () => {
            pending = this.tls?.offer(peer);
            return pending?.offer ?? null;
          });
          // The dialer tries the TLS offer before it says which path data takes.
          let data: ChannelPipe;
          if ((await readPath(r.reader)) === "tls") {
            const s = pending?.take();
            if (!s) {
              throw new HandshakeError("PATH says tls, but no TLS connection proved this offer's token");
            }
            data = tlsPipe(s);
          } else {
            pending?.cancel();
            const d = await acceptDataStream(c, DATA_MAX_BYTES);
            data = irohPipe(d.stream, d.reader);
          }
          return { ctl, data, ...r };
        })(),
        timeout + (this.opts.tlsTimeoutMs ?? 1500),
        "handshake",
      );
      hs.reader.messageMax = CONTROL_MAX_BYTES;
      const addrs = remote.kind === "ip" && remote.addr ? [remote.addr] : [];
      const link = this.#makeLink(c, { id: peer, addrs }, hs.peerBoot, false, {
        control: irohPipe(hs.ctl, hs.reader),
        data: hs.data,
      });
      this.#adopt(link);
    } catch (e) {
      pending?.cancel();
      const why = shortError(e);
      this.#log("warn", `refused connection from ${who}: ${why}`);
      try {
        conn?.close(1n, Array.from(new TextEncoder().encode(`refused: ${why}`.slice(0, 100))));
      } catch { /* closed */ }
    }
  }

  #ctx(peer: PeerId) {
    return { key: this.key, self: this.self.id, peer, boot: hexBoot(this.#boot), log: this.#log };
  }

  #makeLink(
    conn: Connection,
    peer: PeerAddr,
    boot: Uint8Array,
    dialedBySelf: boolean,
    streams: LinkStreams,
  ): IrohLink {
    return new IrohLink(conn, peer, bootHex(boot), dialedBySelf, streams, {
      deliver: this.#deliver,
      log: this.#log,
      flushBytes: this.opts.flushBytes,
      onClosed: (l) => {
        if (this.#links.get(l.peer.id) === l) this.#links.delete(l.peer.id);
      },
    });
  }

  /**
   * Installs a new link as the one used for sending, or keeps the current one (dial dedup). Another run of
   * the peer (new boot) always wins. Two links to the same run come from both sides dialing at once: both
   * keep the one dialed by the smaller endpoint id, and the other closes after a grace period (it is still
   * read until then, so nothing already sent on it is lost).
   */
  #adopt(link: IrohLink): IrohLink {
    if (this.#closed) {
      link.close("transport closed");
      return link;
    }
    const cur = this.#links.get(link.peer.id);
    if (!cur || cur.closed || cur.peerBoot !== link.peerBoot) {
      if (cur && !cur.closed) cur.close("peer restarted");
      this.#links.set(link.peer.id, link);
      return link;
    }
    const dialer = (l: IrohLink) => (l.dialedBySelf ? this.self.id : l.peer.id);
    const keep = dialer(cur) === dialer(link) ? link : (dialer(cur) < dialer(link) ? cur : link);
    const drop = keep === cur ? link : cur;
    this.#links.set(link.peer.id, keep);
    setTimeout(() => drop.close("duplicate connection"), 5000);
    return keep;
  }
}

/**
 * Binds an endpoint on exactly `bindAddr` and returns a transport on it; BindError (one line, no Rust
 * backtrace) when the address cannot be bound.
 *
 * iroh also binds the wildcard address of the other IP family ([::] beside an IPv4 address, 0.0.0.0
 * beside an IPv6 one) unless it is given an address of that family, and the binding has no switch to
 * drop it; so that family is pinned to its loopback address (reachable from this machine only) and left
 * out of the addresses this node advertises. Where the host has no such loopback (IPv6 disabled), the
 * endpoint binds without the pin: iroh's wildcard bind for a family the host lacks fails, and may.
 */
export async function createIrohTransport(opts: IrohTransportOptions): Promise<IrohTransport> {
  if (!(opts.secret instanceof Uint8Array) || opts.secret.length !== 32) {
    throw new TypeError("createIrohTransport needs a 32-byte cluster secret");
  }
  const addr = opts.bindAddr ?? "127.0.0.1:0";
  const v6 = addr.startsWith("[");
  const bind = async (pin: boolean) => {
    const b = EndpointClass.builder();
    (opts.preset === "n0" ? presetN0 : presetMinimal)(b);
    if (opts.relayUrl) b.relayMode(RelayMode.customFromUrls([opts.relayUrl]));
    b.alpns([ALPN]);
    b.bindAddr(addr);
    if (pin) b.bindAddr(v6 ? "127.0.0.1:0" : "[::1]:0");
    if (opts.secretKey) b.secretKey(Array.from(opts.secretKey));
    return await b.bind();
  };
  let endpoint: Endpoint;
  try {
    endpoint = await bind(true).catch(() => bind(false));
  } catch (e) {
    throw new BindError(`cannot bind ${addr}: ${shortError(e)}`);
  }
  const key = await importSecret(opts.secret);
  let tls: TlsPath | undefined;
  // SWACTOR_TLS=off keeps every node's data on iroh: a bench/debug hook (docs/WIRE.md).
  const off = opts.tls === false || (opts.tls === undefined && Deno.env.get("SWACTOR_TLS") === "off");
  try {
    tls = off ? undefined : await startTlsPath(endpoint, key, opts);
  } catch (e) {
    await endpoint.close().catch(() => {});
    throw e;
  }
  return new IrohTransport(endpoint, key, opts, tls);
}

/**
 * The TLS listener beside the endpoint: at `opts.tls`; else on the iroh bind address's host and port (an
 * error when that TCP port is taken: it is the one a firewall opens); with port 0, at the port number the
 * iroh socket got when that TCP port is free, else any free port.
 */
async function startTlsPath(
  endpoint: Endpoint,
  key: CryptoKey,
  opts: IrohTransportOptions,
): Promise<TlsPath> {
  const self = endpoint.id().toString();
  const common = {
    key,
    self,
    advertise: () => endpoint.addr().directAddresses(),
    handshakeTimeoutMs: opts.handshakeTimeoutMs,
    log: opts.log ?? defaultLog(self),
  };
  const start = async (listen: string) => {
    try {
      return await TlsPath.start({ ...common, listen });
    } catch (e) {
      const why = (e as { code?: string }).code === "EADDRINUSE" ? "the TCP port is in use" : shortError(e);
      throw Object.assign(new BindError(`cannot listen for the TLS data path on TCP ${listen}: ${why}`), {
        code: (e as { code?: string }).code,
      });
    }
  };
  if (typeof opts.tls === "string") return await start(opts.tls);
  const { host, port } = splitHostPort(opts.bindAddr ?? "127.0.0.1:0");
  // A port asked for is the firewall's one number: TCP gets the same one or the node does not start.
  if (port !== 0) return await start(joinHostPort(host, port));
  const same = endpoint.boundSockets().map((a) => splitHostPort(a)).find((a) => a.host === host);
  if (same) {
    try {
      return await start(joinHostPort(host, same.port));
    } catch (e) {
      if ((e as { code?: string }).code !== "EADDRINUSE") throw e;
    }
  }
  return await start(joinHostPort(host, 0));
}

/** Warnings to stderr, everything with SWACTOR_LOG=debug. */
function defaultLog(id: string): Log {
  const verbose = Deno.env.get("SWACTOR_LOG") === "debug";
  return (level, msg) =>
    (level === "warn" || verbose) && console.error(`[transport ${id.slice(0, 6)}] ${msg}`);
}

function bootHex(b: Uint8Array): string {
  return Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
}

function hexBoot(h: string): Uint8Array {
  return Uint8Array.from({ length: 8 }, (_, i) => parseInt(h.slice(2 * i, 2 * i + 2) || "0", 16));
}

/** Races a promise against a timer; a result that arrives too late is disposed of with `dispose`. */
function withTimeout<T>(p: Promise<T>, ms: number, what: string, dispose?: (v: T) => void): Promise<T> {
  let timer: ReturnType<typeof setTimeout>;
  let timedOut = false;
  return Promise.race([
    p.then((v) => {
      if (timedOut) dispose?.(v);
      return v;
    }),
    new Promise<never>((_, reject) => {
      timer = setTimeout(() => {
        timedOut = true;
        reject(new Error(`${what} timed out after ${ms} ms`));
      }, ms);
    }),
  ]).finally(() => clearTimeout(timer));
}
