// Issue 17's acceptance with real processes on loopback: `up --model DIR --members 3` and two `join`s that
// differ, one capped by `--memory` to a single layer, one three times slower (SWACTOR_SLOWDOWN=3: its waits
// for the GPU last three times as long, kernels/gpu.ts; measured as such). Each node measures itself; `status --json` shows every
// member's descriptor and links in ../shared/CLI.md's shape; the chain `up --model` placed follows the
// measurements (the capped node holds one layer and not the head, the slow node one layer, the leader the
// rest: with equal nodes the planner would give the leader one) and `plan --live` places the same way;
// `generate --json` through the chain reports the predicted per-token time next to the measured one.
import assert from "node:assert/strict";
import { fixtureDir } from "../fixtures.ts";
import { gpuAvailable, needs } from "../support/needs.ts";
import { getGpu } from "../../kernels/gpu.ts";
import { runCli } from "./run.ts";

const MAIN = new URL("../../main.ts", import.meta.url).pathname;
const tiny = fixtureDir("llama3-tiny", { needs: "reference.json" });
const hasGpu = await gpuAvailable();
// The capped node's memory: the 64 MiB reserve (node/stage/plan_chain.ts) plus room for exactly one of
// llama3-tiny's layers at the planner's 4096-token context: f16 weights with the f16 KV cache take ~0.6 MiB
// a layer (65 MiB: one fits, two do not), f32 weights with the f32 cache ~1.2 MiB (66 MiB).
const cappedMiB = hasGpu && (await getGpu()).hasF16 ? 65 : 66;

interface Proc {
  child: Deno.ChildProcess;
  err(): string;
  out(): string;
}

function spawn(args: string[], env: Record<string, string>): Proc {
  const child = new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", "--quiet", MAIN, ...args],
    env,
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  let out = "", err = "";
  void (async () => {
    for await (const t of child.stdout.pipeThrough(new TextDecoderStream())) out += t;
  })().catch(() => {});
  void (async () => {
    for await (const t of child.stderr.pipeThrough(new TextDecoderStream())) err += t;
  })().catch(() => {});
  return { child, err: () => err, out: () => out };
}

