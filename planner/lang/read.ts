// Gives the generic statement tree (syntax.ts) its meaning: `cluster` blocks (nodes, links, defaults,
// quantization hints, constraints) and `model` blocks (a model graph). See docs/PLANNER.md for the spec.
import {
  type Cluster,
  type Constraints,
  DEFAULT_LINK,
  emptyConstraints,
  type LinkSpec,
  NODE_DEFAULTS,
  type NodeSpec,
} from "../cluster.ts";
import type { AttentionVariant, DTypeBytes, Layer, ModelGraph, Op } from "../model_graph.ts";
import { type Dimension, unitFactor, unitsOf } from "../units.ts";
import { LangError, parseSyntax, type Pos, type Stmt, type Value } from "./syntax.ts";

type Kind = Dimension | "word" | "bool" | "int";
type Schema = Record<string, Kind>;

class Reader {
  constructor(readonly file: string) {}

  fail(pos: Pos, msg: string): never {
    throw new LangError(this.file, pos.line, pos.col, msg);
  }

  /** A name: a word or a string. */
  name(v: Value | undefined, what: string, pos: Pos): string {
    if (v && (v.type === "word" || v.type === "string")) return v.value;
    return this.fail(v?.pos ?? pos, `expected ${what}`);
  }

  scalar(v: Value, kind: Kind, key: string): number | string | boolean {
    if (kind === "word") {
      if (v.type === "word" || v.type === "string") return v.value;
      return this.fail(v.pos, `"${key}" expects a name`);
    }
    if (kind === "bool") {
      if (v.type === "word" && (v.value === "true" || v.value === "false")) return v.value === "true";
      return this.fail(v.pos, `"${key}" expects true or false`);
    }
    if (v.type !== "number") return this.fail(v.pos, `"${key}" expects a number`);
    if (kind === "int" || kind === "count") {
      if (v.unit !== undefined) this.fail(v.pos, `"${key}" is a plain count; drop the unit "${v.unit}"`);
      if (kind === "int" && (!Number.isInteger(v.value) || v.value < 0)) {
        this.fail(v.pos, `"${key}" expects a non-negative integer`);
      }
      return v.value;
    }
    if (v.unit === undefined) {
      if (kind === "elem") return v.value;
      return this.fail(v.pos, `"${key}" needs a unit (one of ${unitsOf(kind).join(", ")})`);
    }
    const f = unitFactor(kind, v.unit);
    if (f === undefined) {
      this.fail(v.pos, `unknown unit "${v.unit}" for "${key}" (expected ${unitsOf(kind).join(", ")})`);
    }
    if (v.value < 0) this.fail(v.pos, `"${key}" must not be negative`);
    return v.value * f!;
  }

  /** Reads a body of `key = value` properties against a schema; unknown or repeated keys are errors. */
  props(body: Stmt[] | undefined, schema: Schema, what: string): Record<string, number | string | boolean> {
    const out: Record<string, number | string | boolean> = {};
    for (const s of body ?? []) {
      const kind = schema[s.key];
      if (!s.prop || kind === undefined) {
        this.fail(
          s.pos,
          `unknown property "${s.key}" in ${what} (expected ${Object.keys(schema).join(", ")})`,
        );
      }
      if (s.key in out) this.fail(s.pos, `"${s.key}" given twice in ${what}`);
      out[s.key] = this.scalar(s.prop!, kind, s.key);
    }
    return out;
  }

  require(p: Record<string, unknown>, key: string, pos: Pos, what: string): number {
    if (!(key in p)) this.fail(pos, `${what} needs "${key}"`);
    return p[key] as number;
  }
}

const NODE_SCHEMA: Schema = {
  mem: "bytes",
  mem_bw: "rate",
  cache: "bytes",
  cache_bw: "rate",
  flops: "flops",
  up: "netrate",
  down: "netrate",
  overhead: "time",
  layer_overhead: "time",
  reserve: "bytes",
  region: "word",
};
const LINK_SCHEMA: Schema = { latency: "time", bw: "netrate" };
const DTYPE_SCHEMA: Schema = {
  dense: "elem",
  experts: "elem",
  embed: "elem",
  kv: "elem",
  activation: "elem",
};

