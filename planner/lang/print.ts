// Prints clusters and model graphs in the planner language. parse(print(x)) gives back x exactly
// (tests/planner/lang/roundtrip_test.ts): every node is printed with all its fields resolved, numbers
// with a unit that parses back to the same float, runs of identical layers as one `layers a..b` block.
import type { Cluster, NodeSpec } from "../cluster.ts";
import type { DTypeBytes, Layer, ModelGraph, Op } from "../model_graph.ts";
import { formatQuantity } from "../units.ts";

const WORD = /^[A-Za-z_][A-Za-z0-9_./-]*$/;
const KEYWORDS = new Set(["default", "true", "false", "on", "layers", "layer", "expert"]);

/** A name as a bare word when it lexes as one, else as a quoted string. */
function name(s: string): string {
  return WORD.test(s) && !s.includes("..") && !KEYWORDS.has(s) ? s : JSON.stringify(s);
}

function nodeProps(n: NodeSpec): string {
  const p = [
    `mem = ${formatQuantity("bytes", n.memBytes)}`,
    `mem_bw = ${formatQuantity("rate", n.memBandwidth)}`,
    `cache = ${formatQuantity("bytes", n.cacheBytes)}`,
    `cache_bw = ${formatQuantity("rate", n.cacheBandwidth)}`,
    `flops = ${formatQuantity("flops", n.flops)}`,
    `up = ${formatQuantity("netrate", n.up)}`,
    `down = ${formatQuantity("netrate", n.down)}`,
    `overhead = ${formatQuantity("time", n.overhead)}`,
    `layer_overhead = ${formatQuantity("time", n.layerOverhead)}`,
    `reserve = ${formatQuantity("bytes", n.reserveBytes)}`,
  ];
  if (n.region !== "") p.push(`region = ${name(n.region)}`);
  return p.join("; ");
}

function dtypeProps(d: Partial<DTypeBytes>): string {
  return (Object.keys(d) as (keyof DTypeBytes)[]).filter((k) => d[k] !== undefined)
    .map((k) => `${k} = ${d[k]}`).join("; ");
}

/** Prints a cluster (nodes, links, quantization hints, constraints) as one `cluster` block. */
export function printCluster(c: Cluster): string {
  const out = [`cluster ${name(c.name)} {`];
  const link = (l: { latency: number; bandwidth: number }) =>
    `{ latency = ${formatQuantity("time", l.latency)}; bw = ${formatQuantity("netrate", l.bandwidth)} }`;
  out.push(`  link default ${link(c.defaultLink)}`);
  for (const n of c.nodes) out.push(`  node ${name(n.id)} { ${nodeProps(n)} }`);
  for (const l of c.links) out.push(`  link ${name(l.a)} ${name(l.b)} ${link(l)}`);
  if (Object.keys(c.quant).length) out.push(`  quant { ${dtypeProps(c.quant)} }`);
  const k = c.constraints;
  for (const p of k.pins) out.push(`  pin layers ${p.start}..${p.end} on ${name(p.node)}`);
  if (k.exclude.length) out.push(`  exclude ${k.exclude.map(name).join(" ")}`);
  for (const r of k.replicas) {
    out.push(`  replicate layer ${r.layer} expert ${r.expert} on [${r.nodes.map(name).join(", ")}]`);
  }
  if (k.order) out.push(`  order [${k.order.map(name).join(", ")}]`);
  out.push("}");
  return out.join("\n") + "\n";
}

function printOp(op: Op): string {
  switch (op.kind) {
    case "attention":
      return `attention ${op.variant} { params = ${op.params}; kv = ${op.kvPerToken}; ${
        op.headDim === undefined ? "" : `head_dim = ${op.headDim}; `
      }flops = ${op.flops}; ctx_flops = ${op.ctxFlops} }`;
    case "mlp":
      return `mlp { params = ${op.params}; flops = ${op.flops} }`;
    case "norm":
      return `norm { params = ${op.params} }`;
    case "moe":
      return `moe { experts = ${op.experts}; top_k = ${op.topK}; expert_params = ${op.expertParams}; ` +
        `router_params = ${op.routerParams}; shared = ${op.shared}; shared_params = ${op.sharedParams}; flops = ${op.flops} }`;
  }
}

function sameLayer(a: Layer, b: Layer): boolean {
  return JSON.stringify(a) === JSON.stringify(b);
}

/** Prints a model graph as one `model` block. */
export function printModel(m: ModelGraph): string {
  const out = [`model ${name(m.name)} {`];
  if (m.family !== "") out.push(`  family = ${name(m.family)}`);
  out.push(`  hidden = ${m.hidden}`, `  vocab = ${m.vocab}`, `  tied = ${m.tied}`);
  out.push(`  embed = ${m.embedParams}`, `  head = ${m.headParams}`);
  out.push(`  dtype { ${dtypeProps(m.dtype)} }`);
  for (let i = 0; i < m.layers.length;) {
    let j = i + 1;
    while (j < m.layers.length && sameLayer(m.layers[i], m.layers[j])) j++;
    out.push(`  layers ${i}..${j} {`);
    for (const op of m.layers[i].ops) out.push(`    ${printOp(op)}`);
    out.push("  }");
    i = j;
  }
  out.push("}");
  return out.join("\n") + "\n";
}
