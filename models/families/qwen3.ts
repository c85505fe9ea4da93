// Qwen3 dense (Qwen3ForCausalLM): Llama's layer plus an RMSNorm over each head's q and k before RoPE
// (q_norm, k_norm [head_dim]), and head_dim independent of hidden / heads (128 when the config omits it).
// `attention_bias` puts biases on q, k, v and o. Sliding windows are not supported and say so.
// Defaults: transformers' Qwen3Config.
import { ConfigReader, type ModelConfig } from "../config.ts";
import type { ModelFamily } from "../family.ts";

export const qwen3: ModelFamily = {
  name: "qwen3",
  modelTypes: ["qwen3"],
  architectures: ["Qwen3ForCausalLM"],
  parseConfig(json: unknown, source: string): ModelConfig {
    const r = new ConfigReader(json, source);
    r.oneOf("use_sliding_window", [false]);
    const bias = r.bool("attention_bias", false);
    const attention = {
      kind: "gqa" as const,
      ...r.gqa({ kvHeads: 32, headDim: 128 }),
      qkvBias: bias,
      oBias: bias,
      qkNorm: true,
    };
    const ffn = { kind: "mlp" as const, intermediate: r.int("intermediate_size") };
    return r.common(
      "qwen3",
      this.architectures,
      { maxPositions: 40960, rmsNormEps: 1e-6, ropeTheta: 10000, tie: false },
      () => ({ attention, ffn }),
    );
  },
};
