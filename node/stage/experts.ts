// Expert parallelism on the node (rung 2): where each MoE layer's routed experts live comes from the Plan
// (`stages[i].experts` for a stage's own node, `expertHosts` for the others: docs/PLAN_FORMAT.md). A node
// that holds experts runs an expert host actor (`moe-host-{node}`); a stage whose layers' experts live
// elsewhere routes on its own GPU, then sends each step's tokens to every node that holds one of the
// experts they chose — one message per destination node per layer, carrying every token's activation —
// and sums the replies (docs/EXPERTS.md). The roadmap's name `moe-expert-{layer}-{idx}` resolves through the
// Plan: the host of (layer, idx) is the node whose list holds idx.
import type { ActorContext, Behavior } from "../actors/mod.ts";
import type { ExpertFanout, ExpertInput, ExpertService } from "./backend.ts";
import type { HopTrace, WireDtype } from "./messages.ts";
import { packHidden, unpackHidden } from "./wire_dtype.ts";

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

/** Whether every expert of `layers` has a host for which `ok(node)` holds (one live replica is enough). */
export function servable(plan: ExpertPlan, layers: number[], ok: (node: string) => boolean): boolean {
  const placement = expertPlacement(plan);
  return layers.every((l) => {
    const covered = new Set<number>();
    for (const [node, ids] of placement.get(l) ?? []) if (ok(node)) { for (const e of ids) covered.add(e); }
    return [...(placement.get(l)?.values() ?? [])].every((ids) => ids.every((e) => covered.has(e)));
  });
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

// The host request: header length (u32 LE), JSON {layer, T, k, request, dtype}, padding to 4 bytes, then
// xn [T, H] in `dtype` (the request's activations on the wire: "f16", or "f32" where the header has none),
// padding to 4 bytes, ids u32 [T, k], weights f32 [T, k]. The reply: y [T, H] in the same dtype, padding to
// 4 bytes, then the host's compute time in ms (f32), so that the stage can split a round trip into wire and
// remote compute.

/** Bytes of n values of `dtype`, padded to a multiple of 4. */
function padded(n: number, dtype: WireDtype): number {
  return Math.ceil((n * (dtype === "f16" ? 2 : 4)) / 4) * 4;
}

export function encodeExpertRequest(layer: number, input: ExpertInput, dtype: WireDtype = "f32"): Uint8Array {
  const k = input.ids.length / input.T;
  const header = new TextEncoder().encode(
    JSON.stringify({ layer, T: input.T, k, request: input.request, ...(dtype === "f32" ? {} : { dtype }) }),
  );
  const head = 4 + header.length + ((4 - ((4 + header.length) % 4)) % 4);
  const xn = packHidden(input.xn, dtype);
  const at = head + padded(input.xn.length, dtype);
  const out = new Uint8Array(at + input.ids.byteLength + input.weights.byteLength);
  new DataView(out.buffer).setUint32(0, header.length, true);
  out.set(header, 4);
  out.set(xn, head);
  out.set(new Uint8Array(input.ids.buffer, input.ids.byteOffset, input.ids.byteLength), at);
  out.set(
    new Uint8Array(input.weights.buffer, input.weights.byteOffset, input.weights.byteLength),
    at + 4 * input.ids.length,
  );
  return out;
}

/** Decodes a host request; RangeError when its sizes do not add up (a garbled or hostile message). */
export function decodeExpertRequest(
  body: Uint8Array,
  hidden: number,
): { layer: number; input: ExpertInput; dtype: WireDtype } {
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
  const dtype: WireDtype = h.dtype ?? "f32";
  if (dtype !== "f16" && dtype !== "f32") {
    throw new RangeError(`expert request: bad dtype ${JSON.stringify(h.dtype)} (f16 or f32)`);
  }
  const head = 4 + len + ((4 - ((4 + len) % 4)) % 4);
  const at = head + padded(T * hidden, dtype);
  const need = at + 8 * T * k;
  if (body.length !== need) throw new RangeError(`expert request of ${body.length} bytes; expected ${need}`);
  const rest = body.slice(at);
  return {
    layer,
    dtype,
    input: {
      request: typeof h.request === "string" ? h.request : undefined,
      T,
      xn: unpackHidden(body.subarray(head, head + T * hidden * (dtype === "f16" ? 2 : 4)), dtype, T * hidden),
      ids: new Uint32Array(rest.buffer, 0, T * k),
      weights: new Float32Array(rest.buffer, 4 * T * k, T * k),
    },
  };
}

/** A host's reply: y in the request's dtype, then its compute time (ms). */
export function encodeExpertReply(y: Float32Array, ms: number, dtype: WireDtype): Uint8Array {
  const at = padded(y.length, dtype);
  const out = new Uint8Array(at + 4);
  out.set(packHidden(y, dtype));
  new DataView(out.buffer).setFloat32(at, ms, true);
  return out;
}

/** Decodes a host's reply of `values` sums; RangeError when its size is not that. */
export function decodeExpertReply(
  reply: Uint8Array,
  values: number,
  dtype: WireDtype,
): { y: Float32Array; hostMs: number } {
  const at = padded(values, dtype);
  if (reply.length !== at + 4) throw new RangeError(`replied ${reply.length} bytes; expected ${at + 4}`);
  return {
    y: unpackHidden(reply.subarray(0, values * (dtype === "f16" ? 2 : 4)), dtype, values),
    hostMs: new DataView(reply.buffer, reply.byteOffset, reply.byteLength).getFloat32(at, true),
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
      return encodeExpertReply(y, performance.now() - t0, req.dtype);
    },
    onStop() {
      service.close();
    },
  };
}

