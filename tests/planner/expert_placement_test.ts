// V2 expert placement and the fan-out term: ids as ranges, the cost model against hand arithmetic and
// brute force, compact placement (contiguous, few destinations), wide placement (every layer on >= 2
// nodes, every node hosting), memory caps, routing counts (busiest experts nearest, hot replicas).
import assert from "node:assert/strict";
import {
  clusterFromNodes,
  compileHfConfig,
  type ModelGraph,
  planPipeline,
  routingShares,
} from "../../planner/mod.ts";
import {
  evaluateAssignment,
  expectedFanout,
  expertsWhenHit,
  SPLIT_READBACKS,
} from "../../planner/evaluate.ts";
import { apportion, placeExperts } from "../../planner/expert_placement.ts";
import { formatIds, fromRanges, toRanges } from "../../planner/expert_ranges.ts";
import type { DTypeBytes } from "../../planner/model_graph.ts";
import { int, rng } from "./random.ts";

const GB = 1e9;
const DT: DTypeBytes = { dense: 1, experts: 1, embed: 1, kv: 1, activation: 2 };

/** `layers` layers of a small attention plus a MoE of `experts` experts of 1 GB each (1 byte per weight). */
function moeModel(layers: number, experts: number, topK: number): ModelGraph {
  return {
    name: "toy-moe",
    family: "test",
    hidden: 1000,
    vocab: 1000,
    dtype: DT,
    embedParams: 1e6,
    headParams: 1e6,
    tied: false,
    layers: Array.from({ length: layers }, () => ({
      ops: [
        { kind: "attention", variant: "gqa", params: 1e6, kvPerToken: 0, flops: 2e6, ctxFlops: 0 },
        {
          kind: "moe",
          experts,
          topK,
          expertParams: GB,
          routerParams: 0,
          shared: 0,
          sharedParams: 0,
          flops: 2 * topK * GB,
        },
      ],
    })),
  };
}

/** Ranges per (layer, host) of a placement. */
const rangesOf = (placed: Map<number, Map<string, number[]>>) =>
  [...placed].flatMap(([l, hosts]) => [...hosts].map(([h, ids]) => ({ l, h, ranges: toRanges(ids) })));

Deno.test("toRanges / fromRanges / formatIds: runs of ids, any order, duplicates merged; bad ids refused", () => {
  assert.deepEqual(toRanges([7, 0, 2, 1, 2]), [[0, 3], [7, 8]]);
  assert.deepEqual(toRanges([]), []);
  assert.deepEqual(fromRanges([[0, 3], [7, 8], [2, 4]]), [0, 1, 2, 3, 7]);
  assert.equal(formatIds([0, 1, 2, 7, 9, 10]), "0-2,7,9-10");
  for (let t = 0; t < 50; t++) {
    const r = rng(t);
    const ids = [...new Set(Array.from({ length: int(r, 0, 40) }, () => int(r, 0, 63)))].sort((a, b) =>
      a - b
    );
    assert.deepEqual(fromRanges(toRanges(ids)), ids);
  }
  assert.throws(() => toRanges([1, -1]), RangeError);
  assert.throws(() => toRanges([1.5]), RangeError);
  assert.throws(() => fromRanges([[3, 3]]), RangeError);
});

Deno.test("apportion: proportional, every part >= 1, sums to the total", () => {
  assert.deepEqual(apportion(16, [1, 1]), [8, 8]);
  assert.deepEqual(apportion(8, [1, 1, 1]), [3, 3, 2]);
  assert.deepEqual(apportion(10, [3, 1]), [7, 3]);
  assert.deepEqual(apportion(3, [100, 1, 1]), [1, 1, 1]);
});

Deno.test("expectedFanout is exact for constant costs: brute force over every sequence of k picks", () => {
  for (let t = 0; t < 40; t++) {
    const r = rng(100 + t);
    const H = int(r, 1, 4), k = int(r, 1, 4);
    const raw = Array.from({ length: H + 1 }, () => r() + 0.05); // the last one: local, costs 0
    const sum = raw.reduce((a, b) => a + b, 0);
    const shares = raw.map((x) => x / sum);
    const costs = Array.from({ length: H }, () => r() * 10);
    let brute = 0;
    const walk = (depth: number, p: number, worst: number) => {
      if (depth === k) return void (brute += p * worst);
      for (let i = 0; i <= H; i++) walk(depth + 1, p * shares[i], Math.max(worst, i < H ? costs[i] : 0));
    };
    walk(0, 1, 0);
    const got = expectedFanout(costs, shares.slice(0, H), k);
    assert.ok(Math.abs(got - brute) <= 1e-9 * (1 + brute), `instance ${t}: ${got} vs ${brute}`);
  }
  assert.equal(expertsWhenHit(0, 8), 1);
  assert.equal(expertsWhenHit(1, 8), 8);
  assert.ok(Math.abs(expertsWhenHit(0.5, 2) - 4 / 3) < 1e-12);
});

