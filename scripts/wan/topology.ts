// Starts the relays that put emulated WAN links between nodes, and says which address each node must
// dial to reach each other node. One link joins two nodes; it is modelled by two shared link states
// (a->b and b->a), used by two relays, one per dial direction: the relay that a dials (target b) and the
// relay that b dials (target a). So whichever side opens the connection, its traffic crosses the same
// emulated link, and a rate cap is shared by both dial directions, as on a real path.
//
//   const topo = await startChain(["127.0.0.1:4001", ...], { hops: { delayMs: 10 }, ring: true });
//   topo.dialAddr(0, 1)  // -> the relay's "127.0.0.1:port" that node 0 puts in node 1's EndpointAddr
//   await topo.close();
//
// With iroh the nodes must sit in isolated network namespaces (netns.ts): iroh learns a peer's real
// address in the handshake and leaves the relay for it. Then pass `listenHosts` (each node's root-side
// veth address, where the relays it dials listen) and `otherPairs: {}` so that non-neighbours, which
// have no route to each other, still reach each other (through a perfect link).

import { createLink, type LinkSpec, type LinkState, retuneLink } from "./link.ts";
import { type Relay, type RelayStats, startRelay } from "./relay.ts";
import { parseSocketAddr } from "./socket_addr.ts";

/** One link between node `a` and node `b` (indices into the node list). */
export interface LinkDef {
  a: number;
  b: number;
  /** The a -> b direction. Default: a perfect link. */
  spec?: LinkSpec;
  /** The b -> a direction. Default: `spec`, drawing its own random pattern. */
  reverse?: LinkSpec;
}

/** Options of `startTopology` and `startChain`. */
export interface TopologyOptions {
  /** Host the relays listen on. Default "127.0.0.1". */
  listenHost?: string;
  /** Per node: the host the relays that this node dials listen on (overrides `listenHost`). */
  listenHosts?: string[];
  /** Give every pair that has no link one with this spec (`{}`: a perfect link). Default: none, such
   * pairs dial each other directly. */
  otherPairs?: LinkSpec;
}

/** Options of `startChain`. */
export interface ChainOptions extends TopologyOptions {
  /** Spec of every hop, or one per hop (hop i joins node i and node i+1; with `ring`, hop N-1 joins the last
   * node to node 0). Default: perfect links. */
  hops?: LinkSpec | LinkSpec[];
  /** Also link the last node back to the first, e.g. for the sampled token's return trip. Default false. */
  ring?: boolean;
}

/** A relay in a topology: it carries traffic that node `from` sends when it dials node `to`. */
export interface TopologyRelay {
  from: number;
  to: number;
  relay: Relay;
}

export interface Topology {
  /** The address node `from` should dial for node `to`: a relay's for linked pairs, else `to`'s own. */
  dialAddr(from: number, to: number): string;
  /** `dial[from][to]` as `dialAddr(from, to)`; the diagonal holds each node's own address. */
  readonly dial: readonly (readonly string[])[];
  readonly relays: readonly TopologyRelay[];
  /**
   * Retunes the link between `a` and `b` in place (both dial directions; `spec` is a -> b, `reverse` b -> a,
   * default `spec`): open connections keep their relays and see the new behaviour at once. Throws
   * RangeError when the pair has no link (dials it directly).
   */
  setLink(a: number, b: number, spec: LinkSpec, reverse?: LinkSpec): void;
  /** Counters of every relay, in `relays` order. */
  stats(): (RelayStats & { from: number; to: number })[];
  /** Closes every relay. */
  close(): Promise<void>;
}

