// The prefill benchmark (scripts/bench/prefill.ts) runs on the software adapter too, at its tiny shape: a line
// per weights and prompt with the timed requests only (--warmup untimed ones before them, listed apart), and a
// bad --warmup or --warmup-ms is refused.
import assert from "node:assert/strict";
import { gpuAvailable, needs } from "../../support/needs.ts";
import { runScript } from "../../support/run_script.ts";

const hasGpu = await gpuAvailable();

Deno.test(
  needs("prefill benchmark: a line per prompt, only the timed requests counted", {
    "a WebGPU adapter": hasGpu,
  }),
  async () => {
    const dir = await Deno.makeTempDir();
    try {
      const args = ["--tiny", "--dir", dir, "--weights", "f32", "--prompts", "24,40", "--runs", "2"];
      const r = await runScript("bench/prefill.ts", [...args, "--warmup", "3", "--warmup-ms", "0"]);
      assert.equal(r.code, 0, r.stderr);
      assert.deepEqual(
        r.json.map((
          l,
        ) => [l.weights, l.prompt, (l.runsMs as number[]).length, (l.warmupMs as number[]).length]),
        [
          ["f32", 24, 2, 3],
          ["f32", 40, 2, 3],
        ],
      );
      for (const l of r.json) assert.ok((l.ttftMs as number) > 0 && (l.tokS as number) > 0);
      const bad = await runScript("bench/prefill.ts", [...args, "--warmup", "0"]);
      assert.notEqual(bad.code, 0);
      assert.match(bad.stderr, /--warmup takes an integer >= 1, got 0/);
      const badMs = await runScript("bench/prefill.ts", [...args, "--warmup-ms", "soon"]);
      assert.notEqual(badMs.code, 0);
      assert.match(badMs.stderr, /--warmup-ms takes ms >= 0, got soon/);
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  },
);
