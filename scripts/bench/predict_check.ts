// The cost model's per-token time from live descriptors against the measured one (issue 17, item 4), on
// real node processes over loopback: `up --model DIR --members N` and N-1 `join`s started one after another
// (each once the one before has measured itself: on the software adapter a process loading its modules
// slows another's measurement), optional per-node --memory caps and SWACTOR_SLOWDOWN factors, a settle time
// for the link estimates, then R greedy requests through the chain with `generate --json`. Prints the
// measured descriptors, the plan, and per request the predicted and measured ms per token, with the
// per-stage breakdown. A markdown report on stdout; progress on stderr.
//
//   deno run -A scripts/bench/predict_check.ts [--model ../shared/fixtures/llama3-tiny] [--nodes 5]
//     [--memory 1GiB,66MiB,...] [--slowdown 1,1,3,...] [--requests 3] [--max-tokens 32] [--settle 20]
//     [--random-layers L]   (instead of --model: a random-weight Llama of L layers, hidden 512, made once)
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { parseFlags } from "../../cli/command.ts";
import type { LiveDescriptor } from "../../planner/mod.ts";
import { ensureRandomCheckpoint, LLAMA_3_2_1B } from "./random_checkpoint.ts";
import { scriptArgs } from "../args.ts";
import { median } from "./stats.ts";

const root = fileURLToPath(new URL("../../", import.meta.url));
const MAIN = join(root, "main.ts");
const { values } = scriptArgs(import.meta.url, (args) =>
  parseFlags(args, {
    model: { type: "string", default: join(root, "../shared/fixtures/llama3-tiny") },
    nodes: { type: "string", default: "5" },
    memory: { type: "string", default: "" },
    slowdown: { type: "string", default: "" },
    requests: { type: "string", default: "3" },
    "max-tokens": { type: "string", default: "32" },
    settle: { type: "string", default: "20" },
    "random-layers": { type: "string" },
  }));
if (values["random-layers"]) {
  const layers = Number(values["random-layers"]);
  values.model = join(Deno.env.get("TMPDIR") ?? "/tmp", `swactor-random-llama-${layers}`);
  await ensureRandomCheckpoint(values.model, {
    ...LLAMA_3_2_1B,
    vocab_size: 4096,
    hidden_size: 512,
    intermediate_size: 1536,
    num_hidden_layers: layers,
    num_attention_heads: 8,
    num_key_value_heads: 4,
    head_dim: 64,
    bos_token_id: 1,
    eos_token_id: [2],
  });
}
const n = Number(values.nodes);
const caps = values.memory ? values.memory.split(",") : [];
const slow = values.slowdown ? values.slowdown.split(",") : [];
const log = (m: string) => console.error(`predict_check: ${m}`);
// The fixture's reference prompt, or 13 arbitrary ids for a checkpoint without one.
const reference = await Deno.readTextFile(join(values.model, "reference.json")).then(
  JSON.parse,
  () => undefined,
);
const prompt: number[] = reference?.tokens.slice(0, reference.prompt_length) ??
  [1, 791, 3367, 315, 982, 374, 1236, 13, 578, 864, 315, 922, 374];
const env = { SWACTOR_STATE_DIR: await Deno.makeTempDir({ prefix: "predict_check" }) };

interface Proc {
  child: Deno.ChildProcess;
  out: string;
  err: string;
}
const procs: Proc[] = [];

function spawn(args: string[], i: number): Proc {
  const extra: Record<string, string> = slow[i] && slow[i] !== "1" ? { SWACTOR_SLOWDOWN: slow[i] } : {};
  const child = new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", "--quiet", MAIN, ...args, ...(caps[i] ? ["--memory", caps[i]] : [])],
    env: { ...env, ...extra },
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const p: Proc = { child, out: "", err: "" };
  void (async () => {
    for await (const t of child.stdout.pipeThrough(new TextDecoderStream())) p.out += t;
  })().catch(() => {});
  void (async () => {
    for await (const t of child.stderr.pipeThrough(new TextDecoderStream())) p.err += t;
  })().catch(() => {});
  procs.push(p);
  return p;
}

