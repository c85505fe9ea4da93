// The cost model, written plainly over the model graph (not the search's prefix sums), so that tests can
// check the fast path against it. Per token of decode:
//   stage   = overhead + layers x layer overhead + max(bytes read / memory bandwidth, FLOPs / matmul throughput)
//             (a stage whose bytes fit the node's cache reads them at the cache's bandwidth)
//   hop     = link latency + hidden-state bytes / min(link bw, sender up, receiver down)
//   return  = the last stage sends the sampled token id back to the first (the loop is closed)
//   fan-out = per MoE layer whose experts live on other nodes: the stage reads back the router's choice and
//             the activations (SPLIT_READBACKS x its overhead), then waits for the expected slowest
//             destination, where a destination h costs wire + compute: round trip + one activation each way +
//             its overhead + the experts it runs for the token (reading their weights); the stage's own share
//             is a destination too, without the wire (it runs as a separate submit and readback in the
//             stage's process, concurrently with the remote ones); see expectedFanout.
import { type Cluster, linkBetween, type NodeSpec, readSeconds } from "./cluster.ts";
import { type DTypeBytes, type ModelGraph, moeOf } from "./model_graph.ts";
import { SAMPLER_BYTES_PER_TOKEN } from "./compiled.ts";

export interface Assignment {
  stages: { node: string; start: number; end: number }[];
  /** Per MoE layer: node id -> expert indices it hosts. A layer not listed keeps all experts on its stage. */
  experts?: Map<number, Map<string, number[]>>;
  /**
   * Per MoE layer: each routed expert's share of the router's picks (non-negative, summing to 1), e.g. from
   * observed routing counts. A layer not listed is routed uniformly.
   */
  load?: Map<number, number[]>;
}

export interface StageCost {
  node: string;
  computeS: number;
  overheadS: number;
  /** Hop from this stage to the next (the return hop for the last stage). */
  hopS: number;
  /** Expected fan-out time of this stage's MoE layers whose experts live elsewhere. */
  fanoutS: number;
  /** The same per MoE layer with remote experts (layer index -> seconds). */
  fanoutByLayer: Map<number, number>;
  bytesRead: number;
  flops: number;
}

export interface NodeMemory {
  capacity: number;
  reserve: number;
  weights: number;
  kv: number;
  /** Routed-expert bytes hosted here (included in weights). */
  experts: number;
  /** Expected routed experts this node runs per token. */
  expertLoad: number;
}

export interface Evaluation {
  tokenS: number;
  stages: StageCost[];
  nodes: Map<string, NodeMemory>;
}

/**
 * Readbacks a stage makes at each MoE layer whose experts it sends away: the normalised input, the router's
 * ids and its weights, one after another (models/engine.ts, `#runSegments`). Each costs about a step's fixed
 * part (the node's `overhead`): measured 2.2-2.4 ms for the three on the software adapter where the node's
 * own step measured 0.6-0.8 (docs/BENCHMARKS.md, "Experts across nodes").
 */
export const SPLIT_READBACKS = 3;

function nodeOf(cluster: Cluster, id: string): NodeSpec {
  const n = cluster.nodes.find((x) => x.id === id);
  if (!n) throw new TypeError(`unknown node "${id}"`);
  return n;
}

/**
 * Expected max of per-host costs when k experts are drawn (with replacement) by `shares` from all experts;
 * host i costs costs[i] when the token picks any of its experts, and the rest of the mass costs 0.
 * Exact for constant costs: E[max] = sum over hosts by descending cost of c_i P(i is the costliest hit).
 */
export function expectedFanout(costs: number[], shares: number[], k: number): number {
  const idx = costs.map((_, i) => i).sort((a, b) => costs[b] - costs[a]);
  let above = 0, e = 0;
  for (const i of idx) {
    const missAbove = Math.max(0, 1 - above) ** k, missThrough = Math.max(0, 1 - above - shares[i]) ** k;
    e += costs[i] * (missAbove - missThrough);
    above += shares[i];
  }
  return e;
}

/**
 * Experts a token runs on a host holding `share` of the routing mass, given that it runs at least one there:
 * k p / (1 - (1 - p)^k) (1 when p -> 0, k when p = 1).
 */
export function expertsWhenHit(share: number, k: number): number {
  if (share <= 0) return 1;
  if (share >= 1) return k;
  return (k * share) / (1 - (1 - share) ** k);
}

