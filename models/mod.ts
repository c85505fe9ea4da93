// models/: everything about running a model. Checkpoints (config + safetensors, single or sharded, read by
// byte range), the model families (models/families/: config.json -> ModelConfig), the tensor table,
// dtype conversion, tokenizers, the built-in demo model; the forward pass (model.ts, blocks/) and the one
// decode engine (engine.ts) that a single node and every pipeline stage run. models/ never imports node/.
export { CheckpointError, RequestError } from "./errors.ts";
export {
  type DType,
  dtypeSize,
  isDType,
  numel,
  readSafetensorsHeader,
  readTensorBytes,
  type TensorData,
  type TensorInfo,
  writeSafetensors,
} from "./safetensors.ts";
export { bf16ToF32, f16ToF32, f32ToBf16, f32ToF16, toF16Bits, toF32 } from "./dtype.ts";
export {
  type AttentionSpec,
  ConfigReader,
  type FfnSpec,
  type LayerSpec,
  type ModelConfig,
  readJsonFile,
} from "./config.ts";
export {
  familyOf,
  type ModelFamily,
  parseModelConfig,
  readModelConfig,
  supportedModelTypes,
} from "./family.ts";
export { Checkpoint, openShards, type Shards } from "./checkpoint.ts";
export { isNormTensor, type ModelPart, tensorShapes } from "./tensors.ts";
export { defaultWeights, type LoadOptions, Model, Sequence, type WeightsOption } from "./model.ts";
export {
  checkTokenIds,
  Engine,
  generate,
  type GenerateOptions,
  type GenerateResult,
  loadEngine,
  loadExpertHost,
  loadStage,
  NonFiniteLogitsError,
  weightsOption,
  wholeModel,
} from "./engine.ts";
export type * from "./backend.ts";
export { ExpertHost } from "./experts.ts";
export {
  LLAMA3_BOS_TOKEN_ID,
  LLAMA3_VOCAB_SIZE,
  loadLlama3Tokenizer,
  loadTokenizer,
  StreamDecoder,
  type TextTokenizer,
} from "./tokenizer.ts";
export {
  defaultCacheDir,
  DEMO_CONFIG,
  DEMO_CONFIG_JSON,
  DEMO_VERSION,
  type DemoOptions,
  demoTensor,
  ensureDemoModel,
} from "./demo.ts";
