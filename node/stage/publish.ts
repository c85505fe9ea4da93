// The leader's step that starts a chain: wait for the members (and for those measuring themselves to finish),
// plan the chain over them from their measured descriptors (or map a given Plan onto them) and publish the
// Assignment on the board, which every member's PipelineNode follows.
import { join } from "node:path";
import type { Member, Membership } from "../membership/mod.ts";
import { descriptorView } from "../descriptor.ts";
import type { Links } from "../links.ts";
import type { Assignment } from "./assignment.ts";
import type { WireDtype } from "./messages.ts";
import type { PipelineNode } from "./pipeline.ts";
import { type ChainMember, planChain } from "./plan_chain.ts";
import { type ExpertPlan, spreadExperts } from "./experts.ts";
import { compileHfConfig } from "../../planner/mod.ts";
import { moeOf } from "../../planner/model_graph.ts";
import { RequestError } from "../../models/errors.ts";

export interface PublishOptions {
  /** Checkpoint folder (absolute paths travel best: every node opens the same path). */
  modelDir: string;
  weights: string;
  /** The KV cache's element type every stage allocates (`up --kv`; absent or "auto": each node's default). */
  kv?: string;
  /** The chain's activations between stages for requests that name none (`up --wire`; default f16). */
  wire?: WireDtype;
  /** Members to wait for before planning. */
  members: number;
  /** A Plan JSON to use instead of planning: its stage nodes are mapped onto the members in order. */
  plan?: { stages: { node: string }[] } & Record<string, unknown>;
  /** Give up waiting for the members after this long (default 60 s). */
  timeoutMs?: number;
  /**
   * Wait at most this long, once the members are there, for those still measuring themselves (default
   * 20 s, or 3 s a member when more); past it, what they have not measured takes the planner's defaults.
   */
  measureTimeoutMs?: number;
  signal?: AbortSignal;
  /**
   * "spread": every MoE layer's routed experts are placed across the members (expert parallelism), even
   * where they would fit on the layer's stage (planChain's spread: the planner's wide placement; a given
   * `plan` gets spreadExperts' ranges); "local" (default): each stage holds its layers' experts.
   */
  experts?: "local" | "spread";
}

/**
 * Waits for `members` live members, plans the chain over them (this node first) and publishes it.
 * Throws TypeError when the model's config.json cannot be read and RangeError when `plan` names more
 * nodes than the cluster has (bad input: the CLI exits 2); a plain Error when the members do not come.
 */
export async function publishPlan(
  node: { membership: Membership; links: Links },
  pipeline: PipelineNode,
  opts: PublishOptions,
): Promise<Assignment> {
  const deadline = performance.now() + (opts.timeoutMs ?? 60_000);
  const alive = () => node.membership.members().filter((m) => m.state === "alive");
  while (alive().length < opts.members) {
    opts.signal?.throwIfAborted();
    if (performance.now() > deadline) {
      throw new Error(
        `only ${alive().length} of ${opts.members} nodes joined within ${
          (opts.timeoutMs ?? 60_000) / 1000
        } s`,
      );
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  const self = node.membership.id;
  const order = (ms: Member[]) =>
    ms.sort((a, b) => (a.id === self ? -1 : b.id === self ? 1 : a.id < b.id ? -1 : 1)).slice(0, opts.members);
  if (!opts.plan) {
    // Measurements on one machine take turns (node/measure.ts), about a second each on a software adapter.
    const until = performance.now() + (opts.measureTimeoutMs ?? Math.max(20_000, 3000 * opts.members));
    while (order(alive()).some((m) => m.meta.measuring) && performance.now() < until) {
      opts.signal?.throwIfAborted();
      await new Promise((r) => setTimeout(r, 100));
    }
  }
  const members = order(alive());
  let config: unknown;
  try {
    config = JSON.parse(await Deno.readTextFile(join(opts.modelDir, "config.json")));
  } catch (e) {
    throw new TypeError(`model ${opts.modelDir}: cannot read config.json: ${(e as Error).message}`);
  }
  const layers = Number((config as Record<string, unknown>).num_hidden_layers);
  let plan;
  if (opts.plan) {
    const ids = members.map((m) => m.id);
    const byName = new Map<string, string>();
    for (const s of opts.plan.stages) {
      if (!byName.has(s.node)) byName.set(s.node, ids.includes(s.node) ? s.node : ids[byName.size]);
    }
    if ([...byName.values()].some((v) => v === undefined)) {
      throw new RangeError(`the Plan names ${byName.size} nodes; the cluster has ${ids.length}`);
    }
    plan = { ...opts.plan, stages: opts.plan.stages.map((s) => ({ ...s, node: byName.get(s.node)! })) };
  } else {
    plan = planChain(config, liveMembers(node, members), {
      weights: opts.weights,
      kv: opts.kv,
      experts: opts.experts ?? "local",
    });
  }
  if (opts.experts === "spread") {
    const graph = compileHfConfig(config);
    const experts = new Map<number, number>();
    graph.layers.forEach((l, i) => {
      const m = moeOf(l);
      if (m) experts.set(i, m.experts);
    });
    if (experts.size === 0) {
      throw new RequestError(
        `experts spread: ${opts.modelDir} has no mixture-of-experts layers, so there are no experts to spread`,
      );
    }
    // planChain placed them already; a Plan given as a file is spread over the members here.
    if (opts.plan) {
      plan = spreadExperts(plan as ExpertPlan, experts, members.slice(0, opts.members).map((m) => m.id));
    }
  }
  return pipeline.board.publish({
    plan: plan as Assignment["plan"],
    model: {
      dir: opts.modelDir,
      weights: opts.weights,
      ...(opts.kv && opts.kv !== "auto" ? { kv: opts.kv } : {}),
    },
    layers,
    wire: opts.wire ?? "f16",
  });
}

/** Members as the planner reads them: id and descriptor view (measurements and link row). */
export function liveMembers(node: { links: Links }, members: Member[]): ChainMember[] {
  return members.map((m) => ({ id: m.id, descriptor: descriptorView(m, node.links), host: m.meta.name }));
}
