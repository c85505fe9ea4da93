// models/: everything about a model directory on disk. Checkpoints (config + safetensors, single or
// sharded, read by byte range), dtype conversion, tokenizers and the built-in demo model. The forward
// pass (models/llama.ts) and the GPU kernels build on this; nothing here touches the GPU.
export { CheckpointError } from "./errors.ts";
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
export { type Llama3RopeScaling, type LlamaConfig, parseLlamaConfig, readConfig } from "./config.ts";
export { Checkpoint, openShards, type Shards } from "./checkpoint.ts";
export { isNormTensor, llamaTensorShapes } from "./llama_tensors.ts";
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
