// `--cluster FILE` (issues 16 and 20): the lab's cluster file, its regional plan, the nodes' memory budgets,
// and a real run of kimi_lab.swl: 12 node processes, each in its own network namespace behind the WAN
// emulation's relays, giving transformers' reference tokens, experts on several nodes, and a trace with a
// track for every working node.
import assert from "node:assert/strict";
import { join } from "node:path";
import { fixtureDir } from "../fixtures.ts";
import { gpuAvailable, needs } from "../support/needs.ts";
import { runCli } from "./run.ts";
import { labLink, planRegional, readLabCluster } from "../../cli/cluster_plan.ts";
import { checkNamespaces, LAB_NETNS_PREFIX, staleNamespaces } from "../../cli/cluster_run.ts";
import { UsageError } from "../../cli/command.ts";
import { WeightBudget } from "../../cli/pipeline_node.ts";
import { PlacementError } from "../../planner/mod.ts";
import type { StageBackend } from "../../node/stage/mod.ts";
import type { ExpertService } from "../../node/stage/backend.ts";
import { breakdown } from "../../scripts/trace_breakdown.ts";
import { readF32, worstRowError } from "../../scripts/check_fixture.ts";

const LAB = new URL("../../planner/examples/kimi_lab.swl", import.meta.url).pathname;
const MODELS = ["kimi-k2-tiny", "deepseek-v3-groups", "deepseek-v3-plain"];
const config = (m: string) => JSON.parse(Deno.readTextFileSync(join(fixtureDir(m)!, "config.json")));

Deno.test("kimi_lab.swl: 12 nodes in 4 regions, half-memory nodes, 1-2 ms links inside, 15-40 ms between", async () => {
  const { cluster, nodes } = await readLabCluster(LAB);
  assert.equal(nodes.length, 12);
  const regions = new Set(nodes.map((n) => n.region));
  assert.ok(regions.size >= 3);
  const mem = nodes.map((n) => n.memBytes);
  assert.ok(mem.some((m) => m * 2 === Math.max(...mem)), "some node has half the largest's memory");
  assert.ok(nodes.some((n) => n.slowdown > 1) && nodes.some((n) => n.slowdown === 1));
  for (const a of nodes) {
    for (const b of nodes) {
      if (a === b) continue;
      const l = labLink(cluster, a.name, b.name);
      if (a.region === b.region) assert.ok(l.delayMs >= 1 && l.delayMs <= 2, `${a.name}-${b.name}`);
      else assert.ok(l.delayMs >= 15 && l.delayMs <= 40, `${a.name}-${b.name}: ${l.delayMs}`);
      assert.ok(Number.isFinite(l.rateBytesPerSec), "a bandwidth cap");
    }
  }
});

for (const m of MODELS) {
  Deno.test(`lab plan of ${m}: layers across regions, each MoE layer's experts inside its stage's region`, async () => {
    const { cluster } = await readLabCluster(LAB);
    const region = new Map(cluster.nodes.map((n) => [n.id, n.region]));
    const plan = planRegional(config(m), cluster);
    const stageRegions = plan.stages.map((s) => region.get(s.node)!);
    assert.ok(new Set(stageRegions).size >= 2, `stages in ${stageRegions}`);
    // Regions in one run each: a token crosses each region once.
    assert.deepEqual(stageRegions.filter((r, i) => r !== stageRegions[i - 1]), [...new Set(stageRegions)]);
    const working = new Set(plan.stages.map((s) => s.node));
    for (const s of plan.stages) {
      for (const layer of Object.keys(s.experts ?? {})) {
        const hosts = [s.node, ...plan.expertHosts.filter((h) => layer in h.experts).map((h) => h.node)];
        const held = plan.expertHosts.flatMap((h) => h.experts[layer] ?? []).concat(s.experts![layer]);
        assert.ok(
          hosts.every((h) => region.get(h) === region.get(s.node)),
          `layer ${layer} leaves its region`,
        );
        assert.ok(hosts.length >= 2, `layer ${layer} on ${hosts.length} node(s)`);
        assert.equal(new Set(held).size, held.length);
        hosts.forEach((h) => working.add(h));
      }
    }
    assert.ok(working.size >= 8, `${working.size} working nodes`);
    for (const n of plan.nodes) assert.ok(n.memory.free >= 0, `${n.id} over its memory`);
    // No single region holds the model.
    for (const r of new Set(region.values())) {
      const one = { ...cluster, nodes: cluster.nodes.filter((n) => n.region === r) };
      assert.throws(() => planRegional(config(m), one), PlacementError, `region ${r} holds ${m}`);
    }
  });
}

