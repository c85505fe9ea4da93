// Expert parallelism measured (issue 16, item 5): MoE models on N local node processes with every MoE layer's
// experts spread over the nodes, on loopback and through the WAN emulation, next to the cost model's
// prediction. Per MoE layer and decode step, the fan-out is split into its parts (generate --json
// `fanout_parts`): the stage's readback of the routing and the activations, the wait for the replies (of which
// the remote messages' round trips, and within them the hosts' own compute; wire = round trip - host compute),
// and the combine.
//
//   deno run -A scripts/bench/experts_wan.ts [--models kimi-k2-tiny,mixtral-tiny] [--nodes 5]
//     [--delays 1,10,25] [--max-tokens 24] [--rounds 2] [--settle 10] [--no-wan] [--json FILE]
//   deno run -A scripts/bench/experts_wan.ts --k2 DIR --nodes 12 [--max-tokens 16] [--rounds 1]
//
// Loopback: `generate --local N --experts spread --weights f32 --wire f32 --json`, `--rounds` times per model.
// `--k2 DIR` instead runs the Kimi-K2-topology checkpoint (scripts/fixtures/make_k2_scaled.ts, written to DIR
// when absent) on one process and on N processes with experts spread (use --nodes 12), checks the tokens are
// equal, and checks at the leader of a fresh N-node cluster that every `moe-expert-{l}-{e}` (23,040 of them)
// resolves to the node the Plan gives it (docs/DOD.md).
// WAN (root: network namespaces): scripts/bench/pipeline_wan.ts `--experts spread --links all`, so every pair
// of nodes (stage hops and expert fan-out alike) goes through a relay with the given one-way delay. Models are
// looked up in tests/fixtures, then ../shared/fixtures. Markdown to stdout; `--json` keeps every result.
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { parseFlags } from "../../cli/command.ts";
import { startLocalCluster } from "../../cli/local_cluster.ts";
import { expertPlacement, type ExpertPlan } from "../../node/stage/experts.ts";
import { expertName } from "../../node/stage/expert_names.ts";
import { writeK2Scaled } from "../fixtures/make_k2_scaled.ts";
import { scriptArgs } from "../args.ts";

const root = fileURLToPath(new URL("../../", import.meta.url));

const log = (m: string) => console.error(`experts_wan: ${m}`);
const deno = Deno.execPath();

/** A layer's fan-outs over a request's decode steps, as generate --json's `fanout_parts` has them. */
export interface Parts {
  steps: number;
  readback_ms: number;
  wait_ms: number;
  combine_ms: number;
  remote: { calls: number; ms: number; host_ms: number };
  own: { calls: number; ms: number };
}

/** One measured request, from either path. */
export interface Measured {
  model: string;
  network: string;
  tokS: number;
  msPerToken: number;
  predictedMs: number;
  /** Predicted fan-out per stage, ms per token. */
  predictedFanoutMs: number[];
  parts: Record<string, Parts>;
  correct: boolean;
}

/** Per MoE layer and decode step, means over the layers: what one layer's fan-out costs and its parts. */
export function layerSummary(parts: Record<string, Parts>) {
  const layers = Object.values(parts).filter((p) => p.steps > 0);
  const mean = (f: (p: Parts) => number) => layers.reduce((a, p) => a + f(p), 0) / Math.max(1, layers.length);
  const perCall = (p: Parts, v: number) => (p.remote.calls ? v / p.remote.calls : 0);
  return {
    layers: layers.length,
    readback: mean((p) => p.readback_ms / p.steps),
    wait: mean((p) => p.wait_ms / p.steps),
    combine: mean((p) => p.combine_ms / p.steps),
    messages: mean((p) => p.remote.calls / p.steps),
    roundTrip: mean((p) => perCall(p, p.remote.ms)),
    host: mean((p) => perCall(p, p.remote.host_ms)),
    wire: mean((p) => perCall(p, p.remote.ms - p.remote.host_ms)),
    own: mean((p) => (p.own.calls ? p.own.ms / p.own.calls : 0)),
    total: mean((p) => (p.readback_ms + p.wait_ms + p.combine_ms) / p.steps),
  };
}

function fixture(name: string): string {
  for (const dir of [join(root, "tests/fixtures", name), join(root, "../shared/fixtures", name)]) {
    try {
      Deno.statSync(join(dir, "reference.json"));
      return dir;
    } catch { /* next */ }
  }
  throw new Error(`no fixture ${name} (with reference.json) in tests/fixtures or ../shared/fixtures`);
}

