// scripts/bench/fused_mlp.ts on the software adapter at a small shape (hidden 256, intermediate 1024, two
// blocks): the engine's MLP kernels, the two-dispatch chain and the fused one (its down partial sums added by
// fixed-point atomics) each agree with the CPU chain to the int8 activations' error, and with each other
// closer than that.
import assert from "node:assert/strict";
import { gpuAvailable, needs } from "../../support/needs.ts";
import { runScript } from "../../support/run_script.ts";

const hasGpu = await gpuAvailable();

Deno.test(
  needs("fused MLP benchmark: one dispatch a block agrees with the engine's kernels and the CPU", {
    "a WebGPU adapter": hasGpu,
  }),
  async () => {
    const r = await runScript(
      "bench/fused_mlp.ts",
      "--layers 2 --hidden 256 --inter 1024 --wg 256 --rows 64 --check-only".split(" "),
    );
    assert.equal(r.code, 0, r.stderr);
    assert.equal(r.json.length, 1, r.stderr);
    const l = r.json[0] as Record<string, number>;
    assert.equal(l.rows, 64);
    for (const k of ["rel_err_engine", "rel_err_two", "rel_err_fused"]) {
      assert.ok(l[k] > 0 && l[k] < 0.03, `${k}: ${JSON.stringify(l)}`);
    }
    assert.ok(l.rel_err_between < 0.005, JSON.stringify(l));
    assert.ok(l.ref_rms > 0.1, "the CPU chain is not vanishing");
  },
);

Deno.test("fused MLP benchmark: a bad option exits 2 naming it", async () => {
  const r = await runScript("bench/fused_mlp.ts", ["--variant", "sideways", "--check-only"]);
  assert.equal(r.code, 2);
  assert.match(r.stderr, /--variant/);
});
