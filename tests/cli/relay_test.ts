// `--relay` on up and join, with real processes on loopback: a bad value is exit 2 naming the flag; with a
// relay that cannot be reached (a loopback port where nothing listens, as n0's relays are from these
// offline machines) each node says so once, the ticket carries the relay, and the worker still joins over
// direct addresses.
import assert from "node:assert/strict";
import { runCli } from "./run.ts";
import { encodeTicket, newSecret, parseTicket } from "../../node/ticket.ts";

const MAIN = new URL("../../main.ts", import.meta.url).pathname;

Deno.test("relay: --relay takes n0, none or an http(s) URL; anything else is exit 2", async () => {
  const up = await runCli(["up", "--relay", "ftp://relay.example"]);
  assert.equal(up.code, 2, up.stderr);
  assert.match(up.stderr, /--relay must be n0, none, or an http\(s\) URL/);
  const ticket = encodeTicket({
    secret: newSecret(),
    leader: { id: "ab".repeat(32), addrs: ["127.0.0.1:9"] },
  });
  const join = await runCli(["join", ticket, "--relay", "somewhere"]);
  assert.equal(join.code, 2, join.stderr);
  assert.match(
    join.stderr,
    /--relay must be n0, none, or an http\(s\) URL of an iroh relay server, got "somewhere"/,
  );
});

Deno.test({
  name: "relay: an unreachable relay is reported once per node, and join works on direct addresses",
  sanitizeResources: false,
  sanitizeOps: false,
  async fn() {
    const relay = "http://127.0.0.1:9/";
    const env = { SWACTOR_STATE_DIR: await Deno.makeTempDir() };
    const up = new Deno.Command(Deno.execPath(), {
      args: ["run", "-A", "--quiet", MAIN, "up", "--peers", "2", "--membership", "test", "--relay", relay],
      env,
      stdout: "piped",
      stderr: "piped",
    }).spawn();
    let out = "", err = "";
    const pumps = [
      (async () => {
        for await (const t of up.stdout.pipeThrough(new TextDecoderStream())) out += t;
      })(),
      (async () => {
        for await (const t of up.stderr.pipeThrough(new TextDecoderStream())) err += t;
      })(),
    ];
    try {
      const end = Date.now() + 60_000;
      let members = 0;
      while (members < 2 || (err.match(/relay unreachable/g) ?? []).length < 2) {
        if (Date.now() > end) throw new Error(`after 60 s: ${members} members\n${err}`);
        await new Promise((r) => setTimeout(r, 300));
        const st = await runCli(["status", "--json"], { env });
        if (st.code === 0) {
          members = JSON.parse(st.stdout).members.filter((m: { state: string }) =>
            m.state === "alive"
          ).length;
        }
      }
      const ticket = parseTicket(/ticket: (\S+)/.exec(out)![1]);
      assert.equal(ticket.relay, relay);
      await new Promise((r) => setTimeout(r, 1500));
      const warnings = err.split("\n").filter((l) => l.includes("relay unreachable"));
      assert.equal(warnings.length, 2, `one warning per node:\n${err}`);
      assert.notEqual(warnings[0].slice(0, 20), warnings[1].slice(0, 20), "from two different nodes");
      assert.match(warnings[0], /working on direct addresses only \(127\.0\.0\.1:\d+\)/);
    } finally {
      const down = await runCli(["down"], { env });
      if (down.code !== 0) up.kill("SIGTERM");
      await up.status;
      await Promise.all(pumps);
    }
  },
});
