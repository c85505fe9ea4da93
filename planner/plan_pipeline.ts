// planPipeline: the planner's pure entry point, from (model graph, cluster) to a Plan or a
// PlacementError. Chooses nodes and their order (node_order.ts), splits layers optimally over them
// (split_dp.ts), places experts (expert_placement.ts) and predicts latency (evaluate.ts).
import type { Cluster } from "./cluster.ts";
import { type CompiledProblem, compileProblem } from "./compiled.ts";
import { PlacementError } from "./errors.ts";
import { type Assignment, evaluateAssignment, type Evaluation } from "./evaluate.ts";
import { type ExpertSpread, placeExperts, routingShares } from "./expert_placement.ts";
import { type DTypeBytes, type ModelGraph, moeOf } from "./model_graph.ts";
import { searchOrder } from "./node_order.ts";
import { type Plan, PLAN_FORMAT_VERSION, type PlanNode, type PlanPrediction } from "./plan.ts";
import type { ExpertMode } from "./split_dp.ts";
import { humanBytes } from "./units.ts";

export interface PlanOptions {
  /** Context length (tokens) the KV cache must hold, and at which latency is predicted. Default 4096. */
  context?: number;
  /** "local": stages hold their layers' experts; "spread": experts may live on other nodes; "auto" (default)
   * tries both and keeps the faster. */
  experts?: "auto" | "local" | "spread";
  /**
   * How experts spread (expert_placement.ts): "compact" (default: the stage keeps what its memory allows,
   * the nearest nodes the rest, fewest destinations) or "wide" (every MoE layer on at least two nodes and
   * every node hosting some, even where they would fit locally: expert parallelism on purpose).
   */
  expertSpread?: ExpertSpread;
  /**
   * Observed routing counts: per MoE layer (key: layer index), one count per routed expert. The cost model
   * weighs experts by them, the stage keeps the busiest, and hot experts get replicas where memory allows.
   * Default: uniform routing.
   */
  routing?: Record<string, number[]>;
  /** Bytes-per-element overrides; applied over the cluster's `quant` hints and the model's dtype. Default none. */
  dtype?: Partial<DTypeBytes>;
  /** Largest candidate-node count searched exhaustively. Default 6. */
  exactLimit?: number;
  /** Most orders the heuristic search evaluates. Default 60,000. */
  budget?: number;
}

interface Candidate {
  assignment: Assignment;
  exact: boolean;
  evals: number;
}

/** Plans a pipeline for `model` on `cluster`; throws PlacementError naming the constraint that fails. */
export function planPipeline(model: ModelGraph, cluster: Cluster, opts: PlanOptions = {}): Plan {
  const t0 = performance.now();
  const context = opts.context ?? 4096;
  if (!Number.isInteger(context) || context < 1) {
    throw new RangeError(`context must be an integer >= 1, got ${context}`);
  }
  const dtype: DTypeBytes = { ...model.dtype, ...cluster.quant, ...opts.dtype };
  const k = cluster.constraints;
  for (const pin of k.pins) {
    if (k.exclude.includes(pin.node)) {
      throw new PlacementError(
        `pin layers ${pin.start}..${pin.end} on ${pin.node}`,
        `node ${pin.node} is both pinned and excluded`,
      );
    }
  }
  const ids = cluster.nodes.map((n) => n.id).filter((id) => !k.exclude.includes(id));
  if (ids.length === 0) throw new PlacementError("exclude", "every node is excluded");
  const p = compileProblem(model, cluster, { context, dtype, nodeIds: ids });
  const candidates = ids.map((_, i) => i);
  const required = [...new Set(k.pins.map((pin) => ids.indexOf(pin.node)))];
  const fixedOrder = k.order?.map((id) => {
    const i = ids.indexOf(id);
    if (i < 0) throw new PlacementError(`order`, `node ${id} in the order is excluded`);
    return i;
  });
  const hasMoe = model.layers.some((l) => moeOf(l) !== undefined);
  const load = opts.routing ? routingShares(model, opts.routing) : undefined;
  if (opts.expertSpread !== undefined && !["compact", "wide"].includes(opts.expertSpread)) {
    throw new RangeError(
      `expertSpread must be "compact" or "wide", got ${JSON.stringify(opts.expertSpread)}`,
    );
  }
  const want = opts.experts ?? "auto";
  const modes: ExpertMode[] = !hasMoe || want === "local"
    ? ["local"]
    : want === "spread"
    ? ["dense"]
    : ["local", "dense"];
  const found: Candidate[] = [];
  const errors: PlacementError[] = [];
  for (const mode of modes) {
    const r = searchOrder(p, candidates, {
      mode,
      required,
      fixedOrder,
      exactLimit: opts.exactLimit,
      budget: opts.budget,
    });
    if (!r) {
      errors.push(diagnose(p, mode));
      continue;
    }
    const stages = r.order.map((n, i) => ({
      node: ids[n],
      start: r.split.cuts[i],
      end: r.split.cuts[i + 1],
    }));
    try {
      const experts = hasMoe
        ? placeExperts(model, cluster, stages, {
          context,
          dtype,
          hosts: ids,
          spread: mode === "local" ? "compact" : opts.expertSpread,
          load,
        })
        : undefined;
      found.push({
        assignment: { stages, experts, ...(load ? { load } : {}) },
        exact: r.exact,
        evals: r.evals,
      });
    } catch (e) {
      if (!(e instanceof PlacementError)) throw e;
      errors.push(e);
    }
  }
  if (found.length === 0) {
    // Report the first mode's failure (stages holding their experts: the simplest to act on), and the other's.
    const [first, ...rest] = errors;
    const more = rest.map((e) => `; with experts spread: ${e.message}`).join("");
    throw new PlacementError(first.constraint, first.message + more);
  }
  const scored = found.map((c) => ({
    c,
    e: evaluateAssignment(model, cluster, c.assignment, { context, dtype }),
  }));
  scored.sort((a, b) => a.e.tokenS - b.e.tokenS);
  const { c, e } = scored[0];
  return toPlan(model, cluster, c, e, {
    context,
    dtype,
    ms: performance.now() - t0,
    evals: found.reduce((s, f) => s + f.evals, 0),
  });
}

