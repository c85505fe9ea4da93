// scripts/bench/gridsync.ts on the software adapter, at one layer and one workgroup: its chain of q4 GEMVs
// agrees with the CPU chain to the int8 activations' error, and the persistent run (every GEMV in one dispatch,
// the next GEMV's weights loaded between arriving at the barrier and waiting) with the run of a dispatch a GEMV
// bit for bit. One workgroup because lavapipe runs one or two workgroups of a grid at a time and ends any loop
// after 65,535 iterations: a barrier of more gives up there (and says so), so only the chain's code, not the
// barrier's waiting, can be checked here; the H200 checked that (docs/BENCHMARKS.md, the thirty-third
// session). ~15 s of lavapipe's first-dispatch compile.
import assert from "node:assert/strict";
import { gpuAvailable, needs } from "../../support/needs.ts";
import { runScript } from "../../support/run_script.ts";

const hasGpu = await gpuAvailable();

Deno.test(
  needs("gridsync benchmark: the persistent chain equals a dispatch a GEMV and the CPU", {
    "a WebGPU adapter": hasGpu,
  }),
  async () => {
    const act = "fresh";
    const r = await runScript(
      "bench/gridsync.ts",
      `--layers 1 --groups 1 --wg 64 --prefetch 2 --act ${act} --check-only`.split(" "),
    );
    assert.equal(r.code, 0, r.stderr);
    assert.equal(r.json.length, 1, r.stderr);
    const l = r.json[0] as {
      gemvs: number;
      act: string;
      same_bits: boolean;
      spin_gave_up: boolean;
      rel_err_vs_cpu: number;
      ref_rms: number;
    };
    assert.equal(l.gemvs, 4);
    assert.equal(l.act, act);
    assert.equal(l.same_bits, true, JSON.stringify(l));
    assert.equal(l.spin_gave_up, false);
    assert.ok(l.rel_err_vs_cpu < 0.03, JSON.stringify(l));
    assert.ok(l.ref_rms > 0.1, "the CPU chain is not vanishing");
  },
);
