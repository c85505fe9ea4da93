// parse(print(x)) == x for random clusters and model graphs, and for the shipped examples.
import assert from "node:assert/strict";
import { type Cluster, clusterFromNodes } from "../../../planner/cluster.ts";
import { compileHfConfig } from "../../../planner/hf_config.ts";
import { parseCluster, parseModel, printCluster, printModel } from "../../../planner/lang/mod.ts";
import type { Layer, ModelGraph, Op } from "../../../planner/model_graph.ts";
import { int, pick, rng } from "../random.ts";

const NAMES = ["a", "b-1", "gpu.2", "node_x", "with space", "7f3a9c", "default", "on", "x..y"];

function randomCluster(r: () => number): Cluster {
  const ids = NAMES.filter(() => r() < 0.6);
  if (ids.length === 0) ids.push("solo");
  const q = () => pick(r, [24 * 2 ** 30, 12e9, 8 * 2 ** 30 + 1, 1e9 * r(), 0.1 + 0.2]);
  const c = clusterFromNodes(
    ids.map((id) => ({
      id,
      memBytes: q(),
      memBandwidth: pick(r, [1008e9, 360e9, 1e12 * r() + 1]),
      ...pick(r, [{}, { cacheBytes: 72 * 2 ** 20, cacheBandwidth: 5e12 * r() + 1 }]),
      flops: pick(r, [82.6e12, 35.6e12, r() * 1e14 + 1]),
      up: pick(r, [125e6, 6.25e6, 1e7 * r() + 1]),
      down: pick(r, [125e6, 62.5e6]),
      overhead: pick(r, [11e-3, 0.5e-3, r() * 0.05]),
      layerOverhead: pick(r, [0, 25e-6, r() * 1e-3]),
      reserveBytes: pick(r, [2 ** 30, 0, 1.5 * 2 ** 30]),
      region: pick(r, ["", "eu", "us-east", "r 2"]),
    })),
    {
      name: pick(r, ["", "lan", "my cluster"]),
      defaultLink: { latency: r() * 0.1, bandwidth: pick(r, [125e6, 3e7 * r() + 1]) },
    },
  );
  for (let i = 0; i < int(r, 0, 3); i++) {
    c.links.push({
      a: pick(r, ids),
      b: pick(r, [...ids, "eu"]),
      latency: pick(r, [3e-3, r()]),
      bandwidth: pick(r, [125e6, 5e6]),
    });
  }
  if (r() < 0.5) c.quant = { experts: pick(r, [0.5, 0.5625, 1]), dense: 1 };
  if (r() < 0.5) c.constraints.pins.push({ start: 0, end: int(r, 1, 5), node: pick(r, ids) });
  if (r() < 0.5) c.constraints.exclude.push(pick(r, ids));
  if (r() < 0.5) {
    c.constraints.replicas.push({
      layer: int(r, 0, 9),
      expert: int(r, 0, 99),
      nodes: [pick(r, ids), pick(r, ids)],
    });
  }
  if (r() < 0.3) c.constraints.order = ids.slice().reverse();
  return c;
}

function randomOp(r: () => number): Op {
  switch (pick(r, ["attention", "mlp", "norm", "moe"])) {
    case "attention":
      return {
        kind: "attention",
        variant: pick(r, ["mha", "gqa", "mla"] as const),
        params: int(r, 1, 1e9),
        kvPerToken: int(r, 0, 4096),
        flops: int(r, 0, 2e9),
        ctxFlops: int(r, 0, 1e6),
      };
    case "mlp":
      return { kind: "mlp", params: int(r, 1, 1e9), flops: int(r, 1, 2e9) };
    case "norm":
      return { kind: "norm", params: int(r, 1, 1e5) };
    default: {
      const experts = int(r, 1, 512);
      return {
        kind: "moe",
        experts,
        topK: int(r, 1, experts),
        expertParams: int(r, 1, 1e8),
        routerParams: int(r, 0, 1e7),
        shared: int(r, 0, 2),
        sharedParams: int(r, 0, 1e8),
        flops: int(r, 0, 1e10),
      };
    }
  }
}

function randomModel(r: () => number): ModelGraph {
  const kinds: Layer[] = [{ ops: [randomOp(r), randomOp(r)] }, { ops: [randomOp(r)] }];
  return {
    name: pick(r, ["m", "kimi k2", "llama-3.2-1b"]),
    family: pick(r, ["", "llama", "deepseek_v3"]),
    hidden: int(r, 1, 8192),
    vocab: int(r, 1, 200000),
    dtype: {
      dense: pick(r, [2, 1, 0.5]),
      experts: pick(r, [0.5625, 2]),
      embed: 2,
      kv: pick(r, [2, 1]),
      activation: 4,
    },
    embedParams: int(r, 0, 1e9),
    headParams: int(r, 0, 1e9),
    tied: r() < 0.5,
    layers: Array.from({ length: int(r, 1, 12) }, () => structuredClone(pick(r, kinds))),
  };
}

Deno.test("property: parse(print(cluster)) == cluster on 300 random clusters", () => {
  const r = rng(1);
  for (let i = 0; i < 300; i++) {
    const c = randomCluster(r);
    const text = printCluster(c);
    assert.deepEqual(parseCluster(text), c, text);
  }
});

Deno.test("property: parse(print(model)) == model on 300 random model graphs", () => {
  const r = rng(2);
  for (let i = 0; i < 300; i++) {
    const m = randomModel(r);
    const text = printModel(m);
    assert.deepEqual(parseModel(text), m, text);
  }
});

Deno.test("compiled Hugging Face graphs and the shipped example clusters round-trip", () => {
  for (const f of ["kimi-k2", "llama-3.2-1b", "mixtral-8x7b", "qwen3-30b-a3b"]) {
    const g = compileHfConfig(
      JSON.parse(Deno.readTextFileSync(new URL(`../data/${f}.json`, import.meta.url))),
      { name: f },
    );
    assert.deepEqual(parseModel(printModel(g)), g);
  }
  for (const f of ["lan5", "home", "kimi_fleet"]) {
    const c = parseCluster(
      Deno.readTextFileSync(new URL(`../../../planner/examples/${f}.swl`, import.meta.url)),
    );
    assert.deepEqual(parseCluster(printCluster(c)), c, f);
  }
});

Deno.test("runs of identical layers print as one block", () => {
  const g = compileHfConfig(
    JSON.parse(Deno.readTextFileSync(new URL(`../data/kimi-k2.json`, import.meta.url))),
  );
  const text = printModel(g);
  assert.match(text, /layers 0\.\.1 \{/);
  assert.match(text, /layers 1\.\.61 \{/);
});
