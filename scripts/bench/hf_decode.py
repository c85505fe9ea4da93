#!/usr/bin/env python3
"""The yardstick for scripts/bench/decode.ts: transformers' decode tok/s on the same checkpoint and GPU
(bf16, static cache, greedy, batch 1), and the device copy bandwidth. Prints one JSON line each.
  python3 scripts/bench/hf_decode.py DIR [--prompt 32] [--new 128]
"""
import json, sys, time
import torch
from transformers import AutoModelForCausalLM

d = sys.argv[1]
P = int(sys.argv[sys.argv.index("--prompt") + 1]) if "--prompt" in sys.argv else 32
N = int(sys.argv[sys.argv.index("--new") + 1]) if "--new" in sys.argv else 128
x = torch.empty(1 << 28, dtype=torch.float32, device="cuda")
y = torch.empty_like(x)
for _ in range(3): y.copy_(x)
torch.cuda.synchronize(); t = time.perf_counter()
for _ in range(20): y.copy_(x)
torch.cuda.synchronize(); dt = (time.perf_counter() - t) / 20
print(json.dumps({"bench": "copy", "gb_s": round(2 * x.numel() * 4 / dt / 1e9, 1)}))
del x, y
model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16).cuda().eval()
ids = torch.tensor([[(i * 7919 + 13) % model.config.vocab_size for i in range(P)]], device="cuda")
for cache in ["static", "dynamic"]:
    kw = dict(max_new_tokens=N, min_new_tokens=N, do_sample=False)
    if cache == "static": kw["cache_implementation"] = "static"
    model.generate(ids, **kw)  # warm-up (and compile for static)
    best = 0
    for _ in range(3):
        torch.cuda.synchronize(); t = time.perf_counter()
        model.generate(ids, **kw)
        torch.cuda.synchronize(); best = max(best, N / (time.perf_counter() - t))
    print(json.dumps({"bench": "hf-decode", "cache": cache, "dtype": "bf16", "tok_s": round(best, 1)}))