async function until<T>(
  what: string,
  f: () => T | undefined | Promise<T | undefined>,
  ms: number,
): Promise<T> {
  const end = Date.now() + ms;
  for (;;) {
    const v = await f();
    if (v !== undefined && v !== null && v !== false) return v as T;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

interface Member {
  id: string;
  state: string;
  descriptor: {
    measured_at: string | null;
    memory_bytes: number;
    read_gbps: number | null;
    dispatch_ms: number | null;
    readback_ms: number | null;
    links: Record<string, { rtt_ms: number; mbps: number | null }>;
  };
}

Deno.test({
  ...needs(
    "live plan: nodes that differ measure themselves; up --model and plan --live split by the numbers",
    {
      "a WebGPU adapter": hasGpu,
      "llama3-tiny (../shared/fixtures)": tiny,
    },
  ),
  sanitizeResources: false,
  sanitizeOps: false,
  async fn() {
    const env = { SWACTOR_STATE_DIR: await Deno.makeTempDir() };
    const ref = JSON.parse(await Deno.readTextFile(`${tiny}/reference.json`));
    const prompt: number[] = ref.tokens.slice(0, ref.prompt_length);
    const want: number[] = ref.tokens.slice(ref.prompt_length, ref.prompt_length + 8);
    const membership = ["--membership", "test"];
    const procs: Proc[] = [];
    try {
      const lead = spawn(["up", "--model", tiny!, "--members", "3", "--memory", "1GiB", ...membership], env);
      procs.push(lead);
      const ticket = await until("the ticket", () => lead.out().match(/^ticket: (\S+)$/m)?.[1], 30_000);
      const idOf = async (p: Proc) =>
        await until("a node id", () => p.err().match(/^id: (\S+)$/m)?.[1], 30_000);
      // On the software adapter the GPU is the CPU: a process starting up (loading its modules) while another
      // measures slows the measurement. Each node starts once the one before has measured itself.
      const measured = (id: string) =>
        until(`${id.slice(0, 8)} measured`, async () => {
          const s = await runCli(["status", "--json"], { env });
          const m = s.code === 0
            ? (JSON.parse(s.stdout).members as Member[]).find((x) => x.id === id)
            : undefined;
          return m?.descriptor.measured_at ? true : undefined;
        }, 30_000);
      const ids = { lead: await idOf(lead), capped: "", slow: "" };
      await measured(ids.lead);
      const capped = spawn(["join", ticket, "--memory", `${cappedMiB}MiB`, ...membership], env);
      procs.push(capped);
      ids.capped = await idOf(capped);
      await measured(ids.capped);
      const slow = spawn(["join", ticket, ...membership], { ...env, SWACTOR_SLOWDOWN: "3" });
      procs.push(slow);
      ids.slow = await idOf(slow);
      await until("the chain", () => /chain ready: 3 stage/.test(lead.err()), 120_000);

      // status --json: every member's descriptor, measured, with its links to the two others.
      const members = await until("every link measured", async () => {
        const s = await runCli(["status", "--json"], { env });
        assert.equal(s.code, 0, s.stderr);
        const body = JSON.parse(s.stdout) as { members: Member[] };
        const all = body.members.every((m) => Object.keys(m.descriptor.links).length === 2);
        return all ? body.members : undefined;
      }, 60_000);
      assert.equal(members.length, 3);
      for (const m of members) {
        const d = m.descriptor;
        assert.ok(d.measured_at && !Number.isNaN(Date.parse(d.measured_at)), m.id);
        assert.ok(d.read_gbps! > 0 && d.dispatch_ms! >= 0 && d.readback_ms! > 0, JSON.stringify(d));
        for (const [to, l] of Object.entries(d.links)) {
          assert.ok(to !== m.id && members.some((o) => o.id === to));
          assert.ok(l.rtt_ms > 0 && l.rtt_ms < 1000, `${l.rtt_ms}`);
          assert.ok(l.mbps === null || l.mbps > 0);
        }
      }
      const byId = new Map(members.map((m) => [m.id, m.descriptor]));
      assert.equal(byId.get(ids.capped)!.memory_bytes, cappedMiB * 2 ** 20);
      assert.equal(byId.get(ids.lead)!.memory_bytes, 2 ** 30);
      assert.ok(
        byId.get(ids.slow)!.read_gbps! < byId.get(ids.lead)!.read_gbps!,
        `the throttled node reads slower: ${byId.get(ids.slow)!.read_gbps} vs ${
          byId.get(ids.lead)!.read_gbps
        }`,
      );

      // The chain up --model placed: the capped node one layer and not the head; the slow node one layer.
      const pipeline = await (await fetch(`http://${
        JSON.parse(
          await Deno.readTextFile(
            `${env.SWACTOR_STATE_DIR}/node.json`,
          ),
        ).api
      }/pipeline`)).json();
      type Stage = { node: string; layers: [number, number]; embeds: boolean; head: boolean };
      const stages: Stage[] = pipeline.assignment.plan.stages;
      const layersOf = (id: string) => {
        const s = stages.find((x) => x.node === id)!;
        return s.layers[1] - s.layers[0];
      };
      assert.deepEqual(stages.map((s) => s.node), [ids.lead, ids.capped, ids.slow], JSON.stringify(stages));
      assert.equal(layersOf(ids.capped), 1);
      assert.equal(stages.find((s) => s.node === ids.capped)!.head, false);
      assert.equal(layersOf(ids.slow), 1);
      assert.equal(layersOf(ids.lead), 2);

      // plan --live on the same cluster: the same placement.
      const planned = await runCli(["plan", "--live", "--model", tiny!, "--json"], { env });
      assert.equal(planned.code, 0, planned.stderr);
      const live = JSON.parse(planned.stdout) as { stages: Stage[]; predicted: { tokenMs: number } };
      assert.deepEqual(
        live.stages.map((s) => [s.node, s.layers, s.embeds, s.head]),
        stages.map((s) => [s.node, s.layers, s.embeds, s.head]),
      );
      assert.ok(live.predicted.tokenMs > 0);

      // generate through the chain: the reference tokens, the predicted per-token time next to the measured.
      const gen = await runCli([
        "generate",
        "--model",
        tiny!,
        "--tokens",
        prompt.join(","),
        "--max-tokens",
        String(want.length),
        "--temperature",
        "0",
        "--json",
      ], { env });
      assert.equal(gen.code, 0, gen.stderr);
      const out = JSON.parse(gen.stdout.trim().split("\n").at(-1)!);
      assert.deepEqual(out.tokens, want);
      assert.ok(out.predicted_ms_per_token > 0, JSON.stringify(out));
      assert.ok(out.ms_per_token > 0, JSON.stringify(out));
      assert.equal(out.predicted.stages.length, 3);
    } finally {
      await runCli(["down"], { env });
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
  },
});