/** One destination of a layer's fan-outs, summed over a request's steps. */
export interface FanoutNode {
  /** Bytes sent and received (0 for the stage's own node). */
  bytes: number;
  /** Round trips (or the local compute), ms. */
  ms: number;
  /** The host's own compute within them, ms. */
  hostMs: number;
  /** Messages (or local computes). */
  calls: number;
  experts: Set<number>;
  /** When the first call started, ms since the epoch (the trace's fan-out spans). */
  at: number;
}

/** A layer's fan-outs over a request's steps: their parts, and what went to each node. */
export interface FanoutLayer {
  steps: number;
  /** Reading back the routing and the activations on the stage's GPU, ms. */
  readbackMs: number;
  /** From the first send to the last reply, ms. */
  waitMs: number;
  /** Summing the replies, ms. */
  combineMs: number;
  nodes: Map<string, FanoutNode>;
  /** The router's picks: expert -> how many times a token chose it (every step, prefill included). */
  picks: Map<number, number>;
}

/** What went to each node for one request, per MoE layer. */
export type FanoutRecord = Map<number, FanoutLayer>;

/** A record as it travels in a hop's trace (messages.ts HopTrace `x` and `xp`). */
export interface FanoutTrace {
  /** layer -> node -> [bytes, ms, experts, at (first call's start, ms since the epoch), host ms, calls]. */
  x: Record<string, Record<string, [number, number, number[], number, number, number]>>;
  /** layer -> [fan-outs, readback ms, wait ms, combine ms]. */
  xp: Record<string, [number, number, number, number]>;
  /** layer -> the router's picks, [expert, count, expert, count, ...] (those picked at least once). */
  xc?: Record<string, number[]>;
}

const ms3 = (v: number) => Number(v.toFixed(3));

export function fanoutTrace(r: FanoutRecord): FanoutTrace {
  const out: FanoutTrace = { x: {}, xp: {}, xc: {} };
  for (const [layer, l] of r) {
    out.xp[layer] = [l.steps, ms3(l.readbackMs), ms3(l.waitMs), ms3(l.combineMs)];
    out.xc![layer] = [...l.picks].sort((a, b) => a[0] - b[0]).flat();
    out.x[layer] = {};
    for (const [node, v] of l.nodes) {
      out.x[layer][node] = [
        v.bytes,
        ms3(v.ms),
        [...v.experts].sort((a, b) => a - b),
        ms3(v.at),
        ms3(v.hostMs),
        v.calls,
      ];
    }
  }
  return out;
}

