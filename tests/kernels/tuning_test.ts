// SWACTOR_TUNING: a process's starting gpu.tuning (kernels/gpu.ts tuningFromEnv), the one way to force a
// kernel choice across processes. No GPU needed: it is parsed before one is asked for.
import assert from "node:assert/strict";
import { tuningFromEnv } from "../../kernels/gpu.ts";

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
