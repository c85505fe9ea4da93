// tok/s of the N-stage pipeline chain through emulated WAN links (issue 4, part 5), next to the bound.
// Needs root (network namespaces). About 2 minutes with the defaults on the 2-core VM.
//
//   deno run -A scripts/bench/pipeline_wan.ts [--model ../shared/fixtures/llama3-tiny] [--nodes 5]
//     [--delays 0,10,25] [--max-tokens 32] [--rounds 3] [--json FILE] [--weights f32|f16|auto] [--settle S]
//     [--experts local|spread] [--links chain|all] [--wire f16|f32]
//     [--speculate K [--drafters target,target:0.2,ngram] [--random-layers N]]
//
// Each node measures itself at start (they start one after another, each once the one before has measured:
// on the software adapter a process loading its modules slows another's measurement), and each request is
// reported with the cost model's prediction from the live descriptors and links; `--settle S` waits S
// seconds after retuning the links, so the link estimates (SWIM round trips) have seen the new delay.
//
// Each node runs in its own network namespace (iroh would otherwise bypass the relays, docs/WAN.md) and
// listens on its namespace address; every pair of nodes gets a relay pair in this (root) namespace, and each
// node's dial table ($SWACTOR_DIAL_TABLE, cli/dial_table.ts) sends its dials for a peer's address to the
// relay. Node ids, and so the stage order the leader plans, are known only once the chain is up; then the
// links between consecutive stages (and last -> first, the token's way back) are retuned to each delay in
// turn, on the same connections, while all other pairs stay perfect links (membership traffic). Each round
// visits every delay: one short warm-up request, then one measured request (greedy, the model's reference
// prompt); rounds spread each delay's requests over the run, so the machine's changing load hits all delays
// alike. Markdown tables to stdout (scripts/bench/pipeline_wan_report.ts says how the bounds are computed).
//
// --speculate K (issue 19): speculative decoding through the same emulation. The leader drafts beside stage 0
// (k = K drafts per verification step, depth 1) with each drafter of --drafters: "target" (the model as its
// own draft, acceptance ~1), "target:P" (the same, each drafted token replaced with probability P) and
// "ngram" (prompt lookup, on a repetitive prompt); DIR or DIR:P names another draft model. Each round and
// delay then also runs plain decoding of the repetitive prompt and one speculative request per drafter, and
// a third table gives each next to plain decoding of the same prompt (in the same round: the machine's load
// hits both alike), the plain bound 1000 / (hops x delay), and whether its tokens equal plain decoding's.
// --random-layers N: the model is a random llama-micro-shaped checkpoint with N layers
// (scripts/bench/random_checkpoint.ts), one layer per node (N = --nodes), prompted with fixed token ids.
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { parseFlags } from "../../cli/command.ts";
import { DIAL_TABLE_ENV } from "../../cli/dial_table.ts";
import { collect } from "../../cli/local_cluster.ts";
import { createNetns } from "../wan/netns.ts";
import { startTopology } from "../wan/topology.ts";
import { type Run, runsTable, type SpecRun, specTable } from "./pipeline_wan_report.ts";
import { llamaMicroShapedCheckpoint } from "./random_checkpoint.ts";
import { scriptArgs } from "../args.ts";

const root = fileURLToPath(new URL("../../", import.meta.url));
const { values } = scriptArgs(import.meta.url, (args) =>
  parseFlags(args, {
    model: { type: "string", default: join(root, "../shared/fixtures/llama3-tiny") },
    nodes: { type: "string", default: "5" },
    delays: { type: "string", default: "0,10,25" },
    "max-tokens": { type: "string", default: "32" },
    rounds: { type: "string", default: "3" },
    port: { type: "string", default: "7400" },
    json: { type: "string" },
    experts: { type: "string", default: "local" },
    links: { type: "string", default: "chain" },
    weights: { type: "string", default: "f32" },
    settle: { type: "string", default: "0" },
    wire: { type: "string", default: "f16" },
    speculate: { type: "string" },
    drafters: { type: "string", default: "target,target:0.2,ngram" },
    "random-layers": { type: "string" },
  }));
