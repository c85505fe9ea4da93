// scripts/bench/transport.ts --json: one JSON line per path and message size, with the fields docs/WIRE.md
// lists; `default` marks the path two default nodes on this machine choose (the TLS path).
import assert from "node:assert/strict";

const BENCH = new URL("../../../scripts/bench/transport.ts", import.meta.url).pathname;

Deno.test("transport bench --json: a line per path and size, the TLS path the default one", async () => {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", "--quiet", BENCH, "--seconds", "0.2", "--sizes", "64,16384", "--json"],
    stdout: "piped",
    stderr: "piped",
  }).output();
  assert.equal(out.code, 0, new TextDecoder().decode(out.stderr));
  const lines = new TextDecoder().decode(out.stdout).trim().split("\n").map((l) => JSON.parse(l));
  assert.deepEqual(
    lines.map((l) => `${l.path} ${l.bytes}`),
    ["tls 64", "tls 16384", "iroh 64", "iroh 16384", "tcp 64", "tcp 16384"],
  );
  for (const l of lines) {
    assert.deepEqual(Object.keys(l).sort(), [
      "authenticated",
      "bytes",
      "default",
      "mb_s",
      "msgs_s",
      "path",
      "rtt_ms",
    ]);
    assert.ok(l.msgs_s > 0 && l.mb_s > 0 && l.rtt_ms > 0, JSON.stringify(l));
    assert.equal(l.default, l.path === "tls");
    assert.equal(l.authenticated, l.path !== "tcp");
  }
});
