// The one decode engine on its three paths, through the CLI: a single node, a one-stage chain
// (`--local 1`: the same engine behind a node process, its decode loop closed on the GPU) and an N-stage
// chain (`--local N`: one step and one hop per stage per token). Prints one JSON line per path with the
// median tok/s of `--rounds` runs and its ratio to the single node's, so the claim "a one-stage chain is
// the single-node engine" is a number anyone can rerun:
// --gpu-thread adds the two chains with SWACTOR_GPU_THREAD=1 (each node's stages on a thread of their own:
// models/gpu_thread.ts), so the cost of that thread is a ratio in the same run. Rounds alternate the paths.
//   deno run -A scripts/bench/engine_paths.ts [--model DIR] [--stages 5] [--max-tokens 64] [--rounds 3]
//     [--weights auto] [--gpu-thread] [--swactor path/to/main.ts]   (another checkout's: "before" numbers)
import { parseArgs } from "node:util";
import { scriptArgs } from "../args.ts";
import { fileURLToPath } from "node:url";
import { ensureDemoModel } from "../../models/demo.ts";
import { readModelConfig } from "../../models/family.ts";
import { median } from "./stats.ts";

const { values } = scriptArgs(import.meta.url, (args) =>
  parseArgs({
    args,
    options: {
      model: { type: "string" },
      stages: { type: "string", default: "5" },
      "max-tokens": { type: "string", default: "64" },
      rounds: { type: "string", default: "3" },
      weights: { type: "string", default: "auto" },
      "gpu-thread": { type: "boolean", default: false },
      swactor: { type: "string", default: fileURLToPath(new URL("../../main.ts", import.meta.url)) },
    },
  }));
const model = values.model ?? await ensureDemoModel();
const maxTokens = values["max-tokens"]!;
// 16 fixed ids within the vocabulary (tiny fixtures have a few hundred tokens).
const vocab = (await readModelConfig(model)).vocabSize;
const prompt = Array.from({ length: 16 }, (_, i) => (i * 7919 + 13) % Math.min(1000, vocab)).join(",");

async function run(extra: string[], env: Record<string, string>): Promise<number> {
  const args = ["run", "-A", "--quiet", values.swactor!, "generate", "--model", model, "--tokens", prompt];
  args.push("--max-tokens", maxTokens, "--temperature", "0", "--json", ...extra);
  if (values.weights !== "auto") args.push("--weights", values.weights!);
  const out = await new Deno.Command(Deno.execPath(), { args, env, stdin: "null", stderr: "piped" }).output();
  const text = new TextDecoder().decode(out.stdout);
  if (out.code !== 0) {
    throw new Error(
      `generate ${extra.join(" ")} exited ${out.code}: ${new TextDecoder().decode(out.stderr)}`,
    );
  }
  return JSON.parse(text).tok_s;
}

const thread = { SWACTOR_GPU_THREAD: "1" };
const paths: [string, string[], Record<string, string>][] = [
  ["single node", [], {}],
  ["--local 1", ["--local", "1"], {}],
  [`--local ${values.stages}`, ["--local", values.stages!, "--wire", "f16"], {}],
  ...(values["gpu-thread"]
    ? [
      ["--local 1, GPU thread", ["--local", "1"], thread],
      [`--local ${values.stages}, GPU thread`, ["--local", values.stages!, "--wire", "f16"], thread],
    ] as [string, string[], Record<string, string>][]
    : []),
];
const runs = paths.map(() => [] as number[]);
for (let r = 0; r < Number(values.rounds); r++) {
  for (const [i, [, extra, env]] of paths.entries()) runs[i].push(await run(extra, env));
}
const single = median(runs[0]);
for (const [i, [path]] of paths.entries()) {
  const tokS = median(runs[i]);
  console.log(JSON.stringify({
    bench: "engine-paths",
    swactor: values.swactor,
    model,
    path,
    max_tokens: Number(maxTokens),
    tok_s: tokS,
    runs: runs[i],
    ratio_to_single_node: Number((tokS / single).toFixed(3)),
  }));
}