function toPlan(
  model: ModelGraph,
  cluster: Cluster,
  c: Candidate,
  e: Evaluation,
  meta: { context: number; dtype: DTypeBytes; ms: number; evals: number },
): Plan {
  return assemblePlan(model, cluster, c.assignment, e, {
    context: meta.context,
    dtype: meta.dtype,
    search: { exact: c.exact, evaluated: meta.evals, ms: meta.ms },
  });
}

/**
 * The Plan for an assignment and its evaluation: the one place a Plan object is put together (the planner's
 * search and the lab's regional plan, cli/cluster_plan.ts, both end here). Every MoE layer of a stage lists
 * the experts it holds ([] if none); experts on other nodes become `expertHosts`.
 */
export function assemblePlan(
  model: ModelGraph,
  cluster: Cluster,
  assignment: Assignment,
  e: Evaluation,
  meta: { context: number; dtype: DTypeBytes; search: Plan["search"] },
): Plan {
  const stageNodes = new Set(assignment.stages.map((s) => s.node));
  const hostExperts = new Map<string, Record<string, number[]>>();
  const stages = assignment.stages.map((s, i) => {
    const own: Record<string, number[]> = {};
    for (let l = s.start; l < s.end; l++) {
      const hosts = assignment.experts?.get(l);
      if (!hosts) continue;
      own[String(l)] = hosts.get(s.node) ?? []; // every MoE layer of the stage is listed, [] if none is here
      for (const [node, list] of hosts) {
        if (node !== s.node) {
          const rec = hostExperts.get(node) ?? {};
          rec[String(l)] = list;
          hostExperts.set(node, rec);
        }
      }
    }
    return {
      index: i,
      node: s.node,
      layers: [s.start, s.end] as [number, number],
      embeds: i === 0,
      head: i === assignment.stages.length - 1,
      ...(assignment.experts ? { experts: own } : {}),
    };
  });
  const nodes: PlanNode[] = cluster.nodes.map((n) => {
    const m = e.nodes.get(n.id);
    const weights = m?.weights ?? 0, kv = m?.kv ?? 0, used = weights + kv + n.reserveBytes;
    return {
      id: n.id,
      role: stageNodes.has(n.id) ? "stage" : m && m.experts > 0 ? "experts" : "idle",
      memory: { capacity: n.memBytes, reserve: n.reserveBytes, weights, kv, used, free: n.memBytes - used },
      expertLoad: m?.expertLoad ?? 0,
    };
  });
  return {
    version: PLAN_FORMAT_VERSION,
    model: {
      name: model.name,
      family: model.family,
      layers: model.layers.length,
      hidden: model.hidden,
      vocab: model.vocab,
      dtypeBytes: { ...meta.dtype },
    },
    cluster: cluster.name,
    context: meta.context,
    objective: "latency",
    // "spread" only when some expert really lives off its layer's stage (a spread that found room for
    // everything on the stages is the local layout).
    expertMode: hostExperts.size > 0 ? "spread" : "local",
    stages,
    expertHosts: [...hostExperts].map(([node, experts]) => ({ node, experts })),
    nodes,
    predicted: {
      ...predictionOf(e),
      layerFanoutMs: Object.fromEntries(
        e.stages.flatMap((s) => [...s.fanoutByLayer].map(([l, f]) => [String(l), f * 1e3])),
      ),
    },
    search: meta.search,
  };
}

