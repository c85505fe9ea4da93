// DeepSeek-V3 and Kimi K2 (DeepseekV3ForCausalLM; model_type deepseek_v3 or kimi_k2), as transformers'
// modeling_deepseek_v3.py computes them:
// - attention is multi-head latent attention (MLA): q through q_a_proj -> q_a_layernorm -> q_b_proj (or
//   q_proj when q_lora_rank is null), K and V from a latent of kv_lora_rank plus a shared roped key of
//   qk_rope_head_dim; RoPE rotates interleaved pairs unless rope_interleave is false; with yarn scaling the
//   softmax scale is multiplied by mscale(factor, mscale_all_dim)^2.
// - layers from first_k_dense_replace on are MoE (transformers ignores moe_layer_freq, and so do we: every
//   released checkpoint has 1), the others a dense MLP of intermediate_size.
// - routing: sigmoid scores; selection adds e_score_correction_bias; experts in n_group groups, a group's
//   score the sum of its best two, the best topk_group groups kept; the chosen experts' unbiased scores,
//   renormalised if norm_topk_prob, times routed_scaling_factor; plus n_shared_experts always-on experts.
// - num_nextn_predict_layers multi-token-prediction modules follow the layers (models/mtp.ts; transformers
//   ignores them; `--draft mtp` drafts with the first).
// Only topk_method "noaux_tc" and scoring_func "sigmoid" exist in transformers; others exit 2.
// Defaults: DeepseekV3Config.
import { ConfigReader, type DenseMlp, type MlaAttention, type ModelConfig, type MoeFfn } from "../config.ts";
import type { ModelFamily } from "../family.ts";
import { mlaSoftmaxScale } from "../../kernels/mod.ts";

export const deepseekV3: ModelFamily = {
  name: "deepseek_v3",
  modelTypes: ["deepseek_v3", "kimi_k2"],
  architectures: ["DeepseekV3ForCausalLM"],
  parseConfig(json: unknown, source: string): ModelConfig {
    const r = new ConfigReader(json, source);
    r.oneOf("topk_method", ["noaux_tc"]);
    r.oneOf("scoring_func", ["sigmoid"]);
    r.oneOf("attention_bias", [false]);
    const qkNope = r.int("qk_nope_head_dim", 128);
    const qkRope = r.int("qk_rope_head_dim", 64);
    if (qkRope % 2 !== 0) throw r.fail(`qk_rope_head_dim must be even for RoPE, got ${qkRope}`);
    const attention: MlaAttention = {
      kind: "mla",
      heads: r.int("num_attention_heads", 128),
      qLoraRank: r.c.q_lora_rank === null ? null : r.int("q_lora_rank", 1536),
      kvLoraRank: r.int("kv_lora_rank", 512),
      qkNopeHeadDim: qkNope,
      qkRopeHeadDim: qkRope,
      vHeadDim: r.int("v_head_dim", 128),
      interleaved: r.bool("rope_interleave", true),
      scale: mlaSoftmaxScale(qkNope + qkRope, r.ropeScaling()),
    };
    const experts = r.count(r.alias(["n_routed_experts", "num_local_experts"]) ?? "n_routed_experts", 256);
    const groups = r.int("n_group", 8);
    const topKGroups = r.int("topk_group", 4);
    const firstDense = r.count("first_k_dense_replace", 3);
    const intermediate = r.int("moe_intermediate_size", 2048);
    const dense: DenseMlp = { kind: "mlp", intermediate: r.int("intermediate_size", 18432) };
    let moe: MoeFfn | null = null;
    if (experts > 0) {
      if (experts % groups !== 0 || experts / groups < 2) {
        throw r.fail(
          `n_group (${groups}) must divide n_routed_experts (${experts}) into groups of 2 or more`,
        );
      }
      if (topKGroups > groups) throw r.fail(`topk_group (${topKGroups}) exceeds n_group (${groups})`);
      const topK = r.int("num_experts_per_tok", 8);
      if (topK > topKGroups * (experts / groups)) {
        throw r.fail(
          `num_experts_per_tok (${topK}) exceeds the experts of topk_group (${topKGroups}) groups of ${
            experts / groups
          }`,
        );
      }
      const shared = r.count("n_shared_experts", 1);
      moe = {
        kind: "moe",
        routing: {
          experts,
          topK,
          scoring: "sigmoid",
          normTopK: r.bool("norm_topk_prob", true),
          groups,
          topKGroups,
          scale: r.finite("routed_scaling_factor", 2.5),
        },
        intermediate,
        sharedIntermediate: shared * intermediate,
        names: {
          router: "mlp.gate.weight",
          bias: "mlp.gate.e_score_correction_bias",
          expert: (e) => {
            const p = `mlp.experts.${e}.`;
            return { gate: p + "gate_proj.weight", up: p + "up_proj.weight", down: p + "down_proj.weight" };
          },
          shared: shared > 0 ? "mlp.shared_experts." : null,
        },
      };
    }
    return r.common(
      "deepseek_v3",
      this.architectures,
      { maxPositions: 4096, rmsNormEps: 1e-6, ropeTheta: 10000, tie: false },
      (i) => ({ attention, ffn: moe && i >= firstDense ? moe : dense }),
      // The MTP modules' decoder layers follow the last layer and are built as it would be (models/mtp.ts).
      { mtpLayers: r.count("num_nextn_predict_layers", 0) },
    );
  },
};
