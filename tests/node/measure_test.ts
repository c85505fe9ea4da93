// A node's self-measurement (node/measure.ts) on this machine's adapter: bounded in time, memory within the
// cap, bandwidth per width, step costs; the event loop stays free enough for membership meanwhile; the
// measurement travels in the descriptor and is validated on the way in.
import assert from "node:assert/strict";
import { getGpu } from "../../kernels/gpu.ts";
import { measureNode, MEMORY_PROBE_MS } from "../../node/measure.ts";
import { validateDescriptor, validateMeasurement } from "../../node/membership/messages.ts";
import type { Membership, NodeMeasurement } from "../../node/membership/mod.ts";
import { selfMeasure, writeSharedMeasurement } from "../../node/descriptor.ts";
import { gpuAvailable, needs } from "../support/needs.ts";

const hasGpu = await gpuAvailable();
const lockPath = ""; // tests measure without waiting for the machine's turn

Deno.test({
  ...needs("measureNode: bounded, memory within the cap, bandwidth per width, step costs", {
    "a WebGPU adapter": hasGpu,
  }),
  async fn() {
    const gpu = await getGpu();
    const cap = 96 * 2 ** 20;
    const t0 = performance.now();
    const m = await measureNode(gpu, { memoryCap: cap, lockPath, budgetMs: 600 });
    // How long it took depends on the machine (pipelines compile inside it): logged, not asserted. That the
    // probes end by their deadlines is the next test's, with clocks it controls.
    console.log(`measureNode with a 600 ms budget took ${(performance.now() - t0).toFixed(0)} ms`);
    assert.equal(m.memoryBytes, cap);
    assert.equal(m.memoryCapBytes, cap);
    assert.equal(m.memoryBound, "cap");
    assert.deepEqual(m.readGbps.map(([k]) => k), [64, 512, 4096]);
    for (const [, gbps] of m.readGbps) assert.ok(gbps > 0.01 && gbps < 50_000, `${gbps} GB/s`);
    assert.deepEqual(m.cachedGbps.map(([k]) => k), [64, 512, 4096]);
    for (const [, gbps] of m.cachedGbps) assert.ok(gbps > 0.01 && gbps < 100_000, `${gbps} GB/s`);
    // The cache probe's working sets are 8..64 MiB; 0 means no cache effect was seen.
    assert.ok([0, 8, 16, 32, 64].includes(m.cacheBytes / 2 ** 20), `cache ${m.cacheBytes}`);
    // Plausible ranges: they catch a unit slip (seconds for ms, us for ms), not a slow or busy machine.
    assert.ok(m.readbackMs > 0 && m.readbackMs < 500, `readback ${m.readbackMs} ms`);
    assert.ok(m.dispatchMs >= 0 && m.dispatchMs < 50, `dispatch ${m.dispatchMs} ms`);
    assert.ok(m.encodeLayerMs > 0 && m.encodeLayerMs < 50, `encode ${m.encodeLayerMs} ms`);
    assert.equal(m.timestamps, gpu.hasTimestamps);
    assert.ok(Math.abs(m.at - Date.now()) < 60_000);
    assert.deepEqual(validateMeasurement(JSON.parse(JSON.stringify(m))), m);
  },
});

