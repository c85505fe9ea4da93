// A user-space UDP relay that emulates a WAN link between a client and a target (this kernel has no
// netem; see docs/WAN.md). Each client source address gets its own upstream socket, so the target sees
// one distinct peer per client and its replies route back to the right client (a NAT-like table).
//
// Library: `startRelay({target, up, down})`. CLI:
//   deno run -A scripts/wan/relay.ts --target 127.0.0.1:PORT --delay-ms 10 --jitter-ms 2 --loss 0.01 \
//     --rate-mbit 100
// prints its listen address on the first line of stdout, and its counters on stderr when stopped.

import dgram from "node:dgram";
import type { Buffer } from "node:buffer";
import { admit, createLink, type LinkSpec, type LinkState } from "./link.ts";
import { DeliveryScheduler, type DeliverySchedulerOptions } from "./delivery_scheduler.ts";
import { OrderedSender } from "./ordered_sender.ts";
import { runRelayCli } from "./relay_cli.ts";
import { formatSocketAddr, isLoopback, parseSocketAddr, type SocketAddr } from "./socket_addr.ts";

/** Options of `startRelay`. */
export interface RelayOptions {
  /** The "host:port" every client's datagrams are forwarded to. Required. */
  target: string;
  /** Where clients send, "host:port". Default "127.0.0.1:0" (a free port; read it from `addr`). */
  listen?: string;
  /**
   * The client -> target direction: a spec, or a LinkState shared with other relays (one physical link
   * carrying several flows, e.g. both dial directions of a pair). Default: a perfect link.
   */
  up?: LinkSpec | LinkState;
  /** The target -> client direction. Default: `up`'s spec, with its own random stream. */
  down?: LinkSpec | LinkState;
  /** Host the per-client upstream sockets bind to. Default: loopback if the target is, else any. */
  upstreamHost?: string;
  /** Forget a client (close its upstream socket) after this long without traffic, ms. Default 0: never. */
  idleTimeoutMs?: number;
  /** Clock and timing knobs of the delivery scheduler (tests pass a fake clock). */
  scheduler?: DeliverySchedulerOptions;
}

/** Counters of one direction. */
export interface DirectionStats {
  /** Datagrams and bytes that entered this direction. */
  packets: number;
  bytes: number;
  /** Datagrams and bytes handed to the socket at the far side. */
  delivered: number;
  deliveredBytes: number;
  /** Dropped by random loss / by a full bottleneck queue. */
  lost: number;
  queueDrops: number;
  /** Admitted but not delivered yet. */
  inFlight: number;
  /** Sends the OS refused (e.g. ICMP unreachable reported on the socket). */
  sendErrors: number;
}

export interface RelayStats {
  up: DirectionStats;
  down: DirectionStats;
  /** Client addresses with a live upstream socket. */
  clients: number;
}

export interface Relay {
  /** The listen address, "host:port", to hand to clients instead of the target's. */
  readonly addr: string;
  stats(): RelayStats;
  /** Closes every socket (listen and upstream) and drops datagrams still in flight. */
  close(): Promise<void>;
}

interface Client {
  addr: SocketAddr;
  socket: dgram.Socket;
  sender: OrderedSender;
  lastSeen: number;
}

function emptyStats(): DirectionStats {
  return {
    packets: 0,
    bytes: 0,
    delivered: 0,
    deliveredBytes: 0,
    lost: 0,
    queueDrops: 0,
    inFlight: 0,
    sendErrors: 0,
  };
}

function asLink(v: LinkSpec | LinkState | undefined, stream: number): LinkState {
  return v && (v as LinkState).kind === "link"
    ? v as LinkState
    : createLink(v as LinkSpec | undefined, { stream });
}

function bind(socket: dgram.Socket, host: string, port: number): Promise<void> {
  return new Promise((resolve, reject) => {
    socket.once("error", reject);
    socket.bind(port, host, () => {
      socket.off("error", reject);
      resolve();
    });
  });
}

function closeSocket(socket: dgram.Socket): Promise<void> {
  return new Promise((resolve) => {
    try {
      socket.close(() => resolve());
    } catch {
      resolve(); // already closed
    }
  });
}