Deno.test("the fan-out term per MoE layer: readbacks, then the slowest destination's wire + compute, by hand", () => {
  // One layer, experts 0 on the stage s and 1 on h. Link 1 ms, 1 MB/s: an activation (1000 x 2 bytes) takes
  // 2 ms each way; h's overhead 0.5 ms, s's 0.2 ms; one expert (1 GB) read at 1 TB/s: 1 ms. The stage reads
  // back the routing (SPLIT_READBACKS x 0.2 ms), then waits for both: its own share runs as a step of its own
  // (0.2 ms + its experts), h's costs the round trip, the wire and h's overhead + its experts.
  const model = moeModel(1, 2, 1);
  const cluster = clusterFromNodes([
    { id: "s", memBytes: 100 * GB, overhead: 0.2e-3, memBandwidth: 1e12, flops: 1e18, up: 1e9, down: 1e9 },
    { id: "h", memBytes: 100 * GB, overhead: 0.5e-3, memBandwidth: 1e12, flops: 1e18, up: 1e9, down: 1e9 },
  ], { links: [{ a: "s", b: "h", latency: 1e-3, bandwidth: 1e6 }] });
  const experts = new Map([[0, new Map([["s", [0]], ["h", [1]]])]]);
  const at = (k: number, load?: number[]) => {
    const m = moeModel(1, 2, k);
    const a = {
      stages: [{ node: "s", start: 0, end: 1 }],
      experts,
      ...(load ? { load: new Map([[0, load]]) } : {}),
    };
    return evaluateAssignment(m, cluster, a, { context: 1, dtype: DT }).stages[0].fanoutByLayer.get(0)!;
  };
  const readbacks = SPLIT_READBACKS * 0.2e-3, fixed = 2e-3 + 4e-3 + 0.5e-3, own = 0.2e-3;
  const near = (a: number, b: number) => Math.abs(a - b) < 1e-12;
  // k = 1: h is hit half the time and then runs one expert; otherwise the stage's own expert is the wait.
  assert.ok(near(at(1), readbacks + (fixed + 1e-3) * 0.5 + (own + 1e-3) * 0.5), `${at(1)}`);
  // k = 2: h hit with probability 3/4, running 4/3 experts on average when hit; else s is the wait, costed
  // at its own conditional mean of 4/3 experts (the model's approximation; it runs both then).
  assert.ok(
    near(at(2), readbacks + (fixed + (4 / 3) * 1e-3) * 0.75 + (own + (4 / 3) * 1e-3) * 0.25),
    `${at(2)}`,
  );
  // Routing counts weigh the destinations: h holds 10% of the picks.
  assert.ok(near(at(1, [0.9, 0.1]), readbacks + (fixed + 1e-3) * 0.1 + (own + 1e-3) * 0.9));
  // All experts on the stage: no fan-out at all (they run in the stage's own step).
  const local = evaluateAssignment(model, cluster, {
    stages: [{ node: "s", start: 0, end: 1 }],
    experts: new Map([[0, new Map([["s", [0, 1]]])]]),
  }, { context: 1, dtype: DT }).stages[0];
  assert.equal(local.fanoutS, 0);
  assert.equal(local.fanoutByLayer.size, 0);
});

