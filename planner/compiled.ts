// The search's view of a (model, cluster, context) problem: flat typed arrays. Per-layer costs are
// prefix sums, so the memory, bytes read and FLOPs of any contiguous layer range are two lookups; links
// are N x N matrices of per-hop seconds. A placement candidate is then evaluated in O(stages x layers)
// arithmetic with no allocation (split_dp.ts).
import { type Cluster, linkBetween } from "./cluster.ts";
import type { DTypeBytes, ModelGraph } from "./model_graph.ts";

/** The sampler's memory traffic per vocabulary entry: f32 logits written by the head, read by the sampler. */
export const SAMPLER_BYTES_PER_TOKEN = 8;

export interface CompiledProblem {
  layers: number;
  nodes: number;
  nodeIds: string[];
  /** Per node: usable memory (capacity - reserve), bandwidth, FLOP/s, fixed overhead per token and per layer. */
  memAvail: Float64Array;
  memBw: Float64Array;
  /** Per node: bytes per token that still read from the cache (0: none), and the cache's bandwidth. */
  cacheBytes: Float64Array;
  cacheBw: Float64Array;
  flops: Float64Array;
  overhead: Float64Array;
  layerOverhead: Float64Array;
  /** N x N: seconds to send one hidden state from i to j (latency + bytes / effective bandwidth). */
  hop: Float64Array;
  /** N x N: seconds to send the sampled token id back from the last stage to the first. */
  ret: Float64Array;
  /** N x N one-way latency and effective bandwidth (min of link, sender's up, receiver's down). */
  lat: Float64Array;
  bwEff: Float64Array;
  /** Prefix sums over layers (length layers + 1). */
  memAll: Float64Array; // weights incl. routed experts + KV cache at the context length
  memDense: Float64Array; // the same without routed experts
  readAll: Float64Array; // bytes read per token (topK experts, KV at the context length)
  readDense: Float64Array; // the same without routed experts
  flopsAll: Float64Array;
  flopsDense: Float64Array;
  /** First-stage and last-stage extras. */
  embedMem: number;
  embedRead: number;
  headMem: number;
  headRead: number;
  headFlops: number;
  /** Bytes saved when a tied model's first and last stage are one node (one copy of the matrix). */
  tiedSaving: number;
  /** Per layer: the node index it is pinned to, or -1; per node: how many layers are pinned to it. */
  pinOf: Int32Array;
  pinPrefix: Int32Array;
  pinCount: Int32Array;
  pinMin: Int32Array;
  pinMax: Int32Array;
  /** Bytes of one hidden state on the wire. */
  actBytes: number;
  context: number;
  dtype: DTypeBytes;
}

