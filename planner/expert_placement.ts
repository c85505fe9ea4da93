// V2 placement (first version): where the routed experts of each MoE layer live when a stage cannot
// hold all of its layers' experts. Per MoE layer, in order: the stage's own node keeps a fair share of
// its free memory's worth (local experts cost no network); the rest go to the nodes nearest the stage
// (round trip + their overhead), each filled before the next so that a token's top-k touches few
// nodes (low fan-out). With uniform routing an expert's expected load is top_k / experts, so filling by
// memory also balances load by memory. `replicate` hints add copies where asked.
import type { Cluster } from "./cluster.ts";
import { linkBetween } from "./cluster.ts";
import { PlacementError } from "./errors.ts";
import { type Assignment, evaluateAssignment } from "./evaluate.ts";
import { type DTypeBytes, type ModelGraph, moeOf } from "./model_graph.ts";
import { humanBytes } from "./units.ts";

export interface ExpertPlacementOptions {
  context: number;
  dtype: DTypeBytes;
  /** Nodes that may host experts (default: every node not excluded). */
  hosts?: string[];
}

/** Places routed experts for the given stages; throws PlacementError when they do not fit. */
export function placeExperts(
  model: ModelGraph,
  cluster: Cluster,
  stages: Assignment["stages"],
  opts: ExpertPlacementOptions,
): Map<number, Map<string, number[]>> {
  const moeLayers = model.layers.map((l, i) => [i, moeOf(l)] as const).filter(([, m]) => m !== undefined);
  const empty = new Map(moeLayers.map(([i]) => [i, new Map<string, number[]>()]));
  const dense = evaluateAssignment(model, cluster, { stages, experts: empty }, opts);
  const hosts = opts.hosts ??
    cluster.nodes.filter((n) => !cluster.constraints.exclude.includes(n.id)).map((n) => n.id);
  const free = new Map<string, number>();
  for (const id of hosts) {
    const n = cluster.nodes.find((x) => x.id === id)!;
    const used = dense.nodes.get(id);
    free.set(id, n.memBytes - n.reserveBytes - (used ? used.weights + used.kv : 0));
  }
  const out = new Map<number, Map<string, number[]>>();
  const act = model.hidden * opts.dtype.activation;
  for (const st of stages) {
    const layers = moeLayers.filter(([i]) => i >= st.start && i < st.end);
    const stageNode = cluster.nodes.find((n) => n.id === st.node)!;
    // Helpers nearest this stage first: round trip, transfer and their fixed per-token overhead.
    const rank = hosts.filter((h) => h !== st.node).map((h) => {
      const hn = cluster.nodes.find((n) => n.id === h)!, l = linkBetween(cluster, stageNode, hn);
      return { h, cost: 2 * l.latency + 2 * act / Math.min(l.bandwidth, hn.up, hn.down) + hn.overhead };
    }).sort((a, b) => a.cost - b.cost);
    for (let k = 0; k < layers.length; k++) {
      const [li, moe] = layers[k];
      // A fair share of the stage's free memory for each of its remaining MoE layers.
      const localShare = Math.max(0, free.get(st.node) ?? 0) / (layers.length - k);
      const eb = moe!.expertParams * opts.dtype.experts;
      const map = new Map<string, number[]>();
      let next = 0;
      const take = (host: string, count: number) => {
        if (count <= 0) return;
        map.set(host, [...(map.get(host) ?? []), ...Array.from({ length: count }, (_, i) => next + i)]);
        next += count;
        free.set(host, free.get(host)! - count * eb);
      };
      if (free.has(st.node)) take(st.node, Math.min(moe!.experts, Math.floor(localShare / eb)));
      for (const { h } of rank) {
        if (next >= moe!.experts) break;
        take(h, Math.min(moe!.experts - next, Math.floor(Math.max(0, free.get(h)!) / eb)));
      }
      // Last resort before giving up: the stage's own memory beyond its fair share.
      if (free.has(st.node)) {
        take(st.node, Math.min(moe!.experts - next, Math.floor(Math.max(0, free.get(st.node)!) / eb)));
      }
      if (next < moe!.experts) {
        const left = moe!.experts - next;
        const total = [...free.values()].reduce((s, v) => s + Math.max(0, v), 0);
        throw new PlacementError(
          "expert memory",
          `layer ${li}: ${left} of ${moe!.experts} experts (${humanBytes(left * eb)}) do not fit; ` +
            `${humanBytes(total)} is free in the whole cluster after the stages' dense weights`,
        );
      }
      out.set(li, map);
    }
  }
  for (const r of cluster.constraints.replicas) {
    const moe = model.layers[r.layer] && moeOf(model.layers[r.layer]);
    if (!moe || r.expert >= moe.experts) {
      throw new RangeError(`replicate layer ${r.layer} expert ${r.expert}: no such MoE layer or expert`);
    }
    const eb = moe.expertParams * opts.dtype.experts;
    for (const node of r.nodes) {
      const map = out.get(r.layer)!;
      const list = map.get(node) ?? [];
      if (list.includes(r.expert)) continue;
      if ((free.get(node) ?? 0) < eb) {
        throw new PlacementError(
          `replicate layer ${r.layer} expert ${r.expert} on ${node}`,
          `node ${node} has ${humanBytes(Math.max(0, free.get(node) ?? 0))} free, the replica needs ${
            humanBytes(eb)
          }`,
        );
      }
      free.set(node, free.get(node)! - eb);
      map.set(node, [...list, r.expert].sort((a, b) => a - b));
    }
  }
  return out;
}
