// What a user's one-shot `swactor generate` gets: each run is a fresh `generate --json` process (the model
// loaded, the request's pipelines built, then one request, greedy), after a pause that lets the GPU go idle,
// so its clock is where a user finds it. Where nvidia-smi answers, its SM clock is sampled every 50 ms beside
// the runs. Set against decode.ts's and prefill.ts's steady-state figures, it shows what a fresh process
// pays: the pipelines' builds in its first token, and its clock where the GPU idled before (docs/BENCHMARKS.md,
// the sixty-third session).
//   deno run -A scripts/bench/oneshot.ts --dir DIR [--weights q4,f16] [--prompts 8,512] [--tokens 128]
//     [--runs 2] [--pause-ms 2500] [--no-shader-cache]
// --no-shader-cache: every child builds its pipelines from scratch (NVIDIA's driver cache off: a first run,
// or one after a driver update), which leaves the GPU idle for longer before the request.
// One JSON line a run: weights, prompt, first_token_ms (first_token_builds: how much of it went to building
// the request's pipelines), tok_s and load_ms as `generate --json` reports them, the process's wall ms, and `mhz`: the
// SM clock's lowest and mean over the request (its first token and decode, the last samples before the child
// printed), null without nvidia-smi. Then one line per (weights, prompt) with the medians.
import { parseArgs } from "node:util";
import { countArg, scriptArgs } from "../args.ts";
import { UsageError } from "../../cli/command.ts";
import { median } from "./stats.ts";

const { values, weights, prompts, runs, pauseMs, tokens } = scriptArgs(import.meta.url, (args) => {
  const { values } = parseArgs({
    args,
    options: {
      dir: { type: "string" },
      weights: { type: "string", default: "q4,f16" },
      prompts: { type: "string", default: "8,512" },
      tokens: { type: "string", default: "128" },
      runs: { type: "string", default: "2" },
      "pause-ms": { type: "string", default: "2500" },
      "no-shader-cache": { type: "boolean", default: false },
    },
  });
  if (!values.dir) throw new UsageError("--dir DIR (a checkpoint folder) is required");
  return {
    values,
    weights: values.weights.split(","),
    prompts: values.prompts.split(",").map((p) => countArg("prompts", p)),
    tokens: countArg("tokens", values.tokens),
    runs: countArg("runs", values.runs),
    pauseMs: countArg("pause-ms", values["pause-ms"], 0),
  };
});

/** SM clock samples (ms since the epoch, MHz) while nvidia-smi runs; none where it does not. */
const clock: { t: number; mhz: number }[] = [];
let smi: Deno.ChildProcess | undefined;
try {
  smi = new Deno.Command("nvidia-smi", {
    args: ["--query-gpu=clocks.sm", "--format=csv,noheader,nounits", "-lms", "50"],
    stdout: "piped",
    stderr: "null",
  }).spawn();
  (async () => {
    let rest = "";
    for await (const chunk of smi!.stdout.pipeThrough(new TextDecoderStream())) {
      const lines = (rest + chunk).split("\n");
      rest = lines.pop()!;
      for (const l of lines) {
        if (Number.isFinite(parseFloat(l))) clock.push({ t: Date.now(), mhz: parseFloat(l) });
      }
    }
  })();
} catch {
  smi = undefined; // no NVIDIA GPU here: runs without the clock
}

const main = new URL("../../main.ts", import.meta.url).pathname;

/** One fresh `generate` process: its JSON line's figures, its wall ms, the clock over its request. */
async function oneRun(weights: string, prompt: number): Promise<Record<string, unknown>> {
  const ids = Array.from({ length: prompt }, (_, i) => (7 + i * 37) % 500).join(","); // in any vocabulary here
  const env: Record<string, string> = {};
  const cache = values["no-shader-cache"] ? await Deno.makeTempDir({ prefix: "swactor-shader-cache-" }) : "";
  if (cache) Object.assign(env, { __GL_SHADER_DISK_CACHE: "0", __GL_SHADER_DISK_CACHE_PATH: cache });
  const args = ["run", "-A", main, "generate", "--model", values.dir!, "--weights", weights, "--tokens", ids];
  args.push("--max-tokens", String(tokens), "--temperature", "0", "--json");
  const t0 = Date.now();
  const out = await new Deno.Command(Deno.execPath(), { args, env, stdout: "piped", stderr: "piped" })
    .output();
  const printed = Date.now();
  if (cache) await Deno.remove(cache, { recursive: true });
  if (!out.success) {
    const said = new TextDecoder().decode(out.stderr).trim().split("\n").at(-1);
    console.error(`oneshot.ts: generate exited ${out.code}: ${said}`);
    smi?.kill();
    Deno.exit(1);
  }
  const result = JSON.parse(new TextDecoder().decode(out.stdout).trim().split("\n").at(-1)!);
  // The request: its first token, then its decode, just before the child printed and exited.
  const decodeMs = result.tok_s > 0 ? (result.tokens.length - 1) / result.tok_s * 1000 : 0;
  const during = clock.filter((s) =>
    s.t >= printed - result.first_token_ms - decodeMs - 100 && s.t <= printed
  );
  return {
    weights,
    prompt,
    first_token_ms: result.first_token_ms,
    first_token_builds: result.first_token_builds ?? null,
    tok_s: result.tok_s,
    load_ms: result.load_ms ?? null,
    wallMs: printed - t0,
    mhz: during.length
      ? {
        min: Math.min(...during.map((s) => s.mhz)),
        mean: +(during.reduce((a, s) => a + s.mhz, 0) / during.length).toFixed(0),
      }
      : null,
    adapter: result.adapter,
  };
}

const rows: Record<string, unknown>[] = [];
for (let run = 1; run <= runs; run++) {
  for (const w of weights) {
    for (const prompt of prompts) {
      await new Promise((r) => setTimeout(r, pauseMs));
      const row = { ...await oneRun(w, prompt), run };
      rows.push(row);
      console.log(JSON.stringify(row));
    }
  }
}
smi?.kill();
for (const w of weights) {
  for (const prompt of prompts) {
    const mine = rows.filter((r) => r.weights === w && r.prompt === prompt);
    console.log(JSON.stringify({
      summary: true,
      weights: w,
      prompt,
      first_token_ms: +median(mine.map((r) => r.first_token_ms as number)).toFixed(1),
      tok_s: +median(mine.map((r) => r.tok_s as number)).toFixed(1),
      load_ms: median(mine.map((r) => r.load_ms as number)),
      runs: mine.length,
    }));
  }
}