if (!["local", "spread"].includes(values.experts)) throw new TypeError(`--experts: local or spread`);
if (!["chain", "all"].includes(values.links)) {
  throw new TypeError(`--links: chain (stage hops) or all (every pair)`);
}
const settleMs = Number(values.settle) * 1000;
const n = Number(values.nodes);
const delays = values.delays.split(",").map(Number);
const maxTokens = Number(values["max-tokens"]);
const rounds = Number(values.rounds);
const randomLayers = values["random-layers"] === undefined ? undefined : Number(values["random-layers"]);
if (randomLayers !== undefined && randomLayers !== n) {
  throw new TypeError(`--random-layers ${randomLayers}: one layer per node, so it must equal --nodes ${n}`);
}
const model = randomLayers === undefined ? values.model : await llamaMicroShapedCheckpoint(randomLayers);
// The random model has no reference continuation: the single-node path's greedy tokens stand for it.
const reference: { tokens: number[]; prompt_length: number } | undefined = randomLayers === undefined
  ? JSON.parse(await Deno.readTextFile(join(model, "reference.json")))
  : undefined;
const prompt = reference?.tokens.slice(0, reference.prompt_length) ??
  [1, 17, 99, 230, 5, 71, 402, 310, 12, 44];
/** ngram's prompt: a repeated phrase, whose continuation prompt lookup can draft. */
const repetitive = Array.from({ length: 40 }, (_, i) => prompt[i % 5]);
const speculateK = values.speculate === undefined ? undefined : Number(values.speculate);
if (speculateK !== undefined && !(Number.isInteger(speculateK) && speculateK >= 1 && speculateK <= 16)) {
  throw new TypeError(`--speculate: 1 to 16 drafts per verification step`);
}
/** --drafters: name, the leader's draft (a folder or "ngram") and its noise. */
const drafters = speculateK === undefined ? [] : values.drafters.split(",").map((d) => {
  const [what, p] = d.split(":");
  const noise = p === undefined ? 0 : Number(p);
  if (!(noise >= 0 && noise <= 1)) throw new TypeError(`--drafters ${d}: the noise must be 0 to 1`);
  const draft = what === "target" ? model : what;
  return {
    name: `${what === "ngram" ? "ngram" : what === "target" ? "target as draft" : what}` +
      (noise > 0 ? ` + noise ${noise}` : ""),
    draft,
    noise,
  };
});
const deno = Deno.execPath();
const log = (m: string) => console.error(`pipeline_wan: ${m}`);

type Msg = Record<string, unknown>;

/** Greedy tokens of the single-node path: the chain's longer continuation must equal them. */
async function singleNode(): Promise<number[]> {
  const args = ["run", "-A", "--quiet", join(root, "main.ts"), "generate", "--model", model];
  args.push("--weights", values.weights, "--wire", values.wire);
  args.push("--tokens", prompt.join(","), "--max-tokens", `${maxTokens}`, "--temperature", "0", "--json");
  const out = await new Deno.Command(deno, { args, stdout: "piped", stderr: "null" }).output();
  if (!out.success) throw new Error(`single-node generate failed (exit ${out.code})`);
  return JSON.parse(new TextDecoder().decode(out.stdout)).tokens;
}

log(`single-node run for the expected tokens (${maxTokens} new)`);
const single = await singleNode();
const t0 = performance.now();
const net = await createNetns(n);
const addrs = net.nodes.map((x) => `${x.nodeIp}:${values.port}`);
// Every pair gets a relay pair on a perfect link; the stage hops are retuned once the stage order is known.
const topo = await startTopology(addrs, [], { listenHosts: net.nodes.map((x) => x.hostIp), otherPairs: {} });
const tmp = await Deno.makeTempDir({ prefix: "pipeline_wan" });
const children: Deno.ChildProcess[] = [];
const stderrTail: string[] = [];
const keep = (who: string) => (l: string) => {
  stderrTail.push(`[${who}] ${l}`);
  if (stderrTail.length > 60) stderrTail.shift();
};

