// The expert registry at Kimi K2's scale (61 layers, 60 of them MoE x 384 routed experts = 23,040 expert
// names) over 32 simulated nodes (in-memory network, fake clock, memberlist's `lan` timings, 64-character
// node ids as iroh's). The leader publishes a Plan (the Assignment rides membership); each node registers
// the experts the Plan gives it as one name set (Registry.registerSet) the moment it adopts the Plan, as the
// runtime should. Measured: the simulated time until every node resolves every expert name to the Plan's
// hosts, and the size of every push-pull against the control channel's message limit. Results feed
// docs/MEMBERSHIP.md.
//
//   deno run -A scripts/sim/expert_registry.ts [--nodes 32] [--layout spread|compact|striped|all]
//                                             [--seeds 3] [--registration sets|names] [--loss 0,0.1]
//                                             [--json out.json]
//
// Layouts: spread = planChain's expert parallelism (every layer on >= 2 nodes, every node hosting);
// compact = the planner's own spread when stages cannot hold their experts (4.5-bit experts, 24 GiB GPUs);
// striped = a worst case no planner makes: expert e of layer l on node (l + e) mod N, so every host holds
// ~720 single ids (no ranges to merge).
import { parseArgs } from "node:util";
import { scriptArgs } from "../args.ts";
import { lan, type MembershipConfig } from "../../node/membership/mod.ts";
import { decodePacket } from "../../node/membership/messages.ts";
import { encodeEntries } from "../../node/registry/entry.ts";
import { encodeParts, toGroups } from "../../node/registry/name_set.ts";
import {
  type Assignment,
  AssignmentBoard,
  EXPERT_PREFIX,
  expertName,
  expertPlacement,
  expertSet,
  planChain,
} from "../../node/stage/mod.ts";
import type { ExpertPlan } from "../../node/stage/experts.ts";
import { CONTROL_MAX_BYTES } from "../../node/wire/mod.ts";
import { clusterFromNodes, compileHfConfig, type Plan, planPipeline } from "../../planner/mod.ts";
import { SimCluster, type SimNode } from "../../tests/support/sim_cluster.ts";

export type Layout = "spread" | "compact" | "striped";

export interface ExpertRegistryResult {
  layout: Layout;
  nodes: number;
  seed: number;
  loss: number;
  /** Expert names the Plan places (MoE layers x routed experts). */
  expertNames: number;
  /** Nodes holding experts; set entries (parts) registered in all. */
  hosts: number;
  setEntries: number;
  /** Simulated ms from the Plan's publication until every node resolves every expert name as placed. */
  agreeMs: number | undefined;
  /** Push-pull messages sent from the publication until 60 s later, and their sizes in bytes. */
  pushPulls: number;
  pushPullMaxBytes: number;
  pushPullMedianBytes: number;
  /** The largest push-pull's parts: the registry's state, the Assignment (the Plan), the member table. */
  largest: { registryBytes: number; pipelineBytes: number; rest: number };
  /** The control channel's message limit. */
  limitBytes: number;
  /**
   * The largest message other than a push-pull: gossip packets (packed up to membership's packetBytes),
   * probes, and the registry's direct update of a new set to each member (all its parts in one message).
   */
  otherMaxBytes: number;
  /** What the registry state would be with one entry per expert (the design this replaces). */
  onePerExpertStateBytes: number;
}

const KIMI = new URL("../../planner/examples/kimi-k2/config.json", import.meta.url);

/** A 64-hex-character id, as iroh's, derived from `i`. */
export function hexId(i: number): string {
  let h = 0x811c9dc5 ^ i, out = "";
  while (out.length < 64) {
    h = Math.imul(h ^ (h >>> 15), 0x2c1b3c6d) >>> 0;
    out += h.toString(16).padStart(8, "0");
  }
  return out.slice(0, 64);
}

/** The Plan a layout gives on `ids`. */
export function kimiPlan(ids: string[], layout: Layout): Plan {
  const config = JSON.parse(Deno.readTextFileSync(KIMI));
  if (layout === "spread") {
    const descriptor = {
      measured_at: null,
      memory_bytes: 80 * 2 ** 30,
      read_gbps: null,
      dispatch_ms: null,
      readback_ms: null,
      links: {},
    };
    return planChain(config, ids.map((id) => ({ id, descriptor })), { experts: "spread" });
  }
  const model = compileHfConfig(config);
  const cluster = clusterFromNodes(ids.map((id) => ({ id, memBytes: 24 * 2 ** 30 })), {
    quant: { experts: 0.5625, dense: 1 },
  });
  const plan = planPipeline(model, cluster, { experts: "spread" });
  if (layout === "compact") return plan;
  // striped: the same stages, every expert moved to node (layer + expert) mod N.
  const hosts = new Map<string, Record<string, number[]>>();
  const stages = plan.stages.map((s) => {
    const own: Record<string, number[]> = {};
    for (const [key, _] of Object.entries(s.experts ?? {})) {
      const l = Number(key);
      own[key] = [];
      for (let e = 0; e < 384; e++) {
        const node = ids[(l + e) % ids.length];
        if (node === s.node) own[key].push(e);
        else {
          const rec = hosts.get(node) ?? {};
          (rec[key] ??= []).push(e);
          hosts.set(node, rec);
        }
      }
    }
    return { ...s, experts: own };
  });
  return { ...plan, stages, expertHosts: [...hosts].map(([node, experts]) => ({ node, experts })) };
}

