// Measures how many candidate placements (node order + optimal DP split) the planner evaluates per second.
// Run: deno run -A scripts/bench_planner.ts   (results go into docs/PLANNER.md by hand)
import { compileProblem } from "../planner/compiled.ts";
import { compileHfConfig, parseCluster, planPipeline } from "../planner/mod.ts";
import { SplitSolver } from "../planner/split_dp.ts";

const root = new URL("../", import.meta.url);
const read = (p: string) => Deno.readTextFileSync(new URL(p, root));

function bench(label: string, modelPath: string, clusterPath: string, orderLen: number) {
  const model = compileHfConfig(JSON.parse(read(modelPath)));
  const cluster = parseCluster(read(clusterPath));
  const dtype = { ...model.dtype, ...cluster.quant };
  const p = compileProblem(model, cluster, { context: 4096, dtype });
  const solver = new SplitSolver(p);
  const base = Array.from({ length: p.nodes }, (_, i) => i);
  const orders = Array.from({ length: 256 }, (_, s) => {
    const o = base.slice();
    for (let i = o.length - 1; i > 0; i--) {
      const j = (s * 7919 + i * 104729) % (i + 1);
      [o[i], o[j]] = [o[j], o[i]];
    }
    return o.slice(0, orderLen);
  });
  let n = 0, feasible = 0;
  const t0 = performance.now();
  while (performance.now() - t0 < 1000) {
    for (const o of orders) if (solver.latency(o) < Infinity) feasible++;
    n += orders.length;
  }
  const s = (performance.now() - t0) / 1000;
  const t1 = performance.now();
  const plan = planPipeline(model, cluster);
  const planMs = performance.now() - t1;
  console.log(
    `${label}: ${(n / s).toFixed(0)} placements/s (${orderLen}-node orders, ${model.layers.length} layers, ` +
      `${((feasible / n) * 100).toFixed(0)}% feasible); full plan ${planMs.toFixed(0)} ms, ` +
      `${plan.search.evaluated} orders, ${plan.predicted.tokS.toFixed(2)} tok/s`,
  );
}

bench("Llama 3.2 1B on lan5", "tests/planner/data/llama-3.2-1b.json", "planner/examples/lan5.swl", 5);
bench("Llama 3.2 1B on home", "tests/planner/data/llama-3.2-1b.json", "planner/examples/home.swl", 3);
bench("Kimi K2 on kimi_fleet", "planner/examples/kimi-k2/config.json", "planner/examples/kimi_fleet.swl", 26);
