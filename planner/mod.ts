// The planner: from a model graph and a cluster to a Plan (what runs where, and its predicted latency).
// Pure: no network, no GPU. See docs/PLANNER.md (design, language) and docs/PLAN_FORMAT.md (the Plan JSON).
export { assemblePlan, type PlanOptions, planPipeline, predictionOf } from "./plan_pipeline.ts";
export { PlacementError } from "./errors.ts";
export { compileHfConfig, type CompileOptions } from "./hf_config.ts";
export {
  type Cluster,
  clusterFromNodes,
  type ClusterFromNodesOptions,
  type Constraints,
  type LinkSpec,
  NODE_DEFAULTS,
  type NodeDescriptor,
  type NodeSpec,
} from "./cluster.ts";
export { LangError, parseCluster, parseDocument, parseModel, printCluster, printModel } from "./lang/mod.ts";
export { activeParams, type DTypeBytes, type ModelGraph, totalParams } from "./model_graph.ts";
export { type Plan, PLAN_FORMAT_VERSION, type PlanPrediction, type PlanStage } from "./plan.ts";
export { type Assignment, evaluateAssignment } from "./evaluate.ts";
export { formatPlanTable } from "./plan_table.ts";
export { type ExpertSpread, routingShares } from "./expert_placement.ts";
export { formatIds, fromRanges, type IdRange, toRanges } from "./expert_ranges.ts";
export {
  gbpsAt,
  LAYER_DISPATCHES,
  liveCluster,
  type LiveClusterOptions,
  type LiveDescriptor,
  type LiveLink,
  liveLinks,
  type LiveMember,
  liveNode,
} from "./live.ts";
