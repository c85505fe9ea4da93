// The keep-warm benchmark (scripts/bench/keep_warm.ts) runs on the software adapter too, at a shrunken Llama
// shape: a line per round, the filler off (none queued) and on (one a step once the gaps are known).
import assert from "node:assert/strict";
import { gpuAvailable, needs } from "../../support/needs.ts";
import { runScript } from "../../support/run_script.ts";

const hasGpu = await gpuAvailable();
const SMALL =
  "vocab_size=512,hidden_size=128,intermediate_size=256,num_attention_heads=4,num_key_value_heads=2," +
  "head_dim=32";

Deno.test(
  needs("keep-warm benchmark: a line per round, fillers queued only with the filler on", {
    "a WebGPU adapter": hasGpu,
  }),
  async () => {
    const args = ["--weights", "f32", "--layers", "1", "--set", SMALL, "--gaps", "2", "--seconds", "0.3"];
    const r = await runScript("bench/keep_warm.ts", [...args, "--fractions", "0.4", "--repeat", "2"]);
    assert.equal(r.code, 0, r.stderr);
    // Round by round: off then on, then (the second repeat) on then off.
    assert.deepEqual(r.json.map((l) => l.fraction), [0, 0.4, 0.4, 0]);
    for (const l of r.json) {
      assert.equal(l.gap, 2);
      // The gap asked for is the gap kept (Deno's timers alone run ~2 ms late).
      assert.ok(Math.abs((l.gapMs as number) - 2) < 0.5, `gap ${l.gapMs}`);
      assert.ok((l.steps as number) > 10 && (l.stepMs as number) > 0 && (l.periodMs as number) >= 2);
      if (l.fraction === 0) assert.equal(l.fillsPerStep, 0);
      else assert.ok((l.fillsPerStep as number) > 0.5 && (l.fillMs as number) > 0, JSON.stringify(l));
    }
    const bad = await runScript("bench/keep_warm.ts", ["--fractions", "1.5"]);
    assert.equal(bad.code, 2);
    assert.match(bad.stderr, /--fractions must be <= 0\.99, got 1\.5/);
  },
);
