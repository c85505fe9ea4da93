#!/usr/bin/env bash
# One full check on the GPU machine (device tool), after ../shared/device/pack.sh here and with the
# fixtures' generator copied to .gpu/fixtures/ (scripts/device/prepare.sh does both):
#   source .gpu/on-device.sh; bash scripts/device/h200.sh
# 1. regenerates the Llama fixtures (+ variants) with transformers there (it has torch), 2. checks every
# one through the CLI with f32, f16, q8 and q4 weights, 3. runs the kernel and CLI tests on the H200,
# 4. the decode benchmark next to transformers (GEMV=1: also the GEMV microbenchmark). Logs go to $OUT.
# With BEFORE=DIR (another checkout, e.g. the commit before a change, unpacked there), the decode benchmark
# alternates between DIR's code and this one's on the same checkpoint, so both are measured in one lease.
set -uo pipefail
export XDG_RUNTIME_DIR=/tmp/xdg; mkdir -p -m 700 $XDG_RUNTIME_DIR
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader | tee "$OUT/gpu.txt"
fx=/tmp/fx
export PYTHONUNBUFFERED=1
python3 .gpu/fixtures/make_fixtures.py $fx llama-micro llama3-tiny qwen2-tiny qwen3-tiny 2>&1 | tail -2
python3 scripts/fixtures/make_llama_variants.py .gpu/fixtures $fx 2>&1 | tail -3
echo "== fixtures through the CLI on the H200"
for w in f32 f16 q8 q4; do
  deno run -A scripts/check_fixture.ts $fx/* --weights $w 2>&1 | tee "$OUT/fixtures_$w.txt"
done
deno run -A scripts/check_fixture.ts $fx/qwen* $fx/llama3-tiny --weights f32 --local 3 2>&1 | tee "$OUT/fixtures_local3.txt"
echo "== tests on the H200"
SWACTOR_FIXTURES=$fx deno test -A tests/kernels tests/models tests/cli/generate_test.ts 2>&1 | grep -E "passed|failed|FAIL|skipped" | tee "$OUT/tests.txt"
if [ "${GEMV:-0}" = 1 ]; then
  echo "== GEMV microbenchmark (ours, then torch; the full sweep is scripts/device/sweep.sh)"
  deno run -A scripts/bench/gemv.ts 2>&1 | tee "$OUT/gemv.txt"
  python3 scripts/bench/torch_gemv.py 2>&1 | tee -a "$OUT/gemv.txt"
fi
echo "== decode benchmark"
deno run -A scripts/bench/decode.ts --dir /tmp/llama1b --weights f16,q8,q4 > "$OUT/bench.txt" 2>&1
if [ -n "${BEFORE:-}" ]; then
  # before / after / before / after on the same checkpoint: drift shows as a difference between rounds
  for round in 1 2; do
    (cd "$BEFORE" && deno run -A scripts/bench/decode.ts --dir /tmp/llama1b --weights f16,q4 2>/dev/null | sed 's/^{/{"code":"before",/') >> "$OUT/before_after.txt"
    deno run -A scripts/bench/decode.ts --dir /tmp/llama1b --weights f16,q4 2>/dev/null | sed 's/^{/{"code":"after",/' >> "$OUT/before_after.txt"
  done
fi
python3 scripts/bench/hf_decode.py /tmp/llama1b 2>&1 | grep -E "^\{|Error" >> "$OUT/bench.txt"
python3 scripts/bench/summarize.py "$OUT/bench.txt"
