// Expert parallelism on the node (rung 2): where each MoE layer's routed experts live comes from the Plan
// (`stages[i].experts` for a stage's own node, `expertHosts` for the others: docs/PLAN_FORMAT.md). A node
// that holds experts runs an expert host actor (`moe-host-{node}`); a stage whose layers' experts live
// elsewhere routes on its own GPU, then sends each step's tokens to every node that holds one of the
// experts they chose — one message per destination node per layer, carrying every token's activation —
// and sums the replies (docs/EXPERTS.md). The roadmap's name `moe-expert-{layer}-{idx}` resolves through the
// Plan: the host of (layer, idx) is the node whose list holds idx.
import type { ActorContext, Behavior } from "../actors/mod.ts";
import type { ExpertFanout, ExpertInput, ExpertService } from "./backend.ts";
import type { HopTrace } from "./messages.ts";

/** The Plan fields this file reads (planner/plan.ts has the whole type). */
export interface ExpertPlan {
  expertMode?: string;
  stages: { node: string; layers: [number, number]; experts?: Record<string, number[]> }[];
  expertHosts?: { node: string; experts: Record<string, number[]> }[];
}

/** The actor that runs a node's held experts. */
export function expertHostName(node: string): string {
  return `moe-host-${node.slice(0, 16)}`;
}

/** Layer -> node -> expert ids, over every placement in the Plan. */
export function expertPlacement(plan: ExpertPlan): Map<number, Map<string, number[]>> {
  const out = new Map<number, Map<string, number[]>>();
  const add = (node: string, experts: Record<string, number[]> | undefined) => {
    for (const [layer, ids] of Object.entries(experts ?? {})) {
      const l = Number(layer);
      if (!out.has(l)) out.set(l, new Map());
      const m = out.get(l)!;
      m.set(node, [...(m.get(node) ?? []), ...ids].sort((a, b) => a - b));
    }
  };
  for (const s of plan.stages) add(s.node, s.experts);
  for (const h of plan.expertHosts ?? []) add(h.node, h.experts);
  return out;
}

/** What `node` holds: layer -> expert ids. */
export function heldBy(plan: ExpertPlan, node: string): Map<number, number[]> {
  const out = new Map<number, number[]>();
  for (const [layer, nodes] of expertPlacement(plan)) {
    const ids = nodes.get(node);
    if (ids?.length) out.set(layer, ids);
  }
  return out;
}

/**
 * The MoE layers of a stage that run their experts through hosts: in "spread" mode, every MoE layer of the
 * stage that the Plan places. ("local" Plans keep experts in the stage's own weights.)
 */
export function remoteLayers(plan: ExpertPlan, stage: number): number[] {
  if (plan.expertMode !== "spread") return [];
  const [a, b] = plan.stages[stage].layers;
  return [...expertPlacement(plan).keys()].filter((l) => l >= a && l < b).sort((x, y) => x - y);
}

/**
 * Spreads every MoE layer's routed experts over `nodes` in contiguous ranges (a node holds one range per
 * layer), rotating the start so that each node hosts some: `experts` maps each MoE layer to its expert
 * count. Writes the ranges into the Plan's stage entries (for a stage's own node) and `expertHosts`.
 */
export function spreadExperts<P extends ExpertPlan>(
  plan: P,
  experts: Map<number, number>,
  nodes: string[],
): P {
  const stages = plan.stages.map((s) => ({ ...s, experts: {} as Record<string, number[]> }));
  const hosts = new Map<string, Record<string, number[]>>();
  let rotate = 0;
  for (const [layer, E] of [...experts].sort((a, b) => a[0] - b[0])) {
    const n = Math.min(nodes.length, E);
    for (let j = 0; j < n; j++) {
      const node = nodes[(j + rotate) % nodes.length];
      const from = Math.floor((j * E) / n), to = Math.floor(((j + 1) * E) / n);
      const ids = Array.from({ length: to - from }, (_, i) => from + i);
      const stage = stages.find((s) => s.node === node);
      if (stage) stage.experts[String(layer)] = ids;
      else {
        if (!hosts.has(node)) hosts.set(node, {});
        hosts.get(node)![String(layer)] = ids;
      }
    }
    rotate = (rotate + 1) % nodes.length;
  }
  return {
    ...plan,
    expertMode: "spread",
    stages,
    expertHosts: [...hosts].map(([node, experts]) => ({ node, experts })),
  };
}