async function until<T>(what: string, f: () => T | undefined, ms: number): Promise<T> {
  const end = Date.now() + ms;
  for (;;) {
    const v = f();
    if (v !== undefined) return v;
    if (Date.now() > end) throw new Error(`no ${what} within ${ms / 1000} s`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

async function cli(args: string[]): Promise<string> {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", "--quiet", MAIN, ...args],
    env,
    stdout: "piped",
    stderr: "piped",
  }).output();
  if (!out.success) throw new Error(`${args[0]} failed: ${new TextDecoder().decode(out.stderr)}`);
  return new TextDecoder().decode(out.stdout);
}

const f = (x: number, d = 1) => x.toFixed(d);
const list = (xs: number[], d = 1) => `[${xs.map((x) => f(x, d)).join(", ")}]`;
let code = 0;
try {
  const lead = spawn(["up", "--model", values.model, "--members", String(n)], 0);
  const measured = (p: Proc) =>
    until("measurement", () => (/measured: /.test(p.err) ? true : undefined), 60_000);
  const ticket = await until("ticket", () => lead.out.match(/^ticket: (\S+)$/m)?.[1], 30_000);
  await measured(lead);
  for (let i = 1; i < n; i++) await measured(spawn(["join", ticket], i));
  await until("the chain", () => (/chain ready/.test(lead.err) ? true : undefined), 120_000);
  log(`chain ready; letting the link estimates settle for ${values.settle} s`);
  await new Promise((r) => setTimeout(r, Number(values.settle) * 1000));
  const status = JSON.parse(await cli(["status", "--json"])) as {
    self: string;
    members: { id: string; descriptor: LiveDescriptor }[];
  };
  const plan = JSON.parse(await cli(["plan", "--live", "--model", values.model, "--json"]));
  const rows: string[] = [];
  for (let r = 0; r < Number(values.requests); r++) {
    const out = JSON.parse(
      await cli([
        "generate",
        ...["--model", values.model, "--tokens", prompt.join(","), "--max-tokens", values["max-tokens"]],
        ...["--temperature", "0", "--json"],
      ]),
    );
    const perToken = out.timings.per_token.slice(2) as { compute_ms: number[]; wire_ms: number[] }[];
    const stages = out.predicted.stages as { compute_ms: number; hop_ms: number }[];
    const col = (k: "compute_ms" | "wire_ms", i: number) => median(perToken.map((t) => t[k][i]));
    rows.push(
      `| ${r + 1} | ${f(out.predicted_ms_per_token)} | ${f(out.ms_per_token)} | ` +
        `${f(out.ms_per_token / out.predicted_ms_per_token, 2)} | ` +
        `${
          f(median(perToken.map((t) =>
            t.compute_ms.reduce((a, b) => a + b) + t.wire_ms.reduce((a, b) => a + b)
          )))
        } | ` +
        `${list(stages.map((s) => s.compute_ms))} | ${list(stages.map((_, i) => col("compute_ms", i)))} | ` +
        `${list(stages.map((s) => s.hop_ms))} | ${list(stages.map((_, i) => col("wire_ms", i)))} |`,
    );
    log(
      `request ${r + 1}: predicted ${f(out.predicted_ms_per_token)} ms/token, measured ${
        f(out.ms_per_token)
      }`,
    );
  }
  console.log(`### ${n} nodes, ${values.model.split("/").pop()}, ${new Date().toISOString()}\n`);
  console.log(
    "| node | memory | GB/s at K=64 / 4096 | step ms | dispatch ms | mean RTT ms | stage: layers |",
  );
  console.log("|---|---|---|---|---|---|---|");
  for (const m of status.members) {
    const d = m.descriptor;
    const s = plan.stages.find((x: { node: string }) => x.node === m.id);
    const rtts = Object.values(d.links).map((l) => l.rtt_ms);
    console.log(
      `| ${m.id.slice(0, 8)}${m.id === status.self ? " (leader)" : ""} | ${
        f(d.memory_bytes / 2 ** 20, 0)
      } MiB | ` +
        `${f(d.read_gbps_by_width?.["64"] ?? 0, 2)} / ${f(d.read_gbps ?? 0, 2)} | ${
          f(d.readback_ms ?? 0, 3)
        } | ` +
        `${f(d.dispatch_ms ?? 0, 4)} | ${
          rtts.length ? f(rtts.reduce((a, b) => a + b) / rtts.length, 2) : "-"
        } | ` +
        `${
          s
            ? `${s.index}: ${s.layers[0]}..${s.layers[1]}${s.embeds ? " +emb" : ""}${s.head ? " +head" : ""}`
            : "idle"
        } |`,
    );
  }
  console.log(
    "\n| request | predicted ms/token | measured ms/token | measured / predicted | median traced ms/token | " +
      "predicted compute ms per stage | measured (median) | predicted hop ms | measured (median) |",
  );
  console.log("|---|---|---|---|---|---|---|---|---|");
  for (const r of rows) console.log(r);
} catch (e) {
  log(e instanceof Error ? e.message : String(e));
  for (const p of procs) console.error(p.err.split("\n").slice(-8).join("\n"));
  code = 1;
} finally {
  await cli(["down"]).catch(() => {});
  for (const p of procs.slice(1)) {
    try {
      p.child.kill("SIGTERM");
    } catch { /* gone */ }
  }
  const killer = setTimeout(() => {
    for (const p of procs) {
      try {
        p.child.kill("SIGKILL");
      } catch { /* gone */ }
    }
  }, 15_000);
  await Promise.allSettled(procs.map((p) => p.child.status));
  clearTimeout(killer);
  await Deno.remove(env.SWACTOR_STATE_DIR, { recursive: true }).catch(() => {});
}
Deno.exit(code);
