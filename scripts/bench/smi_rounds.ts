// The GPU's clock and power over each round of a benchmark that prints one JSON line per round with its end
// time (`at`, ISO), from an nvidia-smi log taken beside it:
//   nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,utilization.gpu --format=csv,noheader \
//     -lms 100 > smi.csv &
// For scripts/bench/keep_warm.ts, whose rounds report their second half: the means are over the last
// --seconds / 2 of each round. Prints the round's line with `smMhz`, `watts` and `samples` added.
//   deno run -A scripts/bench/smi_rounds.ts --smi smi.csv --seconds 5 ROUNDS.jsonl...
import { parseArgs } from "node:util";
import { scriptArgs } from "../args.ts";
import { numberFlag, UsageError } from "../../cli/command.ts";

const { values, positionals } = scriptArgs(import.meta.url, (args) => {
  const r = parseArgs({
    args,
    allowPositionals: true,
    options: { smi: { type: "string" }, seconds: { type: "string", default: "5" } },
  });
  if (!r.values.smi) throw new UsageError("--smi FILE is required");
  if (r.positionals.length === 0) throw new UsageError("give the rounds' JSONL file(s)");
  return r;
});
const seconds = numberFlag(values.seconds, "seconds", { min: 0.1, fallback: 5 });

/** nvidia-smi's timestamp ("2026/12/07 05:59:27.417", the machine's local time, UTC on the device). */
const smiTime = (s: string) => Date.parse(s.trim().replace(/\//g, "-").replace(" ", "T") + "Z");

const samples = (await Deno.readTextFile(values.smi!)).split("\n").flatMap((line) => {
  const f = line.split(",");
  const t = smiTime(f[0] ?? "");
  const mhz = parseFloat(f[1] ?? ""), watts = parseFloat(f[3] ?? "");
  return Number.isFinite(t) && Number.isFinite(mhz) && Number.isFinite(watts) ? [{ t, mhz, watts }] : [];
});
for (const file of positionals) {
  for (const line of (await Deno.readTextFile(file)).split("\n")) {
    if (!line.trim()) continue;
    const round = JSON.parse(line);
    const end = Date.parse(round.at);
    const within = samples.filter((s) => s.t <= end && s.t >= end - seconds * 500);
    const mean = (f: (s: typeof within[number]) => number) =>
      within.length ? +(within.reduce((a, s) => a + f(s), 0) / within.length).toFixed(0) : null;
    console.log(
      JSON.stringify({
        ...round,
        smMhz: mean((s) => s.mhz),
        watts: mean((s) => s.watts),
        samples: within.length,
      }),
    );
  }
}
