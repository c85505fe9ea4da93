// The leader's side of rung 1: from the model's config.json and the live members to a Plan with one stage per
// wanted node. The members' measured descriptors make the cluster (planner/live.ts: memory, bandwidth at the
// model's width, per-step and per-layer costs, links); the planner's DP (planner/) splits the layers over
// them; a chain asks for exactly `stages` stages (an `order` constraint), because the planner alone prefers
// fewer. The first member keeps stage 0 and the others' order is searched. With more nodes than layers, the
// embedding and then the head become stages of their own (a chain holds at most layers + 2 stages); any node
// beyond that is idle. The Plan's prediction is made for the final stages; `predictChain` makes it again for
// one request's context. With `experts: "spread"` every MoE layer's routed experts are placed over the
// members (the planner's "wide" spread: each layer on at least two nodes, its stage's node included, and
// every member hosting some where there are enough experts), even when they would fit on their stage. Pure.
import {
  compileHfConfig,
  type DTypeBytes,
  evaluateAssignment,
  liveCluster,
  type LiveMember,
  type ModelGraph,
  PlacementError,
  type Plan,
  planPipeline,
  type PlanPrediction,
  predictionOf,
} from "../../planner/mod.ts";
import type { Cluster } from "../../planner/cluster.ts";
import { expertPlacement } from "./experts.ts";
import { kvRowBytes, kvTypeOf } from "../../kernels/kv.ts";

/** A member as the planner sees it: its id and, once it has measured itself, its descriptor. */
export type ChainMember = LiveMember;

export interface PlanChainOptions {
  /** Stages wanted (default: every member). */
  stages?: number;
  /** KV context the planner sizes memory for (default 4096). */
  context?: number;
  /**
   * Where MoE layers' routed experts live: "local" (default: on their layer's stage, as the planner places
   * them by cost: elsewhere only when the stage cannot hold them) or "spread" (across the members: expert
   * parallelism on purpose, docs/PLANNER.md). Ignored for models without MoE layers.
   */
  experts?: "local" | "spread";
  /** The weights' form on the GPU ("auto", "f32", "f16", "q8", "q4"; default "auto"): the bytes each reads. */
  weights?: string;
  /** The KV cache's element type ("auto", "f32", "f16", "q8"; default "auto"): the bytes it holds. */
  kv?: string;
}

/** Orders whose predicted per-token time is within this fraction of the fastest count as equally fast. */
const ORDER_TOLERANCE = 0.01;

/** Memory a chain node keeps free besides weights and KV (activations, staging buffers, the runtime). */
const RESERVE_BYTES = 64 * 2 ** 20;

/**
 * Bytes per element the engine holds for `form.weights`: auto is f16 wherever the GPU has shader-f16 (every GPU
 * we run on, and the software adapter) and f32 elsewhere; q8 / q4 hold 1 / 0.5 bytes plus an f16 scale per
 * group of 32. The KV cache (models/model.ts kvCacheType; GQA's K and V, or MLA's latent rows) is `form.kv`
 * where given, else f16 beside f16 / q8 / q4 weights and f32 beside f32 ones or on a GPU without shader-f16. A
 * q8 cache holds a row of `head_dim` int8 values and an f32 scale in GQA layers whose head_dim is a multiple of
 * 4, f16 in the others (kernels/kv.ts kvTypeOf): it counts the largest of `model`'s layers' bytes per element
 * (f16's 2 without `model`). The Plan has one set of sizes for all nodes: when any of `members` measured its
 * GEMVs reading f32 (no shader-f16), auto weights and the KV cache count 4 bytes everywhere, over-counting the
 * others rather than under-counting it. A node told SWACTOR_KV does not say so in its descriptor: not counted
 * (`up --kv` is: the Plan's model carries it to every node).
 */
