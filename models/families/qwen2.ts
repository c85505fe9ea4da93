// Qwen2 (Qwen2ForCausalLM): Llama's layer with biases on q, k and v (always; none on o), rope theta 1e4
// by default. A sliding window (`use_sliding_window` past `max_window_layers`, or `layer_types`) caps the
// context at the window, within which it is exact.
// Defaults: transformers' Qwen2Config.
import { ConfigReader, type ModelConfig } from "../config.ts";
import type { ModelFamily } from "../family.ts";

export const qwen2: ModelFamily = {
  name: "qwen2",
  modelTypes: ["qwen2"],
  architectures: ["Qwen2ForCausalLM"],
  parseConfig(json: unknown, source: string): ModelConfig {
    const r = new ConfigReader(json, source);
    const attention = r.gqa({ kvHeads: 32 }, { qkvBias: true });
    const ffn = { kind: "mlp" as const, intermediate: r.int("intermediate_size") };
    const config = r.common(
      "qwen2",
      this.architectures,
      { maxPositions: 32768, rmsNormEps: 1e-6, ropeTheta: 10000, tie: false },
      () => ({ attention, ffn }),
    );
    r.capSlidingWindow(config);
    return config;
  },
};
