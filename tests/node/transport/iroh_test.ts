// Real iroh endpoints on loopback (port 0): delivery, order, batching, both channels, refusal of a peer
// without the secret, size limits, simultaneous dials, a quiesced (leaving) node's sends.
import assert from "node:assert/strict";
import { createIrohTransport, PeerUnreachableError } from "../../../node/transport/iroh.ts";
import type { Channel, PeerAddr } from "../../../node/transport/transport.ts";
import { newSecret } from "../../../node/ticket.ts";

type Got = { from: string; text: string; channel: Channel };

async function pair(secretB?: Uint8Array) {
  const secret = newSecret();
  const logs: string[] = [];
  const log = (_: string, msg: string) => void logs.push(msg);
  const a = await createIrohTransport({ secret, log });
  const b = await createIrohTransport({ secret: secretB ?? secret, log });
  const got: Record<"a" | "b", Got[]> = { a: [], b: [] };
  const dec = new TextDecoder();
  a.onMessage((from, msg, channel) => got.a.push({ from: from.id, text: dec.decode(msg), channel }));
  b.onMessage((from, msg, channel) => got.b.push({ from: from.id, text: dec.decode(msg), channel }));
  return { a, b, got, logs, close: () => Promise.all([a.close(), b.close()]) };
}

async function until(cond: () => boolean, ms = 5000): Promise<void> {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) throw new Error("condition not met in time");
    await new Promise((r) => setTimeout(r, 10));
  }
}

const enc = (s: string) => new TextEncoder().encode(s);

Deno.test("iroh: messages arrive whole, in order, on both channels, both ways", async () => {
  const { a, b, got, close } = await pair();
  try {
    const sends: Promise<boolean>[] = [];
    for (let i = 0; i < 2000; i++) sends.push(a.send(b.self, enc(`m${i}`), i % 2 ? "data" : "control"));
    assert.ok((await Promise.all(sends)).every((x) => x));
    await until(() => got.b.length === 2000);
    for (const ch of ["control", "data"] as const) {
      const texts = got.b.filter((g) => g.channel === ch).map((g) => g.text);
      assert.deepEqual(texts, Array.from({ length: 1000 }, (_, k) => `m${2 * k + (ch === "data" ? 1 : 0)}`));
    }
    assert.equal(got.b[0].from, a.self.id);
    // the reply reuses the connection b accepted
    assert.ok(await b.send({ id: a.self.id, addrs: [] }, enc("pong")));
    await until(() => got.a.length === 1);
    assert.deepEqual(got.a[0], { from: b.self.id, text: "pong", channel: "control" });
    assert.deepEqual(a.connectedPeers(), [b.self.id]);
  } finally {
    await close();
  }
});

Deno.test("iroh: a peer without the cluster secret is refused, logged, and nothing is delivered", async () => {
  const { a, b, got, logs, close } = await pair(newSecret());
  try {
    assert.equal(await a.send(b.self, enc("hi")), false);
    await assert.rejects(() => a.connect(b.self), PeerUnreachableError);
    await until(() => logs.some((l) => l.includes("refused connection from")));
    assert.ok(logs.some((l) => l.includes("proof of the cluster secret is wrong")), logs.join("\n"));
    assert.equal(got.b.length, 0);
    assert.equal(got.a.length, 0);
  } finally {
    await close();
  }
});

Deno.test("iroh: size limits per channel, and sends after close resolve false", async () => {
  const { a, b, got, close } = await pair();
  try {
    assert.throws(() => a.send(b.self, new Uint8Array(1024 * 1024 + 1), "control"), RangeError);
    assert.throws(() => a.send(b.self, new Uint8Array(a.maxMessageBytes + 1), "data"), RangeError);
    const big = new Uint8Array(3 * 1024 * 1024).map((_, i) => i & 255);
    let size = 0;
    b.onMessage((_, msg) => (size = msg.length));
    assert.ok(await a.send(b.self, big, "data"));
    await until(() => size === big.length, 20000);
    await a.close();
    assert.equal(await a.send(b.self, enc("late")), false);
    assert.equal(got.b.length, 0);
  } finally {
    await close();
  }
});

Deno.test("iroh: a quiesced transport sends over its open links and dials no new one", async () => {
  const { a, b, got, close } = await pair();
  try {
    assert.ok(await a.send(b.self, enc("before")));
    a.quiesce();
    assert.ok(await a.send(b.self, enc("on the open link")));
    await until(() => got.b.length === 2);
    b.forget(a.self.id); // as a peer does once it hears a node left
    await until(() => a.connectedPeers().length === 0);
    assert.equal(await a.send(b.self, enc("after")), false);
    await new Promise((r) => setTimeout(r, 200));
    assert.deepEqual(got.b.map((g) => g.text), ["before", "on the open link"]);
    assert.deepEqual(b.connectedPeers(), [], "no new connection was made");
  } finally {
    await close();
  }
});

Deno.test("iroh: an unreachable peer makes send resolve false, within the dial timeout", async () => {
  const secret = newSecret();
  const a = await createIrohTransport({ secret, dialTimeoutMs: 500, log: () => {} });
  const gone = await createIrohTransport({ secret, log: () => {} });
  const addr: PeerAddr = { ...gone.self };
  await gone.close();
  try {
    const t0 = Date.now();
    assert.equal(await a.send(addr, enc("x")), false);
    assert.ok(Date.now() - t0 < 3000);
  } finally {
    // iroh's own close waits ~3 s for the connect given up above; a process about to exit need not (a `join`
    // whose leader is gone exited 3 s after saying so, with "leaving took over 3 s").
    const t0 = Date.now();
    await a.close({ exiting: true });
    assert.ok(Date.now() - t0 < 2000, `close took ${Date.now() - t0} ms`);
    // This process goes on: let iroh's close finish before the test ends (native work past its isolate can
    // crash the runtime).
    await until(() => a.endpoint.isClosed(), 10_000);
  }
});

