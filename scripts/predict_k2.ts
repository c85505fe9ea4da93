// Kimi K2 (4-bit experts) on a fleet of consumer GPUs over a WAN, on paper (issue 20, item 4): the planner's
// cost model (planner/evaluate.ts) fed with kernel rates measured on the H200 (docs/BENCHMARKS.md), scaled to
// each consumer GPU by its memory bandwidth, per-hop and per-fan-out costs measured on our wire
// (docs/BENCHMARKS.md, docs/WIRE.md), and the fleet's links. Prints markdown tables (docs/DOD.md).
//
//   deno run -A scripts/predict_k2.ts [--json FILE]
//
// Every assumption is a named constant below with where it was measured. Pure arithmetic over planner/ code:
// no GPU, no network.
import { parseFlags } from "../cli/command.ts";
import {
  type Cluster,
  compileHfConfig,
  type DTypeBytes,
  evaluateAssignment,
  type ModelGraph,
  parseCluster,
  type Plan,
  planPipeline,
} from "../planner/mod.ts";
import { moeOf } from "../planner/model_graph.ts";
import { SPLIT_READBACKS } from "../planner/evaluate.ts";
import { expertPlacement, type ExpertPlan } from "../node/stage/experts.ts";
import { scriptArgs } from "./args.ts";

/** Kimi K2's config.json as published (planner/examples/kimi-k2). */
const K2 = JSON.parse(
  Deno.readTextFileSync(new URL("../planner/examples/kimi-k2/config.json", import.meta.url)),
);

/** 4-bit experts with a bf16 scale per group of 32 (4.5 bits); dense weights fp8 as released; f16 KV. */
export const DTYPE: DTypeBytes = { experts: 4.5 / 8, dense: 1, embed: 2, kv: 2, activation: 2 };

// Kernel rates, measured on the H200 (docs/BENCHMARKS.md, 2026-11-30), as fractions of its measured copy
// bandwidth (4.23 TB/s): what our kernels get out of a GPU's memory system today.
/** H200 device copy, read + write (FACTS.md). */
export const H200_COPY = 4.23e12;
/** q8 decode step: 1.31 GB of weights in 0.930 ms = 1.41 TB/s (dense fp8 weights read at this rate). */
export const DENSE_RATE = 1.31e9 / 0.93e-3 / H200_COPY;
/** q4 decode step: 0.70 GB in 0.857 ms = 0.82 TB/s (4-bit experts; the MoE f16 block read ~0.8 TB/s too). */
export const EXPERT_RATE = 0.70e9 / 0.857e-3 / H200_COPY;
/** A GPU's copy bandwidth against its datasheet's (H200: 4.23 measured of 4.8). */
export const COPY_OF_NOMINAL = 4.23 / 4.8;

// Fixed costs, measured on our stack.
/** Per stage per token: the early readback (~0.3 ms on a GPU, kernels/readback.ts) + submit + hand-off. */
export const STAGE_OVERHEAD_S = 0.5e-3;
/** Per layer held: encoding its ~12 dispatches at ~5 us (0.44 ms for 84 dispatches on the H200). */
export const LAYER_OVERHEAD_S = 12 * 5e-6;
/** Our wire's own cost per one-way message on top of the link's latency: a 16 KiB round trip on the TLS path
 * is 0.108 ms on loopback (docs/WIRE.md); 0.25-0.33 ms per decode hop in a 5-stage chain (BENCHMARKS.md). */
export const WIRE_OVERHEAD_S = 0.3e-3;

/** The GPUs of the fleet: datasheet memory bandwidth and size. */
const GPUS = {
  "5090": { mem: 32, bw: 1792e9, flops: 104.8e12 },
  "4090": { mem: 24, bw: 1008e9, flops: 82.6e12 },
  "3090": { mem: 24, bw: 936e9, flops: 35.6e12 },
} as const;

/** 28 GPUs in two regions (kimi_fleet.swl's European part): 9 RTX 5090, 14 RTX 4090, 5 RTX 3090. */
const FLEET: [string, keyof typeof GPUS, number][] = [
  ["a", "5090", 5],
  ["a", "4090", 8],
  ["a", "3090", 2],
  ["b", "5090", 4],
  ["b", "4090", 6],
  ["b", "3090", 3],
];

/** A network: one-way latency and bandwidth inside a region and between regions, and each node's uplink. */
export interface Network {
  name: string;
  intraMs: number;
  interMs: number;
  linkMbit: number;
  upMbit: number;
}