/** Starts `deno run -A argv` in node i's namespace, with its dial table: every peer through its relay. */
async function spawn(i: number, argv: string[]): Promise<Deno.ChildProcess> {
  const table = join(tmp, `dial-${i}.json`);
  const entries = addrs.map((a, j) => [a, topo.dialAddr(i, j)]).filter((_, j) => j !== i);
  await Deno.writeTextFile(table, JSON.stringify(Object.fromEntries(entries)));
  const [cmd, ...args] = net.command(i, [deno, "run", "-A", "--quiet", ...argv]);
  const child = new Deno.Command(cmd, {
    args,
    cwd: root,
    env: { [DIAL_TABLE_ENV]: table },
    stdin: "piped",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  children.push(child);
  return child;
}

async function shutdown(): Promise<void> {
  const signal = (s: Deno.Signal) => {
    for (const c of children) {
      try {
        c.kill(s);
      } catch { /* gone */ }
    }
  };
  signal("SIGTERM");
  const killer = setTimeout(() => signal("SIGKILL"), 5000);
  await Promise.allSettled(children.map((c) => c.status));
  clearTimeout(killer);
  await topo.close();
  await net.close();
  await Deno.remove(tmp, { recursive: true }).catch(() => {});
}
Deno.addSignalListener("SIGINT", () => shutdown().finally(() => Deno.exit(130)));

const runs: Run[] = [];
/** Nodes that said they measured themselves ("swactor: measured: ..." on stderr). */
const measured = new Set<number>();
let code = 0;
try {
  const leader = await spawn(0, [
    join(root, "scripts/bench/pipeline_wan_leader.ts"),
    ...["--listen", addrs[0], "--model", model, "--nodes", `${n}`, "--tokens", prompt.join(",")],
    ...["--experts", values.experts],
    ...["--weights", values.weights, "--wire", values.wire],
    ...(randomLayers !== undefined ? ["--one-stage-each"] : []),
  ]);
  const inbox: Msg[] = [];
  collect(leader.stdout, (l) => inbox.push(JSON.parse(l)));
  collect(leader.stderr, (l) => {
    keep("leader")(l);
    if (l.includes("measured: ")) measured.add(0);
  });
  const writer = leader.stdin.getWriter();
  const next = async (key: string, timeoutMs: number): Promise<Msg> => {
    const deadline = performance.now() + timeoutMs;
    while (!inbox.length) {
      if (performance.now() > deadline) throw new Error(`no "${key}" from the leader within ${timeoutMs} ms`);
      await new Promise((r) => setTimeout(r, 20));
    }
    const m = inbox.shift()!;
    if (!(key in m)) throw new Error(`leader: ${m.error ?? JSON.stringify(m)}`);
    return m;
  };
  const hello = await next("ticket", 60_000);
  const nodeOf = new Map<string, number>([[hello.id as string, 0]]);

  const waitMeasured = async (i: number) => {
    const deadline = performance.now() + 30_000;
    while (!measured.has(i) && performance.now() < deadline) await new Promise((r) => setTimeout(r, 50));
  };
  await waitMeasured(0);
  for (let i = 1; i < n; i++) {
    const w = await spawn(i, [join(root, "main.ts"), "join", hello.ticket as string, "--listen", addrs[i]]);
    collect(w.stderr, (l) => {
      keep(`node ${i}`)(l);
      if (l.startsWith("id: ")) nodeOf.set(l.slice(4).trim(), i);
      if (l.includes("measured: ")) measured.add(i);
    });
    collect(w.stdout, () => {});
    await waitMeasured(i);
  }
  log(`${n} nodes in namespaces; waiting for the chain`);
  const ready = (await next("ready", 240_000)).ready as { stages: { node: string }[] };
  const order = ready.stages.map((s) => {
    const i = nodeOf.get(s.node);
    if (i === undefined) throw new Error(`stage on node ${s.node}, which is none of ours`);
    return i;
  });
  log(`chain ready after ${((performance.now() - t0) / 1000).toFixed(1)} s; stage k runs on node [${order}]`);
  const generate = async (
    tokens: number,
    o: { tokens?: number[]; speculate?: { draft: string; noise: number; k: number } } = {},
  ) => {
    await writer.write(new TextEncoder().encode(JSON.stringify({ maxTokens: tokens, ...o }) + "\n"));
    return (await next("result", 300_000)).result as SpecRun["results"][number];
  };
  runs.push(...delays.map((d) => ({ delayMs: d, hops: order.length, results: [] })));
  const specRuns: SpecRun[] = [];
  const specOf = (delayMs: number, name: string, plain: string) => {
    let r = specRuns.find((x) => x.delayMs === delayMs && x.name === name);
    if (!r) specRuns.push(r = { delayMs, hops: order.length, name, plain, results: [] });
    return r;
  };
  const requests = [
    ...(drafters.some((d) => d.draft === "ngram")
      ? [{ name: "plain, repetitive prompt", plain: "", tokens: repetitive, speculate: undefined }]
      : []),
    ...drafters.map((d) => ({
      name: d.draft === "ngram" ? `${d.name}, repetitive prompt` : d.name,
      plain: d.draft === "ngram" ? "plain, repetitive prompt" : "plain",
      tokens: d.draft === "ngram" ? repetitive : prompt,
      speculate: { draft: d.draft, noise: d.noise, k: speculateK! },
    })),
  ];
  // Warm-up on the perfect links: every request's GPU programs (verification steps compute k + 1 tokens).
  for (const q of requests) await generate(12, { tokens: q.tokens, speculate: q.speculate });
  for (let round = 0; round < rounds; round++) {
    for (const run of runs) {
      // Hop k joins stage k and k+1; the last hop is the token's way back to stage 0.
      // --links all: every pair (expert fan-out crosses them too), else only the stage hops.
      if (values.links === "all") {
        for (let a = 0; a < n; a++) {
          for (let b = a + 1; b < n; b++) topo.setLink(a, b, { delayMs: run.delayMs });
        }
      } else {
        for (let k = 0; k < order.length && order.length > 1; k++) {
          const a = order[k], b = order[(k + 1) % order.length];
          if (order.length > 2 || k === 0) topo.setLink(a, b, { delayMs: run.delayMs });
        }
      }
      if (settleMs > 0) await new Promise((r) => setTimeout(r, settleMs));
      await generate(4); // warm-up
      const r = await generate(maxTokens);
      run.results.push(r);
      log(`round ${round + 1}, ${run.delayMs} ms one-way per hop: ${r.tokS.toFixed(2)} tok/s`);
      if (requests.length) specOf(run.delayMs, "plain", "plain").results.push(r);
      for (const q of requests) {
        const s = await generate(maxTokens, { tokens: q.tokens, speculate: q.speculate });
        specOf(run.delayMs, q.name, q.plain || q.name).results.push(s);
        log(`round ${round + 1}, ${run.delayMs} ms, ${q.name}: ${s.tokS.toFixed(2)} tok/s`);
      }
    }
  }
  await writer.write(new TextEncoder().encode(JSON.stringify({ quit: true }) + "\n"));
  // Everything crossed a relay (the namespaces have no other route); show where the datagrams went.
  const hopPairs = new Set(order.map((a, k) => `${a}-${order[(k + 1) % order.length]}`));
  const count = (hop: boolean) =>
    topo.stats().filter((r) =>
      (hopPairs.has(`${r.from}-${r.to}`) || hopPairs.has(`${r.to}-${r.from}`)) === hop
    )
      .reduce((acc, r) => acc + r.up.delivered + r.down.delivered, 0);
  log(`relay datagrams delivered: ${count(true)} on the stage hops, ${count(false)} between other pairs`);
  const expected = reference?.tokens.slice(reference.prompt_length) ?? single;
  const report = runsTable(runs, { single, expected });
  console.log(report.markdown);
  if (!report.correct) code = 1;
  if (specRuns.length) {
    const spec = specTable(specRuns);
    console.log("\n" + spec.markdown);
    if (!spec.correct) code = 1;
  }
  if (values.json) {
    await Deno.writeTextFile(
      values.json,
      JSON.stringify({ date: new Date().toISOString(), runs, single, speculative: specRuns }),
    );
  }
} catch (e) {
  console.error(stderrTail.join("\n"));
  console.error(`pipeline_wan: ${e instanceof Error ? e.message : e}`);
  code = 1;
} finally {
  await shutdown();
}
Deno.exit(code);
