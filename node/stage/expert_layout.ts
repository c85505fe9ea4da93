// Where a Plan puts each MoE layer's routed experts (docs/PLAN_FORMAT.md), in the forms the runtime needs:
// per layer, each node's expert ids (the stage's own and the expert hosts'), and per node the ranges it
// registers (Registry.registerSet(EXPERT_PREFIX, ...): one compact set instead of a name per expert,
// while `moe-expert-{layer}-{idx}` still resolves). Pure.
import { type IdRange, toRanges } from "../../planner/mod.ts";

/** Names of routed experts: `moe-expert-{layer}-{idx}` (the roadmap's actor names) share this prefix. */
export const EXPERT_PREFIX = "moe-expert-";

/** The registry name of expert `expert` of layer `layer`. */
export function expertName(layer: number, expert: number): string {
  return `${EXPERT_PREFIX}${layer}-${expert}`;
}

/** The part of a Plan that places experts. */
export interface PlanExperts {
  stages: { node: string; layers: [number, number]; experts?: Record<string, number[]> }[];
  expertHosts?: { node: string; experts: Record<string, number[]> }[];
}

/** One MoE layer: the node of the stage that owns it, and every node holding some of its experts. */
export interface LayerExperts {
  stage: string;
  /** node -> expert ids, ascending (an id on several nodes is a replica). */
  hosts: Map<string, number[]>;
}

/** Per MoE layer (in layer order): its stage's node and its experts' hosts. */
export function expertLayout(plan: PlanExperts): Map<number, LayerExperts> {
  const out = new Map<number, LayerExperts>();
  const layer = (key: string) => {
    const l = Number(key);
    if (!Number.isInteger(l) || l < 0) throw new TypeError(`Plan experts: layer key "${key}" is not a layer`);
    return l;
  };
  for (const s of plan.stages) {
    for (const [key, ids] of Object.entries(s.experts ?? {})) {
      const l = layer(key);
      if (l < s.layers[0] || l >= s.layers[1]) {
        throw new TypeError(
          `Plan stage on ${s.node} lists experts of layer ${l} outside its layers [${s.layers}]`,
        );
      }
      out.set(l, { stage: s.node, hosts: new Map(ids.length ? [[s.node, [...ids]]] : []) });
    }
  }
  for (const h of plan.expertHosts ?? []) {
    for (const [key, ids] of Object.entries(h.experts)) {
      const l = layer(key);
      const entry = out.get(l);
      if (!entry) throw new TypeError(`Plan expert host ${h.node} lists layer ${l}, which no stage owns`);
      entry.hosts.set(
        h.node,
        [...new Set([...(entry.hosts.get(h.node) ?? []), ...ids])].sort((a, b) => a - b),
      );
    }
  }
  return new Map([...out].sort((a, b) => a[0] - b[0]));
}

/** The experts `node` holds per layer (key: layer index), as ranges: its `registerSet` argument. */
export function hostedExperts(plan: PlanExperts, node: string): Record<string, IdRange[]> {
  const out: Record<string, IdRange[]> = {};
  for (const [l, { hosts }] of expertLayout(plan)) {
    const ids = hosts.get(node);
    if (ids?.length) out[String(l)] = toRanges(ids);
  }
  return out;
}
