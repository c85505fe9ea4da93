// A swactor node: wires the transport, membership (with the registry and the link table on its gossip) and the
// actor runtime together, and, when asked, measures the node in the background (node/measure.ts) and
// publishes the numbers in its descriptor. Each service lives in its own module; this file only composes them
// and forwards lifecycle.
// The transport is iroh unless the caller passes one (the in-memory network, for in-process tests).
import { ActorSystem } from "./actors/mod.ts";
import {
  describeNode,
  type DescribeOptions,
  gpuAllowed,
  selfMeasure,
  type SelfMeasureOptions,
} from "./descriptor.ts";
import { Links } from "./links.ts";
import { LoopLag } from "./loop_lag.ts";
import { SystemClock } from "./clock.ts";
import { lan, Membership, type MembershipConfig, type NodeMeasurement } from "./membership/mod.ts";
import { isMembershipPacket } from "./membership/mod.ts";
import { Registry } from "./registry/mod.ts";
import { demux } from "./transport/demux.ts";
import { createIrohTransport } from "./transport/iroh.ts";
import type { Log } from "./transport/iroh_link.ts";
import type { CloseOptions, PeerAddr, Transport } from "./transport/transport.ts";
import { Service } from "./wire/mod.ts";

interface CommonNodeOptions extends Omit<DescribeOptions, "measuring"> {
  /** Membership timings (default: the `lan` preset). */
  membership?: MembershipConfig;
  /**
   * Measure the node once it is up, in the background (default false): its usable memory within
   * `memoryCap`, bandwidth and per-step costs go into its descriptor. Skipped without a GPU.
   */
  measure?: boolean | Omit<SelfMeasureOptions, "memoryCap" | "log">;
}

/** A node on iroh (the default): its endpoint is made from these. */
export interface IrohNodeOptions extends CommonNodeOptions {
  /** The cluster secret (from the ticket, or fresh for a leader). */
  secret: Uint8Array;
  /** iroh bind address (default "127.0.0.1:0"). */
  listen?: string;
  /** "minimal" (default, offline) or "n0" (relays and discovery). */
  preset?: "minimal" | "n0";
  /** A relay server of one's own (URL), with the minimal preset. Default: none. */
  relayUrl?: string;
  /** Log sink (default: warnings to stderr). */
  log?: Log;
  /** Peer address -> address to dial instead (a test/bench hook; see IrohTransportOptions). Default none. */
  dialOverrides?: ReadonlyMap<string, string>;
  transport?: undefined;
}

/** A node on a transport the caller made, e.g. `MemoryNetwork.connect(id)` (node/transport/memory.ts). */
export interface TransportNodeOptions extends CommonNodeOptions {
  /** The transport to run over; the node takes it over (sets its handler, closes it on leave). */
  transport: Transport;
}

export type NodeOptions = IrohNodeOptions | TransportNodeOptions;

export interface SwactorNode {
  transport: Transport;
  membership: Membership;
  registry: Registry;
  /** The cluster's link table: this node's measured round trips and the others' rows, by gossip. */
  links: Links;
  actors: ActorSystem;
  /** The self-measurement: resolves once published (undefined when not asked, no GPU, or it failed). */
  measured: Promise<NodeMeasurement | undefined>;
  /** Joins through `seeds`; throws PeerUnreachableError when the first seed refuses or cannot be reached. */
  join(seeds: PeerAddr[]): Promise<void>;
  /** Leaves gracefully (others see `left`), stops the actors, closes the transport (with `opts`). */
  leave(opts?: CloseOptions): Promise<void>;
  /** How long the event loop was held (node/loop_lag.ts); iroh nodes only (the in-memory ones are tests'). */
  loop?: LoopLag;
}

export async function startNode(opts: NodeOptions): Promise<SwactorNode> {
  const transport = opts.transport ?? await createIrohTransport({
    secret: opts.secret,
    bindAddr: opts.listen,
    preset: opts.preset,
    relayUrl: opts.relayUrl,
    log: opts.log,
    dialOverrides: opts.dialOverrides,
  });
  const measure = opts.measure !== undefined && opts.measure !== false && gpuAllowed(opts);
  const meta = await describeNode(transport.self.addrs, { ...opts, measuring: measure });
  // The incarnation starts at the wall clock in seconds, so a restarted node (same identity) outranks the
  // `dead` record the others hold of its previous run.
  const membership = new Membership({
    transport,
    meta,
    config: opts.membership ?? lan,
    listen: false,
    incarnation: Math.floor(Date.now() / 1000),
  });
  const registry = new Registry(membership);
  const links = new Links(membership);
  const actors = new ActorSystem({
    transport,
    resolver: registry,
    registrar: registry,
    peers: {
      addressOf: (id) => {
        const m = membership.member(id);
        return m && (m.state === "alive" || m.state === "suspect") ? { id, addrs: m.addrs } : undefined;
      },
    },
  });
  demux(
    transport,
    new Map([
      [Service.MEMBERSHIP, (from, msg) => isMembershipPacket(msg) && membership.receive(from, msg)],
      [Service.ACTORS, (from, msg, ch) => actors.receive(from, msg, ch)],
    ]),
  );
  membership.onChange(({ member }) => {
    if (member.id !== membership.id && (member.state === "dead" || member.state === "left")) {
      actors.peerDown(member.id);
      transport.forget(member.id);
    }
  });
  membership.start();
  const loop = opts.transport ? undefined : new LoopLag(new SystemClock(), {
    log: (m) => opts.log ? opts.log("warn", m) : console.error(`swactor: ${m}`),
  }).start();
  // After start: the node answers probes while it measures (the GPU work comes in short pieces).
  const measured = meta.measuring
    ? selfMeasure(membership, {
      ...(typeof opts.measure === "object" ? opts.measure : {}),
      memoryCap: opts.memoryCap,
    })
    : Promise.resolve(undefined);

  return {
    transport,
    membership,
    registry,
    links,
    actors,
    measured,
    ...(loop ? { loop } : {}),
    async join(seeds) {
      await transport.connect?.(seeds[0]);
      await membership.join(seeds);
    },
    async leave(opts) {
      loop?.stop();
      await actors.close();
      // The leave goes to every live member directly (dialling where needed); its gossip after that
      // rides only the links still open, as the others drop theirs to this node.
      const leaving = membership.leave();
      transport.quiesce?.();
      await leaving;
      registry.close();
      links.close();
      await transport.close(opts);
    },
  };
}
