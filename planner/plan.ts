// The Plan: what runs where, and what the cost model predicts. Serialized as JSON for the pipeline
// (schema and versioning: docs/PLAN_FORMAT.md). Bump PLAN_FORMAT_VERSION on any incompatible change.

export const PLAN_FORMAT_VERSION = 1;

export interface PlanStage {
  index: number;
  node: string;
  /** Layers [start, end). */
  layers: [number, number];
  /** This stage holds the token embedding (it is the first stage). */
  embeds: boolean;
  /** This stage holds the final norm and LM head and samples (it is the last stage). */
  head: boolean;
  /** Per MoE layer of this stage (key: layer index as a string): the routed experts on this stage's node. */
  experts?: Record<string, number[]>;
}

export interface PlanExpertHost {
  node: string;
  /** Per MoE layer (key: layer index): the routed experts this node hosts for a stage on another node. */
  experts: Record<string, number[]>;
}

export interface PlanNode {
  id: string;
  role: "stage" | "experts" | "idle";
  memory: {
    capacity: number;
    reserve: number;
    weights: number;
    kv: number;
    used: number;
    free: number;
  };
  /** Expected routed experts run on this node per token. */
  expertLoad: number;
}

export interface PlanPrediction {
  tokenMs: number;
  tokS: number;
  stages: {
    index: number;
    node: string;
    computeMs: number;
    overheadMs: number;
    hopMs: number;
    fanoutMs: number;
  }[];
  /** The largest term of the per-token latency: "compute", "overhead", "network" or "fanout". */
  limitedBy: "compute" | "overhead" | "network" | "fanout";
  /**
   * Expected fan-out per MoE layer whose experts are (partly) on other nodes (key: layer index): the
   * slowest destination's wire + compute, in expectation over the router's picks. Absent in older Plans.
   */
  layerFanoutMs?: Record<string, number>;
}

export interface Plan {
  version: number;
  model: {
    name: string;
    family: string;
    layers: number;
    hidden: number;
    vocab: number;
    dtypeBytes: { dense: number; experts: number; embed: number; kv: number; activation: number };
  };
  cluster: string;
  context: number;
  objective: "latency";
  /** "local": every stage holds its layers' experts; "spread": experts placed on other nodes too. */
  expertMode: "local" | "spread";
  stages: PlanStage[];
  expertHosts: PlanExpertHost[];
  nodes: PlanNode[];
  predicted: PlanPrediction;
  search: { exact: boolean; evaluated: number; ms: number };
}
