// Process lifecycle with real processes (issue 11, items 1 and 2): the workers that `up --peers` and
// `--local` start die with their parent whatever signal it gets (SIGKILL included), `--local` tears down on
// SIGTERM and SIGHUP as on SIGINT, leaving is bounded in time when the leader is gone, and no process's
// command line holds the ticket (it carries the cluster secret); `join` reads it from a file or stdin.
import assert from "node:assert/strict";
import { join } from "node:path";
import { fixtureDir } from "../fixtures.ts";
import { gpuAvailable, needs } from "../support/needs.ts";
import { allGone, childrenOf, commandLine, spawnCli } from "./run.ts";

const linux = { "Linux (/proc)": Deno.build.os === "linux" };
const hasGpu = await gpuAvailable();
const proc = { sanitizeOps: false, sanitizeResources: false };
/** The acceptance bound: no node process left this long after its parent ended. */
const GONE_MS = 5000;

async function env(): Promise<Record<string, string>> {
  return { SWACTOR_STATE_DIR: await Deno.makeTempDir(), SWACTOR_NO_GPU: "1" };
}

Deno.test({
  ...needs(
    "up --peers 3 killed with SIGKILL: its workers leave within 5 s; no command line holds the ticket",
    linux,
  ),
  ...proc,
}, async () => {
  const up = spawnCli(["up", "--peers", "3", "--membership", "test"], { env: await env() });
  let workers: number[] = [];
  try {
    const ticket = (await up.waitFor(/^ticket: (\S+)$/m, 30_000, "stdout"))[1];
    await up.waitFor(/joined[\s\S]*joined/, 30_000);
    workers = childrenOf(up.pid);
    assert.equal(workers.length, 2, "two worker processes");
    for (const pid of [up.pid, ...workers]) {
      assert.ok(!commandLine(pid).includes(ticket), `the ticket is in the command line of ${pid}`);
    }
    const t0 = Date.now();
    up.child.kill("SIGKILL");
    await up.child.status;
    await allGone(workers, GONE_MS - (Date.now() - t0));
    console.log(`workers gone ${Date.now() - t0} ms after the SIGKILL`);
  } finally {
    for (const pid of [up.pid, ...workers]) {
      try {
        Deno.kill(pid, "SIGKILL");
      } catch { /* gone */ }
    }
    await up.code();
  }
});

Deno.test({
  ...needs(
    "up --peers 3 given SIGHUP (a closed terminal) leaves like on SIGINT: exit 0, workers gone",
    linux,
  ),
  ...proc,
}, async () => {
  const e = await env();
  const up = spawnCli(["up", "--peers", "3", "--membership", "test"], { env: e });
  let workers: number[] = [];
  try {
    await up.waitFor(/joined[\s\S]*joined/, 30_000);
    workers = childrenOf(up.pid);
    up.child.kill("SIGHUP");
    assert.equal(await up.code(), 0, up.stderr());
    assert.match(up.stderr(), /leaving the cluster/);
    await allGone(workers, GONE_MS);
    await assert.rejects(Deno.stat(join(e.SWACTOR_STATE_DIR, "node.json")), "the state file is removed");
  } finally {
    for (const pid of [up.pid, ...workers]) {
      try {
        Deno.kill(pid, "SIGKILL");
      } catch { /* gone */ }
    }
    await up.code();
  }
});

Deno.test({
  ...needs(
    "join reads the ticket from --ticket-file and from stdin (-), and leaves once the leader is gone",
    linux,
  ),
  ...proc,
}, async () => {
  const e = await env();
  const up = spawnCli(["up", "--membership", "test"], { env: e });
  const procs = [up];
  try {
    const ticket = (await up.waitFor(/^ticket: (\S+)$/m, 30_000, "stdout"))[1];
    const file = join(e.SWACTOR_STATE_DIR, "ticket");
    await Deno.writeTextFile(file, ticket + "\n", { mode: 0o600 });
    const a = spawnCli(["join", "--ticket-file", file, "--membership", "test"], { env: e });
    const b = spawnCli(["join", "-", "--membership", "test"], { env: e, stdin: "piped" });
    procs.push(a, b);
    const w = b.child.stdin.getWriter();
    await w.write(new TextEncoder().encode(ticket + "\n"));
    await w.close(); // without --exit-with-stdin, the end of stdin is not a reason to leave
    await a.waitFor(/joined/, 30_000);
    await b.waitFor(/joined/, 30_000);
    for (const p of [a, b]) assert.ok(!commandLine(p.pid).includes(ticket));
    // The leader dies; the workers, told to stop, must not wait on it for long.
    up.child.kill("SIGKILL");
    await up.code();
    await new Promise((r) => setTimeout(r, 500));
    const t0 = Date.now();
    a.child.kill("SIGTERM");
    b.child.kill("SIGTERM");
    assert.deepEqual([await a.code(), await b.code()], [0, 0], a.stderr() + b.stderr());
    assert.ok(Date.now() - t0 < GONE_MS, `leaving took ${Date.now() - t0} ms`);
  } finally {
    for (const p of procs) {
      try {
        p.child.kill("SIGKILL");
      } catch { /* gone */ }
    }
    await Promise.all(procs.map((p) => p.code()));
  }
});

const micro = fixtureDir("llama-micro");
for (const signal of ["SIGTERM", "SIGHUP"] as const) {
  Deno.test({
    ...needs(
      `generate --local 3 given ${signal} mid-generation tears the cluster down: no worker left after 5 s`,
      {
        ...linux,
        "a WebGPU adapter": hasGpu,
        "the llama-micro fixture": micro,
      },
    ),
    ...proc,
  }, async () => {
    // Greedy: a sampled run may reach end-of-sequence before the signal does (it did, after 5 tokens).
    const gen = spawnCli(
      [
        "generate",
        "--model",
        micro!,
        "--tokens",
        "1,2,3",
        "--local",
        "3",
        "--max-tokens",
        "4000",
        "--temperature",
        "0",
      ],
      { env: await env() },
    );
    let workers: number[] = [];
    try {
      await gen.waitFor(/loading/, 60_000);
      workers = childrenOf(gen.pid);
      assert.equal(workers.length, 2);
      await gen.waitFor(/\d+ \d+ \d+ \d+/, 60_000, "stdout"); // tokens are streaming
      gen.child.kill(signal);
      assert.equal(await gen.code(), signal === "SIGTERM" ? 143 : 129, gen.stderr());
      assert.match(gen.stderr(), /interrupted; the cluster is torn down/);
      await allGone(workers, GONE_MS);
    } finally {
      for (const pid of [gen.pid, ...workers]) {
        try {
          Deno.kill(pid, "SIGKILL");
        } catch { /* gone */ }
      }
      await gen.code();
    }
  });
}