export function servedDtype(
  form: { weights?: string; kv?: string },
  members: ChainMember[] = [],
  model?: ModelGraph,
): Partial<DTypeBytes> {
  const { weights } = form;
  const noF16 = members.some((m) => m.descriptor?.read_weights === "f32");
  const float = noF16 ? 4 : 2;
  const w = weights === "f32" ? 4 : weights === "q8" ? 34 / 32 : weights === "q4" ? 18 / 32 : float;
  return {
    dense: w,
    experts: w,
    embed: w,
    kv: kvElementBytes(form.kv, weights === "f32" ? 4 : float, model),
  };
}

/** Bytes per KV cache element of type `kv` (auto / undefined: `auto`), the largest over `model`'s layers. */
function kvElementBytes(kv: string | undefined, auto: number, model?: ModelGraph): number {
  if (kv === undefined || kv === "auto") return auto;
  if (kv !== "q8") return kv === "f32" ? 4 : 2;
  let bytes = 0;
  for (const layer of model?.layers ?? []) {
    for (const op of layer.ops) {
      if (op.kind !== "attention") continue;
      const width = op.variant === "mla" ? 1 : op.headDim ?? 1;
      bytes = Math.max(
        bytes,
        kvRowBytes(kvTypeOf("q8", { gqa: op.variant !== "mla", width }), width) / width,
      );
    }
  }
  return bytes || 2;
}

/**
 * The cluster a chain is planned on: the members' measurements at the model's width, a chain's reserves, the
 * bytes per element of the weights as served (`quant`), and the chain's node order when given.
 */
export function chainCluster(
  model: ModelGraph,
  members: ChainMember[],
  opts: { order?: string[]; weights?: string; kv?: string } = {},
): Cluster {
  return liveCluster(members, {
    width: model.hidden,
    reserveBytes: RESERVE_BYTES,
    constraints: opts.order ? { order: opts.order } : undefined,
    quant: servedDtype(opts, members, model),
  });
}

/**
 * Which of `members` (in chain order) does what in a chain of `stages` over `layers` layers: the layer stages,
 * and with more stages than layers an embedding-only first stage, then a head-only last one. The others idle.
 */
export function chainRoles<T>(members: T[], stages: number, layers: number) {
  const extra = Math.min(Math.max(0, stages - layers), 2);
  const layerStages = Math.min(stages, layers);
  const first = extra >= 1 ? 1 : 0;
  return {
    embedNode: extra >= 1 ? members[0] : undefined,
    layered: members.slice(first, first + layerStages),
    headNode: extra >= 2 ? members[1 + layerStages] : undefined,
  };
}

/** A Plan over `members` (in chain order: the first one gets stage 0), or PlacementError saying why not. */
export function planChain(configJson: unknown, members: ChainMember[], opts: PlanChainOptions = {}): Plan {
  const model = compileHfConfig(configJson);
  const want = opts.stages ?? members.length;
  const experts = opts.experts ?? "local";
  if (experts !== "local" && experts !== "spread") {
    throw new RangeError(`experts must be "local" or "spread", got ${JSON.stringify(experts)}`);
  }
  if (!(Number.isInteger(want) && want >= 1)) {
    throw new RangeError(`stages must be an integer >= 1, got ${want}`);
  }
  if (want > members.length) {
    throw new PlacementError(
      "stages",
      `${want} stages need ${want} nodes; the cluster has ${members.length}`,
    );
  }
  // The first member keeps stage 0; the order of the others is searched (every order up to 6 members, else
  // a few by memory), since a node's place decides what it must hold (the head, the embedding).
  const found: Plan[] = [];
  let error: unknown;
  for (const rest of orders(members.slice(1))) {
    try {
      found.push(planOrder(model, [members[0], ...rest], want, { ...opts, experts }));
    } catch (e) {
      if (!(e instanceof PlacementError)) throw e;
      error ??= e;
    }
  }
  // The first order (the members' own first) within 1% of the fastest: link estimates that wobble by a
  // few microseconds do not reorder a chain, so `plan --live` and `up --model` agree on the same cluster.
  const fastest = Math.min(...found.map((p) => p.predicted.tokenMs));
  const best = found.find((p) => p.predicted.tokenMs <= fastest * (1 + ORDER_TOLERANCE));
  if (!best) throw error;
  return best;
}

