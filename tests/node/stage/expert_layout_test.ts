// Reading expert placement out of a Plan: per layer the stage and every host's ids, per node its ranges.
import assert from "node:assert/strict";
import {
  expertLayout,
  expertName,
  hostedExperts,
  planChain,
  type PlanExperts,
} from "../../../node/stage/mod.ts";

const plan: PlanExperts = {
  stages: [
    { node: "a", layers: [0, 2], experts: { "1": [0, 1, 2, 3] } },
    { node: "b", layers: [2, 4], experts: { "2": [], "3": [4, 5, 6, 7] } },
  ],
  expertHosts: [
    { node: "c", experts: { "1": [4, 5, 6, 7], "2": [0, 1, 2, 3, 7] } },
    { node: "a", experts: { "2": [4, 5, 6], "3": [0, 1, 2, 3] } },
  ],
};

Deno.test("expertLayout: each MoE layer's stage and hosts; hostedExperts: a node's ranges per layer", () => {
  const layout = expertLayout(plan);
  assert.deepEqual([...layout.keys()], [1, 2, 3]);
  assert.deepEqual(layout.get(2), { stage: "b", hosts: new Map([["c", [0, 1, 2, 3, 7]], ["a", [4, 5, 6]]]) });
  assert.deepEqual(hostedExperts(plan, "a"), { "1": [[0, 4]], "2": [[4, 7]], "3": [[0, 4]] });
  assert.deepEqual(hostedExperts(plan, "c"), { "1": [[4, 8]], "2": [[0, 4], [7, 8]] });
  assert.deepEqual(hostedExperts(plan, "zz"), {});
  assert.equal(expertName(2, 7), "moe-expert-2-7");
  assert.throws(
    () => expertLayout({ stages: [{ node: "a", layers: [0, 1], experts: { "3": [0] } }] }),
    TypeError,
  );
  assert.throws(
    () => expertLayout({ stages: [], expertHosts: [{ node: "a", experts: { "1": [0] } }] }),
    /no stage owns/,
  );
});

Deno.test("hostedExperts over planChain's spread: every host one range per layer, all experts covered", () => {
  const config = JSON.parse(
    Deno.readTextFileSync(new URL("../../fixtures/mixtral-tiny/config.json", import.meta.url)),
  );
  const ids = ["n0", "n1", "n2", "n3", "n4"];
  const p = planChain(config, ids.map((id) => ({ id })), { experts: "spread" });
  for (let l = 0; l < 4; l++) {
    const covered = ids.flatMap((id) => hostedExperts(p, id)[String(l)] ?? []);
    assert.ok(covered.length >= 2, `layer ${l} on ${covered.length} ranges`);
    assert.equal(covered.reduce((a, [s, e]) => a + e - s, 0), 8, `layer ${l}`);
  }
});
