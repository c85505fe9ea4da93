// The state `up` leaves for status/down/generate, and the control API's guard, with real processes
// (issue 11, items 4 and 10): a second `up` is refused naming the first; a stale state file is cleaned
// with a clear message; `down` returns only once the processes have exited; a cross-site POST /down gets
// 403 while status and down keep working.
import assert from "node:assert/strict";
import { join } from "node:path";
import { needs } from "../support/needs.ts";
import { allGone, childrenOf, spawnCli } from "./run.ts";

const linux = { "Linux (/proc)": Deno.build.os === "linux" };
const proc = { sanitizeOps: false, sanitizeResources: false };

/** GET with a Host header of our choosing (fetch sets its own), as a rebound DNS name would send it. */
async function rawGet(addr: string, path: string, host: string): Promise<string> {
  const [hostname, port] = [
    addr.slice(0, addr.lastIndexOf(":")),
    Number(addr.slice(addr.lastIndexOf(":") + 1)),
  ];
  const conn = await Deno.connect({ hostname, port });
  await conn.write(
    new TextEncoder().encode(`GET ${path} HTTP/1.1\r\nHost: ${host}\r\nConnection: close\r\n\r\n`),
  );
  let text = "";
  for await (const chunk of conn.readable.pipeThrough(new TextDecoderStream())) text += chunk;
  return text;
}

/** Runs the CLI to its end, killed after `ms` (old code that hangs fails rather than blocks the suite). */
async function runCli(args: string[], opts: { env: Record<string, string> }, ms = 30_000) {
  const p = spawnCli(args, opts);
  const timer = setTimeout(() => p.child.kill("SIGKILL"), ms);
  const code = await p.code();
  clearTimeout(timer);
  return { code, stdout: p.stdout(), stderr: p.stderr() };
}

async function env(): Promise<Record<string, string>> {
  return { SWACTOR_STATE_DIR: await Deno.makeTempDir(), SWACTOR_NO_GPU: "1" };
}

Deno.test({
  ...needs(
    "a second up is refused naming the first; a cross-site /down is 403; down waits for the exit",
    linux,
  ),
  ...proc,
}, async () => {
  const e = await env();
  const up = spawnCli(["up", "--peers", "2", "--membership", "test"], { env: e });
  try {
    const api = (await up.waitFor(/^api: (\S+)$/m, 30_000))[1];
    await up.waitFor(/joined/, 30_000);
    const workers = childrenOf(up.pid);

    const second = await runCli(["up"], { env: e });
    assert.equal(second.code, 2, second.stderr);
    assert.match(
      second.stderr,
      new RegExp(`a cluster already runs on this machine: \`up\` pid ${up.pid}, control API ${api}`),
    );

    // A web page's form POST: no token, a foreign Origin, text/plain (no CORS preflight).
    const res = await fetch(`http://${api}/down`, {
      method: "POST",
      headers: { origin: "http://evil.example", "content-type": "text/plain" },
      body: "x",
    });
    assert.equal(res.status, 403);
    await res.body?.cancel();
    assert.match(
      await rawGet(api, "/status", "evil.example"),
      /^HTTP\/1\.1 403/,
      "a DNS name rebound to loopback",
    );

    const status = await runCli(["status", "--json"], { env: e });
    assert.equal(status.code, 0, status.stderr);
    const body = JSON.parse(status.stdout);
    assert.equal(body.members.length, 2);
    // How long the node's event loop was held (node/loop_lag.ts): counted from its start.
    assert.ok(
      Number.isInteger(body.loop?.maxMs) && Number.isInteger(body.loop?.holds),
      JSON.stringify(body.loop),
    );

    const down = await runCli(["down"], { env: e });
    assert.equal(down.code, 0, down.stderr);
    await allGone([up.pid, ...workers], 100); // gone when down returns, not some time later
    await assert.rejects(Deno.stat(join(e.SWACTOR_STATE_DIR, "node.json")));
  } finally {
    try {
      up.child.kill("SIGKILL");
    } catch { /* gone */ }
    await up.code();
  }
});

Deno.test({
  ...needs("after the leader dies, status says so and cleans the stale state; up then starts afresh", linux),
  ...proc,
}, async () => {
  const e = await env();
  const first = spawnCli(["up", "--membership", "test"], { env: e });
  await first.waitFor(/^api: /m, 30_000);
  first.child.kill("SIGKILL");
  await first.code();
  const status = await runCli(["status"], { env: e });
  assert.equal(status.code, 1);
  assert.match(
    status.stderr,
    new RegExp(`pid ${first.pid}.* is no longer running; removed its stale state file`),
  );
  await assert.rejects(Deno.stat(join(e.SWACTOR_STATE_DIR, "node.json")));

  // Killed again, and this time `up` meets the stale file itself.
  const second = spawnCli(["up", "--membership", "test"], { env: e });
  await second.waitFor(/^api: /m, 30_000);
  second.child.kill("SIGKILL");
  await second.code();
  const third = spawnCli(["up", "--membership", "test"], { env: e });
  try {
    await third.waitFor(/^api: /m, 30_000);
    assert.match(
      third.stderr(),
      new RegExp(`removed the stale state of an \`up\` that is gone \\(pid ${second.pid}`),
    );
    const down = await runCli(["down"], { env: e });
    assert.equal(down.code, 0, down.stderr);
  } finally {
    try {
      third.child.kill("SIGKILL");
    } catch { /* gone */ }
    await third.code();
  }
});