Deno.test("plan --experts regional --kv q8 counts the q8 cache's bytes in GQA layers; MLA's stay f16", async () => {
  const { cluster } = await readLabCluster(LAB, { memoryScale: 8 }); // the file is sized for kimi-k2-tiny
  const kv = (p: ReturnType<typeof planRegional>) => p.nodes.reduce((s, n) => s + n.memory.kv, 0);
  const gqa = config("qwen3-moe-k1"); // head_dim 24: a q8 row is 24 + 4 bytes against f16's 48
  const f16 = kv(planRegional(gqa, cluster));
  assert.ok(f16 > 0);
  assert.equal(kv(planRegional(gqa, cluster, { kv: "q8" })), f16 * 28 / 48);
  const mla = config("kimi-k2-tiny");
  assert.equal(kv(planRegional(mla, cluster, { kv: "q8" })), kv(planRegional(mla, cluster)));
});

Deno.test("a node's memory budget: a load past it is refused, naming both; closing gives it back", async () => {
  const budget = new WeightBudget(200_000);
  const dir = fixtureDir("kimi-k2-tiny")!;
  const model = { dir, weights: "f16" };
  let closed = 0;
  const stage = budget.stage(() =>
    Promise.resolve({ close: () => void closed++ } as unknown as StageBackend)
  );
  const experts = budget.experts(() =>
    Promise.resolve({ close: () => void closed++ } as unknown as ExpertService)
  );
  // Layer 1 without its routed experts: 51,648 bytes at f16.
  const role = { index: 1, stages: 3, layers: [1, 2] as [number, number], embeds: false, head: false };
  const s = await stage(role, { model, experts: { remote: [1], fanout: () => Promise.reject() } });
  assert.equal(budget.held, 51_648);
  // 16 experts of layer 1 (12,288 bytes each): 196,608 more is past 200,000.
  await assert.rejects(
    experts(new Map([[1, Array.from({ length: 16 }, (_, i) => i)]]), { model }),
    /holding 16 experts needs 196608 bytes .*budget \(--memory\) is 200000 bytes .*, 51648 of them held/,
  );
  const e = await experts(new Map([[1, [0, 1, 2]]]), { model });
  assert.equal(budget.held, 51_648 + 3 * 12_288);
  s.close();
  e.close();
  assert.equal(budget.held, 0);
  assert.equal(closed, 2);
  // The whole layer with its experts on one stage does not fit.
  await assert.rejects(stage(role, { model }), /stage 1 \(layers \[1,2\]\) needs/);
});

Deno.test("generate --cluster: a file whose memory cannot hold the model exits 2 before starting a node", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const file = join(dir, "small.swl");
    await Deno.writeTextFile(
      file,
      "cluster small {\n  node a { mem = 128 KiB; region = x }\n  node b { mem = 128 KiB; region = y }\n}\n",
    );
    const r = await runCli([
      ...["generate", "--model", fixtureDir("kimi-k2-tiny")!, "--tokens", "1,2,3", "--cluster", file],
    ]);
    assert.equal(r.code, 2, r.stderr);
    assert.match(r.stderr, /small\.swl: region x cannot hold/);
    const bad = await runCli(["generate", "--tokens", "1", "--cluster", file, "--experts", "local"]);
    assert.equal(bad.code, 2);
    assert.match(bad.stderr, /--experts local cannot be combined/);
    const count = await runCli(["generate", "--tokens", "1", "--cluster", LAB, "--local", "5"]);
    assert.equal(count.code, 2);
    assert.match(count.stderr, /--local 5 with --cluster .*: the file has 12 nodes/);
    const noCluster = await runCli(["generate", "--tokens", "1", "--emulate-wan"]);
    assert.equal(noCluster.code, 2);
    assert.match(noCluster.stderr, /--emulate-wan needs --cluster FILE/);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

const ROOT = Deno.build.os === "linux" && Deno.uid() === 0 &&
  (await new Deno.Command("ip", { args: ["netns", "list"], stdout: "null", stderr: "null" }).output()
    .then((o) => o.success, () => false));
const hasGpu = await gpuAvailable();

Deno.test({
  ...needs(
    "generate --cluster kimi_lab.swl --emulate-wan: reference tokens, experts on >= 4 nodes, a track per node",
    {
      "root and network namespaces (ip netns)": ROOT,
      "a WebGPU adapter": hasGpu,
    },
  ),
  sanitizeOps: false,
  sanitizeResources: false,
}, async () => {
  const dir = fixtureDir("kimi-k2-tiny", { needs: "reference.json" })!;
  const ref = JSON.parse(await Deno.readTextFile(join(dir, "reference.json")));
  const tmp = await Deno.makeTempDir();
  // A namespace as a run that died would leave it (its pid no longer runs): cleared at start.
  const stale = `${LAB_NETNS_PREFIX}-99999s0-0`;
  await new Deno.Command("ip", { args: ["netns", "add", stale] }).output();
  try {
    const trace = join(tmp, "t.json");
    const n = 3;
    const r = await runCli([
      "generate",
      ...["--model", dir, "--tokens", ref.tokens.slice(0, ref.prompt_length).join(",")],
      ...["--max-tokens", String(n), "--temperature", "0", "--json"],
      ...["--cluster", LAB, "--emulate-wan", "--experts", "spread", "--trace", trace],
    ]);
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stderr, new RegExp(`deleted 1 namespace\\(s\\) of an earlier lab run: ${stale}`));
    const out = JSON.parse(r.stdout);
    assert.deepEqual(out.tokens, ref.tokens.slice(ref.prompt_length, ref.prompt_length + n));
    const hosts = new Set(
      Object.values(out.expert_hosts as Record<string, Record<string, string>>)
        .flatMap((l) => Object.values(l)),
    );
    assert.ok(hosts.size >= 4, `experts served by ${hosts.size} nodes`);
    const t = JSON.parse(await Deno.readTextFile(trace));
    const busy = new Set(
      t.traceEvents.filter((e: { ph: string }) => e.ph !== "M").map((e: { pid: number }) => e.pid),
    );
    assert.ok(busy.size >= 8, `${busy.size} node tracks with events`);
    const b = breakdown(t.traceEvents);
    const decode = b.tokens.filter((x) => x.token > 0);
    assert.equal(decode.length, n - 1);
    // Every decode token crosses the regions: 15 + 40 + 30 + 40 ms of one-way links at least.
    for (const x of decode) assert.ok(x.wireMs >= 125, `token ${x.token}: ${x.wireMs} ms on the wire`);
    // Nothing of the run left behind (other runs going on now keep theirs).
    assert.deepEqual(await staleNamespaces(), []);
  } finally {
    await new Deno.Command("ip", { args: ["netns", "del", stale], stderr: "null" }).output();
    await Deno.remove(tmp, { recursive: true });
  }
});