export const NETWORKS: Network[] = [
  // Home connections: a region is a country (6 ms one way), two regions 12 ms apart, 50 Mbit/s uploads.
  {
    name: "home WAN (6 ms in a region, 12 ms across, 50 Mbit/s up)",
    intraMs: 6,
    interMs: 12,
    linkMbit: 200,
    upMbit: 50,
  },
  // Each region a site with a LAN (0.3 ms, 10 Gbit/s), the sites 12 ms apart over 1 Gbit/s.
  {
    name: "two LAN sites (0.3 ms in a site, 12 ms across)",
    intraMs: 0.3,
    interMs: 12,
    linkMbit: 10_000,
    upMbit: 10_000,
  },
  // A metro fleet: every GPU within 1 ms of every other, 1 Gbit/s.
  { name: "metro (1 ms everywhere, 1 Gbit/s)", intraMs: 1, interMs: 1, linkMbit: 1000, upMbit: 1000 },
];

/** Effective bandwidth (bytes/s) of a GPU for K2's per-token byte mix, at the given kernel efficiencies. */
export function effectiveBandwidth(
  model: ModelGraph,
  nominal: number,
  rates: { dense: number; experts: number },
): number {
  const moe = model.layers.map(moeOf).find((m) => m)!;
  const layer = model.layers.find((l) => moeOf(l))!;
  const dense = layer.ops.filter((o) => o.kind !== "moe").reduce((a, o) => a + o.params, 0) +
    moe.routerParams + moe.shared * moe.sharedParams;
  const denseBytes = dense * DTYPE.dense, expertBytes = moe.topK * moe.expertParams * DTYPE.experts;
  const copy = nominal * COPY_OF_NOMINAL;
  const seconds = denseBytes / (rates.dense * copy) + expertBytes / (rates.experts * copy);
  return (denseBytes + expertBytes) / seconds;
}

/** The fleet as a cluster file (the planner's language), for a network and kernel rates. */
export function fleetCluster(
  model: ModelGraph,
  net: Network,
  rates: { dense: number; experts: number },
): Cluster {
  const lines = [
    `cluster k2_fleet {`,
    `  defaults { up = ${net.upMbit} Mbit/s; down = ${Math.max(net.upMbit, 500)} Mbit/s; overhead = ${
      STAGE_OVERHEAD_S * 1e3
    } ms; layer_overhead = ${LAYER_OVERHEAD_S * 1e6} us; reserve = 1.5 GiB }`,
    `  link default { latency = ${net.interMs + WIRE_OVERHEAD_S * 1e3} ms; bw = ${net.linkMbit} Mbit/s }`,
    `  link a a { latency = ${net.intraMs + WIRE_OVERHEAD_S * 1e3} ms; bw = ${net.linkMbit} Mbit/s }`,
    `  link b b { latency = ${net.intraMs + WIRE_OVERHEAD_S * 1e3} ms; bw = ${net.linkMbit} Mbit/s }`,
  ];
  for (const [region, gpu, count] of FLEET) {
    const g = GPUS[gpu];
    const bw = effectiveBandwidth(model, g.bw, rates);
    for (let i = 1; i <= count; i++) {
      lines.push(
        `  node ${region}-${gpu}-${i} { mem = ${g.mem} GiB; mem_bw = ${(bw / 1e9).toFixed(1)} GB/s; flops = ${
          g.flops / 1e12
        } TFLOP/s; region = ${region} }`,
      );
    }
  }
  lines.push("}");
  return parseCluster(lines.join("\n"), { file: "predict_k2 fleet" });
}

/** Unique experts a layer reads for n tokens, each picking k of E (uniform routing): E (1 - (1 - k/E)^n). */
export function uniqueExperts(n: number, k: number, E: number): number {
  return E * (1 - (1 - k / E) ** n);
}

/**
 * One pass of n tokens through `plan` (speculative verification: the draft's n - 1 tokens and one more): every
 * layer's dense weights read once, the union of the n tokens' experts, n activations on every hop and fan-out.
 */
export function passMs(model: ModelGraph, cluster: Cluster, plan: Plan, n: number, context = 4096): number {
  const m: ModelGraph = {
    ...model,
    layers: model.layers.map((l) => ({
      ops: l.ops.map((o) => o.kind === "moe" ? { ...o, topK: uniqueExperts(n, o.topK, o.experts) } : o),
    })),
  };
  const placement = expertPlacement(plan as unknown as ExpertPlan);
  const e = evaluateAssignment(m, cluster, {
    stages: plan.stages.map((s) => ({ node: s.node, start: s.layers[0], end: s.layers[1] })),
    ...(plan.expertMode === "spread" ? { experts: placement } : {}),
  }, { context, dtype: { ...DTYPE, activation: DTYPE.activation * n } });
  return e.tokenS * 1e3;
}