function applyNode(
  base: Omit<NodeSpec, "id">,
  p: Record<string, number | string | boolean>,
): Omit<NodeSpec, "id"> {
  const n = { ...base };
  if ("mem" in p) n.memBytes = p.mem as number;
  if ("mem_bw" in p) n.memBandwidth = p.mem_bw as number;
  if ("cache" in p) n.cacheBytes = p.cache as number;
  if ("cache_bw" in p) n.cacheBandwidth = p.cache_bw as number;
  if ("flops" in p) n.flops = p.flops as number;
  if ("up" in p) n.up = p.up as number;
  if ("down" in p) n.down = p.down as number;
  if ("overhead" in p) n.overhead = p.overhead as number;
  if ("layer_overhead" in p) n.layerOverhead = p.layer_overhead as number;
  if ("reserve" in p) n.reserveBytes = p.reserve as number;
  if ("region" in p) n.region = p.region as string;
  return n;
}

function readCluster(r: Reader, s: Stmt): Cluster {
  const name = s.args.length ? r.name(s.args[0], "a cluster name", s.pos) : "";
  let defaults = { ...NODE_DEFAULTS };
  let defaultLink = { ...DEFAULT_LINK };
  const nodes: NodeSpec[] = [];
  const links: LinkSpec[] = [];
  const constraints: Constraints = emptyConstraints();
  let quant: Partial<DTypeBytes> = {};
  const declared = new Map<string, Pos>();
  const used: { name: string; pos: Pos }[] = [];
  for (const st of s.body ?? []) {
    const a = st.args;
    const word = (i: number, w: string) => a[i]?.type === "word" && a[i].value === w;
    switch (st.key) {
      case "defaults":
        defaults = applyNode(defaults, r.props(st.body, NODE_SCHEMA, "defaults"));
        break;
      case "node": {
        const id = r.name(a[0], "a node name", st.pos);
        if (declared.has(id)) r.fail(a[0].pos, `node "${id}" declared twice`);
        declared.set(id, a[0].pos);
        nodes.push({ id, ...applyNode(defaults, r.props(st.body, NODE_SCHEMA, `node ${id}`)) });
        break;
      }
      case "link": {
        const p = r.props(st.body, LINK_SCHEMA, "link");
        if (word(0, "default") && a.length === 1) {
          defaultLink = {
            latency: (p.latency as number) ?? defaultLink.latency,
            bandwidth: (p.bw as number) ?? defaultLink.bandwidth,
          };
          break;
        }
        if (a.length !== 2) r.fail(st.pos, "link expects two node or region names (or `default`)");
        links.push({
          a: r.name(a[0], "a node or region name", st.pos),
          b: r.name(a[1], "a node or region name", st.pos),
          latency: (p.latency as number) ?? defaultLink.latency,
          bandwidth: (p.bw as number) ?? defaultLink.bandwidth,
        });
        break;
      }
      case "quant": {
        quant = r.props(st.body, DTYPE_SCHEMA, "quant") as Partial<DTypeBytes>;
        break;
      }
      case "pin": {
        // pin layers 0..4 on a
        if (!word(0, "layers") || a[1]?.type !== "range" || !word(2, "on") || a.length !== 4) {
          r.fail(st.pos, "expected `pin layers START..END on NODE`");
        }
        const range = a[1] as Extract<Value, { type: "range" }>;
        if (range.end <= range.start) r.fail(range.pos, "a layer range START..END needs END > START");
        const node = r.name(a[3], "a node name", st.pos);
        used.push({ name: node, pos: a[3].pos });
        constraints.pins.push({ start: range.start, end: range.end, node });
        break;
      }
      case "exclude":
        if (a.length === 0) r.fail(st.pos, "expected `exclude NODE ...`");
        for (const v of a) {
          const node = r.name(v, "a node name", st.pos);
          used.push({ name: node, pos: v.pos });
          constraints.exclude.push(node);
        }
        break;
      case "replicate": {
        // replicate layer 3 expert 17 on [a, b]
        if (
          !word(0, "layer") || a[1]?.type !== "number" || !word(2, "expert") || a[3]?.type !== "number" ||
          !word(4, "on") || a.length !== 6
        ) r.fail(st.pos, "expected `replicate layer L expert E on [NODE, ...]`");
        const list = a[5].type === "list" ? a[5].items : [a[5]];
        const nodesOn = list.map((v) => {
          const n = r.name(v, "a node name", st.pos);
          used.push({ name: n, pos: v.pos });
          return n;
        });
        const layer = r.scalar(a[1], "int", "layer") as number;
        const expert = r.scalar(a[3], "int", "expert") as number;
        constraints.replicas.push({ layer, expert, nodes: nodesOn });
        break;
      }
      case "order": {
        if (a.length !== 1 || a[0].type !== "list") r.fail(st.pos, "expected `order [NODE, ...]`");
        constraints.order = (a[0] as Extract<Value, { type: "list" }>).items.map((v) => {
          const n = r.name(v, "a node name", st.pos);
          used.push({ name: n, pos: v.pos });
          return n;
        });
        break;
      }
      default:
        r.fail(
          st.pos,
          `unknown statement "${st.key}" in cluster (expected defaults, node, link, quant, pin, exclude, replicate, order)`,
        );
    }
  }
  for (const u of used) if (!declared.has(u.name)) r.fail(u.pos, `unknown node "${u.name}"`);
  if (nodes.length === 0) r.fail(s.pos, "a cluster needs at least one node");
  return { name, nodes, links, defaultLink, constraints, quant };
}

