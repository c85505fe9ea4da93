// scripts/bench/gridsync.ts on the software adapter, at one layer and one workgroup (the only grid lavapipe
// runs exactly: docs/BENCHMARKS.md, the sixteenth session): its chain of q4 GEMVs agrees with the CPU chain to
// the int8 activations' error, and the persistent run (every GEMV in one dispatch, a grid barrier between) with
// the run of a dispatch a GEMV bit for bit (atomic activations: the plain ones differ only in their loads and
// stores, and each variant is ~15 s of lavapipe's first-dispatch compile).
import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
import { gpuAvailable, needs } from "../../support/needs.ts";

const hasGpu = await gpuAvailable();
const SCRIPT = fileURLToPath(new URL("../../../scripts/bench/gridsync.ts", import.meta.url));

Deno.test(
  needs("gridsync benchmark: the persistent chain equals a dispatch a GEMV and the CPU", {
    "a WebGPU adapter": hasGpu,
  }),
  async () => {
    const act = "atomic";
    const args = ["run", "-A", "--quiet", SCRIPT, "--layers", "1", "--groups", "1", "--wg", "64"];
    const out = await new Deno.Command(Deno.execPath(), {
      args: [...args, "--prefetch", "1", "--act", act, "--check-only"],
      stdin: "null",
    }).output();
    const stderr = new TextDecoder().decode(out.stderr);
    assert.equal(out.code, 0, stderr);
    const lines = new TextDecoder().decode(out.stdout).split("\n").filter((l) => l.startsWith("{"))
      .map((l) => JSON.parse(l));
    assert.equal(lines.length, 1, stderr);
    const [l] = lines;
    assert.equal(l.gemvs, 4);
    assert.equal(l.act, act);
    assert.equal(l.same_bits, true, JSON.stringify(l));
    assert.equal(l.spin_gave_up, false);
    assert.ok(l.rel_err_vs_cpu < 0.03, JSON.stringify(l));
    assert.ok(l.ref_rms > 0.1, "the CPU chain is not vanishing");
  },
);