Deno.test({
  ...needs(
    "up --cluster kimi_lab.swl: status shows each node's experts, generate uses it, down stops every node",
    {
      "a WebGPU adapter": hasGpu,
    },
  ),
  sanitizeOps: false,
  sanitizeResources: false,
}, async () => {
  const dir = fixtureDir("kimi-k2-tiny", { needs: "reference.json" })!;
  const ref = JSON.parse(await Deno.readTextFile(join(dir, "reference.json")));
  const state = await Deno.makeTempDir();
  const env = { SWACTOR_STATE_DIR: state };
  const up = new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", "--quiet", new URL("../../main.ts", import.meta.url).pathname, "up"].concat(
      ["--cluster", LAB, "--model", dir],
    ),
    env,
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  let err = "", out = "";
  const reading = Promise.all([
    (async () => {
      for await (const c of up.stderr.pipeThrough(new TextDecoderStream())) err += c;
    })(),
    (async () => {
      for await (const c of up.stdout.pipeThrough(new TextDecoderStream())) out += c;
    })(),
  ]);
  try {
    const deadline = Date.now() + 120_000;
    while (!err.includes("`swactor down` stops them")) {
      if (Date.now() > deadline) throw new Error(`up --cluster did not come up: ${err}`);
      await new Promise((r) => setTimeout(r, 200));
    }
    assert.match(out, /^ticket: \S+\n$/, "one ticket line on stdout, as `up` prints");
    const status = await runCli(["status", "--json"], { env });
    assert.equal(status.code, 0, status.stderr);
    const members = JSON.parse(status.stdout).members as { name: string; roles: string[] }[];
    assert.equal(members.length, 12);
    const hosting = members.filter((m) => m.roles.some((r) => /^experts \d+:\d/.test(r)));
    assert.ok(hosting.length >= 8, `${hosting.length} members list experts among their roles`);
    assert.ok(members.some((m) => m.name === "ew-3060"), "members are named after the file's nodes");
    const gen = await runCli([
      ...["generate", "--tokens", ref.tokens.slice(0, ref.prompt_length).join(","), "--max-tokens", "2"],
      ...["--temperature", "0", "--json"],
    ], { env });
    assert.equal(gen.code, 0, gen.stderr);
    assert.deepEqual(
      JSON.parse(gen.stdout).tokens,
      ref.tokens.slice(ref.prompt_length, ref.prompt_length + 2),
    );
    const down = await runCli(["down"], { env });
    assert.equal(down.code, 0, down.stderr);
    const code = await Promise.race([
      up.status.then((s) => s.code),
      new Promise<null>((r) => setTimeout(() => r(null), 30_000)),
    ]);
    assert.equal(code, 0, `up --cluster after down: ${err}`);
  } finally {
    try {
      up.kill("SIGKILL");
    } catch { /* gone */ }
    await up.status;
    await reading;
    await Deno.remove(state, { recursive: true });
  }
});

