// The TLS data path over loopback: two default transports put their data channel on it; it carries large
// messages in order; a node without the path, or one whose path cannot be reached, falls back to iroh; and
// the listener refuses every connection that does not prove the secret with a live token offered to the
// same peer (forged token, wrong secret, another peer's token, a replayed token, no TLS_HELLO at all).
import assert from "node:assert/strict";
import { BindError, createIrohTransport } from "../../../node/transport/iroh.ts";
import { dialTlsPath, TlsPath } from "../../../node/transport/tls_path.ts";
import { FAST_SERVER_NAME } from "../../../node/transport/cert.ts";
import { importSecret } from "../../../node/transport/handshake.ts";
import { newSecret } from "../../../node/ticket.ts";
import { denoByteConn } from "../../../node/transport/byte_conn.ts";
import { certificatePem } from "../../../node/transport/cert.ts";
import { decodeFrame, encodeFrame, FrameKind } from "../../../node/wire/mod.ts";
import type { Channel } from "../../../node/transport/transport.ts";

async function until(cond: () => boolean, ms = 5000): Promise<void> {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) throw new Error("condition not met in time");
    await new Promise((r) => setTimeout(r, 10));
  }
}

const enc = (s: string) => new TextEncoder().encode(s);
const ID_A = "a".repeat(64), ID_B = "b".repeat(64), ID_C = "c".repeat(64);

Deno.test("tls path: default transports carry data on it both ways, large messages whole and in order", async () => {
  const secret = newSecret();
  const logs: string[] = [];
  const log = (_: string, m: string) => void logs.push(m);
  const a = await createIrohTransport({ secret, log });
  const b = await createIrohTransport({ secret, log });
  const got: { size: number; first: number; channel: Channel }[] = [];
  b.onMessage((_, msg, channel) => got.push({ size: msg.length, first: msg[0], channel }));
  const back: number[] = [];
  a.onMessage((_, msg) => back.push(msg.length));
  try {
    const sizes = [1, 4 << 20, 100, 16 << 10, 9 << 20, 7];
    const sends = sizes.map((n, i) => a.send(b.self, new Uint8Array(n).fill(i + 1), "data"));
    sends.push(a.send(b.self, enc("ctl"), "control"));
    assert.ok((await Promise.all(sends)).every((x) => x));
    await until(() => got.length === sizes.length + 1, 20000);
    const data = got.filter((g) => g.channel === "data");
    assert.deepEqual(data.map((g) => g.size), sizes);
    assert.deepEqual(data.map((g) => g.first), sizes.map((_, i) => i + 1));
    assert.equal(a.dataPath(b.self.id), "tls");
    assert.equal(b.dataPath(a.self.id), "tls");
    assert.ok(await b.send({ id: a.self.id, addrs: [] }, new Uint8Array(3 << 20), "data"));
    await until(() => back.length === 1, 20000);
    assert.deepEqual(back, [3 << 20]);
    assert.ok(logs.some((l) => l.includes("takes the TLS path")), logs.join("\n"));
  } finally {
    await Promise.all([a.close(), b.close()]);
  }
});

Deno.test("tls path: off on either side, or unreachable, leaves data on iroh and still delivers", async () => {
  const secret = newSecret();
  // `on` listens for TLS on a port of its own (by default it takes its iroh port's number, and the table
  // below would then reroute its iroh dials too).
  const on = await createIrohTransport({ secret, tls: "127.0.0.1:0", log: () => {} });
  const off = await createIrohTransport({ secret, tls: false, log: () => {} });
  const closed = await createIrohTransport({ secret, log: () => {} });
  closed.tls!.close(); // its listener is gone: it offers nothing
  // A dial table (the WAN emulation's hook) applies to offered TLS addresses too: here it sends on's TLS
  // dials for `on`'s own offer to a port where nothing listens, as a firewall dropping TCP would.
  const lost = await createIrohTransport({
    secret,
    tlsTimeoutMs: 500,
    log: () => {},
    dialOverrides: new Map([[on.tls!.addr, "127.0.0.1:9"]]),
  });
  const got: string[] = [];
  for (const t of [on, off, closed]) t.onMessage((_, m) => got.push(new TextDecoder().decode(m)));
  try {
    assert.ok(await on.send(off.self, enc("on->off"), "data"));
    assert.ok(await off.send(on.self, enc("off->on"), "data"));
    assert.ok(await on.send(closed.self, enc("on->closed"), "data"));
    assert.ok(await lost.send(on.self, enc("lost->on"), "data"));
    await until(() => got.length === 4);
    assert.deepEqual(got.sort(), ["lost->on", "off->on", "on->closed", "on->off"]);
    assert.equal(on.dataPath(off.self.id), "iroh"); // off offers nothing
    assert.equal(off.dataPath(on.self.id), "iroh"); // and it does not dial (the same link)
    assert.equal(on.dataPath(closed.self.id), "iroh");
    assert.equal(lost.dataPath(on.self.id), "iroh"); // the offer cannot be reached
    assert.equal(on.dataPath(lost.self.id), "iroh");
  } finally {
    await Promise.all([on.close(), off.close(), closed.close(), lost.close()]);
  }
});

