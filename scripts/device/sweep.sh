#!/usr/bin/env bash
# Kernel tuning run on the GPU machine (device tool), after scripts/device/prepare.sh here:
#   source .gpu/on-device.sh; bash scripts/device/sweep.sh
# 1. the kernel tests on the H200 (the subgroup GEMV at 32 lanes), 2. the GEMV sweep (every subgroup
# tuning at the decode step's shapes, f16 / q8 / q4) next to torch, 3. the decode benchmark with the
# subgroup GEMV and with the team GEMV (--gemv team), next to transformers. Full logs go to $OUT;
# the summary at the end is what the reply shows.
set -uo pipefail
export XDG_RUNTIME_DIR=/tmp/xdg; mkdir -p -m 700 $XDG_RUNTIME_DIR
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
echo "== kernel tests on the H200"
deno test -A tests/kernels > "$OUT/tests.txt" 2>&1; grep -E "passed|failed|FAIL|skipped|rror" "$OUT/tests.txt" | head -20
echo "== decode benchmark"
deno run -A scripts/bench/decode.ts --dir /tmp/llama1b --weights f16,q8,q4 2>&1 | tee "$OUT/bench.txt" | grep -v '^{' | tail -3
deno run -A scripts/bench/decode.ts --dir /tmp/llama1b --weights f16 --gemv team 2>&1 | grep '^{' >> "$OUT/bench.txt"
deno run -A scripts/bench/decode.ts --dir /tmp/llama1b --weights f16 --batch 32 2>&1 | grep '^{' >> "$OUT/bench.txt"
python3 scripts/bench/hf_decode.py /tmp/llama1b 2>&1 | grep -E "^\{|Error" >> "$OUT/bench.txt"
echo "== GEMV sweep"
deno run -A scripts/bench/gemv.ts --sweep > "$OUT/gemv.txt" 2>&1; grep -v '^{' "$OUT/gemv.txt" | tail -5
python3 scripts/bench/torch_gemv.py >> "$OUT/gemv.txt" 2>&1
python3 scripts/bench/summarize.py "$OUT/bench.txt" "$OUT/gemv.txt"