/** Compiles a problem; `dtype` is the effective quantization (model dtype with cluster/opts overrides). */
export function compileProblem(
  model: ModelGraph,
  cluster: Cluster,
  opts: { context: number; dtype: DTypeBytes; nodeIds?: string[] },
): CompiledProblem {
  const { context, dtype } = opts;
  const nodes = (opts.nodeIds ?? cluster.nodes.map((n) => n.id)).map((id) => {
    const n = cluster.nodes.find((x) => x.id === id);
    if (!n) throw new TypeError(`unknown node "${id}"`);
    return n;
  });
  const N = nodes.length, L = model.layers.length;
  const actBytes = model.hidden * dtype.activation;
  const p: CompiledProblem = {
    layers: L,
    nodes: N,
    nodeIds: nodes.map((n) => n.id),
    memAvail: Float64Array.from(nodes, (n) => n.memBytes - n.reserveBytes),
    memBw: Float64Array.from(nodes, (n) => n.memBandwidth),
    cacheBytes: Float64Array.from(nodes, (n) => n.cacheBytes),
    cacheBw: Float64Array.from(nodes, (n) => n.cacheBandwidth),
    flops: Float64Array.from(nodes, (n) => n.flops),
    overhead: Float64Array.from(nodes, (n) => n.overhead),
    layerOverhead: Float64Array.from(nodes, (n) => n.layerOverhead),
    hop: new Float64Array(N * N),
    ret: new Float64Array(N * N),
    lat: new Float64Array(N * N),
    bwEff: new Float64Array(N * N),
    memAll: new Float64Array(L + 1),
    memDense: new Float64Array(L + 1),
    readAll: new Float64Array(L + 1),
    readDense: new Float64Array(L + 1),
    flopsAll: new Float64Array(L + 1),
    flopsDense: new Float64Array(L + 1),
    embedMem: model.embedParams * dtype.embed,
    embedRead: model.hidden * dtype.embed,
    headMem: model.headParams * dtype.embed,
    headRead: model.headParams * dtype.embed + SAMPLER_BYTES_PER_TOKEN * model.vocab,
    headFlops: 2 * model.headParams,
    tiedSaving: model.tied ? model.vocab * model.hidden * dtype.embed : 0,
    pinOf: new Int32Array(L).fill(-1),
    pinPrefix: new Int32Array(L + 1),
    pinCount: new Int32Array(N),
    pinMin: new Int32Array(N).fill(L),
    pinMax: new Int32Array(N).fill(-1),
    actBytes,
    context,
    dtype,
  };
  for (let i = 0; i < N; i++) {
    for (let j = 0; j < N; j++) {
      if (i === j) continue;
      const l = linkBetween(cluster, nodes[i], nodes[j]);
      const bw = Math.min(l.bandwidth, nodes[i].up, nodes[j].down);
      p.lat[i * N + j] = l.latency;
      p.bwEff[i * N + j] = bw;
      p.hop[i * N + j] = l.latency + actBytes / bw;
      p.ret[i * N + j] = l.latency + 8 / bw;
    }
  }
  for (let l = 0; l < L; l++) {
    const layer = model.layers[l];
    let dense = 0, experts = 0, readD = 0, readE = 0, fl = 0, flE = 0, kv = 0, ctxFlops = 0;
    for (const op of layer.ops) {
      switch (op.kind) {
        case "norm":
          dense += op.params * dtype.dense;
          break;
        case "attention":
          dense += op.params * dtype.dense;
          kv += op.kvPerToken * dtype.kv * context;
          fl += op.flops;
          ctxFlops += op.ctxFlops * context;
          break;
        case "mlp":
          dense += op.params * dtype.dense;
          fl += op.flops;
          break;
        case "moe":
          dense += (op.routerParams + op.shared * op.sharedParams) * dtype.dense;
          experts += op.experts * op.expertParams * dtype.experts;
          readE += op.topK * op.expertParams * dtype.experts;
          fl += 2 * (op.routerParams + op.shared * op.sharedParams);
          flE += 2 * op.topK * op.expertParams;
          break;
      }
    }
    readD = dense + kv; // decode reads every dense weight once and the whole KV cache
    p.memDense[l + 1] = p.memDense[l] + dense + kv;
    p.memAll[l + 1] = p.memAll[l] + dense + experts + kv;
    p.readDense[l + 1] = p.readDense[l] + readD;
    p.readAll[l + 1] = p.readAll[l] + readD + readE;
    p.flopsDense[l + 1] = p.flopsDense[l] + fl + ctxFlops;
    p.flopsAll[l + 1] = p.flopsAll[l] + fl + ctxFlops + flE;
  }
  for (const pin of cluster.constraints.pins) {
    const n = p.nodeIds.indexOf(pin.node);
    if (pin.end > L) throw new RangeError(`pin layers ${pin.start}..${pin.end}: the model has ${L} layers`);
    for (let l = pin.start; l < pin.end; l++) {
      if (p.pinOf[l] !== -1 && p.pinOf[l] !== n) {
        throw new RangeError(
          `layer ${l} is pinned to two nodes (${p.nodeIds[p.pinOf[l]] ?? "?"} and ${pin.node})`,
        );
      }
      if (n < 0) continue; // pinned to a node that is not part of this problem: handled by the caller
      if (p.pinOf[l] === -1) p.pinCount[n]++;
      p.pinOf[l] = n;
      p.pinMin[n] = Math.min(p.pinMin[n], l);
      p.pinMax[n] = Math.max(p.pinMax[n], l);
    }
  }
  for (let l = 0; l < L; l++) p.pinPrefix[l + 1] = p.pinPrefix[l] + (p.pinOf[l] >= 0 ? 1 : 0);
  return p;
}
