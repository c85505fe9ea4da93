// Pipeline-parallel generation (rung 1): stage backends, the chain's actors, the client, the Assignment
// board, and the leader's chain planning and publication. See docs/PIPELINE.md.
export type {
  ModelFacts,
  ModelRef,
  Sampling,
  StageBackend,
  StageInput,
  StageLoader,
  StageOutput,
  StageResult,
  StageRole,
  StageStats,
} from "./backend.ts";
export { type Assignment, AssignmentBoard } from "./assignment.ts";
export {
  type Chain,
  type GenerateOutcome,
  PipelineClient,
  PipelineError,
  type RecoveryRecord,
  type RequestOptions,
  requestWire,
  type SpeculateOutcome,
  type TokenEvent,
} from "./client.ts";
export { type SpeculateOptions, Speculation, type SpeculationSource, type Trip } from "./speculative.ts";
export { EXPERT_PREFIX, expertName, expertSet } from "./expert_names.ts";
export { FakeBackend, fakeReference } from "./fake_backend.ts";
export { type HopTrace, type WireDtype } from "./messages.ts";
export { type LocalStage, PipelineNode, type PipelineOptions, type StageReport } from "./pipeline.ts";
export {
  chainCluster,
  type ChainMember,
  chainRoles,
  planChain,
  predictChain,
  servedDtype,
} from "./plan_chain.ts";
export { liveMembers, type PublishOptions, publishPlan } from "./publish.ts";
export { ChainRecovery, effectiveLeader, type Replan, withSpares } from "./recovery.ts";
export { rolesOf, splitLayers } from "./roles.ts";
export { StageActor, stageName } from "./stage_actor.ts";
export {
  meanTimings,
  type PrefillTimings,
  prefillTimings,
  type TokenTimings,
  tokenTimings,
} from "./timings.ts";
export { chromeTrace, recoveryNotes, type TraceEvent, type TraceStep } from "./trace_events.ts";
export {
  expertHostName,
  expertPlacement,
  type ExpertReport,
  expertReport,
  heldBy,
  remoteLayers,
  spreadExperts,
} from "./experts.ts";
