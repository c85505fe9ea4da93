// Mixtral (MixtralForCausalLM): Llama's attention, and a mixture of experts in place of the MLP: a softmax
// router over num_local_experts, the top num_experts_per_tok renormalised to sum 1 (transformers'
// MixtralSparseMoeBlock). Experts are stored per expert (w1 = gate, w3 = up, w2 = down). A sliding window,
// where the config sets one, caps the context: within it attention is exact. Defaults: MixtralConfig.
import { ConfigReader, type ModelConfig, type MoeFfn } from "../config.ts";
import type { ModelFamily } from "../family.ts";

export const mixtral: ModelFamily = {
  name: "mixtral",
  modelTypes: ["mixtral"],
  architectures: ["MixtralForCausalLM"],
  parseConfig(json: unknown, source: string): ModelConfig {
    const r = new ConfigReader(json, source);
    const attention = r.gqa({ kvHeads: 8 });
    const experts = r.int(r.alias(["num_local_experts", "num_experts"]) ?? "num_local_experts", 8);
    const ffn: MoeFfn = {
      kind: "moe",
      routing: { experts, topK: r.int("num_experts_per_tok", 2), scoring: "softmax", normTopK: true },
      intermediate: r.int("intermediate_size"),
      sharedIntermediate: 0,
      names: {
        router: "block_sparse_moe.gate.weight",
        bias: null,
        expert: (e) => {
          const p = `block_sparse_moe.experts.${e}.`;
          return { gate: p + "w1.weight", up: p + "w3.weight", down: p + "w2.weight" };
        },
        shared: null,
      },
    };
    if (ffn.routing.topK > experts) {
      throw r.fail(`num_experts_per_tok (${ffn.routing.topK}) exceeds num_local_experts (${experts})`);
    }
    const config = r.common(
      "mixtral",
      this.architectures,
      { maxPositions: 4096 * 32, rmsNormEps: 1e-5, ropeTheta: 1e6, tie: false },
      () => ({ attention, ffn }),
    );
    r.capAtWindow(config, null); // MixtralConfig's sliding_window defaults to none
    return config;
  },
};