Deno.test("iroh: two peers dialing each other at once both deliver and settle on one connection", async () => {
  const { a, b, got, close } = await pair();
  try {
    const [x, y] = await Promise.all([a.send(b.self, enc("from a")), b.send(a.self, enc("from b"))]);
    assert.ok(x && y);
    await until(() => got.a.length === 1 && got.b.length === 1);
    for (let i = 0; i < 10; i++) {
      await a.send(b.self, enc(`a${i}`));
      await b.send(a.self, enc(`b${i}`));
    }
    await until(() => got.a.length === 11 && got.b.length === 11);
    assert.deepEqual(got.b.map((g) => g.text).slice(1), Array.from({ length: 10 }, (_, i) => `a${i}`));
  } finally {
    await close();
  }
});

Deno.test("iroh: dialOverrides sends a dial for a gossiped address to the address in the table", async () => {
  const secret = newSecret();
  const b = await createIrohTransport({ secret, log: () => {} });
  // 192.0.2.0/24 is TEST-NET-1: never routed, so a dial that reaches b went to the override.
  const gossiped = "192.0.2.1:7400";
  const a = await createIrohTransport({
    secret,
    dialTimeoutMs: 500,
    log: () => {},
    dialOverrides: new Map([[gossiped, b.self.addrs[0]]]),
  });
  const plain = await createIrohTransport({ secret, dialTimeoutMs: 500, log: () => {} });
  const got: string[] = [];
  b.onMessage((from, msg) => got.push(`${from.id} ${new TextDecoder().decode(msg)}`));
  try {
    assert.equal(await plain.send({ id: b.self.id, addrs: [gossiped] }, enc("lost")), false);
    assert.ok(await a.send({ id: b.self.id, addrs: [gossiped] }, enc("via table")));
    await until(() => got.length === 1);
    assert.deepEqual(got, [`${a.self.id} via table`]);
  } finally {
    await Promise.all([a.close(), b.close(), plain.close()]);
  }
});

/** This process's UDP sockets as "ip:port" (IPv6 in brackets), from /proc (Linux). */
async function ownUdpSockets(): Promise<string[]> {
  const inodes = new Set<string>();
  for await (const e of Deno.readDir("/proc/self/fd")) {
    const m = /^socket:\[(\d+)\]$/.exec(await Deno.readLink(`/proc/self/fd/${e.name}`).catch(() => ""));
    if (m) inodes.add(m[1]);
  }
  const out: string[] = [];
  for (const [file, v6] of [["/proc/net/udp", false], ["/proc/net/udp6", true]] as const) {
    const lines = (await Deno.readTextFile(file).catch(() => "")).trim().split("\n").slice(1);
    for (const line of lines) {
      const f = line.trim().split(/\s+/);
      if (!inodes.has(f[9])) continue;
      const [hex, port] = f[1].split(":");
      // /proc prints each 32-bit word of the address in host (little-endian) byte order.
      const bytes = hex.match(/.{8}/g)!.flatMap((w) => w.match(/../g)!.reverse()).map((b) => parseInt(b, 16));
      const ip = v6
        ? `[${
          Array.from({ length: 8 }, (_, i) => ((bytes[2 * i] << 8) | bytes[2 * i + 1]).toString(16)).join(":")
        }]`
        : bytes.join(".");
      out.push(`${ip}:${parseInt(port, 16)}`);
    }
  }
  return out;
}

Deno.test({
  name: "iroh: binds exactly the address asked for; no IPv6 wildcard [::] beside 127.0.0.1 (Linux /proc)",
  ignore: Deno.build.os !== "linux",
  async fn() {
    const before = new Set(await ownUdpSockets());
    const t = await createIrohTransport({ secret: newSecret(), bindAddr: "127.0.0.1:0", log: () => {} });
    try {
      const mine = (await ownUdpSockets()).filter((s) => !before.has(s));
      assert.equal(t.self.addrs.length, 1, `advertised ${t.self.addrs}`);
      assert.match(t.self.addrs[0], /^127\.0\.0\.1:\d+$/);
      assert.ok(mine.includes(t.self.addrs[0]), `${t.self.addrs[0]} not among ${mine}`);
      const wildV6 = mine.filter((s) => s.startsWith("[0:0:0:0:0:0:0:0]"));
      assert.deepEqual(wildV6, [], `sockets on every IPv6 interface: ${mine.join(" ")}`);
      // The other family is pinned to its loopback.
      for (const s of mine.filter((s) => s.startsWith("["))) assert.match(s, /^\[0:0:0:0:0:0:0:1\]:/);
    } finally {
      await t.close();
    }
  },
});

Deno.test("iroh: an address that cannot be bound is a BindError in one line, no backtrace or source path", async () => {
  for (const addr of ["10.254.254.254:0", "garbage"]) {
    await assert.rejects(
      createIrohTransport({ secret: newSecret(), bindAddr: addr, log: () => {} }),
      (e: Error) => {
        assert.equal(e.name, "BindError");
        assert.ok(e.message.startsWith(`cannot bind ${addr}: `), e.message);
        assert.doesNotMatch(e.message, /\n|backtrace|\.rs:\d|\.cargo/);
        return true;
      },
    );
  }
});
