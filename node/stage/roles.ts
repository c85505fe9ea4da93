// From a Plan to each stage's role. Pure.
import type { StageRole } from "./backend.ts";

/** The part of a Plan (docs/PLAN_FORMAT.md) the chain reads. */
export interface PlanStages {
  stages: { index: number; node: string; layers: [number, number]; embeds: boolean; head: boolean }[];
}

/** Every stage's role, in chain order; TypeError when the stages do not form one chain over the layers. */
export function rolesOf(plan: PlanStages, layers: number): StageRole[] {
  const s = plan.stages;
  if (!Array.isArray(s) || s.length === 0) throw new TypeError("the Plan has no stages");
  let next = 0;
  s.forEach((st, i) => {
    if (st.index !== i) throw new TypeError(`Plan stage ${i} has index ${st.index}; expected ${i}`);
    if (st.layers[0] !== next || st.layers[1] < st.layers[0]) {
      throw new TypeError(`Plan stage ${i} runs layers [${st.layers}]; expected a range starting at ${next}`);
    }
    if (st.embeds !== (i === 0) || st.head !== (i === s.length - 1)) {
      throw new TypeError(`Plan stage ${i}: only the first stage embeds and only the last has the head`);
    }
    if (st.layers[0] === st.layers[1] && !st.embeds && !st.head) {
      throw new TypeError(`Plan stage ${i} has no layers, no embedding and no head: nothing to run`);
    }
    next = st.layers[1];
  });
  if (next !== layers) {
    throw new TypeError(`the Plan's stages cover layers [0, ${next}); the model has ${layers}`);
  }
  return s.map((st) => ({
    index: st.index,
    stages: s.length,
    layers: st.layers,
    embeds: st.embeds,
    head: st.head,
  }));
}

/** An even contiguous split of `layers` over `stages` (tests and fallbacks; the planner's DP is the rule). */
export function splitLayers(layers: number, stages: number): StageRole[] {
  if (!(Number.isInteger(stages) && stages >= 1 && stages <= layers)) {
    throw new RangeError(`cannot split ${layers} layers into ${stages} stages`);
  }
  return Array.from({ length: stages }, (_, i) => ({
    index: i,
    stages,
    layers: [Math.floor((i * layers) / stages), Math.floor(((i + 1) * layers) / stages)] as [number, number],
    embeds: i === 0,
    head: i === stages - 1,
  }));
}
