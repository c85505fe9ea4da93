// Chaos runs (issue 18, docs/RECOVERY.md): N runs, each on a fresh cluster of P real node processes on this
// machine (the `lan` membership preset, `--wire f32`), each hitting a random non-leader node at a random
// token of a greedy generation through the cluster's control API:
//   kill       kill -9 (on `up --peers P --model DIR`);
//   stop       SIGSTOP for --stop-s, then SIGCONT (on `up --peers P`);
//   partition  the node cut off from every other node for --partition-s at the WAN emulation's relays, then
//              healed (on the lab cluster of `up --cluster FILE --emulate-wan`: each node in a network
//              namespace of its own, reaching the others only through the relays; needs root). The file is
//              written here: P equal nodes on a LAN (0.3 ms, 1 Gbit/s), each a region of its own, so the lab
//              plans a stage per node while there are layers (cli/cluster_plan.ts); the victim is a stage.
// Reports completed runs, outputs identical to the single node's, and the recovery times (from the loss being
// seen to decoding going on: `ms`; from the last token before the loss: `gap_ms`). After a stop or a
// partition, once the node is back with its old Plan, a second generation must give the same tokens too.
//
//   deno run -A scripts/chaos/run.ts --model DIR [--runs 20] [--faults kill,stop,partition] [--peers 5]
//     [--max-tokens 200] [--stop-s 15] [--partition-s 15] [--seed 1] [--temperature 0] [--json out.json]
//
// --temperature T > 0 samples (top-p 0.9, sampling seed 7): the resumed request must draw what the
// uninterrupted one drew, since each position's draw comes from (seed, position).
import { parseArgs } from "node:util";
import { scriptArgs } from "../args.ts";
import { resolve } from "node:path";
import { join } from "node:path";
import { readGenerateLines } from "../../node/api/mod.ts";
import { readLabCluster } from "../../cli/cluster_plan.ts";
import { startClusterRun } from "../../cli/cluster_run.ts";

export const PROMPT = [128000, 12805, 5304, 264, 892, 11, 304, 264, 14458, 555, 279, 9581, 11];
/** The sampling of every generation (greedy unless --temperature). */
let SAMPLING = { temperature: 0, topP: 1, seed: 0 };
export const MAIN = new URL("../../main.ts", import.meta.url).pathname;

interface RunResult {
  fault: string;
  victim: string;
  atToken: number;
  completed: boolean;
  identical: boolean;
  recoveries: { stage: number | null; node: string | null; reason: string; ms: number; gap_ms: number }[];
  /** stop, partition: a generation after the node came back is exact too. */
  afterIdentical?: boolean;
  /** stop, partition: after the node came back, the Assignment's leader is still the first one (no node
   * that was cut off took the lead and had its own Plan adopted). */
  leaderKept?: boolean;
  error?: string;
  wallS: number;
}