/** An expert id no host holds: a slot the destination of a message is not to run (hosts skip unknown ids). */
export const NOT_SENT = 0xffffffff;

/** How long a host whose call failed is passed over while another replica of its experts is live, ms. */
export const HOST_DOWN_MS = 10_000;

/**
 * How long a call to an expert host may go unanswered before its experts are also sent to another live
 * replica (ms; at least 8x that host's recent calls). A host killed without a word is only known dead when
 * membership says so, which a loaded machine can take tens of seconds to do; the hedge moves on sooner.
 */
export const HEDGE_MS = 2_000;

/**
 * The longest a call waits before it is hedged, however slow the host's recent calls were (ms): well under
 * the client's stall timeout (30 s), which would otherwise end the request while a layer waits on a host
 * that died (a loaded machine's calls can take seconds, and 8x that would be the wait).
 */
export const HEDGE_MAX_MS = 5_000;

/**
 * How long a call waits for a live host that has not registered `moe-host-{node}` yet (it is still loading
 * its experts, e.g. a replica the fan-out fails over to right after a new Plan), ms: under the client's
 * stall timeout (30 s), so that a host that never comes up ends in the request's re-plan, not a stall.
 */
export const HOST_READY_MS = 20_000;

/** An expert host's call failed; the message names the host and the layer. */
export class ExpertHostError extends Error {
  constructor(readonly node: string, readonly layer: number, cause: unknown) {
    super(`expert host ${node.slice(0, 10)} failed layer ${layer}: ${(cause as Error)?.message ?? cause}`, {
      cause,
    });
  }
}

/**
 * A stage's fanout: for each layer, each expert some token chose is run by one of its hosts (the Plan may
 * place replicas): the stage's own node when it holds one, else the cheapest live host (`cost`: the measured
 * round trip; ties in the Plan's order), a choice kept until that host fails, so that a request's steps go
 * the same way. Each destination gets one message per layer, whose ids name only the experts it is to run
 * (the others are NOT_SENT), so an expert with two copies is counted once; the replies are summed. When a
 * call fails (or `alive` says the host is gone), the experts it was to run are sent at once to another
 * replica; only an expert with no live replica left fails the step (and the request takes the re-plan
 * path). Records per request what went where, how long each part took, and the router's picks.
 */
