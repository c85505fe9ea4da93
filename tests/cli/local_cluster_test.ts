// When `--local` measures this machine's GPU again rather than reuse its kept measurement
// (cli/local_cluster.ts gpuMemoryTakenSince).
import assert from "node:assert/strict";
import { join } from "node:path";
import { gpuMemoryTakenSince } from "../../cli/local_cluster.ts";
import type { NodeMeasurement } from "../../node/membership/mod.ts";

function measurement(at: number, memoryBound: NodeMeasurement["memoryBound"]): NodeMeasurement {
  return {
    at,
    memoryBytes: 80 * 2 ** 30,
    memoryCapBytes: 0,
    memoryBound,
    readGbps: [[4096, 2000]],
    cachedGbps: [[4096, 4000]],
    cacheBytes: 0,
    readWeights: "f16",
    timestamps: true,
    dispatchMs: 0.003,
    readbackMs: 0.05,
    encodeLayerMs: 0.01,
    tookMs: 5000,
  };
}

Deno.test("a kept GPU measurement is doubted when a swactor node started after it still runs", async () => {
  const before = Deno.env.get("SWACTOR_STATE_DIR");
  const state = await Deno.makeTempDir({ prefix: "swactor-local-test-" });
  // A process whose command line names swactor stands for a node that still runs.
  const live = new Deno.Command("bash", { args: ["-c", "sleep 60; :", "swactor-node"] }).spawn();
  try {
    Deno.env.set("SWACTOR_STATE_DIR", state);
    const nodes = join(state, "nodes");
    await Deno.mkdir(nodes, { recursive: true });
    const record = (pid: number, startedAt: number) =>
      Deno.writeTextFile(
        join(nodes, `${pid}.json`),
        JSON.stringify({
          pid,
          api: "127.0.0.1:1",
          token: "t",
          id: "n",
          startedAt: new Date(startedAt).toISOString(),
        }),
      );
    const t = performance.timeOrigin - 60_000; // measured a minute before this process started
    await record(999999999, t + 1000); // started since, but gone: not counted, and its record removed
    assert.equal(await gpuMemoryTakenSince(measurement(t, "device")), undefined);
    assert.deepEqual([...Deno.readDirSync(nodes)], [], "the stale record is removed");

    await record(live.pid, t - 1000); // started before the measurement: what it holds was measured
    assert.equal(await gpuMemoryTakenSince(measurement(t, "device")), undefined);

    await record(live.pid, t + 1000); // started since, and runs
    const why = await gpuMemoryTakenSince(measurement(t, "device"));
    assert.match(
      why ?? "",
      new RegExp(`^1 swactor node process \\(pid ${live.pid}\\) started since the last`),
    );
    // A software adapter's memory is the host's: no reason to measure it again.
    assert.equal(await gpuMemoryTakenSince(measurement(t, "host")), undefined);
  } finally {
    live.kill("SIGKILL");
    await live.status;
    if (before === undefined) Deno.env.delete("SWACTOR_STATE_DIR");
    else Deno.env.set("SWACTOR_STATE_DIR", before);
    await Deno.remove(state, { recursive: true });
  }
});