/** A generation through the control API at `api` on the chain's wire (`up --wire f32`); its tokens. */
export async function generate(
  api: string,
  token: string,
  maxTokens: number,
  sampling = SAMPLING,
): Promise<number[]> {
  const res = await fetch(`${api}/generate`, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${token}` },
    body: JSON.stringify({ tokens: PROMPT, maxTokens, sampling }),
  });
  if (!res.ok) throw new Error(`generate refused: ${res.status} ${await res.text()}`);
  const tokens: number[] = [];
  for await (const m of readGenerateLines(res.body!)) {
    if ("error" in m) throw new Error(m.error);
    if ("token" in m) tokens.push(m.token);
  }
  return tokens;
}

/** A seeded generator (mulberry32), so a chaos run can be repeated. */
function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

export function quantile(xs: number[], q: number): number | null {
  if (xs.length === 0) return null;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.ceil(q * s.length) - 1)];
}

export async function solo(model: string, maxTokens: number): Promise<number[]> {
  const state = await Deno.makeTempDir({ prefix: "swactor-chaos-solo-" });
  const out = await new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "-A",
      MAIN,
      "generate",
      "--model",
      model,
      "--tokens",
      PROMPT.join(","),
      "--max-tokens",
      String(maxTokens),
      "--temperature",
      String(SAMPLING.temperature),
      "--top-p",
      String(SAMPLING.topP),
      "--seed",
      String(SAMPLING.seed),
      "--json",
    ],
    env: { SWACTOR_STATE_DIR: state },
    stdout: "piped",
    stderr: "piped",
  }).output();
  await Deno.remove(state, { recursive: true });
  if (!out.success) throw new Error(`solo generate failed: ${new TextDecoder().decode(out.stderr)}`);
  return JSON.parse(new TextDecoder().decode(out.stdout)).tokens;
}

/** A cluster a run hits: its leader's control API, and how to end it. */
interface ChaosCluster {
  api: string;
  token: string;
  /** The leader's node id (never the victim). */
  leader: string;
  /** partition: cuts the node `id` off from the others at the relays, or heals it. */
  partition?: (id: string, cut: boolean) => void;
  close(): Promise<void>;
}

/** Starts `up --peers P --model DIR --wire f32` (kill, stop) and waits for the chain. */
async function up(model: string, peers: number): Promise<ChaosCluster> {
  const state = await Deno.makeTempDir({ prefix: "swactor-chaos-" });
  const child = new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "-A",
      MAIN,
      "up",
      "--peers",
      String(peers),
      "--model",
      model,
      "--wire",
      "f32",
      "--http",
      "off",
    ],
    env: { SWACTOR_STATE_DIR: state },
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  child.stdout.pipeTo(new WritableStream()).catch(() => {});
  const lines: string[] = [];
  const reader = child.stderr.pipeThrough(new TextDecoderStream()).getReader();
  let buf = "";
  const deadline = performance.now() + 180_000;
  while (!lines.some((l) => l.includes("chain ready"))) {
    if (performance.now() > deadline) {
      throw new Error(`the chain was not ready: ${lines.slice(-5).join(" | ")}`);
    }
    const { value, done } = await reader.read();
    if (done) throw new Error(`up exited: ${lines.slice(-5).join(" | ")}`);
    buf += value;
    const parts = buf.split("\n");
    buf = parts.pop()!;
    lines.push(...parts);
  }
  // Keep draining stderr so the process never blocks on a full pipe.
  (async () => {
    try {
      while (!(await reader.read()).done) { /* drain */ }
    } catch { /* closed */ }
  })();
  const st = JSON.parse(
    await Deno.readTextFile(`${state}/node.json`).catch(async () => {
      for await (const e of Deno.readDir(state)) {
        if (e.name.endsWith(".json")) return await Deno.readTextFile(`${state}/${e.name}`);
      }
      throw new Error(`no state file in ${state}`);
    }),
  );
  return {
    api: `http://${st.api}`,
    token: st.token as string,
    leader: st.id as string,
    close: async () => {
      try {
        child.kill("SIGTERM");
      } catch { /* gone */ }
      await child.status;
      await Deno.remove(state, { recursive: true }).catch(() => {});
    },
  };
}

/**
 * The lab cluster of `up --cluster FILE --emulate-wan --wire f32` (partition), started in this process (its
 * relays run here, so the run can cut a node off at them): P equal nodes on a LAN, a region each.
 */