export function createFanout(o: {
  plan: ExpertPlan;
  self: string;
  local: ExpertService | undefined;
  /** Calls `moe-host-{node}` (its name: expertHostName(node)). */
  call(name: string, body: Uint8Array, node: string): Promise<Uint8Array>;
  record: Map<string, FanoutRecord>;
  /** False for a node membership says is gone (default: every node is live). */
  alive?: (node: string) => boolean;
  /** The cost of sending to `node` (lower first; default 0: the Plan's order decides). */
  cost?: (node: string) => number;
  /** Milliseconds now (default performance.now), for how long a failed host is passed over. */
  now?: () => number;
  /** The least wait before a call is hedged to another replica (default HEDGE_MS; at most HEDGE_MAX_MS unless more). */
  hedgeMs?: number;
  /**
   * The dtype of a request's activations and sums on the way to and from other hosts: the request's own
   * wire (`--wire`, f16 by default for the chain's hops); absent, or for an unknown request, f32.
   */
  wire?: (request: string | undefined) => WireDtype | undefined;
}): ExpertFanout {
  const placement = expertPlacement(o.plan);
  const now = o.now ?? (() => performance.now());
  // layer -> expert -> its hosts, in the Plan's order.
  const hostsOf = new Map<number, Map<number, string[]>>();
  for (const [layer, nodes] of placement) {
    const m = new Map<number, string[]>();
    for (const [node, ids] of nodes) for (const e of ids) m.set(e, [...(m.get(e) ?? []), node]);
    hostsOf.set(layer, m);
  }
  /** layer -> expert -> the host that runs it (until that host fails). */
  const route = new Map<number, Map<number, string>>();
  /** node -> until when it is passed over (its last call failed, or a replica answered for it first). */
  const down = new Map<string, number>();
  const usable = (node: string) =>
    (node === o.self ? o.local !== undefined : true) && (o.alive?.(node) ?? true);
  /** The host for expert `e` of `layer`, not one of `failed`; undefined when no replica is left. */
  const pick = (layer: number, e: number, failed: Set<string>, keep = true): string | undefined => {
    const kept = route.get(layer)?.get(e);
    if (kept && !failed.has(kept) && usable(kept) && (down.get(kept) ?? 0) <= now()) return kept;
    const all = (hostsOf.get(layer)?.get(e) ?? []).filter((h) => !failed.has(h) && usable(h));
    const t = now();
    const up = all.filter((h) => (down.get(h) ?? 0) <= t);
    const from = up.length ? up : all; // every live replica failed lately: try them again
    if (from.length === 0) return undefined;
    const best = from.includes(o.self) ? o.self : from.map((h, i) => ({ h, i, c: o.cost?.(h) ?? 0 }))
      .sort((a, b) => a.c - b.c || a.i - b.i)[0].h;
    if (!keep) return best;
    if (!route.has(layer)) route.set(layer, new Map());
    route.get(layer)!.set(e, best);
    return best;
  };
  /** node -> its calls' recent duration (a moving average, ms), for when to hedge. */
  const latency = new Map<string, number>();
  const hedgeAfter = (node: string) => {
    const least = o.hedgeMs ?? HEDGE_MS;
    return Math.max(least, Math.min(8 * (latency.get(node) ?? 0), HEDGE_MAX_MS));
  };
  return async (layer, input) => {
    const experts = hostsOf.get(layer);
    if (!experts) throw new Error(`the Plan places no experts of layer ${layer}`);
    const rec = input.request ? o.record.get(input.request) ?? new Map() : undefined;
    if (rec && input.request) o.record.set(input.request, rec);
    const hidden = input.xn.length / input.T;
    const layerRec: FanoutLayer | undefined = rec
      ? rec.get(layer) ??
        { steps: 0, readbackMs: 0, waitMs: 0, combineMs: 0, nodes: new Map(), picks: new Map() }
      : undefined;
    if (rec && layerRec) rec.set(layer, layerRec);
    if (layerRec) { for (const e of input.ids) layerRec.picks.set(e, (layerRec.picks.get(e) ?? 0) + 1); }
    const start = performance.now();

    /** One message to `node` for experts `mine`: its reply (this node's own experts computed here). */
    const callOne = async (node: string, mine: Set<number>): Promise<Float32Array> => {
      const part: ExpertInput = {
        ...input,
        ids: input.ids.map((e) => mine.has(e) ? e : NOT_SENT),
      };
      const t0 = performance.now();
      let y: Float32Array;
      let bytes = 0, hostMs: number;
      if (node === o.self) {
        y = await o.local!.compute(layer, part);
        hostMs = performance.now() - t0;
      } else {
        const dtype = o.wire?.(input.request) ?? "f32";
        const body = encodeExpertRequest(layer, part, dtype);
        let reply: Uint8Array;
        try {
          reply = await o.call(expertHostName(node), body, node);
        } catch (e) {
          throw new ExpertHostError(node, layer, e);
        }
        bytes = body.length + reply.length;
        try {
          ({ y, hostMs } = decodeExpertReply(reply, input.T * hidden, dtype));
        } catch (e) {
          throw new ExpertHostError(node, layer, e);
        }
        const ms = performance.now() - t0;
        latency.set(node, 0.8 * (latency.get(node) ?? ms) + 0.2 * ms);
      }
      if (layerRec) {
        const r = layerRec.nodes.get(node) ??
          {
            bytes: 0,
            ms: 0,
            hostMs: 0,
            calls: 0,
            experts: new Set<number>(),
            at: performance.timeOrigin + t0,
          };
        r.calls++;
        r.bytes += bytes;
        r.ms += performance.now() - t0;
        r.hostMs += hostMs;
        for (const e of mine) r.experts.add(e);
        layerRec.nodes.set(node, r);
      }
      return y;
    };

    /**
     * callOne to another host, hedged: if it has not answered after hedgeAfter(node) (a host that died
     * without a word, before membership says so, or one that stalls) or it fails, `mine` is also sent to
     * other live replicas (runAll without this host); the first complete answer wins, the other is dropped
     * (each sums the same experts). Without another replica it waits for this call, as before.
     */
    const callHedged = (node: string, mine: Set<number>, failed: Set<string>): Promise<Float32Array[]> => {
      if (node === o.self) return callOne(node, mine).then((y) => [y]);
      return new Promise((resolve, reject) => {
        let settled = false, running = 1, hedged = false;
        const win = (parts: Float32Array[]) => {
          if (settled) return;
          settled = true;
          clearTimeout(timer);
          resolve(parts);
        };
        const lose = (e: unknown) => {
          running--;
          if (running > 0 || settled) return;
          settled = true;
          clearTimeout(timer);
          reject(e);
        };
        const hedge = () => {
          if (hedged || settled) return;
          const without = new Set([...failed, node]);
          if (![...mine].every((e) => pick(layer, e, without, false) !== undefined)) return;
          hedged = true;
          running++;
          runAll([...mine], without).then((parts) => {
            // A replica answered while this host had not: it is passed over for later steps and the other
            // layers' routes too (a host killed without a word would otherwise hold each layer for
            // hedgeAfter, one after another, until membership says it is dead).
            if (!settled) down.set(node, now() + HOST_DOWN_MS);
            win(parts);
          }, lose);
        };
        const timer = setTimeout(hedge, hedgeAfter(node));
        callOne(node, mine).then((y) => win([y]), (e) => {
          // Passed over for later steps too; the hedge's picks (or runAll's, without one) move the route.
          if (e instanceof ExpertHostError) {
            down.set(node, now() + HOST_DOWN_MS);
            hedge();
          }
          lose(e);
        });
      });
    };

    /** Experts `ids` of this layer on hosts not in `exclude`, a failed host's experts moved to a replica. */
    const runAll = async (ids: number[], exclude: Set<string>): Promise<Float32Array[]> => {
      const failed = new Set(exclude);
      const parts: Float32Array[] = [];
      let todo = ids;
      let lastError: unknown;
      while (todo.length) {
        const dest = new Map<string, Set<number>>();
        for (const e of todo) {
          const h = pick(layer, e, failed);
          if (h === undefined) {
            if (!experts.has(e)) throw new Error(`the Plan places no host for expert ${e} of layer ${layer}`);
            throw lastError ?? new Error(`no live host holds expert ${e} of layer ${layer}`);
          }
          if (!dest.has(h)) dest.set(h, new Set());
          dest.get(h)!.add(e);
        }
        const results = await Promise.allSettled(
          [...dest].map(([node, mine]) => callHedged(node, mine, failed)),
        );
        todo = [];
        [...dest].forEach(([node, mine], i) => {
          const r = results[i];
          if (r.status === "fulfilled") return void parts.push(...r.value);
          // Only a host's failure moves its experts; a failure of this node's own compute is the step's.
          if (!(r.reason instanceof ExpertHostError)) throw r.reason;
          lastError = r.reason;
          failed.add(node);
          down.set(node, now() + HOST_DOWN_MS);
          for (const e of mine) route.get(layer)?.delete(e);
          todo.push(...mine);
        });
      }
      return parts;
    };

    const parts = await runAll([...new Set(input.ids)], new Set());
    const replied = performance.now();
    const sum = new Float32Array(input.xn.length);
    for (const p of parts) for (let i = 0; i < sum.length; i++) sum[i] += p[i];
    if (layerRec) {
      layerRec.steps++;
      layerRec.readbackMs += input.readbackMs ?? 0;
      layerRec.waitMs += replied - start;
      layerRec.combineMs += performance.now() - replied;
    }
    return sum;
  };
}