Deno.test({
  ...needs(
    "measureNode: the probes end by the clock: at their minimum past every deadline, at a piece cap when it stands still",
    {
      "a WebGPU adapter": hasGpu,
    },
  ),
  async fn() {
    const gpu = await getGpu();
    const cap = 32 * 2 ** 20;
    // One width: two bandwidth probes and at most three cache-size probes.
    const probes = 2 + 3;
    let reads = 0;
    const racing = () => ++reads * 3_600_000; // every read an hour after the last
    const late = await measureNode(gpu, {
      memoryCap: cap,
      lockPath,
      budgetMs: 600,
      widths: [64],
      clock: racing,
    });
    assert.equal(late.memoryBound, "time");
    assert.equal(late.memoryBytes, 0);
    for (const [, gbps] of [...late.readGbps, ...late.cachedGbps]) assert.ok(gbps > 0, `${gbps} GB/s`);
    // The memory probe's deadline and one check, then per probe its deadline and three checks (two pieces).
    assert.ok(reads <= 2 + 4 * probes, `${reads} clock reads past every deadline`);

    reads = 0;
    const frozen = () => (reads++, 0);
    const stuck = await measureNode(gpu, {
      memoryCap: cap,
      lockPath,
      budgetMs: 600,
      widths: [64],
      clock: frozen,
    });
    assert.equal(stuck.memoryBound, "cap");
    for (const [, gbps] of [...stuck.readGbps, ...stuck.cachedGbps]) assert.ok(gbps > 0, `${gbps} GB/s`);
    // Per probe its deadline and 17 checks (16 pieces, the cap), and the memory probe's reads until the cap.
    assert.ok(reads > 2 * 17 && reads <= 8 + 18 * probes, `${reads} clock reads with the clock frozen`);
  },
});

Deno.test({
  ...needs(
    "measureNode: the memory probe has its own time (memoryMs, default MEMORY_PROBE_MS), not the budget's",
    {
      "a WebGPU adapter": hasGpu,
    },
  ),
  async fn() {
    const gpu = await getGpu();
    const cap = 8 * 2 ** 30; // 32 chunks on a software adapter (256 MiB, not committed), 8 on a GPU (1 GiB)
    let now = 0;
    const clock = () => (now += 100); // each read 100 ms after the last: GPUs take ~25 ms a GiB to commit
    const opts = { memoryCap: cap, lockPath, budgetMs: 600, widths: [64], clock };
    // A tenth of the budget (60 ms, the old limit) would end it at the first check; 10 s reach the cap.
    const m = await measureNode(gpu, opts);
    assert.equal(MEMORY_PROBE_MS, 10_000);
    assert.equal(m.memoryBound, "cap");
    assert.equal(m.memoryBytes, cap);
    now = 0;
    const short = await measureNode(gpu, { ...opts, memoryMs: 250 });
    assert.equal(short.memoryBound, "time");
    assert.ok(short.memoryBytes > 0 && short.memoryBytes < cap, `${short.memoryBytes} bytes`);
  },
});

Deno.test({
  ...needs("measureNode: timers keep running meanwhile (membership answers its pings)", {
    "a WebGPU adapter": hasGpu,
  }),
  async fn() {
    const gpu = await getGpu();
    await measureNode(gpu, { lockPath, budgetMs: 200 }); // every pipeline the next one uses compiled
    let last = performance.now(), worst = 0;
    const timer = setInterval(() => {
      const now = performance.now();
      worst = Math.max(worst, now - last);
      last = now;
    }, 5);
    try {
      await measureNode(gpu, { lockPath, budgetMs: 800 });
    } finally {
      clearInterval(timer);
    }
    // GPU work comes in pieces of ~20 ms; the lan preset's probe timeout is 250 ms.
    console.log(`longest gap between 5 ms timer ticks while measuring: ${worst.toFixed(1)} ms`);
    assert.ok(worst < 250, `the event loop was blocked for ${worst.toFixed(0)} ms`);
  },
});

Deno.test({
  ...needs("measureNode: measurements on one machine take turns (the lock file)", {
    "a WebGPU adapter": hasGpu,
  }),
  async fn() {
    const gpu = await getGpu();
    const path = await Deno.makeTempFile({ prefix: "swactor-measure-lock" });
    try {
      const spans: [number, number][] = [];
      const one = async () => {
        const m = await measureNode(gpu, { lockPath: path, budgetMs: 200, memoryMs: 100, widths: [64] });
        spans.push([m.at - m.tookMs, m.at]);
      };
      await Promise.all([one(), one()]);
      spans.sort((a, b) => a[0] - b[0]);
      assert.ok(spans[1][0] >= spans[0][1] - 2, `overlap: ${JSON.stringify(spans)}`);
    } finally {
      await Deno.remove(path);
    }
  },
});