const OP_SCHEMAS: Record<string, Schema> = {
  attention: { params: "count", kv: "count", head_dim: "int", flops: "count", ctx_flops: "count" },
  mlp: { params: "count", flops: "count" },
  norm: { params: "count" },
  moe: {
    experts: "int",
    top_k: "int",
    expert_params: "count",
    router_params: "count",
    shared: "int",
    shared_params: "count",
    flops: "count",
  },
};

function readOp(r: Reader, s: Stmt): Op {
  const schema = OP_SCHEMAS[s.key];
  if (!schema || s.prop) {
    r.fail(s.pos, `unknown operator "${s.key}" (expected ${Object.keys(OP_SCHEMAS).join(", ")})`);
  }
  const p = r.props(s.body, schema, s.key);
  const need = (k: string) => r.require(p, k, s.pos, s.key);
  switch (s.key) {
    case "attention": {
      const variant = r.name(s.args[0], "an attention kind (mha, gqa, mla)", s.pos);
      if (!["mha", "gqa", "mla"].includes(variant)) {
        r.fail(s.args[0].pos, `unknown attention kind "${variant}"`);
      }
      const params = need("params");
      return {
        kind: "attention",
        variant: variant as AttentionVariant,
        params,
        kvPerToken: need("kv"),
        ...(p.head_dim === undefined ? {} : { headDim: p.head_dim as number }),
        flops: (p.flops as number) ?? 2 * params,
        ctxFlops: need("ctx_flops"),
      };
    }
    case "mlp": {
      const params = need("params");
      return { kind: "mlp", params, flops: (p.flops as number) ?? 2 * params };
    }
    case "norm":
      return { kind: "norm", params: need("params") };
    default: {
      const experts = need("experts"), topK = need("top_k"), expertParams = need("expert_params");
      const routerParams = need("router_params");
      const shared = (p.shared as number) ?? 0, sharedParams = (p.shared_params as number) ?? 0;
      if (topK > experts) r.fail(s.pos, `top_k (${topK}) exceeds experts (${experts})`);
      const flops = (p.flops as number) ?? 2 * (topK * expertParams + routerParams + shared * sharedParams);
      return { kind: "moe", experts, topK, expertParams, routerParams, shared, sharedParams, flops };
    }
  }
}