/** What a request's steps sent to expert hosts, summed from its traces (for `generate --json`). */
export interface ExpertReport {
  /** layer -> expert -> the node that served it in this request. */
  hosts: Record<string, Record<string, string>>;
  /** layer -> node -> bytes (request + reply), ms (round trips) and host_ms (its compute) over the request. */
  fanout: Record<string, Record<string, { bytes: number; ms: number; host_ms: number }>>;
  /**
   * layer -> the fan-out's parts over the request: fan-outs (steps), readback of the routing and activations,
   * wait (first send to last reply), combine, ms.
   */
  parts: Record<string, FanoutParts>;
  /** layer -> expert -> how many times the router chose it over the request (prefill included). */
  picks: Record<string, Record<string, number>>;
}

/** A layer's fan-outs over a request: counts and ms summed over its steps. */
export interface FanoutParts {
  /** Fan-outs (the stage's steps through this layer). */
  steps: number;
  /** Reading back the routing and the activations. */
  readback_ms: number;
  /** From the first send to the last reply. */
  wait_ms: number;
  /** Summing the replies. */
  combine_ms: number;
  /** Messages to other nodes, their round trips and the hosts' compute within them (wire = ms - host_ms). */
  remote: { calls: number; ms: number; host_ms: number };
  /** The stage's own share (computed in its process beside the remote ones). */
  own: { calls: number; ms: number };
}

