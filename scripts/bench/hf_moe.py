#!/usr/bin/env python3
"""A random-weight MoE model at a real model's widths, made by transformers on the GPU (fast), and
transformers' own decode speed on it: the yardstick for scripts/bench/moe.ts (and decode.ts) on MoE shapes.
  python3 scripts/bench/hf_moe.py SHAPE LAYERS OUT_DIR [--no-bench]   writes a checkpoint, then benchmarks it
  python3 scripts/bench/hf_moe.py SHAPE LAYERS --random                  random init on the GPU, no checkpoint
With --random nothing is written (the full Qwen3-30B-A3B shape is 61 GB in bf16, more than the GPU machine's
disk): the model is built from the config directly on the GPU in bf16 with transformers' own init.
SHAPE: qwen3-30b-a3b (48 layers, 128 experts top-8, hidden 2048, moe_intermediate 768) or deepseek-v2-lite
(a deepseek_v3 config with DeepSeek-V2-Lite's dimensions: 27 layers, the first dense, 64 experts top-6 + 2
shared, hidden 2048, kv_lora_rank 512, no q low-rank). LAYERS cuts the depth (same widths), so several
depths give the per-layer cost; prints one JSON line per cache kind.
"""
import json, os, sys, time
import torch
from transformers import AutoConfig, AutoModelForCausalLM

SHAPES = {
    "qwen3-30b-a3b": {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "vocab_size": 151936,
                      "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768,
                      "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128,
                      "num_experts_per_tok": 8, "norm_topk_prob": True, "decoder_sparse_step": 1,
                      "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
                      "tie_word_embeddings": False, "torch_dtype": "bfloat16", "bos_token_id": 151643,
                      "eos_token_id": 151645, "hidden_act": "silu"},
    "deepseek-v2-lite": {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "vocab_size": 102400,
                         "hidden_size": 2048, "intermediate_size": 10944, "moe_intermediate_size": 1408,
                         "num_attention_heads": 16, "num_key_value_heads": 16, "kv_lora_rank": 512, "q_lora_rank": None,
                         "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128, "n_routed_experts": 64,
                         "num_experts_per_tok": 6, "n_shared_experts": 2, "n_group": 1, "topk_group": 1,
                         "first_k_dense_replace": 1, "norm_topk_prob": False, "routed_scaling_factor": 1.0,
                         "topk_method": "noaux_tc", "scoring_func": "sigmoid", "max_position_embeddings": 163840,
                         "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False,
                         "torch_dtype": "bfloat16", "bos_token_id": 100000, "eos_token_id": 100001, "hidden_act": "silu"},
}

shape, layers, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
cfg = dict(SHAPES[shape], num_hidden_layers=layers)
random = out == "--random"
if random:
    t = time.perf_counter()
    config = AutoConfig.for_model(cfg["model_type"], **{k: v for k, v in cfg.items() if k != "model_type"})
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model = model.eval()
    torch.cuda.synchronize()
    print(json.dumps({"bench": "hf-moe-made", "shape": shape, "layers": layers, "random": True,
                      "s": round(time.perf_counter() - t, 1)}))
else:
    os.makedirs(out, exist_ok=True)
if not random and not os.path.exists(os.path.join(out, "model.safetensors")):
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    config = AutoConfig.from_pretrained(out)
    t = time.perf_counter()
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(out, max_shard_size="200GB")
    with open(os.path.join(out, "config.json"), "w") as f:  # the hub-style config, as written above
        json.dump(cfg, f, indent=2)
    print(json.dumps({"bench": "hf-moe-made", "shape": shape, "layers": layers, "s": round(time.perf_counter() - t, 1)}))
    del model
    torch.cuda.empty_cache()
if "--no-bench" in sys.argv:
    sys.exit(0)
if not random:
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.bfloat16).cuda().eval()
P, N = 32, 64
ids = torch.tensor([[(i * 7919 + 13) % cfg["vocab_size"] for i in range(P)]], device="cuda")
for cache in os.environ.get("HF_CACHES", "static,dynamic").split(","):
    kw = dict(max_new_tokens=N, min_new_tokens=N, do_sample=False)
    if cache == "static":
        kw["cache_implementation"] = "static"
    try:
        model.generate(ids, **kw)
        best = 0
        for _ in range(2):
            torch.cuda.synchronize(); t = time.perf_counter()
            model.generate(ids, **kw)
            torch.cuda.synchronize(); best = max(best, N / (time.perf_counter() - t))
        print(json.dumps({"bench": "hf-decode", "shape": shape, "layers": layers, "cache": cache, "tok_s": round(best, 1),
                          "random_init": random}))
    except Exception as e:  # a cache kind this model does not support
        print(json.dumps({"bench": "hf-decode", "shape": shape, "layers": layers, "cache": cache, "error": str(e)[:200]}))
