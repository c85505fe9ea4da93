// The cluster: nodes (a GPU each) and the links between them, plus the constraints and hints a user
// gives the planner. Links are symmetric; a link can name two nodes or two regions, and anything not
// named falls back to `defaultLink`. Build one from text with `parseCluster` (planner/lang) or from live
// node descriptors with `clusterFromNodes`.
import type { DTypeBytes } from "./model_graph.ts";

export interface NodeSpec {
  id: string;
  /** GPU memory in bytes. */
  memBytes: number;
  /** Measured memory bandwidth of the GPU, bytes/s (what weight reads run at). */
  memBandwidth: number;
  /**
   * A stage whose bytes read per token are at most this many fit the GPU's cache and read at
   * `cacheBandwidth` instead (0: no cache modelled). Only tiny models' stages fit; real ones stream.
   */
  cacheBytes: number;
  /** Read bandwidth from the cache, bytes/s (used only when cacheBytes > 0). */
  cacheBandwidth: number;
  /** Measured matmul throughput, FLOP/s. */
  flops: number;
  /** Upload and download bandwidth of the node's network connection, bytes/s. */
  up: number;
  down: number;
  /** Fixed cost per token each time this node computes (encode, submit, readback, hand-off), seconds. */
  overhead: number;
  /** Cost per token of each layer a stage holds besides its bytes (encoding and launching its dispatches), s. */
  layerOverhead: number;
  /** Memory kept free for working space (activations, kernels' scratch, the runtime), bytes. */
  reserveBytes: number;
  /** A region name; links between regions apply to every pair of their nodes. "" for none. */
  region: string;
}

export interface LinkSpec {
  /** Two node ids, or two region names (equal names: the link inside one region). */
  a: string;
  b: string;
  /** One-way latency, seconds. */
  latency: number;
  /** Bandwidth, bytes/s. */
  bandwidth: number;
}

export interface LayerPin {
  /** Layers [start, end) must run on `node`. */
  start: number;
  end: number;
  node: string;
}

export interface ExpertReplica {
  layer: number;
  expert: number;
  /** Nodes that hold an extra copy of the expert. */
  nodes: string[];
}

export interface Constraints {
  pins: LayerPin[];
  /** Nodes the planner must not use. */
  exclude: string[];
  replicas: ExpertReplica[];
  /** When set, the pipeline runs through exactly these nodes in this order. */
  order?: string[];
}

export interface Cluster {
  name: string;
  nodes: NodeSpec[];
  links: LinkSpec[];
  /** The link between any two nodes that no LinkSpec names. */
  defaultLink: { latency: number; bandwidth: number };
  constraints: Constraints;
  /** Weight-quantization hints for the model this cluster serves (override the checkpoint's dtype). */
  quant: Partial<DTypeBytes>;
}

/** Defaults for a node described by its id alone: a 24 GB consumer GPU on a gigabit LAN. */
export const NODE_DEFAULTS: Omit<NodeSpec, "id"> = {
  memBytes: 24 * 2 ** 30,
  memBandwidth: 1008e9, // RTX 4090
  cacheBytes: 0,
  cacheBandwidth: 0,
  flops: 82.6e12, // RTX 4090 dense fp16
  up: 125e6, // 1 Gbit/s
  down: 125e6,
  overhead: 1e-3, // encode + submit + early readback + hand-off per stage per token (docs/PLANNER.md)
  layerOverhead: 0, // unknown unless measured (a node measures its own: node/measure.ts)
  reserveBytes: 2 ** 30,
  region: "",
};

export const DEFAULT_LINK = { latency: 0.5e-3, bandwidth: 125e6 };

export function emptyConstraints(): Constraints {
  return { pins: [], exclude: [], replicas: [] };
}

/** A live node's descriptor as the node runtime measures it; missing fields take NODE_DEFAULTS. */
export type NodeDescriptor = Partial<NodeSpec> & { id: string };

export interface ClusterFromNodesOptions {
  name?: string;
  /** Measured links; default none (all pairs use `defaultLink`). */
  links?: LinkSpec[];
  /** Default: DEFAULT_LINK (0.5 ms, 1 Gbit/s). */
  defaultLink?: { latency: number; bandwidth: number };
  /** Default: no constraints. */
  constraints?: Partial<Constraints>;
  /** Default: the checkpoint's dtype. */
  quant?: Partial<DTypeBytes>;
}

/** Builds a Cluster from live node descriptors (what the pipeline code knows about its members). */
export function clusterFromNodes(nodes: NodeDescriptor[], opts: ClusterFromNodesOptions = {}): Cluster {
  const seen = new Set<string>();
  const specs = nodes.map((d) => {
    if (typeof d.id !== "string" || d.id === "") {
      throw new TypeError("clusterFromNodes: every node needs an id");
    }
    if (seen.has(d.id)) throw new TypeError(`clusterFromNodes: duplicate node id "${d.id}"`);
    seen.add(d.id);
    const spec: NodeSpec = { ...NODE_DEFAULTS, ...d };
    for (const k of ["memBytes", "memBandwidth", "flops", "up", "down"] as const) {
      if (!(spec[k] > 0)) {
        throw new RangeError(`clusterFromNodes: node "${d.id}": ${k} must be > 0, got ${spec[k]}`);
      }
    }
    if (spec.cacheBytes > 0 && !(spec.cacheBandwidth > 0)) {
      throw new RangeError(
        `clusterFromNodes: node "${d.id}": a cache of ${spec.cacheBytes} bytes needs cacheBandwidth > 0`,
      );
    }
    for (const k of ["overhead", "layerOverhead", "reserveBytes", "cacheBytes"] as const) {
      if (!(spec[k] >= 0) || !Number.isFinite(spec[k])) {
        throw new RangeError(`clusterFromNodes: node "${d.id}": ${k} must be >= 0, got ${spec[k]}`);
      }
    }
    return spec;
  });
  return {
    name: opts.name ?? "live",
    nodes: specs,
    links: opts.links ?? [],
    defaultLink: opts.defaultLink ?? { ...DEFAULT_LINK },
    constraints: { ...emptyConstraints(), ...opts.constraints },
    quant: opts.quant ?? {},
  };
}

/** Seconds for `node` to read `bytes`: from its cache when they fit it, else from memory. */
export function readSeconds(
  node: Pick<NodeSpec, "memBandwidth" | "cacheBytes" | "cacheBandwidth">,
  bytes: number,
): number {
  return node.cacheBytes > 0 && bytes <= node.cacheBytes
    ? bytes / node.cacheBandwidth
    : bytes / node.memBandwidth;
}

/** The link between two nodes: a node-pair link, else a region-pair link, else the default. */
export function linkBetween(
  cluster: Cluster,
  a: NodeSpec,
  b: NodeSpec,
): { latency: number; bandwidth: number } {
  let regional: LinkSpec | undefined;
  for (const l of cluster.links) {
    if ((l.a === a.id && l.b === b.id) || (l.a === b.id && l.b === a.id)) return l;
    if (
      a.region !== "" && b.region !== "" &&
      ((l.a === a.region && l.b === b.region) || (l.a === b.region && l.b === a.region))
    ) regional = l;
  }
  return regional ?? cluster.defaultLink;
}
