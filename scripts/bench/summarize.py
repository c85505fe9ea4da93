#!/usr/bin/env python3
"""Short tables from the JSON lines of decode.ts / moe.ts / engine_paths.ts / hf_decode.py / gemv.ts /
torch_gemv.py (device runs print this last, so the reply carries it): decode tok/s and GPU time by kernel,
k-step and context ratios, MoE decode with the host's side of a step, engine paths; per GEMV case the team
kernel, the subgroup default, the best tuning and torch's GB/s."""
import json, sys

lines = []
for path in sys.argv[1:]:
    for line in open(path):
        if line.startswith("{"):
            try:
                lines.append(json.loads(line))
            except ValueError:
                pass
def setting(r):
    """The gpu.tuning a line ran under and its --rounds round, where they are there."""
    t = f"  tuning {json.dumps(r['tuning'])}" if r.get("tuning") else ""
    return t + (f"  round {r['round']}" if "round" in r else "")


for r in lines:
    if r.get("bench") == "swactor-decode":
        k = r.get("gpu_ms_by_kernel", {})
        print(f"decode {r['weights']:4} {r.get('gemv','?'):20} {r['decode_tok_s']:7.1f} tok/s  wall {r.get('wall_ms_per_token',0):.3f} ms"
              f"  gpu {r['gpu_ms_per_token']:.3f}  cpu {r['cpu_encode_ms_per_token']:.3f}  runs {r['runs']}"
              f"  err {[v for kk, v in r.items() if kk.startswith('logits_rel')]}")
        print("   by kernel: " + ", ".join(f"{a} {b:.3f}" for a, b in k.items()))
    elif r.get("bench") == "swactor-k-step":
        print(f"k-step {r['weights']:4} one {r['decode_step_ms']:.3f} ms  k {r['k_step_ms']}  ratio {r['ratio_vs_decode']}"
              + setting(r))
    elif r.get("bench") == "swactor-context":
        combine = f"  combine {r['attention_combine_ms']:.3f}" if "attention_combine_ms" in r else ""
        print(f"context {r['weights']:4} {r['context']:6}  gpu {r['gpu_ms_per_token']:.3f} ms  attention {r['attention_ms']:.3f}"
              + combine + setting(r))
    elif r.get("bench") == "swactor-decode-ab":
        print(f"decode-ab {r['weights']:4} " + (f"{r['decode_tok_s']:7.1f} tok/s  gpu {r['gpu_ms_per_token']:.3f} ms"
              if 'decode_tok_s' in r else r.get('error', '?')) + setting(r))
    elif r.get("bench") == "swactor-moe-decode":
        print(f"moe {r['shape']} {r['weights']:4} {r['decode_tok_s']:7.1f} tok/s  runs {r['runs']}  gpu {r['gpu_ms_per_token']:.3f}"
              f"  cpu encode {r['cpu_encode_ms_per_token']:.3f} {r['cpu_ms_per_token']}  dispatches {r['dispatches_per_token']}"
              + (f"  tunings {r['tunings_gpu_ms']}" if 'tunings_gpu_ms' in r else ""))
    elif r.get("bench") == "engine-paths":
        print(f"path {r['path']:28} {r['tok_s']:7.1f} tok/s  runs {r['runs']}  x{r['ratio_to_single_node']}")
    elif r.get("bench", "").startswith("hf") or "transformers" in json.dumps(r)[:80]:
        print("hf", json.dumps(r)[:300])
torch = {(r["N"], r["K"]): r["gb_s"] for r in lines if r.get("bench") == "torch-gemv"}
for r in lines:
    if r.get("bench") != "gemv":
        continue
    g = r["gb_s"]
    top = sorted(((v, k) for k, v in g.items()), reverse=True)[:3]
    t = torch.get((r["N"], r["K"]))
    ratio = f"{r['best_gb_s'] / t:.2f}" if t and r["weights"] == "f16" else "-"
    print(f"gemv {r['case']:9} {r['weights']:3} team {g.get('team', 0):5} sg_def {g.get('sg_default', 0):5}  top "
          + ", ".join(f"{k} {v}" for v, k in top) + f"  torch {t}  best/torch {ratio}")
