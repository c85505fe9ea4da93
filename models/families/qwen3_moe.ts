// Qwen3-MoE (Qwen3MoeForCausalLM): Qwen3's attention (q/k norms; head_dim from the config, else hidden /
// heads: Qwen3MoeConfig has no default of its own), and on every `decoder_sparse_step`-th layer not in
// `mlp_only_layers` a mixture of num_experts experts of moe_intermediate_size: softmax router, top
// num_experts_per_tok, renormalised only if norm_topk_prob. Other layers run a dense MLP of
// intermediate_size. Defaults: Qwen3MoeConfig.
import { ConfigReader, type DenseMlp, type ModelConfig, type MoeFfn } from "../config.ts";
import type { ModelFamily } from "../family.ts";
import { qwen3Attention } from "./qwen3.ts";

export const qwen3Moe: ModelFamily = {
  name: "qwen3_moe",
  modelTypes: ["qwen3_moe"],
  architectures: ["Qwen3MoeForCausalLM"],
  parseConfig(json: unknown, source: string): ModelConfig {
    const r = new ConfigReader(json, source);
    const attention = qwen3Attention(r, { kvHeads: 4 });
    const experts = r.count(r.alias(["num_experts", "num_local_experts"]) ?? "num_experts", 128);
    const step = r.int("decoder_sparse_step", 1);
    const mlpOnly = new Set(r.intList("mlp_only_layers", []));
    const dense: DenseMlp = { kind: "mlp", intermediate: r.int("intermediate_size", 6144) };
    const moe: MoeFfn | null = experts === 0 ? null : {
      kind: "moe",
      routing: {
        experts,
        topK: r.int("num_experts_per_tok", 8),
        scoring: "softmax",
        normTopK: r.bool("norm_topk_prob", false),
      },
      intermediate: r.int("moe_intermediate_size", 768),
      sharedIntermediate: 0,
      names: {
        router: "mlp.gate.weight",
        bias: null,
        expert: (e) => {
          const p = `mlp.experts.${e}.`;
          return { gate: p + "gate_proj.weight", up: p + "up_proj.weight", down: p + "down_proj.weight" };
        },
        shared: null,
      },
    };
    if (moe && moe.routing.topK > experts) {
      throw r.fail(`num_experts_per_tok (${moe.routing.topK}) exceeds num_experts (${experts})`);
    }
    const config = r.common(
      "qwen3_moe",
      this.architectures,
      { maxPositions: 32768, rmsNormEps: 1e-6, ropeTheta: 10000, tie: false },
      (i) => ({ attention, ffn: moe && !mlpOnly.has(i) && (i + 1) % step === 0 ? moe : dense }),
    );
    r.capSlidingWindow(config);
    return config;
  },
};
