// Llama (LlamaForCausalLM): GQA attention with RoPE (optionally llama3-scaled), a gated SiLU MLP,
// RMSNorm before each. `attention_bias` puts biases on q, k, v and o. Defaults: transformers' LlamaConfig.
import { ConfigReader, type ModelConfig } from "../config.ts";
import type { ModelFamily } from "../family.ts";

export const llama: ModelFamily = {
  name: "llama",
  modelTypes: ["llama"],
  architectures: ["LlamaForCausalLM"],
  parseConfig(json: unknown, source: string): ModelConfig {
    const r = new ConfigReader(json, source);
    const bias = r.bool("attention_bias", false);
    if (r.bool("mlp_bias", false)) throw r.fail("unsupported mlp_bias=true: supported: false");
    const attention = r.gqa({}, { qkvBias: bias, oBias: bias });
    const ffn = { kind: "mlp" as const, intermediate: r.int("intermediate_size") };
    return r.common(
      "llama",
      this.architectures,
      { maxPositions: 2048, rmsNormEps: 1e-6, ropeTheta: 10000, tie: false },
      () => ({ attention, ffn }),
    );
  },
};
