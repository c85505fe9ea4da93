// V2 placement: where the routed experts of each MoE layer live, once the stages (dense part) are placed.
// Experts are units with memory (their weights), a cost per token where they run (the destination's round
// trip, wire and overhead, plus reading their weights) and a popularity (their share of the router's
// picks: uniform, or from observed routing counts). Two policies:
//
// - compact (what the planner picks by cost): per MoE layer, the stage's node keeps a fair share of its
//   free memory's worth (local experts cost no network); the rest go to the nodes nearest the stage (round
//   trip + wire + overhead + compute), each filled before the next so that a token's top-k touches few
//   nodes (low fan-out). With observed routing counts the busiest experts go first: the stage keeps the
//   hottest, the nearest nodes the next.
// - wide (expert parallelism on purpose, even where the experts would fit on their stage): every MoE layer
//   on at least two nodes, its stage's node included, and the layers' other hosts rotated so that every
//   node that can hosts some; each layer's experts are split evenly over its hosts (capped by memory).
//
// With routing counts, hot experts served remotely then get replicas where memory allows (replicateHot).
//
// Each host's experts of a layer are contiguous runs of ids where possible (one range in the common case),
// so that a host registers "layer l: [a, b)" instead of every expert's name (expert_ranges.ts).
import type { Cluster, NodeSpec } from "./cluster.ts";
import { linkBetween } from "./cluster.ts";
import { PlacementError } from "./errors.ts";
import { type Assignment, evaluateAssignment } from "./evaluate.ts";
import { type DTypeBytes, type ModelGraph, moeOf, type MoeOp } from "./model_graph.ts";
import { humanBytes } from "./units.ts";

export type ExpertSpread = "compact" | "wide";

export interface ExpertPlacementOptions {
  context: number;
  dtype: DTypeBytes;
  /** Nodes that may host experts (default: every node not excluded). */
  hosts?: string[];
  /** "compact" (default) or "wide"; see the file's comment. */
  spread?: ExpertSpread;
  /**
   * Per MoE layer: each routed expert's share of the router's picks (summing to 1), e.g. from observed
   * routing counts (routingShares). Default: uniform.
   */
  load?: Map<number, number[]>;
}

/** One MoE layer as the placement sees it. */
interface LayerUnit {
  layer: number;
  moe: MoeOp;
  /** The node of the stage that owns the layer (runs its router and shared experts). */
  stage: string;
  /** Bytes of one routed expert. */
  eb: number;
  /** node -> expert ids, filled by the policies. */
  hosts: Map<string, number[]>;
}

/** The shared state of one placement: units, free memory and the cost of each destination. */
class Placement {
  readonly units: LayerUnit[] = [];
  readonly free = new Map<string, number>();
  readonly hosts: string[];
  #nodes = new Map<string, NodeSpec>();
  #act: number;

  constructor(
    model: ModelGraph,
    readonly cluster: Cluster,
    stages: Assignment["stages"],
    readonly opts: ExpertPlacementOptions,
  ) {
    for (const n of cluster.nodes) this.#nodes.set(n.id, n);
    this.#act = model.hidden * opts.dtype.activation;
    this.hosts = opts.hosts ??
      cluster.nodes.filter((n) => !cluster.constraints.exclude.includes(n.id)).map((n) => n.id);
    const empty = new Map<number, Map<string, number[]>>();
    model.layers.forEach((l, i) => moeOf(l) && empty.set(i, new Map()));
    const dense = evaluateAssignment(model, cluster, { stages, experts: empty }, opts);
    for (const id of this.hosts) {
      const n = this.node(id), used = dense.nodes.get(id);
      this.free.set(id, n.memBytes - n.reserveBytes - (used ? used.weights + used.kv : 0));
    }
    for (const st of stages) {
      for (let l = st.start; l < st.end; l++) {
        const moe = moeOf(model.layers[l]);
        if (moe) {
          this.units.push({
            layer: l,
            moe,
            stage: st.node,
            eb: moe.expertParams * opts.dtype.experts,
            hosts: new Map(),
          });
        }
      }
    }
  }

  node(id: string): NodeSpec {
    const n = this.#nodes.get(id);
    if (!n) throw new TypeError(`unknown node "${id}"`);
    return n;
  }

