// scripts/bench/dispatch.ts on the software adapter: it times the six cases (three orders, two grid sizes);
// only its numbers need the H200. A bad option exits 2 naming it.
import assert from "node:assert/strict";
import { gpuAvailable, needs } from "../../support/needs.ts";
import { runScript } from "../../support/run_script.ts";

const hasGpu = await gpuAvailable();

Deno.test(
  needs("dispatch cost benchmark: times every order at both grid sizes", { "a WebGPU adapter": hasGpu }),
  async () => {
    const r = await runScript("bench/dispatch.ts", ["--n", "16", "--groups", "2"]);
    assert.equal(r.code, 0, r.stderr);
    assert.equal(r.json.length, 1, r.stdout);
    for (const order of ["chain", "shared", "independent"]) {
      for (const grid of ["1wg", "wave"]) {
        const us = r.json[0][`${order}_${grid}_us`];
        assert.ok(typeof us === "number" && Number.isFinite(us), `${order}_${grid}_us: ${r.stdout}`);
      }
    }
  },
);

Deno.test("dispatch cost benchmark: a bad option exits 2 naming it", async () => {
  const r = await runScript("bench/dispatch.ts", ["--n", "1"]);
  assert.equal(r.code, 2);
  assert.match(r.stderr, /--n/);
});
