// planner/live.ts: measured descriptors (the `status --json` shape) to a planner Cluster; and the cost
// model's per-layer overhead, which a node's measured dispatch cost feeds.
import assert from "node:assert/strict";
import {
  compileHfConfig,
  evaluateAssignment,
  gbpsAt,
  liveCluster,
  type LiveDescriptor,
  liveLinks,
  liveNode,
  NODE_DEFAULTS,
  parseCluster,
  planPipeline,
  printCluster,
} from "../../planner/mod.ts";
import { tinyLlamaConfig } from "../support/tiny_llama.ts";

const desc = (o: Partial<LiveDescriptor> = {}): LiveDescriptor => ({
  measured_at: "2026-11-30T00:00:00.000Z",
  memory_bytes: 4 * 2 ** 30,
  read_gbps: 4,
  read_gbps_by_width: { "64": 1, "1024": 3, "4096": 4 },
  dispatch_ms: 0.05,
  readback_ms: 0.25,
  links: {},
  ...o,
});

Deno.test("gbpsAt: log-interpolated between measured widths, clamped at the ends", () => {
  const d = desc();
  assert.equal(gbpsAt(d, 32), 1);
  assert.equal(gbpsAt(d, 64), 1);
  assert.ok(Math.abs(gbpsAt(d, 256)! - 2) < 1e-12); // halfway in log between 64 and 1024
  assert.equal(gbpsAt(d, 8192), 4);
  assert.equal(gbpsAt(d, undefined), 4);
  assert.equal(gbpsAt(desc({ read_gbps_by_width: {} }), 256), 4);
});

Deno.test("liveNode: what was measured replaces the defaults, in the planner's units", () => {
  const n = liveNode({ id: "a", descriptor: desc() }, {
    width: 1024,
    layerDispatches: 5,
    reserveBytes: 1 << 26,
  });
  assert.deepEqual(n, {
    id: "a",
    reserveBytes: 1 << 26,
    memBytes: 4 * 2 ** 30,
    memBandwidth: 3e9,
    overhead: 250e-6,
    layerOverhead: 250e-6,
  });
  assert.deepEqual(liveNode({ id: "b" }), { id: "b" });
  // Not measured yet: the memory figure it has (its cap or adapter limit), defaults for the rest.
  const pending = liveNode({
    id: "c",
    descriptor: desc({
      measured_at: null,
      read_gbps: null,
      dispatch_ms: null,
      readback_ms: null,
      memory_bytes: 8e9,
    }),
  });
  assert.deepEqual(pending, { id: "c", memBytes: 8e9 });
});

Deno.test("liveLinks: one link per measured pair, half the larger end's round trip, members only", () => {
  const links = liveLinks([
    { id: "a", descriptor: desc({ links: { b: { rtt_ms: 2, mbps: null }, z: { rtt_ms: 1, mbps: null } } }) },
    { id: "b", descriptor: desc({ links: { a: { rtt_ms: 4, mbps: 80 } } }) },
    { id: "c", descriptor: desc({ links: { a: { rtt_ms: 50, mbps: null } } }) },
  ]);
  assert.deepEqual(links, [
    { a: "a", b: "b", latency: 2e-3, bandwidth: 10e6 },
    { a: "a", b: "c", latency: 25e-3, bandwidth: 125e6 },
  ]);
});

Deno.test("liveCluster: prints and parses back exactly (layer_overhead in the language)", () => {
  const c = liveCluster([
    { id: "a", descriptor: desc() },
    { id: "b", descriptor: desc({ links: { a: { rtt_ms: 0.9, mbps: null } } }) },
  ], { width: 64 });
  const text = printCluster(c);
  assert.match(text, /layer_overhead = 250 us/);
  assert.deepEqual(parseCluster(text), c);
  assert.equal(NODE_DEFAULTS.layerOverhead, 0);
});

const config = tinyLlamaConfig(8);

Deno.test("cost model: a stage whose bytes fit the node's cache reads at the cache's rate", () => {
  const model = compileHfConfig(config);
  const d = desc({
    cache_bytes: 2 ** 20,
    cached_gbps_by_width: { "64": 10 },
    read_gbps_by_width: { "64": 1 },
  });
  const n = liveNode({ id: "a", descriptor: d }, { width: 64 });
  assert.equal(n.cacheBytes, 2 ** 20);
  assert.equal(n.cacheBandwidth, 10e9);
  const c = liveCluster([{ id: "a", descriptor: d }], { width: 64 });
  const ev = (end: number) =>
    evaluateAssignment(model, c, { stages: [{ node: "a", start: 0, end }] }, {
      context: 16,
      dtype: model.dtype,
    })
      .stages[0];
  const small = ev(1), big = ev(8);
  assert.ok(small.bytesRead <= 2 ** 20 && big.bytesRead > 2 ** 20);
  assert.ok(Math.abs(small.computeS - small.bytesRead / 10e9) < 1e-15);
  assert.ok(Math.abs(big.computeS - big.bytesRead / 1e9) < 1e-15);
  assert.match(printCluster(c), /cache = 1 MiB; cache_bw = 10 GB\/s/);
  // Two nodes on one machine evict each other's weights: neither keeps its cache; a third alone does.
  const shared = liveCluster([
    { id: "a", descriptor: d, host: "box" },
    { id: "b", descriptor: d, host: "box" },
    { id: "c", descriptor: d, host: "other" },
  ], { width: 64 });
  assert.deepEqual(shared.nodes.map((x) => x.cacheBytes), [0, 0, 2 ** 20]);
});

Deno.test("cost model: each layer a stage holds costs its node's layer overhead; the DP weighs it", () => {
  const model = compileHfConfig(config);
  const c = liveCluster([
    { id: "cheap", descriptor: desc({ dispatch_ms: 0.01 }) },
    { id: "dear", descriptor: desc({ dispatch_ms: 1 }) },
  ], { constraints: { order: ["cheap", "dear"] } });
  const ev = evaluateAssignment(model, c, {
    stages: [{ node: "cheap", start: 0, end: 5 }, { node: "dear", start: 5, end: 8 }],
  }, { context: 16, dtype: model.dtype });
  assert.ok(Math.abs(ev.stages[0].overheadS - (250e-6 + 5 * 50e-6)) < 1e-12);
  assert.ok(Math.abs(ev.stages[1].overheadS - (250e-6 + 3 * 5e-3)) < 1e-12);
  // The dear node's layers cost 5 ms each: it keeps one, the cheap node takes the rest.
  const plan = planPipeline(model, c, { context: 16 });
  assert.deepEqual(plan.stages.map((s) => [s.node, s.layers]), [["cheap", [0, 7]], ["dear", [7, 8]]]);
});