async function lab(model: string, peers: number): Promise<ChaosCluster> {
  const dir = await Deno.makeTempDir({ prefix: "swactor-chaos-lab-" });
  const file = join(dir, "chaos.swl");
  const names = Array.from({ length: peers }, (_, i) => `n${i + 1}`);
  await Deno.writeTextFile(
    file,
    `# scripts/chaos/run.ts --faults partition: ${peers} equal nodes on a LAN, each a region of its own.
cluster chaos {
  defaults {
    mem = 24 GiB
    mem_bw = 100 GB/s
    flops = 10 TFLOP/s
    up = 1 Gbit/s
    down = 1 Gbit/s
    overhead = 1 ms
    reserve = 256 MiB
  }
  link default { latency = 0.3 ms; bw = 1 Gbit/s }
${names.map((n) => `  node ${n} { region = r${n} }`).join("\n")}
}
`,
  );
  try {
    const run = await startClusterRun({
      file,
      lab: await readLabCluster(file),
      modelDir: model,
      weights: "auto",
      wire: "f32",
      emulateWan: true,
      log: () => {},
    });
    const leader = [...run.names].find(([, name]) => name === names[0])![0];
    return {
      api: run.target.base,
      token: run.target.token!,
      leader,
      partition: (id, cut) => run.partition(run.names.get(id)!, cut),
      close: async () => {
        await run.close();
        await Deno.remove(dir, { recursive: true }).catch(() => {});
      },
    };
  } catch (e) {
    await Deno.remove(dir, { recursive: true }).catch(() => {});
    throw e;
  }
}

async function status(api: string, token: string) {
  const res = await fetch(`${api}/status`, { headers: { authorization: `Bearer ${token}` } });
  return await res.json() as {
    members: { id: string; state: string; pid?: number; roles: string[] }[];
    pipeline?: { assignment?: { leader: string; plan: { stages: { node: string }[] } } | null };
  };
}