Deno.test("compact placement: few destinations per layer, one range per remote host", () => {
  // Kimi K2 with 8-bit experts: a layer's experts (16.9 GB) exceed every 12 GB node.
  const model = compileHfConfig(
    JSON.parse(Deno.readTextFileSync(new URL("./data/kimi-k2.json", import.meta.url))),
    { dtype: { experts: 1 } },
  );
  const cluster = clusterFromNodes(
    Array.from(
      { length: 100 },
      (_, i) => ({ id: `g${i}`, memBytes: 12 * 2 ** 30, region: i < 50 ? "a" : "b" }),
    ),
    {
      defaultLink: { latency: 0.03, bandwidth: 1e8 },
      links: [{ a: "a", b: "a", latency: 1e-3, bandwidth: 1e8 }],
    },
  );
  const plan = planPipeline(model, cluster, { experts: "spread" });
  const stageOf = (l: number) => plan.stages.find((s) => l >= s.layers[0] && l < s.layers[1])!.node;
  const placed = new Map<number, Map<string, number[]>>();
  for (const s of plan.stages) {
    for (const [l, ids] of Object.entries(s.experts ?? {})) {
      placed.set(Number(l), new Map(ids.length ? [[s.node, ids]] : []));
    }
  }
  for (const h of plan.expertHosts) {
    for (const [l, ids] of Object.entries(h.experts)) placed.get(Number(l))!.set(h.node, ids);
  }
  // A helper holds floor(11 GiB / 44 MB) = 268 experts: the fewest destinations a layer can have is
  // ceil(remote / 268); filling one node after another may straddle one more.
  const eb = 3 * 7168 * 2048, room = Math.floor((11 * 2 ** 30) / eb);
  for (const [l, hosts] of placed) {
    const remote = 384 - (hosts.get(stageOf(l))?.length ?? 0);
    const destinations = [...hosts.keys()].filter((h) => h !== stageOf(l)).length;
    assert.ok(destinations <= Math.ceil(remote / room) + 1, `layer ${l} fans out to ${destinations} nodes`);
    const all = [...hosts.values()].flat().sort((a, b) => a - b);
    assert.deepEqual(all, Array.from({ length: 384 }, (_, i) => i), `layer ${l}: each expert exactly once`);
  }
  for (const { l, h, ranges } of rangesOf(placed)) {
    assert.ok(ranges.length <= (h === stageOf(l) ? 2 : 1), `layer ${l} on ${h}: ${JSON.stringify(ranges)}`);
  }
  // The per-layer fan-out term adds up to the stages' fan-out.
  const perLayer = Object.values(plan.predicted.layerFanoutMs ?? {}).reduce((a, b) => a + b, 0);
  const perStage = plan.predicted.stages.reduce((a, s) => a + s.fanoutMs, 0);
  assert.ok(perLayer > 0 && Math.abs(perLayer - perStage) < 1e-9 * perStage);
});

Deno.test("compact placement prefers near nodes, and fills each before the next", () => {
  const model = moeModel(1, 8, 2);
  const cluster = clusterFromNodes([
    { id: "s", memBytes: 3.5 * GB, reserveBytes: 0 },
    { id: "far", memBytes: 20 * GB, reserveBytes: 0 },
    { id: "near", memBytes: 3.5 * GB, reserveBytes: 0 },
  ], {
    defaultLink: { latency: 20e-3, bandwidth: 1e8 },
    links: [{ a: "s", b: "near", latency: 1e-3, bandwidth: 1e8 }],
  });
  const stages = [{ node: "s", start: 0, end: 1 }];
  const placed = placeExperts(model, cluster, stages, { context: 1, dtype: DT });
  assert.deepEqual(Object.fromEntries(placed.get(0)!), { s: [0, 1, 2], near: [3, 4, 5], far: [6, 7] });
});

Deno.test("routing counts: the busiest experts go nearest, which lowers the predicted fan-out", () => {
  const model = moeModel(1, 8, 2);
  const cluster = clusterFromNodes([
    { id: "s", memBytes: 3.5 * GB, reserveBytes: 0 },
    { id: "far", memBytes: 20 * GB, reserveBytes: 0 },
    { id: "near", memBytes: 3.5 * GB, reserveBytes: 0 },
  ], {
    defaultLink: { latency: 20e-3, bandwidth: 1e8 },
    links: [{ a: "s", b: "near", latency: 1e-3, bandwidth: 1e8 }],
  });
  const stages = [{ node: "s", start: 0, end: 1 }];
  const load = routingShares(model, { "0": [1, 1, 1, 1, 1, 1, 30, 20] });
  const aware = placeExperts(model, cluster, stages, { context: 1, dtype: DT, load });
  assert.deepEqual(Object.fromEntries(aware.get(0)!), { s: [0, 6, 7], near: [1, 2, 3], far: [4, 5] });
  const blind = placeExperts(model, cluster, stages, { context: 1, dtype: DT });
  const cost = (experts: Map<number, Map<string, number[]>>) =>
    evaluateAssignment(model, cluster, { stages, experts, load }, { context: 1, dtype: DT }).tokenS;
  assert.ok(cost(aware) < 0.5 * cost(blind), `${cost(aware)} vs ${cost(blind)}`);
});

Deno.test("wide placement: every MoE layer on >= 2 nodes, its stage included, every node hosting", () => {
  const model = moeModel(3, 16, 4);
  const ids = ["n0", "n1", "n2", "n3", "n4"];
  const cluster = clusterFromNodes(ids.map((id) => ({ id, memBytes: 100 * GB })));
  const stages = [{ node: "n2", start: 0, end: 1 }, { node: "n3", start: 1, end: 2 }, {
    node: "n4",
    start: 2,
    end: 3,
  }];
  const placed = placeExperts(model, cluster, stages, { context: 1, dtype: DT, spread: "wide" });
  const hosting = new Set<string>();
  for (const [l, hosts] of placed) {
    assert.ok(hosts.size >= 2, `layer ${l}`);
    assert.ok(hosts.has(stages[l].node), `layer ${l} keeps some experts on its stage`);
    assert.deepEqual(
      [...hosts.values()].flat().sort((a, b) => a - b),
      Array.from({ length: 16 }, (_, i) => i),
    );
    for (const h of hosts.keys()) hosting.add(h);
  }
  assert.deepEqual([...hosting].sort(), ids);
  for (const { ranges } of rangesOf(placed)) assert.equal(ranges.length, 1);
  // Without any flag the same experts would stay on their stages.
  const compact = placeExperts(model, cluster, stages, { context: 1, dtype: DT });
  for (const [l, hosts] of compact) assert.deepEqual([...hosts.keys()], [stages[l].node]);
});

