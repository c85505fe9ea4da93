// planChain: the leader's Plan for N nodes, from the planner's DP on the members' measured descriptors, with
// the embedding and head split off when there are more nodes than layers, and idle nodes beyond layers + 2;
// MoE experts local or spread.
import assert from "node:assert/strict";
import { planChain, predictChain, rolesOf, servedDtype } from "../../../node/stage/mod.ts";
import { compileHfConfig, type LiveDescriptor, PlacementError, toRanges } from "../../../planner/mod.ts";
import { tinyLlamaConfig } from "../../support/tiny_llama.ts";

const config = (layers: number) => tinyLlamaConfig(layers);
const members = (n: number) => Array.from({ length: n }, (_, i) => ({ id: `n${i}` }));

Deno.test("planChain: one stage per node, in the members' order, covering every layer", () => {
  for (const n of [1, 2, 3, 4]) {
    const plan = planChain(config(4), members(n));
    assert.deepEqual(plan.stages.map((s) => s.node), members(n).map((m) => m.id));
    const roles = rolesOf(plan, 4); // throws unless the stages form one chain over the layers
    assert.equal(roles.length, n);
    assert.ok(roles.every((r) => r.layers[1] > r.layers[0]));
  }
});

Deno.test("planChain: more nodes than layers: embedding and head become stages, the rest idle", () => {
  const five = planChain(config(4), members(5));
  assert.deepEqual(five.stages.map((s) => [s.layers, s.embeds, s.head]), [
    [[0, 0], true, false],
    [[0, 1], false, false],
    [[1, 2], false, false],
    [[2, 3], false, false],
    [[3, 4], false, true],
  ]);
  const eight = planChain(config(4), members(8));
  assert.equal(eight.stages.length, 6);
  assert.deepEqual(eight.stages.at(-1)!.layers, [4, 4]);
  assert.deepEqual(eight.nodes.filter((n) => n.role === "idle").map((n) => n.id), ["n6", "n7"]);
  rolesOf(eight, 4);
});

Deno.test("planChain: more stages than nodes is a PlacementError", () => {
  assert.throws(() => planChain(config(4), members(2), { stages: 3 }), PlacementError);
});

const fixtureConfig = (name: string) =>
  JSON.parse(Deno.readTextFileSync(new URL(`../../fixtures/${name}/config.json`, import.meta.url)));

/** Per MoE layer: node -> expert ids, from a Plan's stages and expert hosts. */
function hostsByLayer(plan: ReturnType<typeof planChain>): Map<number, Map<string, number[]>> {
  const out = new Map<number, Map<string, number[]>>();
  const add = (node: string, rec: Record<string, number[]> | undefined) => {
    for (const [l, ids] of Object.entries(rec ?? {})) {
      const m = out.get(Number(l)) ?? new Map<string, number[]>();
      if (ids.length) m.set(node, [...(m.get(node) ?? []), ...ids]);
      out.set(Number(l), m);
    }
  };
  for (const s of plan.stages) add(s.node, s.experts);
  for (const h of plan.expertHosts) add(h.node, h.experts);
  return out;
}

Deno.test("planChain experts spread: every MoE layer on >= 2 nodes (its stage's included), every node hosting", () => {
  for (
    const [name, n, experts, moeLayers] of [
      ["kimi-k2-tiny", 5, 16, [1, 2, 3]],
      ["mixtral-tiny", 5, 8, [0, 1, 2, 3]],
      ["mixtral-tiny", 8, 8, [0, 1, 2, 3]],
    ] as const
  ) {
    const what = `${name} on ${n}`;
    const plan = planChain(fixtureConfig(name), members(n), { experts: "spread" });
    rolesOf(plan, 4);
    assert.equal(plan.expertMode, "spread", what);
    const byLayer = hostsByLayer(plan);
    assert.deepEqual([...byLayer.keys()].sort(), [...moeLayers], what);
    const hosting = new Set<string>();
    for (const [l, hosts] of byLayer) {
      const stage = plan.stages.find((s) => l >= s.layers[0] && l < s.layers[1])!.node;
      assert.ok(hosts.size >= 2 && hosts.has(stage), `${what}: layer ${l} on ${[...hosts.keys()]}`);
      const all = [...hosts.values()].flat().sort((a, b) => a - b);
      assert.deepEqual(all, Array.from({ length: experts }, (_, i) => i), `${what}: layer ${l} once each`);
      for (const [h, ids] of hosts) {
        hosting.add(h);
        assert.equal(toRanges(ids).length, 1, `${what}: layer ${l} on ${h} is one range`);
      }
    }
    assert.equal(hosting.size, n, `${what}: every node hosts experts`);
    for (const node of plan.nodes) {
      assert.equal(node.role, plan.stages.some((s) => s.node === node.id) ? "stage" : "experts", what);
    }
  }
});

