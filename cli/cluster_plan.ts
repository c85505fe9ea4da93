// `--cluster FILE`: a cluster file (planner language, docs/PLANNER.md) as the whole experiment. This file is
// the pure part: what each node of the file declares (its memory budget, how much slower than the fastest it
// is, its region), the links between them, and the lab's regional plan (layers pipelined across the regions
// in the file's order, each MoE layer's routed experts spread over the nodes of its stage's region).
import { type Cluster, linkBetween } from "../planner/cluster.ts";
import {
  assemblePlan,
  compileHfConfig,
  type DTypeBytes,
  evaluateAssignment,
  LangError,
  type ModelGraph,
  parseCluster,
  PlacementError,
  type Plan,
} from "../planner/mod.ts";
import { apportion } from "../planner/expert_placement.ts";
import { moeOf } from "../planner/model_graph.ts";
import { servedDtype } from "../node/stage/plan_chain.ts";
import { UsageError } from "./command.ts";
import { readInputFile } from "./input_file.ts";

/** One node of the file as a lab process runs it. */
export interface LabNode {
  name: string;
  region: string;
  /** Declared memory: the node's budget (`--memory`), bytes. */
  memBytes: number;
  /** SWACTOR_SLOWDOWN: the fastest node's memory bandwidth over this node's (1 for the fastest). */
  slowdown: number;
}

export interface LabCluster {
  cluster: Cluster;
  nodes: LabNode[];
}

/**
 * KV context the lab plans for by default: the lab's requests are short. (1,024 tokens of f16 KV are the
 * bytes 512 of f32 were before MLA's latent cache went f16, so that no region of planner/examples/kimi_lab.swl
 * holds a lab model.)
 */
export const LAB_CONTEXT = 1024;

/** Reads and checks a cluster file for `--cluster`; UsageError naming the file and what is wrong. */
export async function readLabCluster(path: string, opts: { memoryScale?: number } = {}): Promise<LabCluster> {
  const text = await readInputFile(path, "--cluster");
  let cluster: Cluster;
  try {
    cluster = parseCluster(text, { file: path });
  } catch (e) {
    if (e instanceof LangError) throw new UsageError(`--cluster: ${e.message}`);
    throw e;
  }
  return labCluster(cluster, opts);
}

/** The lab's view of a parsed cluster (memory scaled by `memoryScale`, default 1). */
export function labCluster(cluster: Cluster, opts: { memoryScale?: number } = {}): LabCluster {
  const scale = opts.memoryScale ?? 1;
  if (cluster.nodes.length < 1) throw new UsageError(`--cluster: cluster ${cluster.name} has no nodes`);
  if (cluster.nodes.length > 64) {
    throw new UsageError(`--cluster: ${cluster.nodes.length} nodes; the lab runs at most 64 processes`);
  }
  const scaled = {
    ...cluster,
    nodes: cluster.nodes.map((n) => ({ ...n, memBytes: Math.floor(n.memBytes * scale) })),
  };
  const fastest = Math.max(...scaled.nodes.map((n) => n.memBandwidth));
  const nodes = scaled.nodes.map((n) => {
    if (n.memBytes < 64 * 1024) {
      throw new UsageError(
        `--cluster: node ${n.id} declares ${n.memBytes} bytes of memory (after scaling); the lab needs 64 KiB`,
      );
    }
    return {
      name: n.id,
      region: n.region,
      memBytes: n.memBytes,
      slowdown: Number((fastest / n.memBandwidth).toFixed(3)),
    };
  });
  return { cluster: scaled, nodes };
}

/** One-way delay (ms) and rate cap (bytes/s) between two nodes of the file, for the WAN emulation's relays. */
export function labLink(c: Cluster, a: string, b: string): { delayMs: number; rateBytesPerSec: number } {
  const na = c.nodes.find((n) => n.id === a), nb = c.nodes.find((n) => n.id === b);
  if (!na || !nb) throw new RangeError(`no node ${na ? b : a} in cluster ${c.name}`);
  const l = linkBetween(c, na, nb);
  const rate = Math.min(l.bandwidth, na.up, nb.down, nb.up, na.down);
  return { delayMs: l.latency * 1000, rateBytesPerSec: Number.isFinite(rate) ? rate : Infinity };
}

