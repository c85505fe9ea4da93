// What the keep-warm filler (kernels/keep_warm.ts) does for a chain stage: a stage of the first --layers
// layers of a model (random weights at a real shape: embeds, no head) runs one-token `run` steps with a gap
// before each (what a chain's other stages and links take), for --seconds a round, with the filler off and
// on at each --fractions, alternating round by round, --repeat times. The governor moves the GPU's clock over
// seconds, so each round's figures are from its second half (steady state).
//   deno run -A scripts/bench/keep_warm.ts [--shape llama-3.2-1b] [--weights q4] [--layers 14] [--gaps 0,1,3,8]
//     [--fractions 0.3] [--seconds 6] [--repeat 2] [--set key=value,...]
// One JSON line per round: gap ms (asked; gapMs: the median measured), the filler's fraction (0: off), the
// step's median and p90 ms, the period (ms a step plus its gap, mean), and the fillers queued a step with
// their mean length (ms at full clock).
import { parseArgs } from "node:util";
import { countArg, scriptArgs } from "../args.ts";
import { numberFlag } from "../../cli/command.ts";
import { getGpu, KeepWarm } from "../../kernels/mod.ts";
import { Engine } from "../../models/engine.ts";
import { loadBenchStage, STAGE_FLAGS, stageFlags, waitMs } from "./stage.ts";
import { median } from "./stats.ts";

const { stage, gaps, fractions, seconds, repeat } = scriptArgs(import.meta.url, (args) => {
  const { values } = parseArgs({
    args,
    options: {
      ...STAGE_FLAGS,
      gaps: { type: "string", default: "0,1,3,8" },
      fractions: { type: "string", default: "0.3" },
      seconds: { type: "string", default: "6" },
      repeat: { type: "string", default: "2" },
    },
  });
  return {
    stage: stageFlags(values),
    gaps: values.gaps.split(",").map((g) => numberFlag(g, "gaps", { min: 0, max: 1000, fallback: 0 })),
    fractions: values.fractions.split(",").map((f) =>
      numberFlag(f, "fractions", { min: 0.01, max: 0.99, fallback: 0.3 })
    ),
    seconds: numberFlag(values.seconds, "seconds", { min: 0.1, max: 600, fallback: 6 }),
    repeat: countArg("repeat", values.repeat),
  };
});

const gpu = await getGpu();
const { model, role, vocab } = await loadBenchStage(gpu, stage);
// The fillers are timed now, the clock still up from loading.
const variants = [
  { fraction: 0, engine: new Engine(role, model) },
  ...await Promise.all(fractions.map(async (fraction) => ({
    fraction,
    engine: new Engine(role, model, { keepWarm: await KeepWarm.create(gpu, { fraction }) }),
  }))),
];
const greedy = { temperature: 0, topP: 1, seed: 0 };
const maxSeq = 1 << 15;
let round = 0;
for (let rep = 0; rep < repeat; rep++) {
  for (const gap of gaps) {
    const order = rep % 2 ? [...variants].reverse() : variants;
    for (const { fraction, engine } of order) {
      const id = `r${round++}`;
      engine.open(id, { maxSeq, sampling: greedy });
      const input = (pos0: number, T: number) => ({
        pos0,
        T,
        tokens: Uint32Array.from({ length: T }, (_, i) => (pos0 + i) * 7919 % vocab),
        output: "hidden" as const,
      });
      await engine.run(id, input(0, 16));
      await engine.run(id, input(16, 1)); // the one-token program built before the round

      const ms: number[] = [];
      const ends: number[] = [];
      const gapsMs: number[] = [];
      /** Fillers queued so far, and their ms, after each step. */
      const filled: { fills: number; fillMs: number }[] = [];
      const t0 = performance.now();
      // At least 8 steps, so that a short round on a slow adapter still has a second half.
      for (let p = 17; p < maxSeq && (ms.length < 8 || performance.now() - t0 < seconds * 1000); p++) {
        if (gap) await waitMs(gap);
        const t = performance.now();
        if (ends.length) gapsMs.push(t - ends.at(-1)!);
        await engine.run(id, input(p, 1));
        const now = performance.now();
        ms.push(now - t);
        ends.push(now);
        filled.push(engine.warmStats() ?? { fills: 0, fillMs: 0 });
      }
      engine.release(id);
      const k = ms.length >> 1;
      const tail = ms.slice(k).sort((a, b) => a - b);
      const fills = filled.at(-1)!.fills - filled[k - 1].fills;
      const fillMs = filled.at(-1)!.fillMs - filled[k - 1].fillMs;
      console.log(JSON.stringify({
        bench: "swactor-keep-warm",
        adapter: gpu.adapterName,
        shape: stage.shape,
        weights: stage.weights,
        layers: stage.layers,
        gap,
        gapMs: +median(gapsMs.slice(k)).toFixed(3),
        fraction,
        steps: ms.length,
        stepMs: +median(tail).toFixed(3),
        p90Ms: +tail[Math.floor(tail.length * 0.9)].toFixed(3),
        periodMs: +((ends.at(-1)! - ends[k - 1]) / (ms.length - k)).toFixed(3),
        fillsPerStep: +(fills / (ms.length - k)).toFixed(2),
        fillMs: fills ? +(fillMs / fills).toFixed(3) : 0,
        at: new Date().toISOString(),
      }));
    }
  }
}
for (const { engine } of variants) engine.close();
