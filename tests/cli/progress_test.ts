import assert from "node:assert/strict";
import { progressBar } from "../../cli/progress.ts";

function sink(isTTY: boolean) {
  const out: string[] = [];
  return { out, stream: { isTTY, write: (s: string) => out.push(s) } };
}

Deno.test("not a terminal: one plain line per quarter, no escape codes", () => {
  const { out, stream } = sink(false);
  const bar = progressBar("loading weights", 100, { stream });
  for (let i = 0; i <= 100; i += 5) bar.update(i);
  bar.stop();
  bar.stop();
  assert.deepEqual(out, [
    "loading weights: 25% (25 / 100)\n",
    "loading weights: 50% (50 / 100)\n",
    "loading weights: 75% (75 / 100)\n",
    "loading weights: 100% (100 / 100)\n",
  ]);
});

Deno.test("not a terminal: stopping early reports where it stopped; bytes shown in MiB", () => {
  const { out, stream } = sink(false);
  const bar = progressBar("weights", 4 * 2 ** 20, { units: "bytes", stream });
  bar.update(2 ** 20 / 2);
  bar.stop();
  bar.update(4 * 2 ** 20);
  assert.deepEqual(out, ["weights: 12% (0.5 MiB / 4.0 MiB)\n"]);
});

Deno.test("terminal: cli-progress draws the label and amounts, and stop ends it", () => {
  const { out, stream } = sink(true);
  const bar = progressBar("weights", 10, { stream });
  bar.update(10);
  bar.stop();
  const text = out.join("");
  assert.match(text, /weights \[.*\] 100% \| 10 \/ 10/);
});