/** Bytes a node keeps resident for one layer of a stage (everything but the routed experts) and its experts. */
function layerBytes(model: ModelGraph, l: number, dtype: DTypeBytes, context: number) {
  let resident = 0, experts = 0, count = 0, each = 0;
  for (const op of model.layers[l].ops) {
    if (op.kind === "moe") {
      resident += (op.routerParams + op.shared * op.sharedParams) * dtype.dense;
      experts += op.experts * op.expertParams * dtype.experts;
      count = op.experts;
      each = op.expertParams * dtype.experts;
    } else {
      resident += op.params * dtype.dense;
      if (op.kind === "attention") resident += op.kvPerToken * dtype.kv * context;
    }
  }
  return { resident, experts, count, each };
}

/**
 * The lab's plan: the layers are pipelined across the regions, in the order the file declares them (every
 * region takes at least one layer while there are layers enough; contiguous ranges, as even as memory
 * allows); inside a region, the resident part of its layers (attention, norms, routers, shared experts,
 * KV cache for `context` tokens; the embedding first, the head last) is packed onto its nodes, largest
 * first, one stage per node used; then each MoE layer's routed experts are spread over every node of the
 * region in contiguous ranges, in proportion to their free memory. So a token crosses each region once,
 * and a MoE layer's fan-out stays inside its region. Node ids are the file's names unless `ids` maps them.
 * PlacementError (naming what does not fit) when the file's memory cannot hold the model that way. `name`
 * names the model in the Plan (default: its family).
 */