/** Every node's expected view: per holder, its groups (what `sets()` shows when all agree). */
function expectedSets(plan: Plan, ids: string[]): string {
  const out = [];
  for (const id of [...ids].sort()) {
    const groups = expertSet(plan, id);
    if (Object.keys(groups).length === 0) continue;
    const sorted = Object.fromEntries(Object.entries(groups).sort((a, b) => (a[0] < b[0] ? -1 : 1)));
    out.push({ prefix: EXPERT_PREFIX, owner: id, groups: sorted });
  }
  return JSON.stringify(out);
}

/** Runs one simulation. */
export function expertRegistrySim(
  opts: {
    nodes?: number;
    layout?: Layout;
    seed?: number;
    config?: MembershipConfig;
    /** Check every node's resolution of every name (default), or two nodes' (faster). */
    verifyAll?: boolean;
    /** "sets" (default: Registry.registerSet) or "names" (one register() per expert: the old way). */
    registration?: "sets" | "names";
    /** Probability that any message is lost, from the publication on (default 0). */
    loss?: number;
  } = {},
): ExpertRegistryResult {
  const n = opts.nodes ?? 32, layout = opts.layout ?? "spread", seed = opts.seed ?? 1;
  const ids = Array.from({ length: n }, (_, i) => hexId(i));
  const plan = kimiPlan(ids, layout);
  const layoutByLayer = expertPlacement(plan);
  const want = expectedSets(plan, ids);

  let measuring = false;
  const pushPulls: number[] = [];
  let largest = { bytes: 0, registryBytes: 0, pipelineBytes: 0, rest: 0 };
  let otherMax = 0;
  const c = new SimCluster({
    n,
    config: opts.config ?? lan,
    seed,
    ids,
    onSend: (_from, _to, bytes) => {
      if (!measuring) return;
      // A push-pull is one message whose JSON starts with {"t":"pushPull"; anything else is gossip/probes.
      const isPushPull = bytes.length > 20 &&
        new TextDecoder().decode(bytes.subarray(6, 20)) === '{"t":"pushPull';
      if (!isPushPull) return void (otherMax = Math.max(otherMax, bytes.length));
      pushPulls.push(bytes.length);
      if (bytes.length <= largest.bytes) return;
      const m = decodePacket(bytes).messages[0];
      if (m?.t !== "pushPull") return;
      const registryBytes = m.user.registry?.length ?? 0, pipelineBytes = m.user.pipeline?.length ?? 0;
      largest = {
        bytes: bytes.length,
        registryBytes,
        pipelineBytes,
        rest: bytes.length - registryBytes - pipelineBytes,
      };
    },
  });
  c.joinAll();
  if (c.clock.runUntilTrue(() => c.converged(), { stepMs: 50, maxMs: 300_000 }) === undefined) {
    throw new Error("membership did not converge");
  }
  const boards = c.nodes.map((node: SimNode) => {
    const board = new AssignmentBoard(node.membership);
    board.onChange((a: Assignment) => {
      const mine = expertSet(a.plan as unknown as ExpertPlan, node.id);
      if (opts.registration !== "names") return node.registry.registerSet(EXPERT_PREFIX, mine);
      for (const [l, ranges] of Object.entries(mine)) {
        for (const [s, e] of ranges) {
          for (let i = s; i < e; i++) node.registry.register(expertName(Number(l), i));
        }
      }
    });
    return board;
  });
  measuring = true;
  if (opts.loss) c.net.setDefaultLink({ loss: opts.loss });
  const t0 = c.clock.now();
  boards[0].publish({
    plan: plan as unknown as Assignment["plan"],
    model: { dir: "kimi-k2", weights: "q4" },
    layers: 61,
  });
  const names = [...layoutByLayer].flatMap(([l, hosts]) =>
    [...hosts].flatMap(([h, list]) => list.map((e) => [expertName(l, e), h]))
  );
  const agree = opts.registration === "names"
    ? () => c.nodes.every((node) => names.every(([name, h]) => node.registry.resolve(name) === h))
    : () => c.nodes.every((node) => JSON.stringify(node.registry.sets()) === want);
  const agreeMs = c.clock.runUntilTrue(agree, { stepMs: 20, maxMs: 120_000 });
  // Every expert name resolves everywhere to its hosts (all of them for a replica).
  const check = opts.verifyAll === false ? c.nodes.slice(0, 2) : c.nodes;
  if (agreeMs !== undefined && opts.registration !== "names") {
    for (const node of check) {
      for (const [l, hosts] of layoutByLayer) {
        const holders = new Map<number, string[]>();
        for (const [h, list] of hosts) for (const e of list) holders.set(e, [...(holders.get(e) ?? []), h]);
        for (const [e, hs] of holders) {
          const got = node.registry.owners(expertName(l, e));
          if (JSON.stringify(got) !== JSON.stringify(hs.sort())) {
            throw new Error(
              `${node.id.slice(0, 8)} resolves ${expertName(l, e)} to ${got}, the Plan says ${hs}`,
            );
          }
        }
      }
    }
  }
  c.clock.advance(Math.max(0, 60_000 - (c.clock.now() - t0)));
  measuring = false;
  const sorted = [...pushPulls].sort((a, b) => a - b);
  let expertNames = 0;
  const naive = [];
  for (const [l, hosts] of layoutByLayer) {
    const seen = new Set<number>();
    for (const [h, list] of hosts) {
      for (const e of list) {
        if (!seen.has(e)) expertNames++;
        seen.add(e);
        naive.push({ name: expertName(l, e), owner: h, version: 1, writer: h });
      }
    }
  }
  // The parts registerSet writes: one entry per PART_CHARS of range text per holder.
  const setEntries = ids.reduce((a, id) => a + encodeParts(toGroups(expertSet(plan, id))).length, 0);
  return {
    layout,
    nodes: n,
    seed,
    loss: opts.loss ?? 0,
    expertNames,
    hosts: JSON.parse(want).length,
    setEntries,
    agreeMs,
    pushPulls: pushPulls.length,
    pushPullMaxBytes: sorted.at(-1) ?? 0,
    pushPullMedianBytes: sorted[Math.floor((sorted.length - 1) / 2)] ?? 0,
    largest: {
      registryBytes: largest.registryBytes,
      pipelineBytes: largest.pipelineBytes,
      rest: largest.rest,
    },
    limitBytes: CONTROL_MAX_BYTES,
    otherMaxBytes: otherMax,
    onePerExpertStateBytes: Math.ceil(encodeEntries(naive).length * 4 / 3),
  };
}

