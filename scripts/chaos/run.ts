// Chaos runs (issue 18, docs/RECOVERY.md): N runs, each on a fresh `up --peers P --model DIR` (real
// processes on this machine, the `lan` membership preset), each killing (kill -9) or stopping (SIGSTOP for
// --stop-s, then SIGCONT) a random non-leader node at a random token of a greedy generation through the
// cluster's control API. Reports completed runs, outputs identical to the single node's, and the recovery
// times (from the loss being seen to decoding going on: `ms`; from the last token before the loss: `gap_ms`).
//
//   deno run -A scripts/chaos/run.ts --model DIR [--runs 20] [--faults kill,stop] [--peers 5]
//     [--max-tokens 200] [--stop-s 15] [--seed 1] [--temperature 0] [--json out.json]
//
// --temperature T > 0 samples (top-p 0.9, sampling seed 7): the resumed request must draw what the
// uninterrupted one drew, since each position's draw comes from (seed, position).
//
// Partitions through the WAN relay need network namespaces (root); on this machine the partition fault is
// exercised on the in-memory network instead (tests/node/stage/recovery_test.ts).
import { parseArgs } from "node:util";
import { resolve } from "node:path";
import { readGenerateLines } from "../../node/api/mod.ts";

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
  /** stop: a generation after the stopped node came back is exact too. */
  afterIdentical?: boolean;
  error?: string;
  wallS: number;
}

/** A greedy generation through the control API at `api`; its tokens. */
export async function generate(
  api: string,
  token: string,
  maxTokens: number,
  sampling = SAMPLING,
): Promise<number[]> {
  const res = await fetch(`${api}/generate`, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${token}` },
    body: JSON.stringify({ tokens: PROMPT, maxTokens, wire: "f32", sampling }),
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

/** Starts `up`, waits for the chain; returns the process, its state folder and the API. */
async function up(model: string, peers: number) {
  const state = await Deno.makeTempDir({ prefix: "swactor-chaos-" });
  const child = new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", MAIN, "up", "--peers", String(peers), "--model", model, "--http", "off"],
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
  return { child, state, api: `http://${st.api}`, token: st.token as string, leader: st.id as string };
}

async function status(api: string, token: string) {
  const res = await fetch(`${api}/status`, { headers: { authorization: `Bearer ${token}` } });
  return await res.json() as { members: { id: string; state: string; pid?: number; roles: string[] }[] };
}

async function oneRun(
  o: { model: string; peers: number; maxTokens: number; stopS: number; fault: string },
  random: () => number,
  want: number[],
): Promise<RunResult> {
  const t0 = performance.now();
  const c = await up(o.model, o.peers);
  const atToken = 5 + Math.floor(random() * Math.max(1, o.maxTokens - 40));
  let victimPid: number | undefined;
  let stoppedAt = 0;
  let victim = "";
  const result: RunResult = {
    fault: o.fault,
    victim,
    atToken,
    completed: false,
    identical: false,
    recoveries: [],
    wallS: 0,
  };
  try {
    const members = (await status(c.api, c.token)).members.filter((m) => m.id !== c.leader && m.pid);
    const pick = members[Math.floor(random() * members.length)];
    victim = pick.id;
    victimPid = pick.pid!;
    result.victim = victim.slice(0, 10);
    const res = await fetch(`${c.api}/generate`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${c.token}` },
      body: JSON.stringify({ tokens: PROMPT, maxTokens: o.maxTokens, wire: "f32", sampling: SAMPLING }),
    });
    if (!res.ok) throw new Error(`generate refused: ${res.status} ${await res.text()}`);
    const tokens: number[] = [];
    for await (const m of readGenerateLines(res.body!)) {
      if ("error" in m) throw new Error(m.error);
      if ("token" in m) {
        tokens.push(m.token);
        if (tokens.length === atToken) {
          if (o.fault === "kill") Deno.kill(victimPid, "SIGKILL");
          else {
            stoppedAt = performance.now();
            Deno.kill(victimPid, "SIGSTOP");
            const pid = victimPid;
            setTimeout(() => {
              try {
                Deno.kill(pid, "SIGCONT");
              } catch { /* gone */ }
            }, o.stopS * 1000);
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
    if (o.fault === "stop") {
      // The stopped node comes back with the old Plan: once it has, a new generation must still be exact.
      const back = stoppedAt + o.stopS * 1000 + 3000;
      await new Promise((r) => setTimeout(r, Math.max(0, back - performance.now())));
      const again = await generate(c.api, c.token, o.maxTokens);
      result.afterIdentical = JSON.stringify(again) === JSON.stringify(want);
    }
  } catch (e) {
    result.error = (e as Error).message;
  } finally {
    if (victimPid) {
      try {
        Deno.kill(victimPid, "SIGCONT");
      } catch { /* gone */ }
    }
    try {
      c.child.kill("SIGTERM");
    } catch { /* gone */ }
    await c.child.status;
    await Deno.remove(c.state, { recursive: true }).catch(() => {});
  }
  result.wallS = Math.round((performance.now() - t0) / 100) / 10;
  return result;
}

if (import.meta.main) {
  await main();
}

async function main() {
  const { values } = parseArgs({
    args: Deno.args,
    options: {
      model: { type: "string" },
      runs: { type: "string", default: "20" },
      faults: { type: "string", default: "kill,stop" },
      peers: { type: "string", default: "5" },
      "max-tokens": { type: "string", default: "200" },
      "stop-s": { type: "string", default: "15" },
      seed: { type: "string", default: "1" },
      temperature: { type: "string", default: "0" },
      json: { type: "string" },
    },
  });
  if (!values.model) {
    console.error("usage: deno run -A scripts/chaos/run.ts --model DIR [--runs N] [--faults kill,stop] ...");
    Deno.exit(2);
  }
  const faults = values.faults!.split(",");
  for (const f of faults) {
    if (f !== "kill" && f !== "stop") {
      console.error(`--faults: unknown fault "${f}" (kill, stop)`);
      Deno.exit(2);
    }
  }
  const o = {
    model: resolve(values.model),
    peers: Number(values.peers),
    maxTokens: Number(values["max-tokens"]),
    stopS: Number(values["stop-s"]),
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
      ...(fault === "stop" ? { after_identical: runs.filter((r) => r.afterIdentical).length } : {}),
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
