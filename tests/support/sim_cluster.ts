// A simulated cluster: N Membership nodes (each with a Registry) on one MemoryNetwork and one FakeClock.
// Shared by the tests in tests/node/membership/ and tests/node/registry/, and by scripts/sim/membership.ts.
import { FakeClock } from "../../node/clock.ts";
import { Membership, type MembershipConfig } from "../../node/membership/mod.ts";
import type { NodeDescriptor } from "../../node/membership/mod.ts";
import { seededRandom } from "../../node/random.ts";
import { Registry, type RegistryOptions } from "../../node/registry/mod.ts";
import { Links, type LinksOptions } from "../../node/links.ts";
import { type LinkOptions, MemoryNetwork } from "../../node/transport/memory.ts";
import type { PeerAddr } from "../../node/transport/transport.ts";

export interface SimNode {
  id: string;
  membership: Membership;
  registry: Registry;
  /** The link table, when the cluster was made with `links`. */
  links?: Links;
}

export interface SimClusterOptions {
  /** Number of nodes. */
  n: number;
  config: MembershipConfig;
  /** Default 1. */
  seed?: number;
  /** Default link: 1 ms +- 1 ms, no loss. */
  link?: LinkOptions;
  registry?: RegistryOptions;
  /** Node ids (default n00, n01, ...); give realistic ones (64 hex characters, as iroh's) to measure sizes. */
  ids?: string[];
  /** Called with every message a node sends (before the network decides its fate), e.g. to measure sizes. */
  onSend?: (from: string, to: string, bytes: Uint8Array) => void;
  /** Give each node a link table (node/links.ts) with these options. Default: none. */
  links?: LinksOptions;
}

export function descriptor(id: string): NodeDescriptor {
  return { name: id, version: "0.1.0", adapter: "fake", gpuMemoryBytes: 8 << 30, addrs: [`mem:${id}`] };
}

export class SimCluster {
  readonly clock = new FakeClock();
  readonly net: MemoryNetwork;
  readonly nodes: SimNode[] = [];
  readonly config: MembershipConfig;
  #seed: number;
  #registry: RegistryOptions;
  #onSend: SimClusterOptions["onSend"];
  #links?: LinksOptions;

  constructor(opts: SimClusterOptions) {
    this.config = opts.config;
    this.#seed = opts.seed ?? 1;
    this.#registry = opts.registry ?? {};
    this.#onSend = opts.onSend;
    if (opts.ids && opts.ids.length !== opts.n) {
      throw new RangeError(`ids: ${opts.ids.length} ids for ${opts.n} nodes`);
    }
    this.#links = opts.links;
    this.net = new MemoryNetwork(this.clock, {
      seed: this.#seed,
      link: opts.link ?? { delayMs: 1, jitterMs: 1 },
    });
    for (let i = 0; i < opts.n; i++) {
      this.nodes.push(this.spawn(opts.ids?.[i] ?? `n${String(i).padStart(2, "0")}`));
    }
  }

  /** Creates (or recreates after a crash) node `id`, not yet started. */
  spawn(id: string, opts: { incarnation?: number } = {}): SimNode {
    const transport = this.net.connect(id);
    const onSend = this.#onSend;
    if (onSend) {
      const send = transport.send.bind(transport);
      transport.send = (to, msg, channel) => {
        onSend(id, to.id, msg);
        return send(to, msg, channel);
      };
    }
    const membership = new Membership({
      transport,
      meta: descriptor(id),
      clock: this.clock,
      config: this.config,
      random: seededRandom(this.#seed * 7919 + hash(id)),
      incarnation: opts.incarnation,
    });
    const registry = new Registry(membership, this.#registry);
    // A restarted node is a new life: its boot time (the clock's) is later than its previous one's.
    const links = this.#links ? new Links(membership, { boot: this.clock.now(), ...this.#links }) : undefined;
    return { id, membership, registry, links };
  }

  addr(node: SimNode): PeerAddr {
    return { id: node.id, addrs: [`mem:${node.id}`] };
  }

  /** Every node but the seed joins the seed (node 0) at time now; the seed just starts. */
  joinAll(): void {
    const seed = this.nodes[0];
    seed.membership.start();
    for (const n of this.nodes.slice(1)) void n.membership.join([this.addr(seed)]);
  }

  /** True when each of `nodes` sees exactly `nodes` alive and nothing else alive or suspect. */
  converged(nodes: SimNode[] = this.nodes.filter((n) => this.up(n))): boolean {
    const want = new Set(nodes.map((n) => n.id));
    for (const n of nodes) {
      let alive = 0;
      for (const m of n.membership.members()) {
        if (m.state === "alive") {
          if (!want.has(m.id)) return false;
          alive++;
        } else if (m.state === "suspect" && want.has(m.id)) return false;
        else if (m.state === "suspect") return false;
      }
      if (alive !== want.size) return false;
    }
    return true;
  }

  /** Crashes a node (no goodbye). */
  kill(node: SimNode): void {
    node.membership.stop();
    this.net.kill(node.id);
    this.#down.add(node.id);
  }

  /** Restarts a crashed node with the same id and a fresh state (incarnation 0); not yet joined. */
  restart(node: SimNode): SimNode {
    const again = this.spawn(node.id);
    this.nodes[this.nodes.indexOf(node)] = again;
    this.#down.delete(node.id);
    return again;
  }

  up(node: SimNode): boolean {
    return !this.#down.has(node.id);
  }

  #down = new Set<string>();
}

function hash(s: string): number {
  let h = 2166136261;
  for (let i = 0; i < s.length; i++) h = Math.imul(h ^ s.charCodeAt(i), 16777619);
  return h >>> 0;
}
