// scripts/bench/fused_mlp.ts on the software adapter at a small shape (hidden 256, intermediate 1024, two
// blocks): the engine's MLP kernels, the two-dispatch chain and the fused one (its down partial sums added by
// fixed-point atomics) each agree with the CPU chain to the int8 activations' error, and with each other
// closer than that.
import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
import { gpuAvailable, needs } from "../../support/needs.ts";

const hasGpu = await gpuAvailable();
const SCRIPT = fileURLToPath(new URL("../../../scripts/bench/fused_mlp.ts", import.meta.url));

Deno.test(
  needs("fused MLP benchmark: one dispatch a block agrees with the engine's kernels and the CPU", {
    "a WebGPU adapter": hasGpu,
  }),
  async () => {
    const args = ["run", "-A", "--quiet", SCRIPT, "--layers", "2", "--hidden", "256", "--inter", "1024"];
    const out = await new Deno.Command(Deno.execPath(), {
      args: [...args, "--wg", "256", "--rows", "64", "--check-only"],
      stdin: "null",
    }).output();
    const stderr = new TextDecoder().decode(out.stderr);
    assert.equal(out.code, 0, stderr);
    const lines = new TextDecoder().decode(out.stdout).split("\n").filter((l) => l.startsWith("{"))
      .map((l) => JSON.parse(l));
    assert.equal(lines.length, 1, stderr);
    const [l] = lines;
    assert.equal(l.rows, 64);
    for (const k of ["rel_err_engine", "rel_err_two", "rel_err_fused"]) {
      assert.ok(l[k] > 0 && l[k] < 0.03, `${k}: ${JSON.stringify(l)}`);
    }
    assert.ok(l.rel_err_between < 0.005, JSON.stringify(l));
    assert.ok(l.ref_rms > 0.1, "the CPU chain is not vanishing");
  },
);

Deno.test("fused MLP benchmark: a bad option exits 2 naming it", async () => {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", "--quiet", SCRIPT, "--variant", "sideways", "--check-only"],
    stdin: "null",
  }).output();
  assert.equal(out.code, 2);
  assert.match(new TextDecoder().decode(out.stderr), /--variant/);
});