const MODEL_SCHEMA: Schema = {
  family: "word",
  hidden: "int",
  vocab: "int",
  tied: "bool",
  embed: "count",
  head: "count",
};

function readModel(r: Reader, s: Stmt): ModelGraph {
  const name = s.args.length ? r.name(s.args[0], "a model name", s.pos) : "";
  const propStmts = (s.body ?? []).filter((b) => b.prop);
  const p = r.props(propStmts, MODEL_SCHEMA, "model");
  let dtype: DTypeBytes = { dense: 2, experts: 2, embed: 2, kv: 2, activation: 2 };
  const layers: (Layer | undefined)[] = [];
  for (const st of s.body ?? []) {
    if (st.prop) continue;
    if (st.key === "dtype") {
      dtype = { ...dtype, ...r.props(st.body, DTYPE_SCHEMA, "dtype") as Partial<DTypeBytes> };
    } else if (st.key === "layers" || st.key === "layer") {
      const v = st.args[0];
      let start: number, end: number;
      if (v?.type === "range" && st.key === "layers") [start, end] = [v.start, v.end];
      else if (v?.type === "number" && st.key === "layer" && Number.isInteger(v.value)) {
        [start, end] = [v.value, v.value + 1];
      } else return r.fail(st.pos, "expected `layers START..END { ... }` or `layer N { ... }`");
      if (end <= start || start < 0) r.fail(v.pos, "a layer range START..END needs 0 <= START < END");
      const ops = (st.body ?? []).map((o) => readOp(r, o));
      for (let i = start; i < end; i++) {
        if (layers[i]) r.fail(v.pos, `layer ${i} described twice`);
        layers[i] = { ops: ops.map((o) => ({ ...o })) };
      }
    } else r.fail(st.pos, `unknown statement "${st.key}" in model (expected dtype, layers, layer)`);
  }
  for (let i = 0; i < layers.length; i++) if (!layers[i]) r.fail(s.pos, `layer ${i} is not described`);
  const hidden = r.require(p, "hidden", s.pos, "model"), vocab = r.require(p, "vocab", s.pos, "model");
  return {
    name,
    family: (p.family as string) ?? "",
    hidden,
    vocab,
    dtype,
    embedParams: (p.embed as number) ?? vocab * hidden,
    headParams: (p.head as number) ?? vocab * hidden + hidden,
    tied: (p.tied as boolean) ?? false,
    layers: layers as Layer[],
  };
}

export interface Document {
  clusters: Cluster[];
  models: ModelGraph[];
}

/** Parses a file that may hold `cluster` and `model` blocks. */
export function parseDocument(text: string, opts: { file?: string } = {}): Document {
  const file = opts.file ?? "<input>";
  const r = new Reader(file);
  const doc: Document = { clusters: [], models: [] };
  for (const s of parseSyntax(text, file)) {
    if (s.key === "cluster" && s.body) doc.clusters.push(readCluster(r, s));
    else if (s.key === "model" && s.body) doc.models.push(readModel(r, s));
    else r.fail(s.pos, `expected \`cluster NAME { ... }\` or \`model NAME { ... }\`, got "${s.key}"`);
  }
  return doc;
}

/** Parses text holding exactly one `cluster` block. `file` names the source in error messages. */
export function parseCluster(text: string, opts: { file?: string } = {}): Cluster {
  const doc = parseDocument(text, opts);
  if (doc.clusters.length !== 1) {
    throw new LangError(
      opts.file ?? "<input>",
      1,
      1,
      `expected exactly one cluster block, found ${doc.clusters.length}`,
    );
  }
  return doc.clusters[0];
}

/** Parses text holding exactly one `model` block. */
export function parseModel(text: string, opts: { file?: string } = {}): ModelGraph {
  const doc = parseDocument(text, opts);
  if (doc.models.length !== 1) {
    throw new LangError(
      opts.file ?? "<input>",
      1,
      1,
      `expected exactly one model block, found ${doc.models.length}`,
    );
  }
  return doc.models[0];
}