Deno.test("planChain experts local (the default) keeps each MoE layer's experts on its stage", () => {
  for (const opts of [{}, { experts: "local" as const }]) {
    const plan = planChain(fixtureConfig("kimi-k2-tiny"), members(5), opts);
    assert.equal(plan.expertMode, "local");
    assert.deepEqual(plan.expertHosts, []);
    for (const [l, hosts] of hostsByLayer(plan)) assert.equal(hosts.size, 1, `layer ${l}`);
  }
  // A dense model has nothing to spread.
  const dense = planChain(config(4), members(3), { experts: "spread" });
  assert.equal(dense.expertMode, "local");
  assert.deepEqual(dense.expertHosts, []);
  assert.throws(() => planChain(config(4), members(3), { experts: "wide" as "local" }), RangeError);
});

const measured = (o: { gbps?: number; memory?: number; dispatchMs?: number } = {}): LiveDescriptor => ({
  measured_at: "2026-11-30T00:00:00.000Z",
  memory_bytes: o.memory ?? 8 * 2 ** 30,
  read_gbps: o.gbps ?? 4,
  read_gbps_by_width: { "64": o.gbps ?? 4 },
  dispatch_ms: o.dispatchMs ?? 0.05,
  readback_ms: 0.25,
  links: {},
});

// 8 layers of a model big enough that bytes matter: 0.4 MB of f16 weights a layer at hidden 256.
const big = { ...config(8), hidden_size: 256, intermediate_size: 640, vocab_size: 4096 };
const layerBytes = (o: { context: number }) => {
  // weights (f16) + KV cache (f16 beside f16 weights) of one layer, as the planner counts them
  const h = 256, inter = 640;
  return (4 * h * h + 3 * h * inter + 2 * h) * 2 + 2 * h * 2 * o.context;
};

Deno.test("planChain on measured nodes: the faster node takes more layers", () => {
  const plan = planChain(big, [
    { id: "lead", descriptor: measured({ gbps: 4 }) },
    { id: "slow", descriptor: measured({ gbps: 1 }) },
    { id: "fast", descriptor: measured({ gbps: 8 }) },
  ]);
  const layers = Object.fromEntries(plan.stages.map((s) => [s.node, s.layers[1] - s.layers[0]]));
  assert.equal(plan.stages[0].node, "lead", "the first member keeps stage 0");
  assert.equal(layers.slow, 1, JSON.stringify(layers));
  assert.ok(layers.fast > layers.lead, JSON.stringify(layers));
  rolesOf(plan, 8);
});

Deno.test("planChain on measured nodes: a node's memory caps its layers, and it is kept off the head", () => {
  const reserve = 64 * 2 ** 20;
  const twoLayers = reserve + 2 * layerBytes({ context: 4096 }) + 1000;
  const plan = planChain(big, [
    { id: "lead", descriptor: measured({ gbps: 4 }) },
    { id: "z-small", descriptor: measured({ gbps: 8, memory: twoLayers }) },
    { id: "b", descriptor: measured({ gbps: 4 }) },
  ]);
  const small = plan.stages.find((s) => s.node === "z-small")!;
  assert.equal(small.layers[1] - small.layers[0], 2, JSON.stringify(plan.stages));
  assert.equal(small.head, false);
  // In the members' order z-small would be last and hold the head, which it cannot: the order was searched.
  assert.equal(plan.stages.at(-1)!.node, "b");
  // Equal nodes keep the members' order.
  const even = planChain(big, ["n0", "n1", "n2"].map((id) => ({ id, descriptor: measured() })));
  assert.deepEqual(even.stages.map((s) => s.node), ["n0", "n1", "n2"]);
});

