// planPipeline end to end: the examples plan, constraints are obeyed, infeasible inputs name the failing
// constraint, experts spread when stages cannot hold them, and live node descriptors build a cluster.
import assert from "node:assert/strict";
import {
  clusterFromNodes,
  compileHfConfig,
  parseCluster,
  PlacementError,
  PLAN_FORMAT_VERSION,
  planPipeline,
} from "../../planner/mod.ts";

const data = (name: string) =>
  compileHfConfig(JSON.parse(Deno.readTextFileSync(new URL(`./data/${name}.json`, import.meta.url))), {
    name,
  });
const example = (name: string) =>
  parseCluster(Deno.readTextFileSync(new URL(`../../planner/examples/${name}.swl`, import.meta.url)), {
    file: name,
  });

function placementError(f: () => unknown, constraint: string, text: string) {
  assert.throws(f, (e) => {
    assert.ok(e instanceof PlacementError, String(e));
    assert.equal(e.constraint, constraint, e.message);
    assert.ok(e.message.includes(text), e.message);
    return true;
  });
}

Deno.test("Kimi K2 fits the WAN fleet with 4-bit experts; stages cover every layer once; memory fits", () => {
  const model = compileHfConfig(
    JSON.parse(Deno.readTextFileSync(new URL("../../planner/examples/kimi-k2/config.json", import.meta.url))),
  );
  const plan = planPipeline(model, example("kimi_fleet"));
  assert.equal(plan.version, PLAN_FORMAT_VERSION);
  assert.equal(plan.model.dtypeBytes.experts, 0.5625);
  let next = 0;
  for (const s of plan.stages) {
    assert.equal(s.layers[0], next);
    next = s.layers[1];
    for (const l of Object.keys(s.experts ?? {})) {
      assert.ok(Number(l) >= s.layers[0] && Number(l) < s.layers[1]);
    }
  }
  assert.equal(next, 61);
  for (const n of plan.nodes) assert.ok(n.memory.free >= 0, `${n.id} over capacity`);
  assert.ok(plan.predicted.tokS > 0.5 && plan.predicted.tokS < 20, `tok/s ${plan.predicted.tokS}`);
  // Consecutive stages stay inside the cheapest region rather than crossing the Atlantic.
  assert.ok(plan.stages.every((s) => !s.node.startsWith("useast")));
});

Deno.test("Llama 3.2 1B: the examples plan and the JSON round-trips", () => {
  for (const c of ["lan5", "home"]) {
    const plan = planPipeline(data("llama-3.2-1b"), example(c));
    assert.deepEqual(JSON.parse(JSON.stringify(plan)), plan);
    assert.equal(plan.stages[0].embeds, true);
    assert.equal(plan.stages.at(-1)!.head, true);
  }
});

Deno.test("pins, exclude and order are obeyed", () => {
  const c = example("lan5");
  c.constraints.pins.push({ start: 10, end: 16, node: "n3" });
  c.constraints.exclude.push("n1");
  const plan = planPipeline(data("llama-3.2-1b"), c);
  const s = plan.stages.find((x) => x.node === "n3")!;
  assert.ok(s.layers[0] <= 10 && s.layers[1] === 16);
  assert.ok(plan.stages.every((x) => x.node !== "n1"));
  const o = example("lan5");
  o.constraints.order = ["n5", "n4", "n3", "n2", "n1"];
  assert.deepEqual(planPipeline(data("llama-3.2-1b"), o).stages.map((x) => x.node), o.constraints.order);
});

Deno.test("infeasible inputs raise PlacementError naming the constraint", () => {
  const small = clusterFromNodes([{ id: "a", memBytes: 2 * 2 ** 30 }, { id: "b", memBytes: 2 * 2 ** 30 }]);
  placementError(
    () => planPipeline(data("mixtral-8x7b"), small),
    "memory of layer 0",
    "the largest node, a, has",
  );
  const pinned = clusterFromNodes([{ id: "a", memBytes: 6 * 2 ** 30 }, { id: "b", memBytes: 6 * 2 ** 30 }], {
    constraints: { pins: [{ start: 0, end: 16, node: "a" }] },
  });
  placementError(
    () => planPipeline(data("llama-3.2-1b"), pinned, { context: 131072 }),
    "pin on a",
    "node a (5.0 GiB usable) cannot hold its pinned layers 0..16 (5.8 GiB with 128k context)",
  );
  const few = clusterFromNodes(
    Array.from({ length: 3 }, (_, i) => ({ id: `g${i}`, memBytes: 24 * 2 ** 30 })),
  );
  placementError(
    () => planPipeline(data("mixtral-8x7b"), few),
    "total memory",
    "the cluster has 69.0 GiB usable",
  );
  placementError(
    () =>
      planPipeline(
        data("llama-3.2-1b"),
        clusterFromNodes([{ id: "a" }], { constraints: { exclude: ["a"] } }),
      ),
    "exclude",
    "every node is excluded",
  );
});

Deno.test("experts spread to other nodes when no node holds a layer's experts, and fan-out is predicted", () => {
  // Kimi K2 with 8-bit experts: one layer's experts are 16.9 GB, more than any 12 GB node can hold.
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
      constraints: { replicas: [{ layer: 5, expert: 0, nodes: ["g99"] }] },
    },
  );
  placementError(
    () => planPipeline(model, cluster, { experts: "local" }),
    "memory of layer 1",
    "has 11.0 GiB usable",
  );
  const plan = planPipeline(model, cluster);
  assert.equal(plan.expertMode, "spread");
  assert.ok(plan.expertHosts.length > 0);
  assert.ok(plan.predicted.stages.some((s) => s.fanoutMs > 0));
  // Every routed expert of every MoE layer is hosted somewhere, exactly once apart from replicas.
  for (let l = 1; l < 61; l++) {
    const hosted: number[] = [];
    for (const s of plan.stages) hosted.push(...(s.experts?.[l] ?? []));
    for (const h of plan.expertHosts) hosted.push(...(h.experts[l] ?? []));
    const extra = l === 5 ? 1 : 0;
    assert.equal(hosted.length, 384 + extra, `layer ${l}`);
    assert.equal(new Set(hosted).size, 384, `layer ${l}`);
  }
  const replica = plan.expertHosts.find((h) => h.node === "g99")?.experts["5"] ?? [];
  assert.ok(replica.includes(0));
  for (const n of plan.nodes) assert.ok(n.memory.free >= 0, `${n.id} over capacity`);
});

Deno.test("clusterFromNodes validates descriptors", () => {
  assert.throws(() => clusterFromNodes([{ id: "a" }, { id: "a" }]), TypeError);
  assert.throws(() => clusterFromNodes([{ id: "a", memBytes: 0 }]), RangeError);
});