/** Starts a relay; resolves once its listen socket is bound. */
export async function startRelay(options: RelayOptions): Promise<Relay> {
  const target = parseSocketAddr(options.target);
  const listen = parseSocketAddr(options.listen ?? "127.0.0.1:0");
  const idleMs = options.idleTimeoutMs ?? 0;
  if (!(idleMs >= 0)) throw new RangeError(`idleTimeoutMs must be >= 0, got ${idleMs}`);
  const upLink = asLink(options.up, 0);
  const downLink = asLink(options.down ?? (options.up as LinkState)?.spec ?? options.up, 1);
  const upstreamHost = options.upstreamHost ??
    (isLoopback(target.host) ? target.host : target.family === "udp6" ? "::" : "0.0.0.0");
  const scheduler = new DeliveryScheduler(options.scheduler);
  const now = () => (options.scheduler?.clock ?? { now: () => performance.now() }).now();
  const up = emptyStats(), down = emptyStats();
  const clients = new Map<string, Client>();
  let closed = false;

  const listener = dgram.createSocket(listen.family);
  listener.on("error", () => {}); // a UDP socket error (e.g. ICMP) must not crash the process
  await bind(listener, listen.host, listen.port);
  const listenSender = new OrderedSender(listener);
  const bound = listener.address();
  const addr = formatSocketAddr(bound.address, bound.port);

  // Sends `msg` at the time the link decides, counting it in `st`.
  const forward = (link: LinkState, st: DirectionStats, msg: Buffer, send: () => void) => {
    st.packets++;
    st.bytes += msg.length;
    const verdict = admit(link, now(), msg.length);
    if (verdict.dropped === "loss") st.lost++;
    else if (verdict.dropped === "queue") st.queueDrops++;
    else if (verdict.dropped === null) {
      st.inFlight++;
      scheduler.schedule(verdict.deliverAt, () => {
        st.inFlight--;
        if (closed) return;
        st.delivered++;
        st.deliveredBytes += msg.length;
        send();
      });
    }
  };
  const sent = (st: DirectionStats) => (err: Error | null) => {
    if (err) st.sendErrors++;
  };

  const openClient = async (from: SocketAddr, key: string): Promise<Client> => {
    const socket = dgram.createSocket(target.family);
    socket.on("error", () => {});
    const client: Client = { addr: from, socket, sender: new OrderedSender(socket), lastSeen: now() };
    clients.set(key, client);
    socket.on("message", (msg, rinfo) => {
      // Endpoint-dependent filtering, as a NAT does: only the target may answer through this mapping.
      if (rinfo.port !== target.port || rinfo.address !== target.host || closed) return;
      client.lastSeen = now();
      forward(downLink, down, msg, () => listenSender.send(msg, from.port, from.host, sent(down)));
    });
    await bind(socket, upstreamHost, 0);
    return client;
  };

  // Datagrams that arrive while a client's upstream socket is still binding wait on its promise.
  const pending = new Map<string, Promise<Client>>();
  listener.on("message", (msg, rinfo) => {
    if (closed) return;
    const key = formatSocketAddr(rinfo.address, rinfo.port);
    const known = clients.get(key);
    const relayUp = (c: Client) => {
      c.lastSeen = now();
      forward(upLink, up, msg, () => c.sender.send(msg, target.port, target.host, sent(up)));
    };
    if (known && !pending.has(key)) return relayUp(known);
    let p = pending.get(key);
    if (!p) {
      p = openClient({ host: rinfo.address, port: rinfo.port, family: listen.family }, key);
      pending.set(key, p);
      p.finally(() => pending.delete(key)).catch(() => {});
    }
    p.then((c) => !closed && relayUp(c), () => up.sendErrors++);
  });

  const sweeper = idleMs > 0
    ? setInterval(() => {
      for (const [key, c] of clients) {
        if (now() - c.lastSeen > idleMs && !pending.has(key)) {
          clients.delete(key);
          closeSocket(c.socket);
        }
      }
    }, Math.max(10, idleMs / 2))
    : undefined;

  return {
    addr,
    stats: () => ({ up: { ...up }, down: { ...down }, clients: clients.size }),
    close: async () => {
      if (closed) return;
      closed = true;
      if (sweeper !== undefined) clearInterval(sweeper);
      scheduler.close();
      up.inFlight = down.inFlight = 0;
      await Promise.allSettled(pending.values());
      await Promise.all([listener, ...[...clients.values()].map((c) => c.socket)].map(closeSocket));
      clients.clear();
    },
  };
}

if (import.meta.main) {
  Deno.exit(await runRelayCli(Deno.args, startRelay));
}