if (import.meta.main) {
  const { values } = scriptArgs(import.meta.url, (args) =>
    parseArgs({
      args,
      options: {
        nodes: { type: "string", default: "32" },
        layout: { type: "string", default: "spread" },
        seeds: { type: "string", default: "3" },
        registration: { type: "string", default: "sets" },
        loss: { type: "string", default: "0" },
        json: { type: "string" },
      },
    }));
  const layouts = values.layout === "all" ? ["spread", "compact", "striped"] : [values.layout];
  const results: ExpertRegistryResult[] = [];
  const losses = values.loss.split(",").map(Number);
  for (const loss of losses) {
    for (const layout of layouts as Layout[]) {
      for (let seed = 1; seed <= Number(values.seeds); seed++) {
        const t = performance.now();
        const registration = values.registration as "sets" | "names";
        const r = expertRegistrySim({ nodes: Number(values.nodes), layout, seed, registration, loss });
        results.push(r);
        console.log(
          `${layout} seed ${seed}${
            loss ? `, ${loss * 100}% loss` : ""
          }: ${r.expertNames} expert names on ${r.hosts} hosts in ${r.setEntries} set entries; ` +
            `agree after ${
              r.agreeMs === undefined ? "never (120 s)" : `${(r.agreeMs / 1000).toFixed(2)} s`
            }; ` +
            `${r.pushPulls} push-pulls, max ${r.pushPullMaxBytes} B (registry ${r.largest.registryBytes}, plan ${r.largest.pipelineBytes}, ` +
            `rest ${r.largest.rest}), median ${r.pushPullMedianBytes} B, limit ${r.limitBytes} B; other messages <= ${r.otherMaxBytes} B; ` +
            `one entry per expert would be ${r.onePerExpertStateBytes} B of registry state [${
              ((performance.now() - t) / 1000).toFixed(1)
            } s]`,
        );
      }
    }
  }
  if (values.json) Deno.writeTextFileSync(values.json, JSON.stringify(results, null, 2) + "\n");
}
