// scripts/bench/gridsync.ts on the software adapter, at one layer and four workgroups: its chain of q4 GEMVs
// agrees with the CPU chain to the int8 activations' error, and the persistent run (every GEMV in one dispatch,
// a grid barrier between, the next GEMV's weights loaded between arriving and waiting) with the run of a
// dispatch a GEMV bit for bit. The activations pass between workgroups by plain loads and stores, each GEMV
// writing a region of its own (`--act fresh`): the way that is exact on the H200 too (docs/BENCHMARKS.md, the
// thirty-third session). One variant: each is ~15 s of lavapipe's first-dispatch compile.
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
      `--layers 1 --groups 4 --wg 64 --prefetch 2 --act ${act} --check-only`.split(" "),
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