Deno.test("predictChain: the plan's per-token time at a request's context, on current measurements", () => {
  const members = ["n0", "n1", "n2", "n3", "n4"].map((id) => ({
    id,
    descriptor: { ...measured(), links: { n0: { rtt_ms: 50, mbps: null } } } as LiveDescriptor,
  }));
  const plan = planChain(config(4), members); // 5 nodes, 4 layers: an embedding-only first stage
  assert.equal(plan.predicted.stages.length, 5);
  const short = predictChain(config(4), plan, members, { context: 20 });
  const long = predictChain(config(4), plan, members, { context: 4000 });
  assert.ok(long.tokenMs > short.tokenMs, "a longer context reads more KV cache");
  // Each of n1..n4 measured 50 ms to n0: the hops n0 -> n1 and n4 -> n0 cost 25 ms one way each.
  assert.ok(Math.abs(short.stages[0].hopMs - 25) < 0.01, `${short.stages[0].hopMs}`);
  assert.ok(Math.abs(short.stages[4].hopMs - 25) < 0.01, `${short.stages[4].hopMs}`);
  assert.deepEqual(servedDtype({ weights: "f32" }), { dense: 4, experts: 4, embed: 4, kv: 4 });
  // The KV cache (GQA's K and V, MLA's latent rows) is f16 beside f16 / q8 / q4 weights.
  assert.deepEqual(servedDtype({ weights: "auto" }), { dense: 2, experts: 2, embed: 2, kv: 2 });
  assert.equal(servedDtype({ weights: "q4" }).kv, 2);
  // A member without shader-f16 holds auto weights and the KV cache in f32: the Plan counts 4 bytes for all.
  const noF16 = [{ id: "a", descriptor: { ...members[0].descriptor!, read_weights: "f32" as const } }];
  assert.deepEqual(servedDtype({ weights: "auto" }, noF16), { dense: 4, experts: 4, embed: 4, kv: 4 });
  assert.deepEqual(servedDtype({ weights: "q4" }, noF16), {
    dense: 18 / 32,
    experts: 18 / 32,
    embed: 18 / 32,
    kv: 4,
  });
  assert.deepEqual(
    servedDtype({ weights: "q4" }, members),
    servedDtype({ weights: "q4" }),
    "members that read f16: as before",
  );
});

Deno.test("servedDtype: a KV cache type counts its bytes: q8 a row of head_dim int8 values and a scale", async () => {
  const llama = compileHfConfig(config(2)); // head_dim 64 / 4 = 16
  assert.equal(servedDtype({ weights: "q4", kv: "q8" }, [], llama).kv, 20 / 16);
  assert.equal(servedDtype({ weights: "q4", kv: "f32" }, [], llama).kv, 4);
  assert.equal(servedDtype({ weights: "f32", kv: "f16" }, [], llama).kv, 2);
  assert.equal(servedDtype({ weights: "q4", kv: "auto" }, [], llama).kv, 2);
  // Without the model (its head_dim unknown), or where a layer keeps f16 (MLA's latent rows), f16's 2.
  assert.equal(servedDtype({ weights: "q4", kv: "q8" }).kv, 2);
  const kimi = compileHfConfig(
    JSON.parse(await Deno.readTextFile(new URL("../../planner/data/kimi-k2.json", import.meta.url))),
  );
  assert.equal(servedDtype({ weights: "q4", kv: "q8" }, [], kimi).kv, 2);
  // A head_dim of 128: 132 / 128 bytes an element.
  const wide = compileHfConfig({
    ...config(2),
    hidden_size: 512,
    num_attention_heads: 4,
    num_key_value_heads: 2,
  });
  assert.equal(servedDtype({ weights: "q4", kv: "q8" }, [], wide).kv, 132 / 128);
});

Deno.test("planChain: a q8 KV cache leaves the stages about half the f16 cache's bytes", () => {
  const f16 = planChain(config(4), members(2), { weights: "q4", context: 4096 });
  const q8 = planChain(config(4), members(2), { weights: "q4", kv: "q8", context: 4096 });
  const kv = (p: typeof f16) => p.nodes.reduce((s, n) => s + (n.memory?.kv ?? 0), 0);
  assert.ok(kv(f16) > 0);
  assert.equal(kv(q8), kv(f16) * (20 / 16) / 2);
});

Deno.test("predictChain: a spread Plan is predicted with its fan-out (each MoE layer's readbacks and wait)", () => {
  // Before, the request's prediction dropped the Plan's expert placement: it counted every expert as the
  // stage's own and no fan-out, so a spread chain was predicted at the local chain's time (6.9 ms against
  // 16.8 measured for kimi-k2-tiny on 5 processes).
  const members = ["n0", "n1", "n2", "n3", "n4"].map((id) => ({ id, descriptor: measured() }));
  const kimi = fixtureConfig("kimi-k2-tiny");
  const spread = planChain(kimi, members, { experts: "spread" });
  const local = planChain(kimi, members);
  const s = predictChain(kimi, spread, members, { context: 20 });
  const l = predictChain(kimi, local, members, { context: 20 });
  const moeStages = spread.stages.filter((st) => st.layers[1] > Math.max(1, st.layers[0]));
  assert.equal(s.stages.filter((st) => st.fanoutMs > 0).length, moeStages.length);
  assert.ok(l.stages.every((st) => st.fanoutMs === 0));
  assert.ok(s.tokenMs > l.tokenMs, `${s.tokenMs} vs ${l.tokenMs}`);
});