Deno.test("wide placement splits evenly whatever the measured bandwidths (a flaky layout before)", () => {
  const model = moeModel(1, 16, 4);
  const cluster = clusterFromNodes([
    { id: "s", memBytes: 100 * GB, memBandwidth: 80e9 },
    { id: "slow", memBytes: 100 * GB, memBandwidth: 10e9 },
  ]);
  const placed = placeExperts(model, cluster, [{ node: "s", start: 0, end: 1 }], {
    context: 1,
    dtype: DT,
    spread: "wide",
  }).get(0)!;
  assert.deepEqual([...placed.values()].map((ids) => ids.length), [8, 8]);
});

Deno.test("wide placement respects memory: a host with room for one expert takes one, the rest go elsewhere", () => {
  const model = moeModel(1, 8, 2);
  const cluster = clusterFromNodes([
    { id: "s", memBytes: 100 * GB, reserveBytes: 0 },
    { id: "tiny", memBytes: 1.5 * GB, reserveBytes: 0 },
    { id: "big", memBytes: 100 * GB, reserveBytes: 0 },
  ]);
  const stages = [{ node: "s", start: 0, end: 1 }];
  const placed = placeExperts(model, cluster, stages, { context: 1, dtype: DT, spread: "wide" }).get(0)!;
  assert.equal(placed.get("tiny")!.length, 1);
  assert.deepEqual([...placed.values()].flat().sort((a, b) => a - b), [0, 1, 2, 3, 4, 5, 6, 7]);
  const e = evaluateAssignment(model, cluster, { stages, experts: new Map([[0, placed]]) }, {
    context: 1,
    dtype: DT,
  });
  for (const [id, m] of e.nodes) {
    assert.ok(m.weights + m.kv <= m.capacity - m.reserve, `${id} over capacity`);
  }
});

Deno.test("hot experts get replicas where memory allows (a wide layer keeps its cold experts spread)", () => {
  const model = moeModel(1, 8, 2);
  const cluster = clusterFromNodes([{ id: "s", memBytes: 100 * GB }, { id: "h", memBytes: 100 * GB }]);
  const stages = [{ node: "s", start: 0, end: 1 }];
  const plain = placeExperts(model, cluster, stages, { context: 1, dtype: DT, spread: "wide" }).get(0)!;
  assert.deepEqual(Object.fromEntries(plain), { s: [0, 1, 2, 3], h: [4, 5, 6, 7] });
  const load = routingShares(model, { "0": [1, 1, 1, 1, 1, 1, 10, 1] });
  const hot = placeExperts(model, cluster, stages, { context: 1, dtype: DT, spread: "wide", load }).get(0)!;
  assert.deepEqual(Object.fromEntries(hot), { s: [0, 1, 2, 3, 6], h: [4, 5, 6, 7] });
  // The wait for the destinations (the readbacks before it are the same either way).
  const fan = (p: Map<string, number[]>) =>
    evaluateAssignment(model, cluster, { stages, experts: new Map([[0, p]]), load }, {
      context: 1,
      dtype: DT,
    })
      .stages[0].fanoutS - SPLIT_READBACKS * cluster.nodes[0].overhead;
  // (The stage's own share is a destination too, costing its step and its experts: the replica saves ~20%.)
  assert.ok(fan(hot) < 0.85 * fan(plain), `${fan(hot)} vs ${fan(plain)}`);
});

Deno.test("routing counts that do not fit the model are a RangeError naming the layer", () => {
  const model = moeModel(2, 4, 1);
  model.layers[1] = { ops: [{ kind: "mlp", params: 1, flops: 2 }] };
  assert.throws(() => routingShares(model, { "1": [1, 1, 1, 1] }), /layer "1": not a MoE layer/);
  assert.throws(() => routingShares(model, { "0": [1, 1] }), /layer 0: expected 4 counts/);
  assert.throws(() => routingShares(model, { "0": [1, 1, -1, 1] }), /finite numbers >= 0/);
  assert.throws(() => routingShares(model, { "0": [0, 0, 0, 0] }), /all zero/);
  assert.deepEqual(routingShares(model, { "0": [1, 1, 2, 0] }).get(0), [0.25, 0.25, 0.5, 0]);
});