Deno.test({
  ...needs("logits --cluster kimi_lab.swl (f32, memory scaled 2x): transformers' logits within 1e-4", {
    "a WebGPU adapter": hasGpu,
  }),
  sanitizeOps: false,
  sanitizeResources: false,
}, async () => {
  const dir = fixtureDir("kimi-k2-tiny", { needs: "reference.safetensors" })!;
  const ref = JSON.parse(await Deno.readTextFile(join(dir, "reference.json")));
  const tmp = await Deno.makeTempDir();
  try {
    const out = join(tmp, "l.safetensors");
    const r = await runCli([
      ...["logits", "--model", dir, "--tokens", ref.tokens.join(","), "--out", out, "--weights", "f32"],
      ...["--cluster", LAB, "--memory-scale", "2"],
    ]);
    assert.equal(r.code, 0, r.stderr);
    const got = await readF32(out, "logits");
    const want = await readF32(join(dir, "reference.safetensors"), "logits");
    const err = worstRowError(got.data, want.data, got.shape[1]);
    assert.ok(err <= 1e-4, `logits error ${err}`);
  } finally {
    await Deno.remove(tmp, { recursive: true });
  }
});

Deno.test({
  ...needs(
    "generate --cluster chain5_25ms.swl --emulate-wan --draft DIR --draft-noise: the leader drafts, same tokens",
    {
      "root and network namespaces (ip netns)": ROOT,
      "a WebGPU adapter": hasGpu,
    },
  ),
  sanitizeOps: false,
  sanitizeResources: false,
}, async () => {
  const dir = fixtureDir("llama-micro")!;
  const chain = new URL("../../planner/examples/chain5_25ms.swl", import.meta.url).pathname;
  const run = (extra: string[]) =>
    runCli([
      ...["generate", "--model", dir, "--tokens", "1,17,99,230,5,1,17,99", "--max-tokens", "12"],
      ...[
        "--temperature",
        "0",
        "--json",
        "--weights",
        "f32",
        "--wire",
        "f32",
        "--cluster",
        chain,
        "--emulate-wan",
      ],
      ...extra,
    ]);
  const plain = await run([]);
  assert.equal(plain.code, 0, plain.stderr);
  // --draft-noise reaches the leader's drafter (the request only names the drafter): acceptance below 1.
  const spec = await run(["--draft", dir, "--speculate", "4", "--draft-noise", "0.5"]);
  assert.equal(spec.code, 0, spec.stderr);
  const p = JSON.parse(plain.stdout), s = JSON.parse(spec.stdout);
  assert.deepEqual(s.tokens, p.tokens);
  assert.ok(s.trips < s.tokens.length, `${s.trips} trips for ${s.tokens.length} tokens`);
  assert.ok(s.acceptance < 1, `acceptance ${s.acceptance} with noise 0.5`);
  const mtp = await runCli(["up", "--cluster", chain, "--model", dir, "--draft", "mtp"]);
  assert.equal(mtp.code, 2);
  assert.match(mtp.stderr, /one node only/);
});

Deno.test("--emulate-wan without root or on another OS: a UsageError saying so (exit 2)", async () => {
  await assert.rejects(checkNamespaces({ os: "linux", uid: 1000 }), UsageError, "--emulate-wan needs root");
  await assert.rejects(checkNamespaces({ os: "darwin", uid: 0 }), UsageError, "Linux network namespaces");
});

Deno.test("plan --experts regional prints the plan generate --cluster runs; f32 needs --memory-scale 2", async () => {
  const dir = fixtureDir("kimi-k2-tiny")!;
  const r = await runCli(["plan", "--model", dir, "--cluster", LAB, "--experts", "regional", "--json"]);
  assert.equal(r.code, 0, r.stderr);
  const { cluster } = await readLabCluster(LAB);
  assert.deepEqual(JSON.parse(r.stdout), {
    ...planRegional(config("kimi-k2-tiny"), cluster, { name: "kimi-k2-tiny" }),
    search: JSON.parse(r.stdout).search,
  });
  const f32 = await runCli([
    "plan",
    "--model",
    dir,
    "--cluster",
    LAB,
    "--experts",
    "regional",
    "--weights",
    "f32",
  ]);
  assert.equal(f32.code, 2);
  assert.match(f32.stderr, /no placement fits \(memory of region eu-west\)/);
  const scaled = await runCli([
    ...["plan", "--model", dir, "--cluster", LAB, "--experts", "regional", "--weights", "f32"],
    ...["--memory-scale", "2"],
  ]);
  assert.equal(scaled.code, 0, scaled.stderr);
  assert.match(scaled.stdout, /context 1024, experts spread; cluster kimi_lab: \d stages/);
});
