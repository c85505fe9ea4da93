// scripts/bench/rows.ts and scripts/bench/dp4.ts on the software adapter: the interleaved-rows q4 GEMV agrees
// with the engine's int8 direct kernel on the same input for several token counts and splits (the benchmark's
// check; only its timings need the H200), and the packed-dot rate probe runs each variant. Bad options exit 2.
import assert from "node:assert/strict";
import { gpuAvailable, needs } from "../../support/needs.ts";
import { runScript } from "../../support/run_script.ts";

const hasGpu = await gpuAvailable();

Deno.test(
  needs("interleaved-rows GEMV benchmark: agrees with the engine's k-step GEMV", {
    "a WebGPU adapter": hasGpu,
  }),
  async () => {
    // Two weight copies: each copy's GEMV reads its own input pass's copy (a first version read one never
    // written and compared against zeros).
    const r = await runScript("bench/rows.ts", [
      "--copies",
      "2",
      "--t",
      "1,3,8",
      "--variants",
      '[{"splitK":1,"unroll":2},{"splitK":2,"unroll":1}]',
    ]);
    assert.equal(r.code, 0, r.stderr);
    const rows = r.json.filter((l) => l.variant !== "engine");
    assert.equal(rows.length, 6, r.stdout);
    for (const l of rows) {
      assert.ok((l.ref_max as number) > 0.1, `the reference is not vanishing: ${JSON.stringify(l)}`);
      assert.equal(l.not_finite, 0, JSON.stringify(l));
      assert.ok((l.err_over_max as number) < 1e-5, JSON.stringify(l));
    }
  },
);

Deno.test(
  needs("packed-dot rate benchmark: times each variant", { "a WebGPU adapter": hasGpu }),
  async () => {
    const r = await runScript("bench/dp4.ts", ["--iter", "8", "--groups", "2"]);
    assert.equal(r.code, 0, r.stderr);
    assert.equal(r.json.length, 1, r.stdout);
    const rates = r.json[0].g_ops_s as Record<string, number>;
    for (const k of ["fma", "dp4", "spelled", "xor"]) assert.ok(rates[k] > 0, JSON.stringify(r.json[0]));
  },
);

Deno.test("rows / dp4 benchmarks: a bad option exits 2 naming it", async () => {
  const rows = await runScript("bench/rows.ts", ["--shape", "sideways"]);
  assert.equal(rows.code, 2);
  assert.match(rows.stderr, /--shape/);
  const dp4 = await runScript("bench/dp4.ts", ["--iter", "0"]);
  assert.equal(dp4.code, 2);
  assert.match(dp4.stderr, /--iter/);
  for (const u of ["0", "17", "two"]) {
    const r = await runScript("bench/dp4.ts", ["--unroll", u]);
    assert.equal(r.code, 2, `--unroll ${u}: ${r.stderr}`);
    assert.match(r.stderr, /--unroll takes a positive integer up to 16/);
  }
});