/** Predicts the per-token latency and memory use of an assignment. Pure; does not check feasibility. */
export function evaluateAssignment(
  model: ModelGraph,
  cluster: Cluster,
  a: Assignment,
  opts: { context: number; dtype: DTypeBytes },
): Evaluation {
  const { context, dtype } = opts;
  const act = model.hidden * dtype.activation;
  const nodes = new Map<string, NodeMemory>();
  const mem = (id: string) => {
    let m = nodes.get(id);
    if (!m) {
      const n = nodeOf(cluster, id);
      m = { capacity: n.memBytes, reserve: n.reserveBytes, weights: 0, kv: 0, experts: 0, expertLoad: 0 };
      nodes.set(id, m);
    }
    return m;
  };
  const m = a.stages.length;
  const stages: StageCost[] = [];
  for (let si = 0; si < m; si++) {
    const st = a.stages[si], node = nodeOf(cluster, st.node), nm = mem(st.node);
    let bytes = 0, flops = 0, fanout = 0;
    const fanoutByLayer = new Map<number, number>();
    if (si === 0) {
      nm.weights += model.embedParams * dtype.embed;
      bytes += model.hidden * dtype.embed;
    }
    if (si === m - 1) {
      nm.weights += model.headParams * dtype.embed -
        (m === 1 && model.tied ? model.vocab * model.hidden * dtype.embed : 0);
      bytes += model.headParams * dtype.embed + SAMPLER_BYTES_PER_TOKEN * model.vocab;
      flops += 2 * model.headParams;
    }
    for (let l = st.start; l < st.end; l++) {
      for (const op of model.layers[l].ops) {
        if (op.kind === "moe") continue;
        nm.weights += op.params * dtype.dense;
        bytes += op.params * dtype.dense;
        if (op.kind === "attention") {
          const kv = op.kvPerToken * dtype.kv * context;
          nm.kv += kv;
          bytes += kv;
          flops += op.flops + op.ctxFlops * context;
        } else if (op.kind === "mlp") flops += op.flops;
      }
      const moe = moeOf(model.layers[l]);
      if (!moe) continue;
      const denseMoe = (moe.routerParams + moe.shared * moe.sharedParams) * dtype.dense;
      nm.weights += denseMoe;
      bytes += denseMoe;
      flops += 2 * (moe.routerParams + moe.shared * moe.sharedParams);
      const eb = moe.expertParams * dtype.experts;
      const hosts = a.experts?.get(l) ??
        new Map([[st.node, Array.from({ length: moe.experts }, (_, i) => i)]]);
      const load = a.load?.get(l);
      const loadOf = (e: number) => load ? load[e] ?? 0 : 1 / moe.experts;
      // A destination's fixed cost: the round trip, one activation each way and its per-token overhead.
      const fixedOf = (h: string) => {
        if (h === st.node) return 0;
        const hn = nodeOf(cluster, h),
          go = linkBetween(cluster, node, hn),
          back = linkBetween(cluster, hn, node);
        return go.latency + back.latency + act / Math.min(go.bandwidth, node.up, hn.down) +
          act / Math.min(back.bandwidth, hn.up, node.down) + hn.overhead;
      };
      // Each expert runs on its cheapest host: the stage itself if it holds a copy.
      const chosen = new Map<number, string>();
      for (const [h, list] of hosts) {
        const hm = mem(h);
        hm.weights += list.length * eb;
        hm.experts += list.length * eb;
        for (const e of list) {
          const prev = chosen.get(e);
          if (prev === undefined || fixedOf(h) < fixedOf(prev)) chosen.set(e, h);
        }
      }
      const share = new Map<string, number>();
      for (const [e, h] of chosen) share.set(h, (share.get(h) ?? 0) + loadOf(e));
      for (const [h, p] of share) mem(h).expertLoad += moe.topK * p;
      const split = [...share.keys()].some((h) => h !== st.node);
      if (!split) {
        const p = share.get(st.node) ?? 0;
        bytes += moe.topK * p * eb;
        flops += moe.topK * p * 2 * moe.expertParams;
      } else {
        // Wire + compute per destination: its fixed cost plus the experts the token runs there. The stage's
        // own share runs beside the remote ones as a step of its own (its overhead, no wire).
        const dests = [...share.keys()];
        const costs = dests.map((h) => {
          const hn = nodeOf(cluster, h);
          const perExpert = Math.max(eb / hn.memBandwidth, (2 * moe.expertParams) / hn.flops);
          const fixed = h === st.node ? node.overhead : fixedOf(h);
          return fixed + expertsWhenHit(share.get(h)!, moe.topK) * perExpert;
        });
        const f = SPLIT_READBACKS * node.overhead +
          expectedFanout(costs, dests.map((h) => share.get(h)!), moe.topK);
        fanoutByLayer.set(l, f);
        fanout += f;
      }
    }
    const next = nodeOf(cluster, a.stages[(si + 1) % m].node);
    let hop = 0;
    if (m > 1) {
      const l = linkBetween(cluster, node, next), bw = Math.min(l.bandwidth, node.up, next.down);
      hop = l.latency + (si === m - 1 ? 8 : act) / bw;
    }
    const compute = Math.max(readSeconds(node, bytes), flops / node.flops);
    stages.push({
      node: st.node,
      computeS: compute,
      overheadS: node.overhead + (st.end - st.start) * node.layerOverhead,
      hopS: hop,
      fanoutS: fanout,
      fanoutByLayer,
      bytesRead: bytes,
      flops,
    });
  }
  const tokenS = stages.reduce((s, x) => s + x.computeS + x.overheadS + x.hopS + x.fanoutS, 0);
  return { tokenS, stages, nodes };
}
