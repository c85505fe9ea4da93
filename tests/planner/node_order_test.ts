// The exact order search equals brute force over every ordered subset; the heuristic finds feasible
// pipelines close to the optimum on clusters just above the exact limit.
import assert from "node:assert/strict";
import { compileProblem } from "../../planner/compiled.ts";
import { searchOrder } from "../../planner/node_order.ts";
import { SplitSolver } from "../../planner/split_dp.ts";
import { int, rng } from "./random.ts";
import { randomCluster, randomModel } from "./instances.ts";

function bruteForce(solver: SplitSolver, n: number): number {
  let best = Infinity;
  const rec = (cur: number[], used: boolean[]) => {
    if (cur.length) best = Math.min(best, solver.latency(cur));
    for (let i = 0; i < n; i++) {
      if (used[i]) continue;
      used[i] = true;
      rec([...cur, i], used);
      used[i] = false;
    }
  };
  rec([], new Array(n).fill(false));
  return best;
}

Deno.test("property: exact node-order search equals brute force over ordered subsets (60 instances)", () => {
  const r = rng(11);
  const kinds = ["uniform", "random", "regions", "asymmetric-nodes"] as const;
  for (let t = 0; t < 60; t++) {
    const model = randomModel(r, int(r, 2, 8)), cluster = randomCluster(r, int(r, 1, 4), kinds[t % 4]);
    const p = compileProblem(model, cluster, { context: 256, dtype: model.dtype });
    const got = searchOrder(p, cluster.nodes.map((_, i) => i));
    const best = bruteForce(new SplitSolver(p), cluster.nodes.length);
    if (best === Infinity) assert.equal(got, undefined);
    else {assert.ok(
        got && Math.abs(got.split.latency - best) <= 1e-9 * best,
        `instance ${t}: ${got?.split.latency} vs ${best}`,
      );}
  }
});

Deno.test("heuristic search on 8-node clusters stays within 15% of the exhaustive optimum", () => {
  const r = rng(5);
  let worst = 1;
  for (let t = 0; t < 6; t++) {
    const model = randomModel(r, 10), cluster = randomCluster(r, 8, t % 2 ? "random" : "regions");
    const p = compileProblem(model, cluster, { context: 256, dtype: model.dtype });
    const all = cluster.nodes.map((_, i) => i);
    const exact = searchOrder(p, all, { exactLimit: 8 });
    const heur = searchOrder(p, all, { exactLimit: 0, budget: 20_000 });
    assert.equal(heur === undefined, exact === undefined);
    if (exact && heur) worst = Math.max(worst, heur.split.latency / exact.split.latency);
  }
  assert.ok(worst <= 1.15, `worst ratio ${worst}`);
});