export function planRegional(
  configJson: unknown,
  cluster: Cluster,
  opts: { context?: number; weights?: string; kv?: string; ids?: Map<string, string>; name?: string } = {},
): Plan {
  const t0 = performance.now();
  const model = compileHfConfig(configJson, { name: opts.name });
  const context = opts.context ?? LAB_CONTEXT;
  const dtype: DTypeBytes = { ...model.dtype, ...cluster.quant, ...servedDtype(opts, [], model) };
  const L = model.layers.length;
  const regions: string[] = [];
  for (const n of cluster.nodes) if (!regions.includes(n.region)) regions.push(n.region);
  const members = (r: string) => cluster.nodes.filter((n) => n.region === r);
  const free = new Map(cluster.nodes.map((n) => [n.id, n.memBytes - n.reserveBytes]));
  const layer = Array.from({ length: L }, (_, l) => layerBytes(model, l, dtype, context));
  const regionCap = (r: string) => members(r).reduce((s, n) => s + free.get(n.id)!, 0);
  const need = (a: number, b: number) => {
    let s = 0;
    for (let l = a; l < b; l++) s += layer[l].resident + layer[l].experts;
    if (a === 0) s += model.embedParams * dtype.embed;
    if (b === L) s += model.headParams * dtype.embed;
    return s;
  };
  // Contiguous ranges over the regions: every region gets a layer while there are enough; a range ends where
  // the next layer would not fit the region, or where the rest must be left to the regions after it.
  const R = Math.min(regions.length, L);
  const ranges: [number, number][] = [];
  let at = 0;
  for (let r = 0; r < R; r++) {
    const left = R - r - 1;
    let end = at + 1;
    const fair = at + Math.ceil((L - at) / (R - r));
    while (end < L - left && end < fair && need(at, end + 1) <= regionCap(regions[r])) end++;
    if (r === R - 1) end = L;
    ranges.push([at, end]);
    at = end;
  }
  const stages: { node: string; start: number; end: number }[] = [];
  const experts = new Map<number, Map<string, number[]>>();
  const name = (id: string) => opts.ids?.get(id) ?? id;
  for (const [r, [a, b]] of ranges.entries()) {
    const region = regions[r];
    const nodes = [...members(region)].sort((x, y) => free.get(y.id)! - free.get(x.id)!);
    // Resident parts onto the largest nodes, in layer order; a stage per node used.
    let k = 0;
    let cur: { node: string; start: number; end: number } | undefined;
    // A part goes onto the current stage's node while it fits, else onto the next node as a new stage
    // (the embedding opens the first stage, [0, 0]; the head closes the last, [L, L] when alone).
    const place = (bytes: number, what: string, start: number, end: number) => {
      if (cur && free.get(cur.node)! < bytes) {
        k++;
        cur = undefined;
      }
      while (!cur && k < nodes.length && free.get(nodes[k].id)! < bytes) k++;
      if (k >= nodes.length) {
        throw new PlacementError(
          `memory of region ${region}`,
          `region ${region} cannot hold ${what} (${bytes} bytes) with the layers before it: its nodes have ` +
            `${nodes.map((n) => `${n.id} ${free.get(n.id)}`).join(", ")} bytes free (context ${context})`,
        );
      }
      const node = cur?.node ?? nodes[k].id;
      free.set(node, free.get(node)! - bytes);
      if (!cur) {
        cur = { node, start, end };
        stages.push(cur);
      } else cur.end = Math.max(cur.end, end);
    };
    if (a === 0) place(model.embedParams * dtype.embed, "the embedding", 0, 0);
    for (let l = a; l < b; l++) place(layer[l].resident, `layer ${l}`, l, l + 1);
    if (b === L) place(model.headParams * dtype.embed, "the head", L, L);
    // Routed experts over every node of the region, by free memory, contiguous ranges.
    for (let l = a; l < b; l++) {
      const { count, each } = layer[l];
      if (count === 0) continue;
      const hosts = nodes.filter((n) => free.get(n.id)! >= each);
      const room = hosts.map((n) => Math.floor(free.get(n.id)! / each));
      if (room.reduce((s, x) => s + x, 0) < count || hosts.length === 0) {
        throw new PlacementError(
          `expert memory of layer ${l}`,
          `region ${region} has room for ${room.reduce((s, x) => s + x, 0)} of layer ${l}'s ${count} ` +
            `experts (${each} bytes each) besides its stages (context ${context})`,
        );
      }
      const share = capped(count, room);
      const m = new Map<string, number[]>();
      let from = 0;
      hosts.forEach((n, i) => {
        if (share[i] === 0) return;
        m.set(n.id, Array.from({ length: share[i] }, (_, j) => from + j));
        from += share[i];
        free.set(n.id, free.get(n.id)! - share[i] * each);
      });
      experts.set(l, m);
    }
  }
  const e = evaluateAssignment(model, cluster, { stages, experts }, { context, dtype });
  const search = { exact: true, evaluated: 1, ms: performance.now() - t0 };
  return renamePlan(assemblePlan(model, cluster, { stages, experts }, e, { context, dtype, search }), name);
}

/** `count` split in proportion to `room`, none above its room (callers checked the sum fits). */
function capped(count: number, room: number[]): number[] {
  const share = count >= room.length ? apportion(count, room) : room.map((_, i) => (i < count ? 1 : 0));
  let over = 0;
  for (let i = 0; i < share.length; i++) {
    if (share[i] > room[i]) {
      over += share[i] - room[i];
      share[i] = room[i];
    }
  }
  for (let i = 0; over > 0 && i < share.length; i++) {
    const add = Math.min(over, room[i] - share[i]);
    share[i] += add;
    over -= add;
  }
  return share;
}

/** The Plan with every node named by `name` (the file's names -> the members' ids). */
function renamePlan(p: Plan, name: (id: string) => string): Plan {
  return {
    ...p,
    stages: p.stages.map((s) => ({ ...s, node: name(s.node) })),
    expertHosts: p.expertHosts.map((h) => ({ ...h, node: name(h.node) })),
    nodes: p.nodes.map((n) => ({ ...n, id: name(n.id) })),
    predicted: { ...p.predicted, stages: p.predicted.stages.map((s) => ({ ...s, node: name(s.node) })) },
  };
}

/** Whether the model has MoE layers (the lab spreads their experts). */
export function hasExperts(configJson: unknown): boolean {
  return compileHfConfig(configJson).layers.some((l) => moeOf(l) !== undefined);
}
