// A chain stage's one-token step on the host's clock: a stage of the first --layers layers of a model
// (random weights at a real shape: embeds, no head) runs one-token `run` steps with a --gap (ms) before each,
// as a chain's other stages and links leave it, under the default kernel settings and each of --tunings
// (e.g. '[{"encodeAhead":false}]'), in turn, --rounds times. No keep-warm filler (kernels/keep_warm.ts; see
// keep_warm.ts for that): at gaps of a few ms the GPU's clock falls between steps, which moves every setting
// alike, so compare settings within a run, round by round.
//   deno run -A scripts/bench/stage_step.ts [--shape llama-3.2-1b] [--weights q4] [--layers 14] [--gap 1]
//     [--steps 600] [--rounds 3] [--tunings '[{...}]'] [--set key=value,...]
// One JSON line per setting and round: the step's median and p90 wall ms over the round's second half.
import { parseArgs } from "node:util";
import { countArg, scriptArgs, tuningsArg } from "../args.ts";
import { numberFlag } from "../../cli/command.ts";
import { getGpu } from "../../kernels/mod.ts";
import { Engine } from "../../models/engine.ts";
import { loadBenchStage, STAGE_FLAGS, stageFlags, waitMs } from "./stage.ts";
import { median } from "./stats.ts";

const { stage, gap, steps, rounds, tunings } = scriptArgs(import.meta.url, (args) => {
  const { values } = parseArgs({
    args,
    options: {
      ...STAGE_FLAGS,
      gap: { type: "string", default: "1" },
      steps: { type: "string", default: "600" },
      rounds: { type: "string", default: "3" },
      tunings: { type: "string" },
    },
  });
  return {
    stage: stageFlags(values),
    gap: numberFlag(values.gap, "gap", { min: 0, max: 1000, fallback: 1 }),
    steps: countArg("steps", values.steps),
    rounds: countArg("rounds", values.rounds),
    tunings: [{}, ...tuningsArg(values.tunings)],
  };
});

const gpu = await getGpu();
const { model, role, vocab } = await loadBenchStage(gpu, stage);
const engine = new Engine(role, model);
const base = { ...gpu.tuning };
const ids = (pos0: number, T: number) => Uint32Array.from({ length: T }, (_, i) => (pos0 + i) * 7919 % vocab);
try {
  for (let round = 0; round < rounds; round++) {
    for (const [i, tuning] of tunings.entries()) {
      gpu.tuning = { ...base, ...tuning };
      const id = `r${round}-${i}`;
      engine.open(id, { maxSeq: steps + 32, sampling: { temperature: 0, topP: 1, seed: 0 } });
      await engine.run(id, { pos0: 0, T: 16, tokens: ids(0, 16), output: "hidden" });
      const ms: number[] = [];
      for (let p = 16; p < 16 + steps; p++) {
        await waitMs(gap);
        const t = performance.now();
        await engine.run(id, { pos0: p, T: 1, tokens: ids(p, 1), output: "hidden" });
        ms.push(performance.now() - t);
      }
      engine.release(id);
      const tail = ms.slice(ms.length >> 1).sort((a, b) => a - b);
      console.log(JSON.stringify({
        bench: "swactor-stage-step",
        adapter: gpu.adapterName,
        shape: stage.shape,
        weights: stage.weights,
        layers: stage.layers,
        gap,
        tuning,
        round,
        stepMs: +median(tail).toFixed(3),
        p90Ms: +tail[Math.floor(tail.length * 0.9)].toFixed(3),
      }));
    }
  }
} finally {
  gpu.tuning = base;
  engine.close();
}
