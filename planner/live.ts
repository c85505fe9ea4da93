// The cluster as its nodes measured it: from the descriptors that members gossip (the shape `status --json`
// prints, ../shared/CLI.md) to a planner Cluster. `plan --live`, `up --model` and `--local` (through
// node/stage/publish.ts) and each request's predicted per-token time all go through here, so they agree.
// How a measurement becomes a node spec (docs/PLANNER.md, "Live clusters"):
//   memBytes      = memory_bytes (what the node could allocate, within its --memory cap)
//   memBandwidth  = the GEMV bandwidth streaming from memory at the model's width (read_gbps_by_width,
//                   log-interpolated); cacheBytes / cacheBandwidth = cache_bytes and the cached rate there,
//                   for a node alone on its machine (nodes on one machine evict each other's weights)
//   overhead      = readback_ms (a step's fixed part: upload, submit, read back)
//   layerOverhead = dispatch_ms x the dispatches of a decoder layer
//   links         = half the round trip each way, the larger of both ends' estimates
// A member that has not measured (yet) keeps the planner's defaults for what it lacks. Pure.
import {
  type Cluster,
  clusterFromNodes,
  type Constraints,
  DEFAULT_LINK,
  type LinkSpec,
  type NodeDescriptor,
} from "./cluster.ts";
import type { DTypeBytes } from "./model_graph.ts";

/** One link as `status --json` shows it. */
export interface LiveLink {
  rtt_ms: number;
  /** Mbit/s, or null when not measured. */
  mbps: number | null;
  age_ms?: number;
  samples?: number;
}

/** A member's descriptor as `status --json` shows it (fields null until the node has measured itself). */
export interface LiveDescriptor {
  /** ISO time of the self-measurement, or null. */
  measured_at: string | null;
  /** Usable GPU memory, bytes: measured, else the cap or the adapter's largest buffer (0: unknown). */
  memory_bytes: number;
  /** GEMV weight-read bandwidth at the widest width measured, GB/s. */
  read_gbps: number | null;
  /** The same by GEMV input width K (keys: K as a string). */
  read_gbps_by_width?: Record<string, number>;
  /** The GEMV's rate on one matrix that stays in the cache, by width. */
  cached_gbps_by_width?: Record<string, number>;
  /** The largest working set that still reads at the cached rate, bytes (0: none seen). */
  cache_bytes?: number;
  dispatch_ms: number | null;
  readback_ms: number | null;
  encode_layer_ms?: number | null;
  /** The float type its GEMVs read: "f32" where the GPU lacks shader-f16 (its KV cache is f32 too). */
  read_weights?: "f16" | "f32" | null;
  /** Round trips this member measured to others, by node id. */
  links: Record<string, LiveLink>;
}

export interface LiveMember {
  id: string;
  descriptor?: LiveDescriptor;
  /** The machine it runs on (the descriptor's name, the host name by default), when known. */
  host?: string;
}

/** Dispatches of one decoder layer's decode step (Llama, docs/ARCHITECTURE.md), the default. */
export const LAYER_DISPATCHES = 5;

export interface LiveClusterOptions {
  /** The model's hidden size: bandwidth is taken at this GEMV width (default: read_gbps). */
  width?: number;
  /** Dispatches per decoder layer (default LAYER_DISPATCHES). */
  layerDispatches?: number;
  /** Memory each node keeps free, bytes (default: the planner's NODE_DEFAULTS). */
  reserveBytes?: number;
  /** Default "live". */
  name?: string;
  constraints?: Partial<Constraints>;
  quant?: Partial<DTypeBytes>;
}

/**
 * The bandwidth of a descriptor at GEMV width `k`, GB/s (streaming; `table` "cached" for the cache's):
 * log-interpolated between widths, clamped.
 */
