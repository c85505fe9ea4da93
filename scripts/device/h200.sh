#!/usr/bin/env bash
# The full check on the GPU machine (device tool), after scripts/device/prepare.sh here (packs deno,
# node_modules and the Vulkan loader into .gpu/ and copies the fixtures' generator to .gpu/fixtures/):
#   source .gpu/on-device.sh; bash scripts/device/h200.sh [PART ...]
# PARTs (default: all, in this order; each logs to $OUT/PART.txt and is cut off after its time limit):
#   fixtures  regenerate the fixtures with transformers there (shared Llamas + Qwens, the Llama, family and
#             long-prompt variants; tests/fixtures' MoE ones are checked as they are), check every one
#             through the CLI with f32, f16, q8 and q4 weights (FIXTURE_WEIGHTS="q8 q4": only those)
#   chain     a few of them through --local 3 (three node processes on the one GPU)
#   tests     the kernel and engine tests on the H200 (its subgroups of 32, shader-f16)
#   decode    Llama-3.2-1B shape, random weights: decode tok/s f16 / q8 / q4, the k-token step against the
#             one-token step, decode at 128 / 2048 / 8192 of context (A/B: without multi-token GEMV and
#             flash-decoding splits), q8 / q4 k-steps with and without the int8 direct multi-token
#             GEMV and its copies made by the kernels before (and gate/up's from o_proj), then transformers
#             on the same checkpoint
#   prefill   time to first token of 512- and 2048-token prompts (f16, q4; GEMM math f32, f16 and the default: int8 for q4), the GEMM
#             microbenchmark at M = 512 against the FP32 FMA ceiling (default tiles)
#   gemm      (not in the default list) the GEMM tile sweep at M = 512 (f16, q4: every tile flag and thread
#             tile, a `best` line per shape), the large tile with parts of its k loop left out
#             (gemm_parts.ts), then the prefill with the tiles before and early submit A/B'd
#   moe       Qwen3-30B-A3B and DeepSeek-V2-Lite shapes at full depth (random weights made on the GPU), f16
#             and q4, then transformers on the same shapes
#   targets   (not in the default list) just the open speed targets' figures, in three decode processes, two
#             MoE ones and one prefill one, judged by scripts/bench/targets.ts (a row a target: met / missed)
#   load      (not in the default list) how fast weights reach the GPU: scripts/bench/load.ts (Llama-1B, q4 / f16,
#             read-ahead off and on, from the page cache, then from the disk), then one-shot generate processes
#             (oneshot.ts: load_ms, first token, tok/s)
# With BEFORE=DIR (another checkout), `decode` also alternates DIR's code and this one's on one checkpoint.
set -uo pipefail
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp/xdg}; mkdir -p -m 700 "$XDG_RUNTIME_DIR"
export PYTHONUNBUFFERED=1
export OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
parts=("$@"); [ ${#parts[@]} -eq 0 ] && parts=(fixtures chain tests decode prefill moe)
fx=/tmp/fx
t0=$(date +%s)
log() { echo "[$(($(date +%s) - t0)) s] $*"; }
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader | tee "$OUT/gpu.txt"

make_fixtures() {
  [ -d $fx/llama-micro ] && return
  python3 .gpu/fixtures/make_fixtures.py $fx llama-micro llama3-tiny qwen2-tiny qwen3-tiny 2>&1 | tail -1
  python3 scripts/fixtures/make_llama_variants.py .gpu/fixtures $fx 2>&1 | tail -1
  python3 scripts/fixtures/make_family_variants.py .gpu/fixtures $fx 2>&1 | tail -1
  python3 scripts/fixtures/make_long_prompts.py .gpu/fixtures $fx 2>&1 | grep -v Warning | tail -1
  # the MoE fixtures copied into tests/ (made by ../shared's generator) are checked as they are
  for d in tests/fixtures/*/; do [ -f "$d/config.json" ] && [ ! -e "$fx/$(basename "$d")" ] && cp -r "$d" $fx/; done
}

part_fixtures() {
  make_fixtures
  for w in ${FIXTURE_WEIGHTS:-f32 f16 q8 q4}; do
    log "fixtures, $w weights"
    deno run -A scripts/check_fixture.ts $fx/* --weights $w 2>&1 | grep -E "PASS|FAIL|passed|rror"
  done
}

part_chain() {
  make_fixtures
  deno run -A scripts/check_fixture.ts $fx/qwen3-tiny $fx/llama3-tiny $fx/llama-hd128-long $fx/kimi-k2-tiny \
    $fx/qwen3-moe-norm --weights f32 --local 3 2>&1 | grep -E "PASS|FAIL|passed|rror"
}

part_tests() {
  # The kernel tests first (no fixtures needed), each test's line kept, so a cut-off run still says which
  # passed; then the engine tests with the regenerated fixtures.
  NO_COLOR=1 deno test -A tests/kernels 2>&1 | grep --line-buffered -E " ok | FAILED|passed|failed|skipped|=>"
  make_fixtures
  NO_COLOR=1 SWACTOR_FIXTURES=$fx deno test -A tests/models/verify_test.ts tests/models/engine_test.ts 2>&1 |
    grep --line-buffered -E " ok | FAILED|passed|failed|skipped|=>"
}

part_decode() {
  deno run -A scripts/bench/decode.ts --dir /tmp/llama1b --weights f16,q8,q4 2>&1 | grep -E "^\{|rror"
  log "k-token steps and context lengths"
  deno run -A scripts/bench/decode.ts --dir /tmp/llama1b --weights f16,q4 --k 1,2,4,8,16 \
    --context 128,2048,8192 --skip-decode --ab 2>&1 | grep -E "^\{|rror"
  log "quantised k-steps: the default (int8 direct multi-token GEMV) against it off, and without the copies"
  deno run -A scripts/bench/decode.ts --dir /tmp/llama1b --weights q8,q4 --k 1,2,4,8,16 --skip-decode \
    --tunings '[{},{"multiInt8":false},{"multiInt8Copies":false},{"multiInt8NormCopies":false},{}]' 2>&1 |
    grep -E "^\{|rror"
  if [ -n "${BEFORE:-}" ]; then
    for round in 1 2; do
      (cd "$BEFORE" && deno run -A scripts/bench/decode.ts --dir /tmp/llama1b --weights f16,q4 2>/dev/null |
        sed 's/^{/{"code":"before",/')
      deno run -A scripts/bench/decode.ts --dir /tmp/llama1b --weights f16,q4 2>/dev/null | sed 's/^{/{"code":"after",/'
    done
  fi
  log "transformers"
  python3 scripts/bench/hf_decode.py /tmp/llama1b 2>&1 | grep -E "^\{|Error"
}

part_prefill() {
  deno run -A scripts/bench/prefill.ts --dir /tmp/llama1b --weights f16,q4 --prompts 512,2048 --runs 3 \
    --kernels --math f32,f16,default 2>&1 | grep -E "^\{|rror"
  log "GEMM at M = 512"
  deno run -A scripts/bench/gemm.ts --ceiling 67 --weights f16,q4 --tiles default 2>&1 | grep -E "^\{|rror"
}

part_gemm() {
  deno run -A scripts/bench/gemm.ts --ceiling 67 --weights f16,q4 2>&1 | grep -E "^\{|rror"
  log "where the large tile's time goes"
  deno run -A scripts/bench/gemm_parts.ts --weights f16 2>&1 | grep -E "^\{|rror"
  log "prefill: default tiles, the tiles before (with their wave), early submit on and off"
  deno run -A scripts/bench/prefill.ts --dir /tmp/llama1b --weights f16,q4 --prompts 512,2048 --runs 3 \
    --gemm default,128x128k8r22c/64x64k16r11c/264 --early on,off 2>&1 | grep -E "^\{|rror"
}

part_moe() {
  local B="deno run -A scripts/bench/moe.ts --runs 3"
  $B --shape qwen3-30b-a3b,deepseek-v2-lite --weights q4,f16 2>&1 | grep -E "^\{|rror"
  log "transformers"
  HF_CACHES=dynamic python3 scripts/bench/hf_moe.py qwen3-30b-a3b 48 --random 2>&1 | grep -E "^\{|Error" | tail -3
  HF_CACHES=dynamic python3 scripts/bench/hf_moe.py deepseek-v2-lite 27 --random 2>&1 | grep -E "^\{|Error" | tail -3
}

part_targets() {
  local lines=$OUT/targets.jsonl
  : > "$lines"
  for round in 1 2 3; do
    deno run -A scripts/bench/decode.ts --dir /tmp/llama1b --weights q4,f16 --k 1,8 --context 128,8192 2>&1 |
      grep -E "^\{" | tee -a "$lines"
  done
  for round in 1 2; do
    deno run -A scripts/bench/moe.ts --shape qwen3-30b-a3b --weights q4 --runs 2 2>&1 | grep -E "^\{" | tee -a "$lines"
  done
  deno run -A scripts/bench/prefill.ts --dir /tmp/llama1b --weights f16,q4 --prompts 512,2048 --runs 3 2>&1 |
    grep -E "^\{" | tee -a "$lines"
  log "the targets"
  deno run -A scripts/bench/targets.ts "$lines"
}

part_load() {
  deno eval 'import { ensureRandomCheckpoint, LLAMA_3_2_1B } from "./scripts/bench/random_checkpoint.ts";
    await ensureRandomCheckpoint("/tmp/llama1b", LLAMA_3_2_1B);'
  deno run -A scripts/bench/load.ts --dir /tmp/llama1b --weights q4,f16 --read-ahead 0,512 --runs 3 2>&1 |
    grep -E "^\{|rror"
  log "from the disk (the page cache dropped before each load)"
  deno run -A scripts/bench/load.ts --dir /tmp/llama1b --weights q4 --read-ahead 0,512 --runs 2 --drop-caches 2>&1 |
    grep -E "^\{|rror"
  log "one-shot generate"
  deno run -A scripts/bench/oneshot.ts --dir /tmp/llama1b --weights q4 --prompts 8 --tokens 32 --runs 3 2>&1 |
    grep -E "^\{|rror"
}

declare -A limit=([fixtures]=300 [chain]=150 [tests]=420 [decode]=260 [prefill]=180 [gemm]=420 [moe]=280 [targets]=480 [load]=300)
for p in "${parts[@]}"; do
  log "== $p"
  export -f make_fixtures part_$p log; export fx t0
  timeout "${LIMIT:-${limit[$p]:-300}}" bash -c "part_$p" 2>&1 | tee "$OUT/$p.txt"
  [ "${PIPESTATUS[0]}" = 124 ] && echo "($p cut off after its time limit)" | tee -a "$OUT/$p.txt"
done
log "done"
