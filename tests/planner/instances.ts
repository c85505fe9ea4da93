// Random small, heterogeneous planning instances for the property tests.
import { type Cluster, clusterFromNodes, type LinkSpec } from "../../planner/cluster.ts";
import type { Layer, ModelGraph } from "../../planner/model_graph.ts";
import { int, pick } from "./random.ts";

export function randomModel(r: () => number, layers: number): ModelGraph {
  const ls: Layer[] = Array.from({ length: layers }, () => {
    const attn = int(r, 1, 4) * 1e8;
    const ops: Layer["ops"] = [{
      kind: "attention",
      variant: "gqa",
      params: attn,
      kvPerToken: int(r, 1, 4) * 256,
      flops: 2 * attn,
      ctxFlops: 1e4,
    }];
    if (r() < 0.5) ops.push({ kind: "mlp", params: int(r, 1, 8) * 1e8, flops: int(r, 1, 8) * 2e8 });
    else {
      const experts = int(r, 2, 16), topK = int(r, 1, 2);
      ops.push({
        kind: "moe",
        experts,
        topK,
        expertParams: 5e7,
        routerParams: 1e5,
        shared: int(r, 0, 1),
        sharedParams: 5e7,
        flops: 0,
      });
    }
    return { ops };
  });
  return {
    name: "m",
    family: "test",
    hidden: 4096,
    vocab: 32000,
    dtype: { dense: 2, experts: pick(r, [2, 0.5]), embed: 2, kv: 2, activation: 2 },
    embedParams: 32000 * 4096,
    headParams: 32000 * 4096 + 4096,
    tied: r() < 0.5,
    layers: ls,
  };
}

export const LINKS = ["uniform", "random", "regions", "asymmetric-nodes"] as const;

export function randomCluster(r: () => number, nodes: number, kind: typeof LINKS[number]): Cluster {
  const ids = Array.from({ length: nodes }, (_, i) => `n${i}`);
  const c = clusterFromNodes(
    ids.map((id) => ({
      id,
      memBytes: pick(r, [2, 3, 4, 6, 8]) * 2 ** 30,
      memBandwidth: pick(r, [100e9, 360e9, 1e12]),
      ...pick(r, [{}, {}, { cacheBytes: 64e6, cacheBandwidth: 3e12 }, {
        cacheBytes: 2 ** 30,
        cacheBandwidth: 2e12,
      }]),
      flops: pick(r, [1e12, 20e12, 80e12]),
      up: kind === "asymmetric-nodes" ? pick(r, [1e6, 1e8]) : 1e8,
      down: 1e8,
      overhead: pick(r, [0, 1e-3, 11e-3]),
      layerOverhead: pick(r, [0, 0, 50e-6, 1e-3]),
      reserveBytes: 0.25 * 2 ** 30,
      region: kind === "regions" ? pick(r, ["x", "y"]) : "",
    })),
    { defaultLink: { latency: 1e-3 + r() * 0.05, bandwidth: 1e7 + r() * 1e8 } },
  );
  const links: LinkSpec[] = [];
  if (kind === "random") {
    for (let i = 0; i < nodes; i++) {
      for (let j = i + 1; j < nodes; j++) {
        links.push({ a: ids[i], b: ids[j], latency: r() * 0.04, bandwidth: 1e6 + r() * 1e8 });
      }
    }
  }
  if (kind === "regions") {
    links.push({ a: "x", b: "x", latency: 1e-3, bandwidth: 1e8 }, {
      a: "x",
      b: "y",
      latency: 0.04,
      bandwidth: 1e7,
    });
  }
  c.links = links;
  return c;
}
