// The DP's split is optimal: brute force over every composition of the layers on random small, heterogeneous
// instances with several kinds of link matrices; and its objective equals the plain cost model's.
import assert from "node:assert/strict";
import { compileProblem } from "../../planner/compiled.ts";
import { evaluateAssignment } from "../../planner/evaluate.ts";
import { SplitSolver } from "../../planner/split_dp.ts";
import { int, pick, rng } from "./random.ts";
import { LINKS, randomCluster, randomModel } from "./instances.ts";

/** Every way to cut L layers into m non-empty contiguous ranges. */
function* compositions(L: number, m: number, from = 0): Generator<number[]> {
  if (m === 1) {
    yield [from, L];
    return;
  }
  for (let j = from + 1; j <= L - m + 1; j++) {
    for (const rest of compositions(L, m - 1, j)) yield [from, ...rest];
  }
}

Deno.test("property: the DP split equals brute force over all splits (200 random instances, 4 link kinds)", () => {
  const r = rng(7);
  let feasible = 0, infeasible = 0;
  for (let t = 0; t < 200; t++) {
    const L = int(r, 1, 9), n = int(r, 1, 4);
    const model = randomModel(r, L), cluster = randomCluster(r, n, LINKS[t % LINKS.length]);
    const dtype = model.dtype, context = pick(r, [128, 4096]);
    const p = compileProblem(model, cluster, { context, dtype });
    const solver = new SplitSolver(p);
    const order = Array.from({ length: n }, (_, i) => i).sort(() => r() - 0.5);
    const got = solver.solve(order);
    let best = Infinity;
    if (order.length <= L) {
      for (const cuts of compositions(L, order.length)) {
        const stages = order.map((o, i) => ({ node: p.nodeIds[o], start: cuts[i], end: cuts[i + 1] }));
        const e = evaluateAssignment(model, cluster, { stages }, { context, dtype });
        const fits = [...e.nodes.entries()].every(([id, m]) => {
          const spec = cluster.nodes.find((x) => x.id === id)!;
          return m.weights + m.kv <= spec.memBytes - spec.reserveBytes;
        });
        if (fits) best = Math.min(best, e.tokenS);
      }
    }
    if (best === Infinity) {
      assert.equal(got, undefined, `instance ${t}: brute force finds no split but the DP does`);
      infeasible++;
      continue;
    }
    feasible++;
    assert.ok(got, `instance ${t}: the DP finds no split but brute force does`);
    assert.ok(
      Math.abs(got.latency - best) <= 1e-12 + 1e-9 * best,
      `instance ${t}: DP ${got.latency} vs brute force ${best}`,
    );
    // The DP's own split, evaluated by the plain cost model, gives the DP's objective.
    const stages = order.map((o, i) => ({ node: p.nodeIds[o], start: got.cuts[i], end: got.cuts[i + 1] }));
    const e = evaluateAssignment(model, cluster, { stages }, { context, dtype });
    assert.ok(Math.abs(e.tokenS - got.latency) <= 1e-9 * got.latency);
  }
  assert.ok(
    feasible > 80 && infeasible > 10,
    `both cases exercised: ${feasible} feasible, ${infeasible} infeasible`,
  );
});

Deno.test("pins restrict the DP: pinned layers land on their node", () => {
  const r = rng(3);
  const model = randomModel(r, 8);
  const cluster = randomCluster(r, 3, "uniform");
  for (const n of cluster.nodes) n.memBytes = 64 * 2 ** 30;
  cluster.constraints.pins.push({ start: 2, end: 4, node: "n1" });
  const p = compileProblem(model, cluster, { context: 128, dtype: model.dtype });
  const s = new SplitSolver(p).solve([0, 1, 2])!;
  assert.ok(s.cuts[1] <= 2 && s.cuts[2] >= 4, `cuts ${s.cuts}`);
  cluster.constraints.pins = [{ start: 0, end: 2, node: "n1" }];
  const q = compileProblem(model, cluster, { context: 128, dtype: model.dtype });
  assert.equal(new SplitSolver(q).solve([0, 1, 2]), undefined, "layer 0 is n1's, so n1 must come first");
  assert.ok(new SplitSolver(q).solve([1, 0, 2])!.cuts[1] >= 2);
});