/** A listener for node ID_B with the real secret, and a helper that dials it. */
async function listener() {
  const secret = newSecret();
  const key = await importSecret(secret);
  const logs: string[] = [];
  const path = await TlsPath.start({
    key,
    self: ID_B,
    listen: "127.0.0.1:0",
    log: (_, m) => void logs.push(m),
  });
  const dial = async (self: string, dialKey: CryptoKey, token?: Uint8Array) => {
    const offer = { ...path.offer(ID_A)!.offer };
    if (token) offer.token = token;
    return await dialTlsPath({ key: dialKey, self, log: () => {} }, ID_B, offer, [path.addr], 3000);
  };
  return { key, path, logs, dial };
}

Deno.test("tls path: the listener refuses a forged token, a wrong secret and another peer's token", async () => {
  const { key, path, logs, dial } = await listener();
  try {
    const s = await dial(ID_A, key); // the peer the offer was made to, with the secret: admitted
    s.conn.close();
    await assert.rejects(
      () => dial(ID_A, key, crypto.getRandomValues(new Uint8Array(32))),
      /no pending offer/,
    );
    await assert.rejects(
      async () => dial(ID_A, await importSecret(newSecret())),
      /wrong proof of the cluster secret/,
    );
    // ID_C holds the secret, but the token was offered to ID_A over ID_A's iroh connection.
    await assert.rejects(() => dial(ID_C, key), /wrong proof of the cluster secret/);
    await until(() => logs.filter((l) => l.startsWith("refused TLS connection")).length === 3);
  } finally {
    path.close();
  }
});

Deno.test("tls path: a token admits one connection once; a dialer refuses a listener without the secret", async () => {
  const { key, path, dial } = await listener();
  try {
    const pending = path.offer(ID_A)!;
    const ctx = { key, self: ID_A, log: () => {} };
    const s = await dialTlsPath(ctx, ID_B, pending.offer, [path.addr], 3000);
    await assert.rejects(() => dialTlsPath(ctx, ID_B, pending.offer, [path.addr], 3000), /no pending offer/);
    assert.ok(pending.take(), "the first connection is the offer's");
    s.conn.close();
    // The listener's proof is checked too: a dialer with another secret gets its answer rejected.
    await assert.rejects(
      async () => dial(ID_A, await importSecret(newSecret())),
      /proof of the cluster secret/,
    );
  } finally {
    path.close();
  }
});

Deno.test("tls path: a connection that skips TLS_HELLO is refused and never delivered", async () => {
  const secret = newSecret();
  const logs: string[] = [];
  const b = await createIrohTransport({ secret, log: (_, m) => void logs.push(m) });
  let delivered = 0;
  b.onMessage(() => delivered++);
  try {
    const [host, port] = b.tls!.addr.split(":");
    const tcp = await Deno.connect({ hostname: host, port: Number(port) });
    const tls = await Deno.startTls(tcp, {
      hostname: FAST_SERVER_NAME,
      caCerts: [certificatePem(b.tls!.cert.der)],
    });
    const conn = denoByteConn(tls);
    await conn.write(encodeFrame(FrameKind.MESSAGE, enc("Aunauthenticated")));
    const chunk = await conn.read();
    assert.ok(chunk, "the listener answers before it closes");
    const refuse = decodeFrame(Uint8Array.from(chunk), { messageMax: 1024 });
    assert.equal(refuse.kind, FrameKind.REFUSE);
    assert.equal(await conn.read().catch(() => null), null);
    conn.close();
    await until(() => logs.some((l) => l.includes("expected TLS_HELLO")));
    assert.equal(delivered, 0);
  } finally {
    await b.close();
  }
});

Deno.test("tls path: a client that pins another certificate never completes TLS", async () => {
  const { path } = await listener();
  const other = await TlsPath.start({
    key: await importSecret(newSecret()),
    self: ID_C,
    listen: "127.0.0.1:0",
    log: () => {},
  });
  try {
    // An offer carrying C's certificate, pointed at B's listener (as a tampered offer would be).
    const offer = { ...path.offer(ID_A)!.offer, cert: other.cert.der };
    const ctx = { key: await importSecret(newSecret()), self: ID_A, log: () => {} };
    await assert.rejects(() => dialTlsPath(ctx, ID_B, offer, [path.addr], 3000), /certificate|BadSignature/i);
  } finally {
    path.close();
    other.close();
  }
});

Deno.test("tls path: it listens on TCP at --listen's own port, and a taken TCP port is a clear error", async () => {
  const secret = newSecret();
  const probe = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = (probe.addr as Deno.NetAddr).port;
  probe.close();
  const t = await createIrohTransport({ secret, bindAddr: `127.0.0.1:${port}`, log: () => {} });
  try {
    assert.equal(t.tls!.addr, `127.0.0.1:${port}`);
    assert.deepEqual(t.self.addrs, [`127.0.0.1:${port}`]);
  } finally {
    await t.close();
  }
  const busy = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const taken = (busy.addr as Deno.NetAddr).port;
  try {
    const e = await createIrohTransport({ secret, bindAddr: `127.0.0.1:${taken}`, log: () => {} }).then(
      () => undefined,
      (e) => e,
    );
    assert.ok(e instanceof BindError, `a BindError (the CLI's exit 2 naming --listen), got ${e}`);
    assert.match(
      e.message,
      new RegExp(
        `cannot listen for the TLS data path on TCP 127\\.0\\.0\\.1:${taken}: the TCP port is in use`,
      ),
    );
  } finally {
    busy.close();
  }
});