  /** Seconds a destination adds for the layer's stage: round trip, an activation each way, its overhead. */
  fixedCost(stage: string, host: string): number {
    if (stage === host) return 0;
    const s = this.node(stage), h = this.node(host);
    const go = linkBetween(this.cluster, s, h), back = linkBetween(this.cluster, h, s);
    return go.latency + back.latency + this.#act / Math.min(go.bandwidth, s.up, h.down) +
      this.#act / Math.min(back.bandwidth, h.up, s.down) + h.overhead;
  }

  /** Seconds one expert of `u` takes on `host` (its weights read, or its FLOPs). */
  expertCost(u: LayerUnit, host: string): number {
    const n = this.node(host);
    return Math.max(u.eb / n.memBandwidth, (2 * u.moe.expertParams) / n.flops);
  }

  /** Experts of `u` that fit in `host`'s free memory. */
  room(u: LayerUnit, host: string): number {
    return Math.max(0, Math.floor(Math.max(0, this.free.get(host) ?? 0) / u.eb));
  }

  /** Puts `ids` of `u` on `host` and charges its memory. */
  take(u: LayerUnit, host: string, ids: number[]): void {
    if (ids.length === 0) return;
    u.hosts.set(host, [...(u.hosts.get(host) ?? []), ...ids]);
    this.free.set(host, (this.free.get(host) ?? 0) - ids.length * u.eb);
  }

  /** Other hosts by their cost for `u`'s stage: fixed cost plus one expert's compute, then id order. */
  nearest(u: LayerUnit): string[] {
    return this.hosts.filter((h) => h !== u.stage).map((h, i) => ({
      h,
      i,
      c: this.fixedCost(u.stage, h) + this.expertCost(u, h),
    })).sort((a, b) => a.c - b.c || a.i - b.i).map((x) => x.h);
  }

  /** Fills `ids` (in order) onto `order`'s hosts, each filled before the next; returns what is left. */
  fill(u: LayerUnit, order: string[], ids: number[]): number[] {
    let next = 0;
    for (const h of order) {
      if (next >= ids.length) break;
      const n = Math.min(ids.length - next, this.room(u, h));
      this.take(u, h, ids.slice(next, next + n));
      next += n;
    }
    return ids.slice(next);
  }

  unfit(u: LayerUnit, left: number): PlacementError {
    const total = [...this.free.values()].reduce((s, v) => s + Math.max(0, v), 0);
    return new PlacementError(
      "expert memory",
      `layer ${u.layer}: ${left} of ${u.moe.experts} experts (${humanBytes(left * u.eb)}) do not fit; ` +
        `${humanBytes(total)} is free in the whole cluster after the stages' dense weights`,
    );
  }
}

/**
 * Places routed experts for the given stages: per MoE layer, node id -> expert ids (ascending). Throws
 * PlacementError when they do not fit, RangeError for a `replicate` hint naming no such expert.
 */
export function placeExperts(
  model: ModelGraph,
  cluster: Cluster,
  stages: Assignment["stages"],
  opts: ExpertPlacementOptions,
): Map<number, Map<string, number[]>> {
  const p = new Placement(model, cluster, stages, opts);
  if ((opts.spread ?? "compact") === "wide") placeWide(p);
  else placeCompact(p);
  replicateHinted(p, model);
  if (opts.load) replicateHot(p, opts.load);
  const out = new Map<number, Map<string, number[]>>();
  for (const u of p.units) {
    out.set(u.layer, new Map([...u.hosts].map(([h, ids]) => [h, [...new Set(ids)].sort((a, b) => a - b)])));
  }
  return out;
}

/**
 * Each stage keeps a fair share of its memory (all stages first, so that no stage's node fills up with
 * another stage's experts); then, layer by layer, the nearest other nodes take the rest, one filled after
 * another; a stage's own memory beyond its fair share is the last resort.
 */
