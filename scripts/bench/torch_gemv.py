#!/usr/bin/env python3
"""torch's f16 GEMV (y = W x, batch 1) bandwidth at the shapes of scripts/bench/gemv.ts, rotating over
weight copies as that script does. One JSON line per shape."""
import json, torch
for N, K in [(2048, 2048), (3072, 2048), (2048, 8192), (16384, 2048), (8192, 2048), (128256, 2048)]:
    nbytes = N * K * 2
    copies = max(1, min(8, -(-256_000_000 // nbytes)))
    ws = [torch.randn(N, K, device="cuda", dtype=torch.float16) for _ in range(copies)]
    x = torch.randn(K, device="cuda", dtype=torch.float16)
    for w in ws: w @ x
    reps = max(2, round(2000 / copies))
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(reps):
        for w in ws: w @ x
    e.record(); torch.cuda.synchronize()
    ms = s.elapsed_time(e) / (reps * copies)
    print(json.dumps({"bench": "torch-gemv", "N": N, "K": K, "gb_s": round(nbytes / ms / 1e6)}))
