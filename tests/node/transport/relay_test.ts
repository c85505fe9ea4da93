// A relay that cannot be reached (here: a loopback port where nothing listens, as n0's relays are from
// these offline machines): the node says so once, and works on direct addresses meanwhile.
import assert from "node:assert/strict";
import { createIrohTransport } from "../../../node/transport/iroh.ts";
import { newSecret } from "../../../node/ticket.ts";

Deno.test("relay: unreachable is reported once, and peers still talk over direct addresses", async () => {
  const secret = newSecret();
  const relayUrl = "http://127.0.0.1:9/";
  const warnings: string[] = [];
  const log = (level: string, m: string) => level === "warn" && warnings.push(m);
  const a = await createIrohTransport({ secret, relayUrl, relayTimeoutMs: 300, log });
  const b = await createIrohTransport({ secret, relayUrl, relayTimeoutMs: 300, log: () => {} });
  const got: string[] = [];
  b.onMessage((_, m, ch) => got.push(`${ch} ${new TextDecoder().decode(m)}`));
  try {
    assert.equal(a.self.relay, relayUrl);
    assert.ok(await a.send(b.self, new TextEncoder().encode("hi"), "control"));
    assert.ok(await a.send(b.self, new TextEncoder().encode("data"), "data"));
    const end = Date.now() + 5000;
    while (got.length < 2 || warnings.length === 0) {
      if (Date.now() > end) throw new Error(`got ${got}, warnings ${warnings}`);
      await new Promise((r) => setTimeout(r, 20));
    }
    await new Promise((r) => setTimeout(r, 700));
    assert.deepEqual(got.sort(), ["control hi", "data data"]); // order holds per channel only
    assert.equal(warnings.length, 1, warnings.join("\n"));
    assert.match(
      warnings[0],
      /relay unreachable \(http:\/\/127\.0\.0\.1:9\/.*working on direct addresses only/,
    );
    assert.equal(a.dataPath(b.self.id), "tls");
  } finally {
    await Promise.all([a.close(), b.close()]);
  }
});