export function gbpsAt(
  d: LiveDescriptor,
  k: number | undefined,
  table: "read" | "cached" = "read",
): number | null {
  const byWidth = table === "read" ? d.read_gbps_by_width : d.cached_gbps_by_width;
  if (table === "cached" && !byWidth) return null;
  const w = Object.entries(byWidth ?? {}).map(([kk, v]) => [Number(kk), v] as const)
    .filter(([kk, v]) => kk > 0 && v > 0).sort((a, b) => a[0] - b[0]);
  if (k === undefined || w.length === 0) return d.read_gbps;
  if (k <= w[0][0]) return w[0][1];
  for (let i = 1; i < w.length; i++) {
    if (k <= w[i][0]) {
      const f = Math.log(k / w[i - 1][0]) / Math.log(w[i][0] / w[i - 1][0]);
      return w[i - 1][1] + f * (w[i][1] - w[i - 1][1]);
    }
  }
  return w[w.length - 1][1];
}

/** A member's planner descriptor from what it measured. */
export function liveNode(m: LiveMember, opts: LiveClusterOptions = {}): NodeDescriptor {
  const n: NodeDescriptor = { id: m.id };
  if (opts.reserveBytes !== undefined) n.reserveBytes = opts.reserveBytes;
  const d = m.descriptor;
  if (!d) return n;
  if (d.memory_bytes > 0) n.memBytes = d.memory_bytes;
  const gbps = gbpsAt(d, opts.width);
  if (gbps !== null && gbps > 0) n.memBandwidth = Math.round(gbps * 1e3) * 1e6; // MB/s resolution
  const cached = gbpsAt(d, opts.width, "cached");
  if (d.cache_bytes && cached !== null && cached > 0) {
    n.cacheBytes = d.cache_bytes;
    n.cacheBandwidth = Math.round(cached * 1e3) * 1e6;
  }
  if (d.readback_ms !== null) n.overhead = microseconds(d.readback_ms);
  if (d.dispatch_ms !== null) {
    n.layerOverhead = microseconds(d.dispatch_ms * (opts.layerDispatches ?? LAYER_DISPATCHES));
  }
  return n;
}

/** ms to seconds, rounded to the microsecond (so a printed cluster reads "260 us", not "0.00025979... s"). */
const microseconds = (ms: number) => Math.round(ms * 1e3) / 1e6;

/**
 * The links among `members`: one per pair that either end measured, latency half the round trip. Each end's
 * estimate is the smallest of its recent round trips (node/links.ts), a lower bound of what the link does;
 * of two lower bounds the larger is the tighter, and it is the one that has seen a link get slower.
 */
export function liveLinks(members: LiveMember[]): LinkSpec[] {
  const ids = new Set(members.map((m) => m.id));
  const pairs = new Map<string, { a: string; b: string; rtt: number[]; mbps: number[] }>();
  for (const m of members) {
    for (const [to, l] of Object.entries(m.descriptor?.links ?? {})) {
      if (!ids.has(to) || to === m.id || !(l.rtt_ms >= 0)) continue;
      const [a, b] = m.id < to ? [m.id, to] : [to, m.id];
      const key = `${a} ${b}`;
      let p = pairs.get(key);
      if (!p) pairs.set(key, p = { a, b, rtt: [], mbps: [] });
      p.rtt.push(l.rtt_ms);
      if (l.mbps !== null && l.mbps > 0) p.mbps.push(l.mbps);
    }
  }
  return [...pairs.values()].map((p) => ({
    a: p.a,
    b: p.b,
    latency: microseconds(Math.max(...p.rtt) / 2),
    bandwidth: p.mbps.length ? Math.min(...p.mbps) * 125e3 : DEFAULT_LINK.bandwidth,
  }));
}

/** The running cluster as a planner Cluster, from its members' descriptors. */
export function liveCluster(members: LiveMember[], opts: LiveClusterOptions = {}): Cluster {
  // Nodes on one machine share its cache: each one's weights evict the others', so none keeps a cache.
  const perHost = new Map<string, number>();
  for (const m of members) if (m.host) perHost.set(m.host, (perHost.get(m.host) ?? 0) + 1);
  const shared = (m: LiveMember) => m.host !== undefined && perHost.get(m.host)! > 1;
  const nodes = members.map((m) => {
    const n = liveNode(m, opts);
    if (shared(m)) {
      delete n.cacheBytes;
      delete n.cacheBandwidth;
    }
    return n;
  });
  return clusterFromNodes(nodes, {
    name: opts.name ?? "live",
    links: liveLinks(members),
    constraints: opts.constraints,
    quant: opts.quant,
  });
}
