// The leader's loss (issue 18, docs/RECOVERY.md): `up --peers 1 --members P --model DIR` and P-1 `join`
// processes (which, unlike `up --peers` workers, outlive the leader), a greedy generation through the
// leader, kill -9 of the leader mid-generation; then how long until another member leads with a ready chain
// (its status says so), and whether a new generation through that member gives the single node's tokens
// (on the chain's wire: the new leader's re-plan keeps `up --wire f32`).
//
//   deno run -A scripts/chaos/leader.ts --model DIR [--peers 5] [--max-tokens 200] [--runs 1] [--json out.json]
import { parseArgs } from "node:util";
import { scriptArgs } from "../args.ts";
import { resolve } from "node:path";
import { generate, MAIN, PROMPT, solo } from "./run.ts";

interface LeaderRun {
  /** From the kill to a member's status naming another leader with a ready chain, ms. */
  newLeaderMs: number | null;
  leader: string | null;
  identical: boolean;
  error?: string;
}

async function lines(stream: ReadableStream<Uint8Array>, until: (l: string) => boolean, ms: number) {
  const reader = stream.pipeThrough(new TextDecoderStream()).getReader();
  const seen: string[] = [];
  let buf = "";
  const deadline = performance.now() + ms;
  while (!seen.some(until)) {
    if (performance.now() > deadline) throw new Error(`timed out: ${seen.slice(-4).join(" | ")}`);
    const { value, done } = await reader.read();
    if (done) throw new Error(`the process ended: ${seen.slice(-4).join(" | ")}`);
    buf += value;
    const parts = buf.split("\n");
    buf = parts.pop()!;
    seen.push(...parts);
  }
  (async () => {
    try {
      while (!(await reader.read()).done) { /* drain */ }
    } catch { /* closed */ }
  })();
  return seen;
}

async function tokenOf(state: string, addr: string): Promise<string> {
  for await (const e of Deno.readDir(`${state}/nodes`)) {
    const s = JSON.parse(await Deno.readTextFile(`${state}/nodes/${e.name}`));
    if (s.api === addr) return s.token;
  }
  throw new Error(`no state recorded for the node at ${addr}`);
}

async function oneRun(model: string, peers: number, maxTokens: number, want: number[]): Promise<LeaderRun> {
  const state = await Deno.makeTempDir({ prefix: "swactor-leader-" });
  const env = { SWACTOR_STATE_DIR: state };
  const procs: Deno.ChildProcess[] = [];
  const spawn = (args: string[]) => {
    const p = new Deno.Command(Deno.execPath(), {
      args: ["run", "-A", MAIN, ...args],
      env,
      stdout: "piped",
      stderr: "piped",
    })
      .spawn();
    procs.push(p);
    return p;
  };
  const run: LeaderRun = { newLeaderMs: null, leader: null, identical: false };
  try {
    const up = spawn([
      "up",
      "--peers",
      "1",
      "--members",
      String(peers),
      "--model",
      model,
      "--wire",
      "f32",
      "--http",
      "off",
    ]);
    const out = await lines(up.stdout, (l) => l.startsWith("ticket: "), 60_000);
    const ticket = out.find((l) => l.startsWith("ticket: "))!.slice(8);
    const file = `${state}/ticket`;
    await Deno.writeTextFile(file, ticket, { mode: 0o600 });
    const upReady = lines(up.stderr, (l) => l.includes("chain ready"), 240_000);
    const apis: string[] = [];
    for (let i = 1; i < peers; i++) {
      const j = spawn(["join", "--ticket-file", file]);
      const seen = await lines(j.stderr, (l) => l.startsWith("api: "), 60_000);
      apis.push(seen.find((l) => l.startsWith("api: "))!.slice(5));
    }
    await upReady;
    const upState = JSON.parse(await Deno.readTextFile(`${state}/node.json`));
    // The generation through the leader dies with it (its origin is gone); the kill comes at token 20.
    const res = await fetch(`http://${upState.api}/generate`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${upState.token}` },
      body: JSON.stringify({ tokens: PROMPT, maxTokens }),
    });
    const reader = res.body!.pipeThrough(new TextDecoderStream()).getReader();
    let n = 0;
    while (n < 20) {
      const { value, done } = await reader.read();
      if (done) break;
      n += (value.match(/"token"/g) ?? []).length;
    }
    up.kill("SIGKILL");
    const killed = performance.now();
    reader.cancel().catch(() => {});
    // Ask every surviving member until one says another member leads and the chain is ready.
    const deadline = killed + 60_000;
    while (performance.now() < deadline && run.leader === null) {
      for (const api of apis) {
        try {
          const token = await tokenOf(state, api);
          const s =
            await (await fetch(`http://${api}/status`, { headers: { authorization: `Bearer ${token}` } }))
              .json();
          const leader = s.members.find((m: { id: string; roles: string[]; state: string }) =>
            m.roles.includes("leader") && m.state === "alive" && m.id !== upState.id
          );
          if (leader && s.pipeline?.ready && s.pipeline.assignment?.leader === leader.id) {
            run.newLeaderMs = Math.round(performance.now() - killed);
            run.leader = leader.id;
            break;
          }
        } catch { /* not answering yet */ }
      }
      if (run.leader === null) await new Promise((r) => setTimeout(r, 200));
    }
    if (run.leader === null) throw new Error("no member took the lead within 60 s");
    // A new generation through the new leader's control API.
    for (const api of apis) {
      const token = await tokenOf(state, api);
      const s = await (await fetch(`http://${api}/status`, { headers: { authorization: `Bearer ${token}` } }))
        .json();
      if (s.self !== run.leader) continue;
      run.identical =
        JSON.stringify(await generate(`http://${api}`, token, maxTokens)) === JSON.stringify(want);
    }
  } catch (e) {
    run.error = (e as Error).message;
  } finally {
    for (const p of procs) {
      try {
        p.kill("SIGTERM");
      } catch { /* gone */ }
    }
    await Promise.all(procs.map((p) => p.status));
    await Deno.remove(state, { recursive: true }).catch(() => {});
  }
  return run;
}

if (import.meta.main) {
  const { values } = scriptArgs(import.meta.url, (args) =>
    parseArgs({
      args,
      options: {
        model: { type: "string" },
        peers: { type: "string", default: "5" },
        "max-tokens": { type: "string", default: "200" },
        runs: { type: "string", default: "1" },
        json: { type: "string" },
      },
    }));
  if (!values.model) {
    console.error("usage: deno run -A scripts/chaos/leader.ts --model DIR [--peers 5] [--runs 1]");
    Deno.exit(2);
  }
  const model = resolve(values.model);
  const maxTokens = Number(values["max-tokens"]);
  const want = await solo(model, maxTokens);
  const runs: LeaderRun[] = [];
  for (let i = 0; i < Number(values.runs); i++) {
    const r = await oneRun(model, Number(values.peers), maxTokens, want);
    console.error(JSON.stringify(r));
    runs.push(r);
  }
  const summary = {
    runs: runs.length,
    led: runs.filter((r) => r.leader).length,
    identical: runs.filter((r) => r.identical).length,
    new_leader_ms: runs.map((r) => r.newLeaderMs),
  };
  console.log(JSON.stringify(summary));
  if (values.json) await Deno.writeTextFile(values.json, JSON.stringify({ summary, runs }, null, 1));
}