/** Published acceptance: mean tokens accepted per verification pass (drafted + the verifier's own). */
export const SPECULATION = [
  // DeepSeek-V3's MTP module (1 draft token): 85-90% acceptance of the second token -> ~1.85 per pass
  // (DeepSeek-V3 technical report, 2024). Kimi K2 ships no MTP layer (num_nextn_predict_layers 0).
  { name: "MTP, 1 draft token (DeepSeek-V3: 85-90% accepted)", n: 2, tokens: 1.85 },
  // EAGLE-style drafter, chain of 4: EAGLE-2/3 report 3-4 accepted per pass on chat at this depth for 8-70B
  // models (EAGLE-3 paper, 2025: 5-6.5 with 60-token trees at depth 8); 3.0 is the conservative end.
  { name: "EAGLE-style, 4 draft tokens (3.0 accepted per pass)", n: 5, tokens: 3.0 },
  { name: "EAGLE-style, 6 draft tokens (4.0 accepted per pass)", n: 7, tokens: 4.0 },
];

/**
 * Expert parallelism inside regions on top of a pipeline: each MoE layer's experts split evenly over its
 * stage's node and the next `w - 1` nodes of the same region (in the cluster's order, wrapping), so a token's
 * experts are read on up to w GPUs at once, each layer paying a fan-out inside its region.
 */
export function insideRegions(cluster: Cluster, plan: Plan, model: ModelGraph, w: number): Plan {
  const regionOf = new Map(cluster.nodes.map((n) => [n.id, n.region]));
  const stages = plan.stages.map((s) => ({ ...s, experts: {} as Record<string, number[]> }));
  const hosts = new Map<string, Record<string, number[]>>();
  for (const s of stages) {
    const peers = cluster.nodes.filter((n) => n.region === regionOf.get(s.node)).map((n) => n.id);
    const at = peers.indexOf(s.node);
    const group = Array.from({ length: Math.min(w, peers.length) }, (_, j) => peers[(at + j) % peers.length]);
    for (let l = s.layers[0]; l < s.layers[1]; l++) {
      const moe = moeOf(model.layers[l]);
      if (!moe) continue;
      group.forEach((node, j) => {
        const from = Math.floor((j * moe.experts) / group.length),
          to = Math.floor(((j + 1) * moe.experts) / group.length);
        const ids = Array.from({ length: to - from }, (_, i) => from + i);
        const stage = stages.find((x) => x.node === node);
        if (stage) stage.experts[String(l)] = ids;
        else {
          if (!hosts.has(node)) hosts.set(node, {});
          hosts.get(node)![String(l)] = ids;
        }
      });
    }
  }
  return {
    ...plan,
    expertMode: "spread",
    stages,
    expertHosts: [...hosts].map(([node, experts]) => ({ node, experts })),
  };
}

/** The plan's per-token terms and its fullest node's memory use (weights + KV / capacity). */
function evaluate(model: ModelGraph, cluster: Cluster, plan: Plan) {
  const e = evaluateAssignment(model, cluster, {
    stages: plan.stages.map((s) => ({ node: s.node, start: s.layers[0], end: s.layers[1] })),
    ...(plan.expertMode === "spread" ? { experts: expertPlacement(plan as unknown as ExpertPlan) } : {}),
  }, { context: 4096, dtype: DTYPE });
  const sum = (f: (s: typeof e.stages[number]) => number) => e.stages.reduce((a, s) => a + f(s), 0) * 1e3;
  const fullest = Math.max(
    ...[...e.nodes.values()].map((m) => (m.weights + m.kv + m.reserve) / m.capacity),
  );
  const split = e.stages.reduce((a, s) => a + s.fanoutByLayer.size, 0);
  return {
    compute: sum((s) => s.computeS),
    overhead: sum((s) => s.overheadS),
    hops: sum((s) => s.hopS),
    fanout: sum((s) => s.fanoutS),
    tokenMs: e.tokenS * 1e3,
    fullest,
    split,
  };
}

const f1 = (v: number) => v.toFixed(1);

