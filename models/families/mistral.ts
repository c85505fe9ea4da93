// Mistral (MistralForCausalLM): Llama's layer without biases, 8 KV heads and head_dim from the config
// (else hidden / heads) by default, and sliding-window attention over `sliding_window` keys (4096 when the
// key is absent, none when it is null). As for Mixtral, the window caps the context: within it attention is
// exact (transformers' mask keeps keys less than a window back). Defaults: transformers' MistralConfig.
import { ConfigReader, type ModelConfig } from "../config.ts";
import type { ModelFamily } from "../family.ts";

export const mistral: ModelFamily = {
  name: "mistral",
  modelTypes: ["mistral"],
  architectures: ["MistralForCausalLM"],
  parseConfig(json: unknown, source: string): ModelConfig {
    const r = new ConfigReader(json, source);
    const attention = r.gqa({ kvHeads: 8 });
    const ffn = { kind: "mlp" as const, intermediate: r.int("intermediate_size", 14336) };
    const config = r.common(
      "mistral",
      this.architectures,
      { maxPositions: 4096 * 32, rmsNormEps: 1e-6, ropeTheta: 10000, tie: false },
      () => ({ attention, ffn }),
    );
    r.capAtWindow(config, 4096);
    return config;
  },
};
