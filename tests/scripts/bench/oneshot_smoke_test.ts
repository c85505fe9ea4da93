// The one-shot benchmark (scripts/bench/oneshot.ts) on the software adapter: a fresh `generate` process a
// run, a line each with what it reported, then the medians; a generate that fails stops it, naming why.
import assert from "node:assert/strict";
import { gpuAvailable, needs } from "../../support/needs.ts";
import { runScript } from "../../support/run_script.ts";
import { fixtureDir } from "../../fixtures.ts";

const hasGpu = await gpuAvailable();
const micro = fixtureDir("llama-micro");

Deno.test(
  needs("oneshot benchmark: a generate process a run, then the medians", {
    "a WebGPU adapter": hasGpu,
    "tests/fixtures/llama-micro": micro,
  }),
  async () => {
    const args = ["--dir", micro!, "--weights", "f32", "--prompts", "3,9", "--tokens", "4", "--runs", "2"];
    const r = await runScript("bench/oneshot.ts", [...args, "--pause-ms", "0"]);
    assert.equal(r.code, 0, r.stderr);
    const runs = r.json.filter((l) => !l.summary), sums = r.json.filter((l) => l.summary);
    assert.deepEqual(runs.map((l) => [l.prompt, l.run]), [[3, 1], [9, 1], [3, 2], [9, 2]]);
    for (const l of runs) {
      assert.equal(l.weights, "f32");
      assert.ok((l.first_token_ms as number) > 0 && (l.tok_s as number) > 0, JSON.stringify(l));
      assert.ok((l.wallMs as number) >= (l.first_token_ms as number) + (l.load_ms as number));
      const builds = l.first_token_builds as { pipelines: number; ms: number };
      assert.ok(builds.pipelines > 0 && builds.ms <= (l.first_token_ms as number), "a fresh process builds");
      // The clock only where nvidia-smi answers.
      const mhz = l.mhz as { min: number; mean: number } | null;
      assert.ok(mhz === null || mhz.min <= mhz.mean, JSON.stringify(mhz));
    }
    assert.deepEqual(sums.map((l) => [l.prompt, l.runs]), [[3, 2], [9, 2]]);
    const bad = await runScript("bench/oneshot.ts", [
      "--dir",
      "/nonexistent-model",
      "--runs",
      "1",
      "--pause-ms",
      "0",
    ]);
    assert.equal(bad.code, 1);
    assert.match(bad.stderr, /generate exited 2: .*nonexistent-model/);
  },
);
