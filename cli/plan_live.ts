// `swactor plan --live`: the Plan for a model on the running cluster, from the descriptors its members
// measured and gossiped (memory, bandwidth, per-step costs, links), fetched from a node's control API. It
// plans as `up --model` does (node/stage/plan_chain.ts: a chain over the members, the node asked first, then
// by id), so the two place the same way on the same measurements.
import { apiFetch, type ApiTarget, apiTarget, type MemberView } from "../node/api/mod.ts";
import { chainCluster, chainRoles, planChain } from "../node/stage/mod.ts";
import { compileHfConfig, type LiveMember, PlacementError, type Plan, printCluster } from "../planner/mod.ts";
import { UsageError } from "./command.ts";

export interface PlanLiveOptions {
  /** The model's config.json, parsed. */
  config: unknown;
  api?: string;
  /** Members to plan over (default: every alive member). */
  nodes?: number;
  context: number;
  weights?: string;
  kv?: string;
  /** Write the live cluster, in the planner language, to this file. */
  saveCluster?: string;
}

/** The alive members of the cluster whose control API is at `base`, in chain order (that node first). */
export async function liveMembersAt(base: ApiTarget): Promise<LiveMember[]> {
  const res = await apiFetch(base, "/status");
  if (!res.ok) throw new Error(`control API answered ${res.status}`);
  const body = await res.json() as { self: string; members: MemberView[] };
  const self = body.self;
  return body.members.filter((m) => m.state === "alive")
    .sort((a, b) => (a.id === self ? -1 : b.id === self ? 1 : a.id < b.id ? -1 : 1))
    .map((m) => ({ id: m.id, descriptor: m.descriptor, host: m.name }));
}

export async function planLive(o: PlanLiveOptions): Promise<{ plan: Plan; members: LiveMember[] }> {
  const base = await apiTarget(o.api);
  let members = await liveMembersAt(base);
  // Without --weights / --kv, those of the chain the cluster runs, if any: plan as it was planned.
  const chain = o.weights === undefined || o.kv === undefined ? await chainModel(base) : undefined;
  const weights = o.weights ?? chain?.weights;
  const kv = o.kv ?? chain?.kv;
  const unmeasured = members.filter((m) => !m.descriptor?.measured_at).map((m) => m.id.slice(0, 10));
  if (unmeasured.length) {
    console.error(
      `swactor plan: ${unmeasured.length} member(s) have not measured themselves (${
        unmeasured.join(", ")
      }): ` +
        `the planner's defaults stand in for what they lack`,
    );
  }
  if (o.nodes !== undefined) {
    if (o.nodes > members.length) {
      throw new UsageError(`--nodes ${o.nodes}: the cluster has ${members.length} alive member(s)`);
    }
    members = members.slice(0, o.nodes);
  }
  if (o.saveCluster) {
    const model = compileHfConfig(o.config);
    // As planChain builds it, so `plan --model DIR --cluster FILE` on the saved file plans the same split.
    const order = chainRoles(members, members.length, model.layers.length).layered.map((m) => m.id);
    const cluster = chainCluster(model, members, { order, weights, kv });
    await Deno.writeTextFile(o.saveCluster, printCluster(cluster));
  }
  try {
    return { plan: planChain(o.config, members, { context: o.context, weights, kv }), members };
  } catch (e) {
    if (e instanceof PlacementError) {
      throw new UsageError(`no placement fits (${e.constraint}): ${e.message}`);
    }
    throw e;
  }
}

/** The weights and KV cache of the chain the node at `base` runs, or undefined (no chain, or an older node). */
async function chainModel(base: ApiTarget): Promise<{ weights?: string; kv?: string } | undefined> {
  try {
    const res = await apiFetch(base, "/pipeline");
    if (!res.ok) return undefined;
    const body = await res.json() as { assignment?: { model?: { weights?: string; kv?: string } } | null };
    return body.assignment?.model ?? undefined;
  } catch {
    return undefined;
  }
}