if (import.meta.main) {
  const { values } = scriptArgs(import.meta.url, (args) => parseFlags(args, { json: { type: "string" } }));
  const model = compileHfConfig(K2, { dtype: DTYPE });
  const out: Record<string, unknown>[] = [];
  const rateSets = [
    { name: "today's kernels", dense: DENSE_RATE, experts: EXPERT_RATE },
    { name: "kernels at 60% of copy", dense: 0.6, experts: 0.6 },
  ];
  console.log(
    `Kernel rates (fractions of a GPU's copy bandwidth): dense fp8 ${DENSE_RATE.toFixed(2)}, 4-bit experts ${
      EXPERT_RATE.toFixed(2)
    } (H200, docs/BENCHMARKS.md). Effective read rate for K2's byte mix, today: RTX 5090 ${
      f1(effectiveBandwidth(model, GPUS["5090"].bw, rateSets[0]) / 1e9)
    } GB/s, RTX 4090 ${f1(effectiveBandwidth(model, GPUS["4090"].bw, rateSets[0]) / 1e9)} GB/s, RTX 3090 ${
      f1(effectiveBandwidth(model, GPUS["3090"].bw, rateSets[0]) / 1e9)
    } GB/s.\n`,
  );
  const head =
    "| network | kernels | experts | stages | compute ms | overhead ms | hops ms | fan-out ms (one readback) | ms/token | tok/s | fullest GPU |";
  console.log(head);
  console.log(head.replace(/[^|]+/g, " --- "));
  const best = new Map<string, { plan: Plan; cluster: Cluster }>();
  for (const net of NETWORKS) {
    for (const rates of rateSets) {
      const cluster = fleetCluster(model, net, rates);
      const local = planPipeline(model, cluster, { context: 4096, dtype: DTYPE, experts: "local" });
      const plans: [string, Plan][] = [
        ["local (pipeline only)", local],
        ["spread over 2 GPUs of the region", insideRegions(cluster, local, model, 2)],
        ["spread over 4 GPUs of the region", insideRegions(cluster, local, model, 4)],
      ];
      for (const [label, plan] of plans) {
        const r = evaluate(model, cluster, plan);
        // The same with one readback per split layer instead of SPLIT_READBACKS (a lever: one copy, one map).
        const saved = (SPLIT_READBACKS - 1) * STAGE_OVERHEAD_S * 1e3 * r.split;
        console.log(
          `| ${net.name} | ${rates.name} | ${label} | ${plan.stages.length} | ${f1(r.compute)} | ${
            f1(r.overhead)
          } | ${f1(r.hops)} | ${f1(r.fanout)}${r.split ? ` (${f1(r.fanout - saved)})` : ""} | ${
            f1(r.tokenMs)
          } | ${(1000 / r.tokenMs).toFixed(2)}${
            r.split ? ` (${(1000 / (r.tokenMs - saved)).toFixed(2)})` : ""
          } | ${(100 * r.fullest).toFixed(0)}% |`,
        );
        out.push({
          network: net.name,
          kernels: rates.name,
          experts: label,
          stages: plan.stages.length,
          ...r,
        });
        const key = `${net.name}|${rates.name}`;
        if (
          r.fullest <= 1 &&
          (!best.has(key) || r.tokenMs < evaluate(model, cluster, best.get(key)!.plan).tokenMs)
        ) {
          best.set(key, { plan, cluster });
        }
      }
    }
  }
  console.log(
    "\nSpeculative decoding on the fastest placement of each network and kernel rate above (tok/s = accepted tokens per pass / pass time):\n",
  );
  const sh = `| network | kernels | plain tok/s | ${SPECULATION.map((s) => s.name).join(" | ")} |`;
  console.log(sh);
  console.log(sh.replace(/[^|]+/g, " --- "));
  for (const [key, { plan, cluster }] of best) {
    const [net, kernels] = key.split("|");
    const plain = 1000 / passMs(model, cluster, plan, 1);
    const spec = SPECULATION.map((s) => ({ ...s, passMs: passMs(model, cluster, plan, s.n) }));
    const cells = spec.map((s) => `${(1000 * s.tokens / s.passMs).toFixed(2)} (pass ${f1(s.passMs)} ms)`);
    console.log(`| ${net} | ${kernels} | ${plain.toFixed(2)} | ${cells.join(" | ")} |`);
    out.push({ network: net, kernels, plainTokS: plain, speculation: spec });
  }
  if (values.json) await Deno.writeTextFile(values.json, JSON.stringify(out, null, 1));
}