// The host request: header length (u32 LE), JSON {layer, T, k, request}, then xn f32 [T, H], ids u32 [T, k],
// weights f32 [T, k]. The reply: y f32 [T, H], then the host's compute time for it, ms (one f32): what the
// trace splits a fan-out's time by (the rest is the wire and the two ends' message handling).

export function encodeExpertRequest(layer: number, input: ExpertInput): Uint8Array {
  const k = input.ids.length / input.T;
  const header = new TextEncoder().encode(JSON.stringify({ layer, T: input.T, k, request: input.request }));
  const head = 4 + header.length + ((4 - ((4 + header.length) % 4)) % 4);
  const out = new Uint8Array(head + input.xn.byteLength + input.ids.byteLength + input.weights.byteLength);
  new DataView(out.buffer).setUint32(0, header.length, true);
  out.set(header, 4);
  let at = head;
  for (const a of [input.xn, input.ids, input.weights]) {
    out.set(new Uint8Array(a.buffer, a.byteOffset, a.byteLength), at);
    at += a.byteLength;
  }
  return out;
}

/** Decodes a host request; RangeError when its sizes do not add up (a garbled or hostile message). */
export function decodeExpertRequest(body: Uint8Array, hidden: number): { layer: number; input: ExpertInput } {
  if (body.length < 4) throw new RangeError("expert request shorter than its header");
  const len = new DataView(body.buffer, body.byteOffset, body.byteLength).getUint32(0, true);
  if (4 + len > body.length) throw new RangeError("expert request header past the end");
  const h = JSON.parse(new TextDecoder().decode(body.subarray(4, 4 + len)));
  const { layer, T, k } = h;
  for (const [name, v] of [["layer", layer], ["T", T], ["k", k]] as const) {
    if (!Number.isSafeInteger(v) || v < 0 || (name !== "layer" && v === 0)) {
      throw new RangeError(`expert request: bad ${name} ${JSON.stringify(v)}`);
    }
  }
  const head = 4 + len + ((4 - ((4 + len) % 4)) % 4);
  const need = head + 4 * (T * hidden + 2 * T * k);
  if (body.length !== need) throw new RangeError(`expert request of ${body.length} bytes; expected ${need}`);
  const data = body.slice(head);
  return {
    layer,
    input: {
      request: typeof h.request === "string" ? h.request : undefined,
      T,
      xn: new Float32Array(data.buffer, 0, T * hidden),
      ids: new Uint32Array(data.buffer, 4 * T * hidden, T * k),
      weights: new Float32Array(data.buffer, 4 * (T * hidden + T * k), T * k),
    },
  };
}

/** The behavior of `moe-host-{node}`: runs requests on the node's held experts and replies with their sum. */
export function expertHostBehavior(
  service: ExpertService,
  hidden: number,
  log: (m: string) => void,
): Behavior {
  return {
    async receive(body: Uint8Array, _ctx: ActorContext): Promise<Uint8Array> {
      let req;
      try {
        req = decodeExpertRequest(body, hidden);
      } catch (e) {
        log(`expert host: dropped a malformed request: ${(e as Error).message}`);
        throw e;
      }
      const t0 = performance.now();
      const y = await service.compute(req.layer, req.input);
      const out = new Uint8Array(y.byteLength + 4);
      out.set(new Uint8Array(y.buffer, y.byteOffset, y.byteLength));
      new DataView(out.buffer).setFloat32(y.byteLength, performance.now() - t0, true);
      return out;
    },
    onStop() {
      service.close();
    },
  };
}

/**
 * What went to each node for one request since the last step: layer -> node -> bytes sent + received, ms,
 * experts served, when the first call started (ms since the epoch) and the host's own compute ms.
 */
export type FanoutRecord = Map<
  number,
  Map<string, { bytes: number; ms: number; experts: Set<number>; at: number; hostMs: number }>
>;

/** A record as it travels in a hop's trace: layer -> node -> [bytes, ms, experts, at, host ms]. */
export type FanoutTrace = Record<string, Record<string, [number, number, number[], number, number]>>;

