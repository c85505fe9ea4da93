// The stage backend interface lives with the model runtime that implements it (models/backend.ts); the
// node's stage code sees only this interface, never a model family.
export type {
  ExpertFanout,
  ExpertInput,
  ExpertLoader,
  ExpertService,
  LoopOptions,
  LoopResult,
  ModelFacts,
  ModelRef,
  OpenOptions,
  Sampling,
  StageBackend,
  StageInput,
  StageLoader,
  StageOutput,
  StageResult,
  StageRole,
  StageStats,
} from "../../models/backend.ts";
