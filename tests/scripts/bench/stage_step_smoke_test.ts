// The stage-step benchmark (scripts/bench/stage_step.ts) runs on the software adapter too, at a shrunken
// Llama shape: a line per setting and round, the default first, then each of --tunings, in turn.
import assert from "node:assert/strict";
import { gpuAvailable, needs } from "../../support/needs.ts";
import { runScript } from "../../support/run_script.ts";

const hasGpu = await gpuAvailable();
const SMALL =
  "vocab_size=512,hidden_size=128,intermediate_size=256,num_attention_heads=4,num_key_value_heads=2," +
  "head_dim=32";

Deno.test(
  needs("stage-step benchmark: a line per setting and round, the settings in turn", {
    "a WebGPU adapter": hasGpu,
  }),
  async () => {
    const args = ["--weights", "f32", "--layers", "1", "--set", SMALL, "--steps", "12", "--rounds", "2"];
    const r = await runScript("bench/stage_step.ts", [...args, "--tunings", '[{"encodeAhead":false}]']);
    assert.equal(r.code, 0, r.stderr);
    assert.deepEqual(
      r.json.map((l) => [l.round, l.tuning]),
      [[0, {}], [0, { encodeAhead: false }], [1, {}], [1, { encodeAhead: false }]],
    );
    for (const l of r.json) {
      assert.ok((l.stepMs as number) > 0 && (l.p90Ms as number) >= (l.stepMs as number));
    }
    const bad = await runScript("bench/stage_step.ts", ["--tunings", '[{"noSuchSetting":1}]']);
    assert.equal(bad.code, 2);
    assert.match(bad.stderr, /noSuchSetting/);
  },
);