Deno.test("measureNode: bad options are RangeErrors", async () => {
  const gpu = {} as never; // never reached: options are checked first
  await assert.rejects(() => measureNode(gpu, { memoryCap: -1 }), RangeError);
  await assert.rejects(() => measureNode(gpu, { widths: [12] }), RangeError);
  await assert.rejects(() => measureNode(gpu, { widths: [] }), RangeError);
});

Deno.test("descriptor: a measurement is validated on the way in; unknown or bad fields are dropped or refused", () => {
  const base = { name: "n", version: "0.1.0", adapter: "x", gpuMemoryBytes: 1, addrs: [] };
  const m = {
    at: 1,
    memoryBytes: 2,
    memoryCapBytes: 0,
    memoryBound: "device",
    readGbps: [[64, 1.5], [4096, 3]],
    cachedGbps: [[64, 2.5], [4096, 6]],
    cacheBytes: 16 * 2 ** 20,
    readWeights: "f16",
    timestamps: true,
    dispatchMs: 0.05,
    readbackMs: 0.2,
    encodeLayerMs: 0.004,
    tookMs: 900,
    extra: "dropped",
  };
  const ok = validateDescriptor({ ...base, measuring: true, measured: m });
  assert.ok(ok?.measured);
  assert.equal(ok.measuring, true);
  assert.equal("extra" in ok.measured, false);
  for (
    const bad of [
      { ...m, memoryBound: "lots" },
      { ...m, readGbps: [[4096, 3], [64, 1.5]] }, // widths must ascend
      { ...m, readGbps: [[64, -1]] },
      { ...m, cachedGbps: undefined },
      { ...m, cacheBytes: -1 },
      { ...m, dispatchMs: -1 },
      { ...m, readWeights: "q4" },
      { ...m, at: 1.5 },
    ]
  ) {
    assert.equal(validateDescriptor({ ...base, measured: bad }), undefined, JSON.stringify(bad));
  }
  assert.deepEqual(validateDescriptor({ ...base, measuring: "yes" }), base);
});

/** A membership of one alive member, recording what the node publishes: all selfMeasure touches. */
function oneMember(adapter?: string) {
  const published: Record<string, unknown>[] = [];
  const membership = {
    id: "me",
    member: () => ({
      state: "alive",
      meta: { name: "me", measuring: true, ...(adapter ? { adapter } : {}) },
    }),
    setMetadata: (meta: Record<string, unknown>) => published.push(meta),
  } as unknown as Membership;
  return { membership, published };
}

const sample: NodeMeasurement = {
  at: 1_700_000_000_000,
  memoryBytes: 2 ** 30,
  memoryCapBytes: 0,
  memoryBound: "time",
  readGbps: [[64, 1.5], [4096, 3]],
  cachedGbps: [[64, 2.5], [4096, 6]],
  cacheBytes: 16 * 2 ** 20,
  readWeights: "f16",
  timestamps: false,
  dispatchMs: 0.05,
  readbackMs: 0.2,
  encodeLayerMs: 0.004,
  tookMs: 900,
};