function placeCompact(p: Placement): void {
  const byStage = new Map<string, LayerUnit[]>();
  for (const u of p.units) byStage.set(u.stage, [...(byStage.get(u.stage) ?? []), u]);
  const rest = new Map<LayerUnit, number[]>();
  for (const [stage, units] of byStage) {
    units.forEach((u, k) => {
      const E = u.moe.experts;
      const local = p.free.has(stage)
        ? Math.min(E, Math.floor(Math.max(0, p.free.get(stage)!) / (units.length - k) / u.eb))
        : 0;
      // Without routing counts: ids in order, so each host gets one range. With them: the busiest first, so
      // the stage keeps the hottest experts and the nearest nodes the next hottest.
      const load = p.opts.load?.get(u.layer);
      const ranked = Array.from({ length: E }, (_, i) => i);
      if (load) ranked.sort((a, b) => load[b] - load[a] || a - b);
      p.take(u, stage, ranked.slice(0, local));
      rest.set(u, ranked.slice(local));
    });
  }
  for (const u of p.units) {
    let left = p.fill(u, p.nearest(u), rest.get(u)!);
    if (p.free.has(u.stage)) left = p.fill(u, [u.stage], left);
    if (left.length) throw p.unfit(u, left.length);
  }
}

/**
 * Every MoE layer on w >= 2 nodes (its stage's node first), w = ceil(hosts / MoE layers) so that every
 * host gets some layer when there are enough; the other hosts are the least used so far (then those serving
 * fewest other stages), then the nearest.
 * A layer's experts are split evenly over its hosts (capped by their memory), contiguous in host order.
 */
function placeWide(p: Placement): void {
  const H = p.hosts.length, M = p.units.length;
  // Layers each host serves (its stage's own included from the start), and those it serves for another stage.
  const used = new Map(p.hosts.map((h) => [h, 0]));
  const remote = new Map(p.hosts.map((h) => [h, 0]));
  for (const u of p.units) if (used.has(u.stage)) used.set(u.stage, used.get(u.stage)! + 1);
  for (const u of p.units) {
    const E = u.moe.experts;
    const w = Math.max(1, Math.min(E, H, Math.max(2, Math.ceil(H / M))));
    const near = p.nearest(u);
    const others = near.filter((h) => p.room(u, h) > 0)
      .sort((a, b) =>
        used.get(a)! - used.get(b)! || remote.get(a)! - remote.get(b)! || near.indexOf(a) - near.indexOf(b)
      );
    const chosen = [...(p.room(u, u.stage) > 0 ? [u.stage] : []), ...others].slice(0, w);
    for (const h of chosen) {
      if (h === u.stage) continue;
      used.set(h, used.get(h)! + 1);
      remote.set(h, remote.get(h)! + 1);
    }
    // An even split, not one by measured bandwidth: live measurements on a loaded machine wobble by several
    // times (a host measured 8x slower than its peer got 3 of 16 experts, which the router may not pick in
    // a short request), and a wide spread's layout should not follow that noise. Memory still caps a share.
    const counts = apportion(E, chosen.map(() => 1));
    let next = 0;
    chosen.forEach((h, i) => {
      const n = Math.min(counts[i], p.room(u, h));
      p.take(u, h, Array.from({ length: n }, (_, j) => next + j));
      next += n;
    });
    // What a chosen host had no room for goes compact: the chosen hosts first, then the nearest others.
    const rest = Array.from({ length: E - next }, (_, j) => next + j);
    const left = p.fill(u, [...chosen, ...near.filter((h) => !chosen.includes(h))], rest);
    if (left.length) throw p.unfit(u, left.length);
  }
}

/** `total` split in proportion to `weights`, each part >= 1 (largest remainder); total >= weights.length. */
export function apportion(total: number, weights: number[]): number[] {
  const n = weights.length;
  if (n === 0) return [];
  const sum = weights.reduce((a, b) => a + b, 0);
  const spare = total - n;
  const exact = weights.map((w) => (sum > 0 ? (spare * w) / sum : spare / n));
  const out = exact.map((x) => 1 + Math.floor(x));
  let left = total - out.reduce((a, b) => a + b, 0);
  const order = exact.map((x, i) => ({ i, r: x - Math.floor(x) })).sort((a, b) => b.r - a.r || a.i - b.i);
  for (let j = 0; left > 0; j = (j + 1) % n, left--) out[order[j].i]++;
  return out;
}

