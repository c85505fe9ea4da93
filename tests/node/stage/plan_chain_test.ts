// planChain: the leader's Plan for N nodes, from the planner's DP, with the embedding and head split off
// when there are more nodes than layers, and idle nodes beyond layers + 2; MoE experts local or spread.
import assert from "node:assert/strict";
import { planChain, rolesOf } from "../../../node/stage/mod.ts";
import { PlacementError, toRanges } from "../../../planner/mod.ts";

const config = (layers: number) => ({
  model_type: "llama",
  architectures: ["LlamaForCausalLM"],
  vocab_size: 512,
  hidden_size: 64,
  intermediate_size: 160,
  num_hidden_layers: layers,
  num_attention_heads: 4,
  num_key_value_heads: 4,
  max_position_embeddings: 4096,
  torch_dtype: "float32",
});
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