/** Orders of `rest` to try: every one when few (members' order first), else the members' and by memory. */
function orders(rest: ChainMember[]): ChainMember[][] {
  if (rest.length <= 5) return permutations(rest);
  const mem = (m: ChainMember) => m.descriptor?.memory_bytes ?? 0;
  const up = [...rest].sort((a, b) => mem(a) - mem(b));
  return [rest, up, [...up].reverse()];
}

function permutations<T>(xs: T[]): T[][] {
  if (xs.length <= 1) return [xs];
  const out: T[][] = [];
  xs.forEach((x, i) => {
    for (const p of permutations([...xs.slice(0, i), ...xs.slice(i + 1)])) out.push([x, ...p]);
  });
  return out;
}

/** The Plan for the chain over `members` in this order. */
function planOrder(model: ModelGraph, members: ChainMember[], want: number, opts: PlanChainOptions): Plan {
  const L = model.layers.length;
  const { embedNode, layered, headNode } = chainRoles(members, want, L);
  const layerStages = layered.length;
  const context = opts.context ?? 4096;
  const cluster = chainCluster(model, members, {
    order: layered.map((m) => m.id),
    weights: opts.weights,
    kv: opts.kv,
  });
  const plan = planPipeline(model, cluster, {
    context,
    ...(opts.experts === "spread" ? { experts: "spread", expertSpread: "wide" } : {}),
  });
  if (plan.stages.length !== layerStages) {
    throw new PlacementError(
      "order",
      `the planner made ${plan.stages.length} stages; ${layerStages} were asked`,
    );
  }
  const stages = plan.stages.map((s) => ({ ...s }));
  if (embedNode) {
    stages[0].embeds = false;
    stages.unshift({ index: 0, node: embedNode.id, layers: [0, 0], embeds: true, head: false });
  }
  if (headNode) {
    stages[stages.length - 1].head = false;
    stages.push({ index: 0, node: headNode.id, layers: [L, L], embeds: false, head: true });
  }
  stages.forEach((s, i) => (s.index = i));
  const used = new Set(stages.map((s) => s.node));
  const hosting = new Set(plan.expertHosts.map((h) => h.node));
  const nodes = plan.nodes.map((n) => ({
    ...n,
    role: used.has(n.id) ? "stage" as const : hosting.has(n.id) ? "experts" as const : "idle" as const,
  }));
  const out = { ...plan, stages, nodes };
  if (embedNode || headNode) out.predicted = predict(model, cluster, out, context);
  return out;
}

function predict(model: ModelGraph, cluster: Cluster, plan: Plan, context: number): PlanPrediction {
  // The Plan's expert placement, so that a spread Plan is predicted with its fan-out.
  const experts = expertPlacement(plan);
  const assignment = {
    stages: plan.stages.map((s) => ({ node: s.node, start: s.layers[0], end: s.layers[1] })),
    ...(plan.expertMode === "spread" && experts.size ? { experts } : {}),
  };
  return predictionOf(
    evaluateAssignment(model, cluster, assignment, { context, dtype: plan.model.dtypeBytes }),
  );
}

/**
 * The cost model's per-token time for `plan` on `members` as they measure now, at `context` tokens of KV
 * cache (a request's mean context, for its prediction). The stages' nodes must be among the members.
 */
export function predictChain(
  configJson: unknown,
  plan: Plan,
  members: ChainMember[],
  opts: { context: number },
): PlanPrediction {
  const model = compileHfConfig(configJson);
  return predict(model, chainCluster(model, members), plan, Math.max(1, Math.round(opts.context)));
}
