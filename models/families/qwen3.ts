// Qwen3 dense (Qwen3ForCausalLM): Llama's layer plus an RMSNorm over each head's q and k before RoPE
// (q_norm, k_norm [head_dim]), and head_dim independent of hidden / heads (128 when the config omits it).
// `attention_bias` puts biases on q, k, v and o. A sliding window caps the context (ConfigReader.capSlidingWindow).
// Defaults: transformers' Qwen3Config.
import { type AttentionSpec, ConfigReader, type ModelConfig } from "../config.ts";
import type { ModelFamily } from "../family.ts";

export const qwen3: ModelFamily = {
  name: "qwen3",
  modelTypes: ["qwen3"],
  architectures: ["Qwen3ForCausalLM"],
  parseConfig(json: unknown, source: string): ModelConfig {
    const r = new ConfigReader(json, source);
    const attention = qwen3Attention(r, { kvHeads: 32, headDim: 128 });
    const ffn = { kind: "mlp" as const, intermediate: r.int("intermediate_size") };
    const config = r.common(
      "qwen3",
      this.architectures,
      { maxPositions: 32768, rmsNormEps: 1e-6, ropeTheta: 10000, tie: false },
      () => ({ attention, ffn }),
    );
    r.capSlidingWindow(config);
    return config;
  },
};

/** Qwen3's attention (dense and MoE): q/k RMSNorm per head, `attention_bias` on q, k, v and o. */
export function qwen3Attention(r: ConfigReader, defaults: Parameters<ConfigReader["gqa"]>[0]): AttentionSpec {
  const bias = r.bool("attention_bias", false);
  return r.gqa(defaults, { qkvBias: bias, oBias: bias, qkNorm: true });
}