/** `generate --json` on `dir` (f32 weights and wire, greedy), with more CLI arguments; its JSON. */
async function generate(dir: string, prompt: number[], maxTokens: number, more: string[]) {
  const args = ["run", "-A", "--quiet", join(root, "main.ts"), "generate", "--model", dir];
  args.push("--tokens", prompt.join(","), "--max-tokens", `${maxTokens}`, "--temperature", "0", "--json");
  args.push("--weights", "f32", "--wire", "f32", ...more);
  const out = await new Deno.Command(deno, { args, stdout: "piped", stderr: "piped" }).output();
  if (!out.success) {
    throw new Error(
      `generate ${more.join(" ")} failed: ${new TextDecoder().decode(out.stderr).slice(-2000)}`,
    );
  }
  return JSON.parse(new TextDecoder().decode(out.stdout));
}

/** The fixture's prompt and reference continuation. */
async function reference(dir: string): Promise<{ prompt: number[]; expected: number[] }> {
  const ref = JSON.parse(await Deno.readTextFile(join(dir, "reference.json")));
  return { prompt: ref.tokens.slice(0, ref.prompt_length), expected: ref.tokens.slice(ref.prompt_length) };
}

async function loopback(
  model: string,
  dir: string,
  nodes: number,
  maxTokens: number,
  ref: { prompt: number[]; expected: number[] },
): Promise<Measured> {
  const j = await generate(dir, ref.prompt, maxTokens, ["--local", `${nodes}`, "--experts", "spread"]);
  const expected = ref.expected;
  const n = Math.min(expected.length, j.tokens.length);
  return {
    model,
    network: "loopback",
    tokS: j.tok_s,
    msPerToken: j.ms_per_token,
    predictedMs: j.predicted_ms_per_token,
    predictedFanoutMs: j.predicted.stages.map((s: { fanout_ms: number }) => s.fanout_ms),
    parts: j.fanout_parts,
    correct: j.tokens.slice(0, n).join() === expected.slice(0, n).join(),
  };
}

async function wan(
  model: string,
  dir: string,
  o: { nodes: number; delays: number[]; maxTokens: number; rounds: number; settle: number },
): Promise<Measured[]> {
  const file = await Deno.makeTempFile({ prefix: "experts_wan", suffix: ".json" });
  const args = ["run", "-A", "--quiet", join(root, "scripts/bench/pipeline_wan.ts"), "--model", dir];
  args.push("--nodes", `${o.nodes}`, "--delays", o.delays.join(","), "--max-tokens", `${o.maxTokens}`);
  args.push("--rounds", `${o.rounds}`, "--experts", "spread", "--links", "all", "--settle", `${o.settle}`);
  args.push("--weights", "f32", "--json", file);
  const out = await new Deno.Command(deno, { args, stdout: "piped", stderr: "piped" }).output();
  const correct = out.success;
  if (!out.success) {
    log(`pipeline_wan exited ${out.code}: ${new TextDecoder().decode(out.stderr).slice(-1500)}`);
  }
  const j = JSON.parse(await Deno.readTextFile(file).catch(() => "{}"));
  await Deno.remove(file).catch(() => {});
  const rows: Measured[] = [];
  for (const run of j.runs ?? []) {
    for (const r of run.results) {
      rows.push({
        model,
        network: `WAN ${run.delayMs} ms`,
        tokS: r.tokS,
        msPerToken: r.msPerToken,
        predictedMs: r.predictedMs,
        predictedFanoutMs: r.predictedStages.map((s: { fanoutMs: number }) => s.fanoutMs),
        parts: r.fanoutParts ?? {},
        correct,
      });
    }
  }
  return rows;
}

