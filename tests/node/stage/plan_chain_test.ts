// planChain: the leader's Plan for N nodes, from the planner's DP, with the embedding and head split off
// when there are more nodes than layers, and idle nodes beyond layers + 2.
import assert from "node:assert/strict";
import { planChain, rolesOf } from "../../../node/stage/mod.ts";
import { PlacementError } from "../../../planner/mod.ts";

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