export function expertReport(
  traces: (Pick<HopTrace, "x" | "xp" | "xc">[] | undefined)[],
): ExpertReport | undefined {
  const hosts: ExpertReport["hosts"] = {};
  const picks: ExpertReport["picks"] = {};
  const fanout: ExpertReport["fanout"] = {};
  const parts: ExpertReport["parts"] = {};
  const part = (layer: string) =>
    parts[layer] ??= {
      steps: 0,
      readback_ms: 0,
      wait_ms: 0,
      combine_ms: 0,
      remote: { calls: 0, ms: 0, host_ms: 0 },
      own: { calls: 0, ms: 0 },
    };
  let any = false;
  for (const trace of traces) {
    for (const hop of trace ?? []) {
      for (const [layer, nodes] of Object.entries(hop.x ?? {})) {
        any = true;
        hosts[layer] ??= {};
        fanout[layer] ??= {};
        for (const [node, [bytes, ms, experts, _at, hostMs, calls]] of Object.entries(nodes)) {
          for (const e of experts) hosts[layer][e] = node;
          const p = part(layer);
          if (bytes > 0) {
            p.remote.calls += calls ?? 0;
            p.remote.ms = ms3(p.remote.ms + ms);
            p.remote.host_ms = ms3(p.remote.host_ms + (hostMs ?? 0));
          } else {
            p.own.calls += calls ?? 0;
            p.own.ms = ms3(p.own.ms + ms);
          }
          const f = fanout[layer][node] ?? { bytes: 0, ms: 0, host_ms: 0 };
          fanout[layer][node] = {
            bytes: f.bytes + bytes,
            ms: ms3(f.ms + ms),
            host_ms: ms3(f.host_ms + (hostMs ?? 0)),
          };
        }
      }
      for (const [layer, flat] of Object.entries(hop.xc ?? {})) {
        const c = picks[layer] ??= {};
        for (let i = 0; i + 1 < flat.length; i += 2) c[flat[i]] = (c[flat[i]] ?? 0) + flat[i + 1];
      }
      for (const [layer, [steps, readback, wait, combine]] of Object.entries(hop.xp ?? {})) {
        const p = part(layer);
        p.steps += steps;
        p.readback_ms = ms3(p.readback_ms + readback);
        p.wait_ms = ms3(p.wait_ms + wait);
        p.combine_ms = ms3(p.combine_ms + combine);
      }
    }
  }
  return any ? { hosts, fanout, parts, picks } : undefined;
}

/**
 * A request's picks as the routing counts `plan --routing FILE` reads: {"<layer>": [count per routed
 * expert]}, `experts(layer)` giving each MoE layer's expert count (its experts never picked count 0).
 */
export function routingCounts(
  picks: ExpertReport["picks"],
  experts: (layer: number) => number,
): Record<string, number[]> {
  const out: Record<string, number[]> = {};
  for (const [layer, c] of Object.entries(picks)) {
    const E = experts(Number(layer));
    out[layer] = Array.from({ length: E }, (_, e) => c[e] ?? 0);
  }
  return out;
}