async function oneRun(
  o: { model: string; peers: number; maxTokens: number; stopS: number; partitionS: number; fault: string },
  random: () => number,
  want: number[],
): Promise<RunResult> {
  const t0 = performance.now();
  const c = o.fault === "partition" ? await lab(o.model, o.peers) : await up(o.model, o.peers);
  const atToken = 5 + Math.floor(random() * Math.max(1, o.maxTokens - 40));
  let victimPid: number | undefined;
  let hitAt = 0;
  let heal: ReturnType<typeof setTimeout> | undefined;
  const downS = o.fault === "partition" ? o.partitionS : o.stopS;
  const result: RunResult = {
    fault: o.fault,
    victim: "",
    atToken,
    completed: false,
    identical: false,
    recoveries: [],
    wallS: 0,
  };
  try {
    const st = await status(c.api, c.token);
    // kill, stop: a member with a process on this machine; partition: a stage's node (a spare's loss would
    // change nothing).
    const stages = new Set(st.pipeline?.assignment?.plan.stages.map((s) => s.node) ?? []);
    const members = st.members.filter((m) =>
      m.id !== c.leader && (o.fault === "partition" ? stages.has(m.id) : m.pid)
    );
    const pick = members[Math.floor(random() * members.length)];
    const victim = pick.id;
    victimPid = pick.pid;
    result.victim = victim.slice(0, 10);
    const res = await fetch(`${c.api}/generate`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${c.token}` },
      body: JSON.stringify({ tokens: PROMPT, maxTokens: o.maxTokens, sampling: SAMPLING }),
    });
    if (!res.ok) throw new Error(`generate refused: ${res.status} ${await res.text()}`);
    const tokens: number[] = [];
    for await (const m of readGenerateLines(res.body!)) {
      if ("error" in m) throw new Error(m.error);
      if ("token" in m) {
        tokens.push(m.token);
        if (tokens.length === atToken) {
          hitAt = performance.now();
          if (o.fault === "kill") Deno.kill(victimPid!, "SIGKILL");
          else if (o.fault === "stop") {
            Deno.kill(victimPid!, "SIGSTOP");
            const pid = victimPid!;
            setTimeout(() => {
              try {
                Deno.kill(pid, "SIGCONT");
              } catch { /* gone */ }
            }, o.stopS * 1000);
          } else {
            c.partition!(victim, true);
            heal = setTimeout(() => c.partition!(victim, false), o.partitionS * 1000);
          }
        }
      }
      if ("done" in m) {
        result.completed = true;
        result.recoveries = (m.done.recoveries ?? []).map((r) => ({
          stage: r.stage,
          node: r.node?.slice(0, 10) ?? null,
          reason: r.reason,
          ms: r.ms,
          gap_ms: r.gap_ms,
        }));
      }
    }
    result.identical = JSON.stringify(tokens) === JSON.stringify(want);
    if (o.fault !== "kill" && hitAt > 0) {
      // The stopped or cut-off node comes back with the old Plan: once it has, a new generation must still
      // be exact.
      const back = hitAt + downS * 1000 + 3000;
      await new Promise((r) => setTimeout(r, Math.max(0, back - performance.now())));
      const again = await generate(c.api, c.token, o.maxTokens);
      result.afterIdentical = JSON.stringify(again) === JSON.stringify(want);
      result.leaderKept = (await status(c.api, c.token)).pipeline?.assignment?.leader === c.leader;
    }
  } catch (e) {
    result.error = (e as Error).message;
  } finally {
    clearTimeout(heal);
    if (o.fault === "stop" && victimPid) {
      try {
        Deno.kill(victimPid, "SIGCONT");
      } catch { /* gone */ }
    }
    await c.close();
  }
  result.wallS = Math.round((performance.now() - t0) / 100) / 10;
  return result;
}

if (import.meta.main) {
  await main();
}

async function main() {
  const { values } = scriptArgs(import.meta.url, (args) =>
    parseArgs({
      args,
      options: {
        model: { type: "string" },
        runs: { type: "string", default: "20" },
        faults: { type: "string", default: "kill,stop" },
        "partition-s": { type: "string", default: "15" },
        peers: { type: "string", default: "5" },
        "max-tokens": { type: "string", default: "200" },
        "stop-s": { type: "string", default: "15" },
        seed: { type: "string", default: "1" },
        temperature: { type: "string", default: "0" },
        json: { type: "string" },
      },
    }));
  if (!values.model) {
    console.error(
      "usage: deno run -A scripts/chaos/run.ts --model DIR [--runs N] [--faults kill,stop,partition] ...",
    );
    Deno.exit(2);
  }
  const faults = values.faults!.split(",");
  for (const f of faults) {
    if (f !== "kill" && f !== "stop" && f !== "partition") {
      console.error(`--faults: unknown fault "${f}" (kill, stop, partition)`);
      Deno.exit(2);
    }
  }
  const o = {
    model: resolve(values.model),
    peers: Number(values.peers),
    maxTokens: Number(values["max-tokens"]),
    stopS: Number(values["stop-s"]),
    partitionS: Number(values["partition-s"]),
  };
  const random = rng(Number(values.seed));
  const temperature = Number(values.temperature);
  if (temperature > 0) SAMPLING = { temperature, topP: 0.9, seed: 7 };
  const want = await solo(o.model, o.maxTokens);
  console.error(`solo: ${want.length} tokens, ${new Set(want).size} distinct`);
  const summary: Record<string, unknown> = {};
  const all: RunResult[] = [];
  for (const fault of faults) {
    const runs: RunResult[] = [];
    for (let i = 0; i < Number(values.runs); i++) {
      const r = await oneRun({ ...o, fault }, random, want);
      runs.push(r);
      all.push(r);
      console.error(JSON.stringify(r));
    }
    const ms = runs.flatMap((r) => r.recoveries.map((x) => x.ms));
    const gap = runs.flatMap((r) => r.recoveries.map((x) => x.gap_ms));
    summary[fault] = {
      runs: runs.length,
      completed: runs.filter((r) => r.completed).length,
      identical: runs.filter((r) => r.identical).length,
      ...(fault !== "kill"
        ? {
          after_identical: runs.filter((r) => r.afterIdentical).length,
          leader_kept: runs.filter((r) => r.leaderKept).length,
        }
        : {}),
      recoveries: ms.length,
      recovery_ms: { p50: quantile(ms, 0.5), p95: quantile(ms, 0.95), max: quantile(ms, 1) },
      gap_ms: { p50: quantile(gap, 0.5), p95: quantile(gap, 0.95), max: quantile(gap, 1) },
    };
  }
  console.log(JSON.stringify(summary));
  if (values.json) {
    await Deno.writeTextFile(values.json, JSON.stringify({ options: o, summary, runs: all }, null, 1));
  }
}