/** The Plan's `predicted` block from the cost model's evaluation of an assignment. */
export function predictionOf(e: Evaluation): PlanPrediction {
  const sum = (f: (s: typeof e.stages[number]) => number) => e.stages.reduce((a, s) => a + f(s), 0);
  const terms = {
    compute: sum((s) => s.computeS),
    overhead: sum((s) => s.overheadS),
    network: sum((s) => s.hopS),
    fanout: sum((s) => s.fanoutS),
  };
  const limitedBy = (Object.keys(terms) as (keyof typeof terms)[]).reduce((a, b) =>
    terms[a] >= terms[b] ? a : b
  );
  return {
    tokenMs: e.tokenS * 1e3,
    tokS: 1 / e.tokenS,
    stages: e.stages.map((s, i) => ({
      index: i,
      node: s.node,
      computeMs: s.computeS * 1e3,
      overheadMs: s.overheadS * 1e3,
      hopMs: s.hopS * 1e3,
      fanoutMs: s.fanoutS * 1e3,
    })),
    limitedBy,
  };
}

const ctxText = (c: number) => c % 1024 === 0 ? `${c / 1024}k` : String(c);

/** Names the first constraint that makes the problem infeasible. */
function diagnose(p: CompiledProblem, mode: ExpertMode): PlacementError {
  const mem = mode === "local" ? p.memAll : p.memDense;
  const ctx = `with ${ctxText(p.context)} context`;
  const largest = p.memAvail.reduce((b, v, i) => v > p.memAvail[b] ? i : b, 0);
  const what = mode === "local" ? "" : " (dense part, experts placed apart)";
  for (let n = 0; n < p.nodes; n++) {
    if (p.pinCount[n] === 0) continue;
    const need = mem[p.pinMax[n] + 1] - mem[p.pinMin[n]];
    if (need > p.memAvail[n]) {
      return new PlacementError(
        `pin on ${p.nodeIds[n]}`,
        `node ${p.nodeIds[n]} (${humanBytes(p.memAvail[n])} usable) cannot hold its pinned layers ${
          p.pinMin[n]
        }..${p.pinMax[n] + 1} (${humanBytes(need)} ${ctx})${what}`,
      );
    }
  }
  for (let l = 0; l < p.layers; l++) {
    const need = mem[l + 1] - mem[l] + (l === 0 ? p.embedMem : 0) + (l === p.layers - 1 ? p.headMem : 0);
    if (need > p.memAvail[largest]) {
      return new PlacementError(
        `memory of layer ${l}`,
        `layer ${l}${l === 0 ? " with the embedding" : l === p.layers - 1 ? " with the head" : ""} needs ${
          humanBytes(need)
        } ${ctx}${what}, ` +
          `but the largest node, ${p.nodeIds[largest]}, has ${humanBytes(p.memAvail[largest])} usable`,
      );
    }
  }
  const need = mem[p.layers] + p.embedMem + p.headMem;
  const have = p.memAvail.reduce((a, b) => a + b, 0);
  if (need > have) {
    return new PlacementError(
      "total memory",
      `the model needs ${humanBytes(need)} (weights + KV ${ctx})${what}, the cluster has ${
        humanBytes(have)
      } usable after reserves`,
    );
  }
  return new PlacementError(
    "contiguous split",
    `no contiguous split of the ${p.layers} layers fits the nodes' memory and pins ${ctx}${what}`,
  );
}
