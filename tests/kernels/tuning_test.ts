// SWACTOR_TUNING: a process's starting gpu.tuning (kernels/gpu.ts tuningFromEnv), the one way to force a
// kernel choice across processes. No GPU needed: it is parsed before one is asked for.
import assert from "node:assert/strict";
import { tuningFromEnv, tuningList } from "../../kernels/gpu.ts";

Deno.test("tuningFromEnv: a JSON object of KernelTuning fields; anything else is an error naming it", () => {
  assert.deepEqual(tuningFromEnv(""), {});
  assert.deepEqual(tuningFromEnv("  "), {});
  assert.deepEqual(
    tuningFromEnv('{"moe":{"fused":{"rows":64,"threads":512}},"headNorm":"own","gemmMath":"f32"}'),
    { moe: { fused: { rows: 64, threads: 512 } }, headNorm: "own", gemmMath: "f32" },
  );
  assert.throws(() => tuningFromEnv('{"moeFused":false}'), /no kernel setting named "moeFused"/);
  assert.throws(() => tuningFromEnv("[1]"), /must be a JSON object/);
  assert.throws(() => tuningFromEnv("{moe: 1}"), /must be a JSON object of kernel settings: .*JSON/);
});

Deno.test("tuningList: a benchmark's --tunings, every entry checked as SWACTOR_TUNING is", () => {
  assert.deepEqual(tuningList('[{}, {"attentionUnroll": 8}, {"moe": {"fused": {"rows": 64}}}]'), [
    {},
    { attentionUnroll: 8 },
    { moe: { fused: { rows: 64 } } },
  ]);
  assert.deepEqual(tuningList("[]"), []);
  assert.throws(
    () => tuningList('[{}, {"attentionProbe": true}]'),
    /--tunings\[1\]: no kernel setting named "attentionProbe"/,
  );
  assert.throws(() => tuningList("[{}, [1]]"), /--tunings\[1\] must be a JSON object/);
  assert.throws(() => tuningList('{"attentionUnroll": 8}'), /--tunings must be a JSON list/);
  assert.throws(() => tuningList("[{", "--x"), /--x must be a JSON list of kernel settings objects: .*JSON/);
});
