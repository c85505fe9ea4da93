// The GEMM benchmarks run on the software adapter too, at small shapes: scripts/bench/gemm.ts --quick prints a
// line per case and a `best` line, and scripts/bench/gemm_parts.ts still finds the k loop it cuts in the
// generated GEMM (it throws when kernels/gemm.ts's layout changes) and prints a line per variant.
import assert from "node:assert/strict";
import { gpuAvailable, needs } from "../../support/needs.ts";
import { runScript } from "../../support/run_script.ts";

const hasGpu = await gpuAvailable();

const run = (script: string, ...args: string[]) => runScript(`bench/${script}`, args);

Deno.test(
  needs("gemm benchmark: a line per tile and a best line", { "a WebGPU adapter": hasGpu }),
  async () => {
    const r = await run("gemm.ts", "--quick", "--weights", "q4", "--tiles", "64x64k16r22cv");
    assert.equal(r.code, 0, r.stderr);
    const lines = r.json;
    assert.deepEqual(lines.filter((l) => !l.best).map((l) => l.tile).sort(), [
      "64x64k16r11c",
      "64x64k16r22cv",
    ]);
    assert.equal(lines.filter((l) => l.best).length, 1);
    // A time for each case (its TFLOP/s round to 0 on a software adapter).
    for (const l of lines.filter((l) => !l.best)) assert.ok((l.us as number) > 0, JSON.stringify(l));
  },
);

Deno.test(
  needs("gemm_parts: every variant of a vector-store tile, timed", { "a WebGPU adapter": hasGpu }),
  async () => {
    const r = await run(
      "gemm_parts.ts",
      "--weights",
      "f16",
      "--shape",
      "64,128,128",
      "--tile",
      "64x64k16r22cv",
    );
    assert.equal(r.code, 0, r.stderr);
    const variants = r.json.map((l) => l.variant);
    for (const v of ["whole", "no-fetch", "fma-only", "x-fetch-only", "w-fetch-only", "fetch-unused"]) {
      assert.ok(variants.includes(v), `${v} missing from ${variants}`);
    }
  },
);
