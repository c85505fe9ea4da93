// Expert names in the registry: `moe-expert-{layer}-{idx}` (the roadmap's actor names) resolve to the node
// holding the expert. A node registers what the Plan gives it as one name set (node/registry/name_set.ts:
// ranges per layer, not a name per expert), so 23,000 experts stay a few registry entries. Pure.
import { type IdRange, toRanges } from "../../planner/mod.ts";
import { type ExpertPlan, heldBy } from "./experts.ts";

/** The prefix of every routed expert's registry name. */
export const EXPERT_PREFIX = "moe-expert-";

/** The registry name of expert `expert` of layer `layer`. */
export function expertName(layer: number, expert: number): string {
  return `${EXPERT_PREFIX}${layer}-${expert}`;
}

/**
 * What `node` holds under the Plan, per layer (key: layer index), as ranges: the argument of
 * `registry.registerSet(EXPERT_PREFIX, expertSet(plan, node))`.
 */
export function expertSet(plan: ExpertPlan, node: string): Record<string, IdRange[]> {
  const out: Record<string, IdRange[]> = {};
  for (const [layer, ids] of heldBy(plan, node)) out[String(layer)] = toRanges(ids);
  return out;
}