Deno.test("selfMeasure adoptFrom: waits for the leader's file and publishes that measurement (no GPU touched)", async () => {
  const dir = await Deno.makeTempDir({ prefix: "swactor-adopt" });
  try {
    const { membership, published } = oneMember();
    const logs: string[] = [];
    const file = `${dir}/measurement.json`;
    setTimeout(() => writeSharedMeasurement(file, sample), 150); // the leader finishes later
    const got = await selfMeasure(membership, { adoptFrom: file, log: (m) => logs.push(m) });
    assert.deepEqual(got, sample);
    assert.deepEqual(published, [{ name: "me", gpuMemoryBytes: sample.memoryBytes, measured: sample }]);
    assert.match(logs.join("\n"), /adopted the measurement/);
    assert.deepEqual(
      [...Deno.readDirSync(dir)].map((e) => e.name),
      ["measurement.json"],
      "no temporary left",
    );
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test({
  ...needs("selfMeasure adoptFrom: none, garbage, another cap or too long a wait: it measures itself", {
    "a WebGPU adapter": hasGpu,
  }),
  async fn() {
    const dir = await Deno.makeTempDir({ prefix: "swactor-adopt" });
    const quick = { lockPath, budgetMs: 100, memoryMs: 100, widths: [64] }; // memoryMs: a GPU's whole memory takes seconds
    try {
      const cases: [string, (file: string) => Promise<void>][] = [
        ["the leader had none", (f) => writeSharedMeasurement(f, undefined)],
        ["garbage", (f) => Deno.writeTextFile(f, "{not json")],
        ["not a measurement", (f) => Deno.writeTextFile(f, JSON.stringify({ measured: { at: -1 } }))],
        ["another memory cap", (f) => writeSharedMeasurement(f, { ...sample, memoryCapBytes: 2 ** 30 })],
        ["never written", async () => {}],
      ];
      for (const [why, write] of cases) {
        const file = `${dir}/${why.replaceAll(" ", "-")}.json`;
        await write(file);
        const { membership } = oneMember();
        const logs: string[] = [];
        const got = await selfMeasure(membership, {
          ...quick,
          adoptFrom: file,
          adoptWaitMs: 200,
          log: (m) => logs.push(m),
        });
        assert.ok(got && got.at !== sample.at && got.tookMs > 0, why);
        assert.doesNotMatch(logs.join("\n"), /adopted/, why);
      }
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  },
});

Deno.test({
  ...needs(
    "selfMeasure reuse: this machine's recent measurement is published again; old, another adapter, cap or garbage: measured anew",
    {
      "a WebGPU adapter": hasGpu,
    },
  ),
  async fn() {
    const dir = await Deno.makeTempDir({ prefix: "swactor-reuse" });
    const path = `${dir}/state/measurement.json`;
    const quick = { lockPath, budgetMs: 100, memoryMs: 100, widths: [64] }; // memoryMs: a GPU's whole memory takes seconds
    const run = async (
      o: {
        maxAgeMs?: number;
        adapter?: string;
        memoryCap?: number;
        changed?: (m: NodeMeasurement) => Promise<string | undefined>;
      } = {},
    ) => {
      const { membership, published } = oneMember(o.adapter ?? "gpu A");
      const logs: string[] = [];
      const got = await selfMeasure(membership, {
        ...quick,
        memoryCap: o.memoryCap,
        reuse: { path, maxAgeMs: o.maxAgeMs ?? 60_000, changed: o.changed },
        log: (m) => logs.push(m),
      });
      return { got: got!, published, log: logs.join("\n") };
    };
    try {
      const first = await run(); // no file yet (nor its folder): measures and keeps it
      assert.match(first.log, /^measured: /);
      assert.equal((Deno.statSync(path).mode ?? 0) & 0o077, 0, "owner-only");
      const again = await run();
      assert.deepEqual(again.got, first.got, "the kept measurement");
      assert.match(again.log, /^measured \d+ s ago: .*remove it to measure again/);
      assert.deepEqual(again.published, [{
        name: "me",
        adapter: "gpu A",
        gpuMemoryBytes: first.got.memoryBytes,
        measured: first.got,
      }]);
      for (
        const [why, o] of [
          ["too old", { maxAgeMs: -1 }],
          ["another adapter", { adapter: "gpu B" }],
          ["another memory cap", { memoryCap: 2 ** 30 }],
        ] as const
      ) {
        const r = await run(o);
        assert.ok(r.got.at > first.got.at, why);
        assert.match(r.log, /^measured: /, why);
        await Deno.remove(path);
        await run(); // keep one made under the first key again
      }
      const doubted = await run({ changed: () => Promise.resolve("another process took memory") });
      assert.ok(doubted.got.at > first.got.at, "doubted");
      assert.match(doubted.log, /^measuring again: another process took memory\nmeasured: /);
      await Deno.writeTextFile(path, "{not json");
      const garbage = await run();
      assert.ok(garbage.got.at > first.got.at && /^measured: /.test(garbage.log), "garbage");
      assert.deepEqual((await run()).got, garbage.got, "then kept again");
      assert.deepEqual(
        [...Deno.readDirSync(`${dir}/state`)].map((e) => e.name),
        ["measurement.json"],
        "no temporary",
      );
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  },
});