/** The cluster's `replicate layer L expert E on [...]` hints. */
function replicateHinted(p: Placement, model: ModelGraph): void {
  for (const r of p.cluster.constraints.replicas) {
    const moe = model.layers[r.layer] && moeOf(model.layers[r.layer]);
    const u = p.units.find((x) => x.layer === r.layer);
    if (!moe || !u || r.expert >= moe.experts) {
      throw new RangeError(`replicate layer ${r.layer} expert ${r.expert}: no such MoE layer or expert`);
    }
    for (const node of r.nodes) {
      if (u.hosts.get(node)?.includes(r.expert)) continue;
      if ((p.free.get(node) ?? 0) < u.eb) {
        throw new PlacementError(
          `replicate layer ${r.layer} expert ${r.expert} on ${node}`,
          `node ${node} has ${humanBytes(Math.max(0, p.free.get(node) ?? 0))} free, the replica needs ${
            humanBytes(u.eb)
          }`,
        );
      }
      p.take(u, node, [r.expert]);
    }
  }
}

/** An expert is hot when the router picks it at least this many times as often as the average expert. */
export const HOT_FACTOR = 2;

/**
 * EPLB-style replicas of the busiest experts: a hot expert (HOT_FACTOR x the mean share or more) whose
 * serving copy is remote gets a copy on a cheaper node the layer already uses (its stage first), while
 * memory allows; busiest first (expected picks per token x the round trip saved). No new destination
 * appears, and cold experts stay where they are, so a wide layer stays spread. After a compact placement
 * the cheap hosts are full of the hottest experts already, so this mostly acts on wide ones.
 */
function replicateHot(p: Placement, load: Map<number, number[]>): void {
  const candidates: { u: LayerUnit; e: number; gain: number }[] = [];
  for (const u of p.units) {
    const shares = load.get(u.layer);
    if (!shares) continue;
    for (const [e, h] of servers(p, u)) {
      if (h === u.stage || shares[e] < HOT_FACTOR / u.moe.experts) continue;
      candidates.push({ u, e, gain: u.moe.topK * shares[e] * p.fixedCost(u.stage, h) });
    }
  }
  candidates.sort((a, b) => b.gain - a.gain || a.u.layer - b.u.layer || a.e - b.e);
  for (const { u, e } of candidates) {
    const current = p.fixedCost(u.stage, servers(p, u).get(e)!);
    const target = [u.stage, ...[...u.hosts.keys()].filter((h) => h !== u.stage)]
      .filter((h) => p.fixedCost(u.stage, h) < current && p.room(u, h) > 0)
      .sort((a, b) => p.fixedCost(u.stage, a) - p.fixedCost(u.stage, b))[0];
    if (target) p.take(u, target, [e]);
  }
}

/** Each expert of `u` -> the host whose copy serves it (the cheapest for the stage). */
function servers(p: Placement, u: LayerUnit): Map<number, string> {
  const out = new Map<number, string>();
  for (const [h, ids] of u.hosts) {
    for (const e of ids) {
      const prev = out.get(e);
      if (prev === undefined || p.fixedCost(u.stage, h) < p.fixedCost(u.stage, prev)) out.set(e, h);
    }
  }
  return out;
}

/**
 * Routing counts (per MoE layer key, one count per routed expert, as observed) to the shares the placement
 * and the cost model use. Throws RangeError naming the layer when counts do not match the model.
 */
export function routingShares(model: ModelGraph, counts: Record<string, number[]>): Map<number, number[]> {
  const out = new Map<number, number[]>();
  for (const [key, list] of Object.entries(counts)) {
    const l = Number(key);
    const moe = Number.isInteger(l) && model.layers[l] ? moeOf(model.layers[l]) : undefined;
    if (!moe) throw new RangeError(`routing counts for layer "${key}": not a MoE layer of ${model.name}`);
    if (!Array.isArray(list) || list.length !== moe.experts) {
      throw new RangeError(
        `routing counts for layer ${l}: expected ${moe.experts} counts, one per routed expert`,
      );
    }
    if (!list.every((c) => typeof c === "number" && Number.isFinite(c) && c >= 0)) {
      throw new RangeError(`routing counts for layer ${l}: counts must be finite numbers >= 0`);
    }
    const sum = list.reduce((a, b) => a + b, 0);
    if (sum <= 0) throw new RangeError(`routing counts for layer ${l}: all zero`);
    out.set(l, list.map((c) => c / sum));
  }
  return out;
}
