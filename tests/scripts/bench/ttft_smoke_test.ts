// The time-to-first-token benchmark (scripts/bench/ttft.ts) runs on the software adapter too, at a shrunken
// Llama shape: a line per prompt and engine, the default engine's requests after the first taking the
// released sequence and the one without spares building their own; then a stream of mixed prompts.
import assert from "node:assert/strict";
import { gpuAvailable, needs } from "../../support/needs.ts";
import { runScript } from "../../support/run_script.ts";

const hasGpu = await gpuAvailable();
const SMALL =
  "vocab_size=512,hidden_size=128,intermediate_size=256,num_attention_heads=4,num_key_value_heads=2," +
  "head_dim=32";

Deno.test(
  needs("ttft benchmark: a line per prompt and engine, requests reusing a released sequence", {
    "a WebGPU adapter": hasGpu,
  }),
  async () => {
    const r = await runScript("bench/ttft.ts", [
      "--shape",
      "llama-3.2-1b",
      "--weights",
      "f32",
      "--layers",
      "1",
      "--set",
      SMALL,
      "--prompts",
      "5,12",
      "--tokens",
      "3",
      "--runs",
      "2",
      "--warmup-ms",
      "200",
      "--room",
      "40",
      "--stream",
      "5,40,12",
    ]);
    assert.equal(r.code, 0, r.stderr);
    // The stream: 12's sequence (56 positions, 32 rows) serves the next run's 5 (48); 40's (96, 64 rows)
    // serves neither: one reuse a run after the first.
    assert.deepEqual(r.json.map((l) => [l.prompt, l.spares, l.reused, l.requests]), [
      [5, "default", 2, 2],
      [5, 0, 0, 2],
      [12, "default", 2, 2],
      [12, 0, 0, 2],
      ["stream", "default", 2, 6],
      ["stream", 0, 0, 6],
    ]);
    for (const l of r.json) {
      assert.ok((l.firstTokenMs as number) > 0 && (l.runsMs as number[]).length > 0);
      assert.ok((l.requestMs as number) >= (l.firstTokenMs as number));
      // 3 tokens: the prefill's, then two batches of one step (the first decode batch has one step, and one
      // token is left for the next).
      assert.equal(l.batches, 3);
    }
    const bad = await runScript("bench/ttft.ts", ["--shape", "gpt-5"]);
    assert.equal(bad.code, 2);
    assert.match(bad.stderr, /--shape takes llama-3.2-1b/);
  },
);