/** Starts two relays per link; nodes not linked dial each other directly. */
export async function startTopology(
  nodes: string[],
  links: LinkDef[],
  options: TopologyOptions = {},
): Promise<Topology> {
  nodes.forEach((n) => parseSocketAddr(n)); // validate before starting anything
  if (options.listenHosts && options.listenHosts.length !== nodes.length) {
    throw new RangeError(
      `expected ${nodes.length} listenHosts, one per node, got ${options.listenHosts.length}`,
    );
  }
  const hostFor = (i: number) => {
    const h = options.listenHosts?.[i] ?? options.listenHost ?? "127.0.0.1";
    return `${h.includes(":") ? `[${h}]` : h}:0`;
  };
  const dial = nodes.map(() => [...nodes]);
  const seen = new Set<string>();
  for (const l of links) {
    for (const i of [l.a, l.b]) {
      if (!Number.isInteger(i) || i < 0 || i >= nodes.length) {
        throw new RangeError(`link node index must be in [0, ${nodes.length}), got ${i}`);
      }
    }
    if (l.a === l.b) throw new RangeError(`a link must join two different nodes, got ${l.a}-${l.b}`);
    const key = `${Math.min(l.a, l.b)}-${Math.max(l.a, l.b)}`;
    if (seen.has(key)) throw new RangeError(`nodes ${key} are linked twice`);
    seen.add(key);
  }
  const all = [...links];
  if (options.otherPairs) {
    for (let a = 0; a < nodes.length; a++) {
      for (let b = a + 1; b < nodes.length; b++) {
        if (!seen.has(`${a}-${b}`)) all.push({ a, b, spec: options.otherPairs });
      }
    }
  }
  const relays: TopologyRelay[] = [];
  const states = new Map<string, { a: number; ab: LinkState; ba: LinkState }>();
  try {
    for (const [k, l] of all.entries()) {
      // Distinct random streams per link and direction, even when every link shares one spec and seed.
      const ab = createLink(l.spec, { stream: 2 * k });
      const ba = createLink(l.reverse ?? l.spec, { stream: 2 * k + 1 });
      states.set(`${Math.min(l.a, l.b)}-${Math.max(l.a, l.b)}`, { a: l.a, ab, ba });
      const toB = await startRelay({ target: nodes[l.b], listen: hostFor(l.a), up: ab, down: ba });
      relays.push({ from: l.a, to: l.b, relay: toB });
      const toA = await startRelay({ target: nodes[l.a], listen: hostFor(l.b), up: ba, down: ab });
      relays.push({ from: l.b, to: l.a, relay: toA });
      dial[l.a][l.b] = toB.addr;
      dial[l.b][l.a] = toA.addr;
    }
  } catch (e) {
    await Promise.all(relays.map((r) => r.relay.close()));
    throw e;
  }
  return {
    dial,
    relays,
    dialAddr: (from, to) => {
      const addr = dial[from]?.[to];
      if (addr === undefined) {
        throw new RangeError(`no node pair ${from} -> ${to} among ${nodes.length} nodes`);
      }
      return addr;
    },
    setLink: (a, b, spec, reverse) => {
      const link = states.get(`${Math.min(a, b)}-${Math.max(a, b)}`);
      if (!link) throw new RangeError(`nodes ${a} and ${b} have no link to retune`);
      const [fwd, back] = link.a === a ? [link.ab, link.ba] : [link.ba, link.ab];
      retuneLink(fwd, spec);
      retuneLink(back, reverse ?? spec);
    },
    stats: () => relays.map((r) => ({ from: r.from, to: r.to, ...r.relay.stats() })),
    close: async () => {
      await Promise.all(relays.map((r) => r.relay.close()));
    },
  };
}

/** Links node i to node i+1 for each i (and the last to the first with `ring`). */
export function startChain(nodes: string[], options: ChainOptions = {}): Promise<Topology> {
  if (nodes.length < 2) throw new RangeError(`a chain needs at least 2 nodes, got ${nodes.length}`);
  const hopCount = options.ring && nodes.length > 2 ? nodes.length : nodes.length - 1;
  const hops = options.hops ?? {};
  if (Array.isArray(hops) && hops.length !== hopCount) {
    throw new RangeError(`expected ${hopCount} hop specs for ${nodes.length} nodes, got ${hops.length}`);
  }
  const links: LinkDef[] = [];
  for (let i = 0; i < hopCount; i++) {
    links.push({ a: i, b: (i + 1) % nodes.length, spec: Array.isArray(hops) ? hops[i] : hops });
  }
  return startTopology(nodes, links, options);
}
