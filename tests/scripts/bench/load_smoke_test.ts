// The load benchmark (scripts/bench/load.ts) on the software adapter: a line a load with its phases, the
// read-ahead settings alternating, then the medians; a bad option is one line naming it.
import assert from "node:assert/strict";
import { gpuAvailable, needs } from "../../support/needs.ts";
import { runScript } from "../../support/run_script.ts";
import { fixtureDir } from "../../fixtures.ts";

const hasGpu = await gpuAvailable();
const micro = fixtureDir("llama-micro");

Deno.test(
  needs("load benchmark: a line a load, read-ahead settings alternating, then the medians", {
    "a WebGPU adapter": hasGpu,
    "tests/fixtures/llama-micro": micro,
  }),
  async () => {
    const r = await runScript("bench/load.ts", [
      "--dir",
      micro!,
      "--weights",
      "q4",
      "--read-ahead",
      "0,1",
      "--runs",
      "2",
    ]);
    assert.equal(r.code, 0, r.stderr);
    const loads = r.json.filter((l) => !l.summary), sums = r.json.filter((l) => l.summary);
    assert.deepEqual(loads.map((l) => [l.read_ahead_mib, l.run]), [[0, 1], [1, 1], [0, 2], [1, 2]]);
    const bytes = (await Deno.stat(`${micro}/model.safetensors`)).size;
    for (const l of loads) {
      assert.equal(l.weights, "q4");
      // Every tensor read: the file less its header.
      assert.ok((l.bytes as number) > bytes * 0.95 && (l.bytes as number) < bytes, JSON.stringify(l));
      assert.ok((l.ms as number) > 0 && (l.read_wait_ms as number) >= 0 && (l.submit_ms as number) >= 0);
    }
    assert.deepEqual(sums.map((l) => [l.read_ahead_mib, l.runs]), [[0, 2], [1, 2]]);
    // Reads alone: every tensor once, two at once.
    const reads = await runScript("bench/load.ts", [
      "--dir",
      micro!,
      "--reads-only",
      "--reads",
      "2",
      "--runs",
      "1",
    ]);
    assert.equal(reads.code, 0, reads.stderr);
    assert.deepEqual(reads.json.map((l) => [l.reads, l.bytes]), [[2, loads[0].bytes]]);
    const bad = await runScript("bench/load.ts", ["--dir", micro!, "--read-ahead=0,-1"]);
    assert.equal(bad.code, 2);
    assert.match(bad.stderr, /--read-ahead must be a whole number >= 0, got "-1"/);
  },
);
