// The GPU step advance (kernels/step.ts) against its CPU reference: a decode batch encodes the advance
// after every step, so n advances in one pass must leave the record where n reference steps do, for
// T = 1 (decode), T > 1 and T = 0 (a step that does nothing), and the padding word untouched.
import {
  advanceCall,
  advanceRef,
  createStepBuffer,
  runCalls,
  type StepValues,
  writeStep,
} from "../../kernels/mod.ts";
import { gpuOrSkip, readU32 } from "./harness.ts";

const gpu = await gpuOrSkip();

Deno.test({ name: "the GPU step advance matches the reference", ignore: gpu === null }, async () => {
  const g = gpu!;
  const cases: [StepValues, number][] = [
    [{ pos0: 0, T: 1, tokOut: 1 }, 1],
    [{ pos0: 31, T: 1, tokOut: 32 }, 17],
    [{ pos0: 100, T: 5, tokOut: 105 }, 3],
    [{ pos0: 7, T: 0, tokOut: 9 }, 4],
    [{ pos0: 4_000_000_000, T: 16, tokOut: 4_000_000_016 }, 2],
  ];
  for (const [start, n] of cases) {
    const step = createStepBuffer(g);
    writeStep(g, step, start);
    const call = advanceCall(g, step);
    await runCalls(g, Array.from({ length: n }, () => call));
    const got = await readU32(g, step, 4);
    let want = start;
    for (let i = 0; i < n; i++) want = advanceRef(want);
    const what = `${JSON.stringify(start)} x${n}`;
    if (got[0] !== want.pos0 || got[1] !== want.T || got[2] !== want.tokOut || got[3] !== 0) {
      throw new Error(`${what}: got [${got}], want ${JSON.stringify(want)} (pad 0)`);
    }
    step.destroy();
  }
});
