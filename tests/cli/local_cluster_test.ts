// When `--local` measures this machine's GPU again rather than reuse its kept measurement
// (cli/local_cluster.ts gpuMemoryTakenSince).
import assert from "node:assert/strict";
import { join } from "node:path";
import { gpuMemoryTakenSince } from "../../cli/local_cluster.ts";
import type { NodeMeasurement } from "../../node/membership/mod.ts";
import { withStateDir } from "../support/state_dir.ts";

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
  await withStateDir(async (state, livePid) => {
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

    await record(livePid, t - 1000); // started before the measurement: what it holds was measured
    assert.equal(await gpuMemoryTakenSince(measurement(t, "device")), undefined);

    await record(livePid, t + 1000); // started since, and runs
    const why = await gpuMemoryTakenSince(measurement(t, "device"));
    assert.match(
      why ?? "",
      new RegExp(`^1 swactor node process \\(pid ${livePid}\\) started since the last`),
    );
    // A software adapter's memory is the host's: no reason to measure it again.
    assert.equal(await gpuMemoryTakenSince(measurement(t, "host")), undefined);
  });
});
