// planChain: the leader's Plan for N nodes, from the planner's DP on the members' measured descriptors, with
// the embedding and head split off when there are more nodes than layers, and idle nodes beyond layers + 2.
import assert from "node:assert/strict";
import { planChain, predictChain, rolesOf, servedDtype } from "../../../node/stage/mod.ts";
import { type LiveDescriptor, PlacementError } from "../../../planner/mod.ts";

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
  // weights (f16) + KV cache (f32) of one layer, as the planner counts them
  const h = 256, inter = 640;
  return (4 * h * h + 3 * h * inter + 2 * h) * 2 + 2 * h * 4 * o.context;
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
  assert.deepEqual(servedDtype("f32"), { dense: 4, experts: 4, embed: 4, kv: 4 });
  assert.deepEqual(servedDtype("auto"), { dense: 2, experts: 2, embed: 2, kv: 4 });
});
