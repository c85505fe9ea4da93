// Expert names from a Plan: each node's expert set (ranges per layer) registered as a name set makes every
// `moe-expert-{layer}-{idx}` resolve, at every node, to the node the Plan puts it on.
import assert from "node:assert/strict";
import { membershipConfig, test as testPreset } from "../../../node/membership/mod.ts";
import { expertName, expertPlacement, expertSet, planChain } from "../../../node/stage/mod.ts";
import { SimCluster } from "../../support/sim_cluster.ts";

Deno.test("expertSet: a node's ranges per layer; registered, every expert name resolves as the Plan says", () => {
  const config = JSON.parse(
    Deno.readTextFileSync(new URL("../../fixtures/kimi-k2-tiny/config.json", import.meta.url)),
  );
  const c = new SimCluster({ n: 5, config: membershipConfig({}, testPreset) });
  c.joinAll();
  assert.ok(c.clock.runUntilTrue(() => c.converged(), { stepMs: 20, maxMs: 30_000 }) !== undefined);
  const plan = planChain(config, c.nodes.map((n) => ({ id: n.id })), { experts: "spread" });
  for (const n of c.nodes) {
    const set = expertSet(plan, n.id);
    for (const ranges of Object.values(set)) assert.equal(ranges.length, 1, `${n.id}: one range per layer`);
    n.registry.registerSet("moe-expert-", set);
  }
  assert.deepEqual(expertSet(plan, "nobody"), {});
  c.clock.advance(100);
  const placement = expertPlacement(plan);
  assert.deepEqual([...placement.keys()].sort(), [1, 2, 3]);
  for (const [layer, hosts] of placement) {
    for (const [node, ids] of hosts) {
      for (const e of ids) {
        for (const n of c.nodes) assert.equal(n.registry.resolve(expertName(layer, e)), node, `${n.id}`);
      }
    }
  }
  assert.equal(expertName(3, 15), "moe-expert-3-15");
});
