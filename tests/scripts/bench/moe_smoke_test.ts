// The MoE benchmark (scripts/bench/moe.ts) runs on the software adapter too, at a shrunken Qwen3-MoE shape:
// one JSON line with its timings, with --tunings a GPU time per gpu.tuning override (the median of --rounds
// timed in turn) and with --marginal each
// kernel's share of the step; a --tunings that is not a JSON list of kernel settings objects (a misspelt
// setting too), or a bad --rounds, is one line and exit 2.
import assert from "node:assert/strict";
import { gpuAvailable, needs } from "../../support/needs.ts";
import { runScript } from "../../support/run_script.ts";

const hasGpu = await gpuAvailable();
const SMALL = "vocab_size=512,hidden_size=128,num_attention_heads=4,num_key_value_heads=2,head_dim=32," +
  "num_experts=8,num_experts_per_tok=2,moe_intermediate_size=64";

const moe = (...args: string[]) =>
  runScript("bench/moe.ts", ["--shape", "qwen3-30b-a3b", "--layers", "1", "--set", SMALL, ...args]);

Deno.test(
  needs("moe benchmark: one JSON line, and a GPU time per --tunings override", {
    "a WebGPU adapter": hasGpu,
  }),
  async () => {
    const r = await moe(
      "--weights",
      "f32",
      "--runs",
      "1",
      "--prompt",
      "4",
      "--new",
      "4",
      "--tunings",
      '[{},{"attentionUnroll":4}]',
      "--rounds",
      "3",
      "--marginal",
    );
    assert.equal(r.code, 0, r.stderr);
    const lines = r.stdout.trim().split("\n").map((l) => JSON.parse(l));
    assert.equal(lines.length, 1);
    const m = lines[0];
    assert.equal(m.bench, "swactor-moe-decode");
    assert.ok(m.decode_tok_s > 0 && m.dispatches_per_token > 0, JSON.stringify(m));
    if (m.gpu_ms_per_token > 0) {
      // Timestamps: each override timed on its own programs (two sequences, built in mirrored order), three
      // rounds in turn, the median of its six timings reported.
      assert.deepEqual(Object.keys(m.tunings_gpu_ms), ["0 {}", '1 {"attentionUnroll":4}']);
      for (const [k, v] of Object.entries(m.tunings_gpu_ms)) {
        const series = m.tunings_gpu_ms_rounds[k] as number[];
        assert.equal(series.length, 6, k);
        assert.ok((v as number) > 0 && series.every((x) => x > 0), k);
        const sorted = [...series].sort((a, b) => a - b);
        assert.ok(Math.abs((v as number) - (sorted[2] + sorted[3]) / 2) < 1e-9, k);
      }
      // Every kernel's share of the step, under the same labels as the per-dispatch timings.
      assert.deepEqual(Object.keys(m.marginal_ms_by_kernel).sort(), Object.keys(m.gpu_ms_by_kernel).sort());
    } else {
      console.log("no timestamp queries on this adapter: the --tunings timings are not checked");
    }
  },
);

Deno.test("moe benchmark: a --tunings that is not a list of objects is one line naming it, exit 2", async () => {
  for (const bad of ["{", '{"attentionUnroll":4}', "[1]", '[{}, {"attentionUnrol":4}]']) {
    const r = await moe("--tunings", bad);
    assert.equal(r.code, 2, `${bad}: ${r.stderr}`);
    assert.match(r.stderr, /^moe\.ts: --tunings(\[\d+\])?[ :]/);
    assert.equal(r.stderr.trim().split("\n").length, 1, r.stderr);
  }
});

Deno.test("moe benchmark: a --rounds that is not a whole number >= 1 is one line naming it, exit 2", async () => {
  for (const bad of ["0", "two", "1.5"]) {
    const r = await moe("--rounds", bad);
    assert.equal(r.code, 2, `${bad}: ${r.stderr}`);
    assert.match(r.stderr, /^moe\.ts: --rounds must be a whole number >= 1/);
  }
});

Deno.test("moe benchmark: a --set entry that is not key=number is one line naming it, exit 2", async () => {
  for (const bad of ['{"vocab_size":4096}', "vocab_size=abc", "vocab_size"]) {
    const r = await moe("--set", bad);
    assert.equal(r.code, 2, `${bad}: ${r.stderr}`);
    assert.match(r.stderr, /^moe\.ts: --set takes key=number entries/);
    assert.ok(r.stderr.includes(bad), r.stderr);
    assert.equal(r.stderr.trim().split("\n").length, 1, r.stderr);
  }
});