/** The K2-topology checkpoint on one process and on `nodes` with experts spread; its expert names resolved. */
async function k2Scaled(dir: string, nodes: number, maxTokens: number, rounds: number): Promise<Measured[]> {
  try {
    await Deno.stat(join(dir, "config.json"));
  } catch {
    log(`writing the K2-topology checkpoint to ${dir}`);
    await writeK2Scaled(dir);
  }
  const prompt = [0, 500, 33, 901, 7, 64, 250, 1000, 12, 3, 77];
  log("k2-scaled: one process");
  const single: number[] = (await generate(dir, prompt, maxTokens, [])).tokens;
  const rows: Measured[] = [];
  for (let i = 0; i < rounds; i++) {
    log(`k2-scaled: --local ${nodes} --experts spread, round ${i + 1}`);
    rows.push(await loopback("k2-scaled", dir, nodes, maxTokens, { prompt, expected: single }));
  }
  log(`k2-scaled: a fresh ${nodes}-node cluster, every expert name resolved at the leader`);
  const t0 = performance.now();
  const c = await startLocalCluster(nodes, {
    modelDir: dir,
    weights: "f32",
    experts: "spread",
    log: () => {},
  });
  try {
    const readyS = (performance.now() - t0) / 1000;
    const want = [...expertPlacement(c.assignment.plan as ExpertPlan)].flatMap(([l, hosts]) =>
      [...hosts].flatMap(([node, ids]) => ids.map((e) => [expertName(l, e), node] as const))
    );
    const unresolved = () => want.filter(([name, node]) => c.node.registry.resolve(name) !== node).length;
    for (let i = 0; i < 100 && unresolved() > 0; i++) await new Promise((r) => setTimeout(r, 100));
    const bad = unresolved();
    console.log(
      `k2-scaled on ${nodes} nodes: ready in ${readyS.toFixed(1)} s; ${want.length} experts placed, ${bad} ` +
        `unresolved at the leader; Plan ${JSON.stringify(c.assignment.plan).length} bytes\n`,
    );
    if (bad) rows.forEach((r) => (r.correct = false));
  } finally {
    await c.close();
  }
  return rows;
}

const f1 = (v: number) => v.toFixed(1), f2 = (v: number) => v.toFixed(2);

/** The markdown table: one row per request. */
export function table(rows: Measured[]): string {
  const head = [
    "model",
    "network",
    "tok/s",
    "ms/token",
    "predicted",
    "measured / predicted",
    "MoE layers",
    "fan-out ms per layer (predicted)",
    "readback",
    "wait",
    "msgs",
    "round trip",
    "host",
    "wire",
    "own",
    "combine",
  ];
  const lines = [`| ${head.join(" | ")} |`, `| ${head.map(() => "---").join(" | ")} |`];
  for (const r of rows) {
    const s = layerSummary(r.parts);
    const predictedPerLayer = r.predictedFanoutMs.reduce((a, b) => a + b, 0) / Math.max(1, s.layers);
    lines.push(
      `| ${
        [
          r.model,
          r.network + (r.correct ? "" : " (tokens differ!)"),
          f1(r.tokS),
          f1(r.msPerToken),
          f1(r.predictedMs),
          f2(r.msPerToken / r.predictedMs),
          s.layers,
          `${f2(s.total)} (${f2(predictedPerLayer)})`,
          f2(s.readback),
          f2(s.wait),
          f1(s.messages),
          f2(s.roundTrip),
          f2(s.host),
          f2(s.wire),
          f2(s.own),
          f2(s.combine),
        ].join(" | ")
      } |`,
    );
  }
  return lines.join("\n");
}

if (import.meta.main) {
  const { values } = scriptArgs(import.meta.url, (args) =>
    parseFlags(args, {
      models: { type: "string", default: "kimi-k2-tiny,mixtral-tiny" },
      nodes: { type: "string", default: "5" },
      delays: { type: "string", default: "1,10,25" },
      "max-tokens": { type: "string", default: "24" },
      rounds: { type: "string", default: "2" },
      settle: { type: "string", default: "10" },
      "no-wan": { type: "boolean", default: false },
      json: { type: "string" },
      k2: { type: "string" },
    }));
  const nodes = Number(values.nodes),
    maxTokens = Number(values["max-tokens"]),
    rounds = Number(values.rounds);
  const delays = values.delays.split(",").map(Number);
  if (![nodes, maxTokens, rounds, ...delays].every((v) => Number.isFinite(v) && v >= 0)) {
    console.error("experts_wan: --nodes, --max-tokens, --rounds and --delays take numbers");
    Deno.exit(2);
  }
  const rows: Measured[] = [];
  if (values.k2) {
    rows.push(...await k2Scaled(values.k2, nodes, maxTokens, rounds));
    console.log(table(rows));
    Deno.exit(rows.every((r) => r.correct) ? 0 : 1);
  }
  for (const model of values.models.split(",")) {
    const dir = fixture(model);
    const ref = await reference(dir);
    for (let i = 0; i < rounds; i++) {
      log(`${model}: loopback, round ${i + 1}`);
      rows.push(await loopback(model, dir, nodes, maxTokens, ref));
    }
    if (!values["no-wan"]) {
      log(`${model}: through the WAN emulation at ${delays.join(", ")} ms`);
      rows.push(
        ...await wan(model, dir, { nodes, delays, maxTokens, rounds, settle: Number(values.settle) }),
      );
    }
  }
  console.log(table(rows));
  if (values.json) {
    await Deno.writeTextFile(values.json, JSON.stringify({ date: new Date().toISOString(), rows }, null, 1));
  }
}
