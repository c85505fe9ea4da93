// The leader's side of rung 1: from the model's config.json and the live members to a Plan with one stage per
// wanted node. The planner's DP (planner/) splits the layers; a chain asks for exactly `stages` stages (an
// `order` constraint), because the planner alone prefers fewer. With more nodes than layers, the embedding
// and then the head become stages of their own (a chain holds at most layers + 2 stages); any node beyond
// that is idle. With `experts: "spread"` every MoE layer's routed experts are placed over the members
// (the planner's "wide" spread: each layer on at least two nodes, its stage's node included, and every
// member hosting some where there are enough experts), even when they would fit on their stage. Pure.
import {
  clusterFromNodes,
  compileHfConfig,
  type NodeDescriptor,
  PlacementError,
  type Plan,
  planPipeline,
} from "../../planner/mod.ts";

export interface ChainMember {
  id: string;
  /** The descriptor's usable GPU memory estimate (0: unknown, the planner's default is used). */
  gpuMemoryBytes?: number;
}

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
}

/** A Plan over `members` (in chain order: the first one gets stage 0), or PlacementError saying why not. */
export function planChain(configJson: unknown, members: ChainMember[], opts: PlanChainOptions = {}): Plan {
  const model = compileHfConfig(configJson);
  const L = model.layers.length;
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
  const extra = Math.min(Math.max(0, want - L), 2);
  const layerStages = Math.min(want, L);
  // Stage order: [embedding node], the layer stages, [head node]; then idle nodes.
  const embedNode = extra >= 1 ? members[0] : undefined;
  const layered = members.slice(extra >= 1 ? 1 : 0, (extra >= 1 ? 1 : 0) + layerStages);
  const headNode = extra >= 2 ? members[1 + layerStages] : undefined;
  const descriptors: NodeDescriptor[] = members.map((m) => ({
    id: m.id,
    ...(m.gpuMemoryBytes ? { memBytes: m.gpuMemoryBytes } : {}),
    reserveBytes: 64 * 2 ** 20,
  }));
  const cluster = clusterFromNodes(descriptors, { constraints: { order: layered.map((m) => m.id) } });
  const plan = planPipeline(model, cluster, {
    context: opts.context ?? 4096,
    ...(experts === "spread" ? { experts: "spread", expertSpread: "wide" } : {}),
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
  return { ...plan, stages, nodes };
}
