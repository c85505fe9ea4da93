// scripts/predict_k2.ts: the arithmetic behind docs/DOD.md's prediction for the real Kimi K2.
import assert from "node:assert/strict";
import {
  DTYPE,
  effectiveBandwidth,
  fleetCluster,
  insideRegions,
  NETWORKS,
  passMs,
  uniqueExperts,
} from "../../scripts/predict_k2.ts";
import { compileHfConfig, planPipeline } from "../../planner/mod.ts";
import { expertPlacement, type ExpertPlan } from "../../node/stage/experts.ts";

const K2 = JSON.parse(
  Deno.readTextFileSync(new URL("../../planner/examples/kimi-k2/config.json", import.meta.url)),
);
const model = compileHfConfig(K2, { dtype: DTYPE });

Deno.test("predict_k2: unique experts of n tokens (8 of 384 each): 8 for one, fewer than 8n after", () => {
  assert.ok(Math.abs(uniqueExperts(1, 8, 384) - 8) < 1e-9);
  assert.ok(uniqueExperts(5, 8, 384) < 40 && uniqueExperts(5, 8, 384) > 38);
  assert.ok(Math.abs(uniqueExperts(1e6, 8, 384) - 384) < 1e-6);
});

Deno.test("predict_k2: the effective bandwidth lies between the two kernel rates, times the copy share", () => {
  const bw = effectiveBandwidth(model, 1000e9, { dense: 0.5, experts: 0.25 });
  assert.ok(bw > 0.25 * 1000e9 * (4.23 / 4.8) && bw < 0.5 * 1000e9 * (4.23 / 4.8), `${bw}`);
  assert.equal(effectiveBandwidth(model, 1000e9, { dense: 1, experts: 1 }), 1000e9 * (4.23 / 4.8));
});

Deno.test("predict_k2: experts inside regions place every expert once, in its stage's region; n = 1 is the plain token", () => {
  const cluster = fleetCluster(model, NETWORKS[1], { dense: 0.6, experts: 0.6 });
  const local = planPipeline(model, cluster, { context: 4096, dtype: DTYPE, experts: "local" });
  const spread = insideRegions(cluster, local, model, 2);
  const region = new Map(cluster.nodes.map((n) => [n.id, n.region]));
  const placement = expertPlacement(spread as unknown as ExpertPlan);
  assert.equal(placement.size, 60);
  for (const [l, nodes] of placement) {
    const stage = local.stages.find((s) => l >= s.layers[0] && l < s.layers[1])!;
    assert.equal(nodes.size, 2, `layer ${l}`);
    for (const n of nodes.keys()) assert.equal(region.get(n), region.get(stage.node));
    assert.deepEqual(
      [...nodes.values()].flat().sort((a, b) => a - b),
      Array.from({ length: 384 }, (_, i) => i),
    );
  }
  assert.ok(
    Math.abs(passMs(model, cluster, local, 1) - local.predicted.tokenMs) < 1e-6 * local.predicted.tokenMs,
  );
  // A pass of 5 tokens reads ~4.9x the experts and carries 5 activations: slower than one token, < 5x.
  const five = passMs(model, cluster, local, 5);
  assert.ok(five > local.predicted.tokenMs && five < 5 * local.predicted.tokenMs);
});