export function fanoutTrace(r: FanoutRecord): FanoutTrace {
  const out: FanoutTrace = {};
  for (const [layer, nodes] of r) {
    out[layer] = {};
    for (const [node, v] of nodes) {
      out[layer][node] = [
        v.bytes,
        Number(v.ms.toFixed(3)),
        [...v.experts].sort((a, b) => a - b),
        Number(v.at.toFixed(3)),
        Number(v.hostMs.toFixed(3)),
      ];
    }
  }
  return out;
}

/**
 * A stage's fanout: for each layer, the nodes holding an expert some token chose get one message each (the
 * local node's experts run in-process); their sums are added. Records per request what went where.
 */
export function createFanout(o: {
  plan: ExpertPlan;
  self: string;
  local: ExpertService | undefined;
  call(name: string, body: Uint8Array): Promise<Uint8Array>;
  record: Map<string, FanoutRecord>;
}): ExpertFanout {
  const placement = expertPlacement(o.plan);
  const sets = new Map(
    [...placement].map(([l, m]) => [l, [...m].map(([node, ids]) => [node, new Set(ids)] as const)]),
  );
  return async (layer, input) => {
    const hosts = sets.get(layer);
    if (!hosts) throw new Error(`the Plan places no experts of layer ${layer}`);
    const rec = input.request ? o.record.get(input.request) ?? new Map() : undefined;
    if (rec && input.request) o.record.set(input.request, rec);
    const chosen = new Set(input.ids);
    const body = encodeExpertRequest(layer, input);
    const parts = await Promise.all(
      hosts.filter(([, ids]) => [...chosen].some((e) => ids.has(e))).map(
        async ([node, ids]) => {
          const t0 = performance.now();
          let y: Float32Array;
          let bytes = 0;
          const hidden = input.xn.length / input.T;
          let hostMs;
          if (node === o.self && o.local) {
            y = await o.local.compute(layer, input);
            hostMs = performance.now() - t0;
          } else {
            const reply = await o.call(expertHostName(node), body);
            bytes = body.length + reply.length;
            const n = input.T * hidden * 4;
            if (reply.length !== n + 4) {
              throw new Error(
                `expert host ${node.slice(0, 10)} replied ${reply.length} bytes for layer ${layer}; ` +
                  `expected ${n + 4}`,
              );
            }
            y = new Float32Array(reply.slice(0, n).buffer);
            hostMs = new DataView(reply.buffer, reply.byteOffset + n, 4).getFloat32(0, true);
          }
          if (rec) {
            if (!rec.has(layer)) rec.set(layer, new Map());
            const r = rec.get(layer)!.get(node) ??
              { bytes: 0, ms: 0, experts: new Set<number>(), at: performance.timeOrigin + t0, hostMs: 0 };
            r.bytes += bytes;
            r.hostMs += hostMs;
            r.ms += performance.now() - t0;
            for (const e of chosen) if (ids.has(e)) r.experts.add(e);
            rec.get(layer)!.set(node, r);
          }
          return y;
        },
      ),
    );
    const sum = new Float32Array(input.xn.length);
    for (const p of parts) for (let i = 0; i < sum.length; i++) sum[i] += p[i];
    return sum;
  };
}

/** What a request's steps sent to expert hosts, summed from its traces (for `generate --json`). */
export interface ExpertReport {
  /** layer -> expert -> the node that served it in this request. */
  hosts: Record<string, Record<string, string>>;
  /** layer -> node -> bytes (request + reply) and ms over the whole request. */
  fanout: Record<string, Record<string, { bytes: number; ms: number }>>;
}

export function expertReport(
  traces: ({ x?: HopTrace["x"] }[] | undefined)[],
): ExpertReport | undefined {
  const hosts: ExpertReport["hosts"] = {};
  const fanout: ExpertReport["fanout"] = {};
  let any = false;
  for (const trace of traces) {
    for (const hop of trace ?? []) {
      for (const [layer, nodes] of Object.entries(hop.x ?? {})) {
        any = true;
        hosts[layer] ??= {};
        fanout[layer] ??= {};
        for (const [node, [bytes, ms, experts]] of Object.entries(nodes)) {
          for (const e of experts) hosts[layer][e] = node;
          const f = fanout[layer][node] ?? { bytes: 0, ms: 0 };
          fanout[layer][node] = { bytes: f.bytes + bytes, ms: Number((f.ms + ms).toFixed(3)) };
        }
      }
    }
  }
  return any ? { hosts, fanout } : undefined;
}
