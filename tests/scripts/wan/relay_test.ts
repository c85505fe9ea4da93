// Real UDP sockets on loopback, port 0 everywhere. Delays are kept short so the file runs in a few seconds.
import assert from "node:assert/strict";
import dgram from "node:dgram";
import { Buffer } from "node:buffer";
import { startRelay } from "../../../scripts/wan/relay.ts";
import { admit, createLink } from "../../../scripts/wan/link.ts";
import { parseSocketAddr } from "../../../scripts/wan/socket_addr.ts";
import { OrderedSender } from "../../../scripts/wan/ordered_sender.ts";

async function udp(onMessage?: (msg: Buffer, from: dgram.RemoteInfo, s: dgram.Socket) => void) {
  const s = dgram.createSocket("udp4");
  if (onMessage) s.on("message", (m, r) => onMessage(m, r, s));
  await new Promise<void>((r) => s.bind(0, "127.0.0.1", r));
  return {
    socket: s,
    addr: `127.0.0.1:${s.address().port}`,
    close: () => new Promise<void>((r) => s.close(r)),
  };
}

/** An echo server that answers each datagram with itself prefixed by the sender's "host:port". */
function echoServer() {
  return udp((m, r, s) =>
    s.send(Buffer.concat([Buffer.from(`${r.address}:${r.port}|`), m]), r.port, r.address)
  );
}

/** A sink that records arrival times. */
async function sink() {
  const arrivals: { t: number; msg: Buffer }[] = [];
  const s = await udp((msg) => arrivals.push({ t: performance.now(), msg }));
  return { ...s, arrivals };
}

// Deno's dgram reverses a cold socket's first burst of sends (see ordered_sender.ts); tests must not.
const senders = new WeakMap<dgram.Socket, OrderedSender>();
function sendTo(s: dgram.Socket, addr: string, msg: Buffer | string) {
  const a = parseSocketAddr(addr);
  if (!senders.has(s)) senders.set(s, new OrderedSender(s));
  senders.get(s)!.send(typeof msg === "string" ? Buffer.from(msg) : msg, a.port, a.host, () => {});
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function waitFor(cond: () => boolean, ms = 2000) {
  const end = performance.now() + ms;
  while (!cond() && performance.now() < end) await sleep(5);
  return cond();
}

Deno.test("round trips through the relay take twice the one-way delay", async () => {
  const echo = await echoServer();
  const relay = await startRelay({ target: echo.addr, up: { delayMs: 15 } });
  const replies: number[] = [];
  const client = await udp(() => replies.push(performance.now()));
  const rtts: number[] = [];
  for (let i = 0; i < 15; i++) {
    const t0 = performance.now();
    sendTo(client.socket, relay.addr, `ping ${i}`);
    assert.ok(await waitFor(() => replies.length > i), `no reply to ping ${i}`);
    rtts.push(replies[i] - t0);
  }
  rtts.sort((a, b) => a - b);
  // Lower bound: the scheduler may run an entry up to its slack (0.5 ms) early per direction.
  assert.ok(rtts[0] >= 30 - 1.1, `fastest round trip ${rtts[0]} ms is below 2 x 15 ms`);
  // Upper bounds: the fastest within 3 ms of 30 ms, the median within 10 (CPU contention on a shared
  // 2-core VM delays whole event loops; on an idle one the median is within 1-2 ms).
  assert.ok(rtts[0] <= 33, `fastest round trip ${rtts[0]} ms`);
  assert.ok(rtts[7] <= 40, `median round trip ${rtts[7]} ms`);
  await Promise.all([relay.close(), client.close(), echo.close()]);
});

Deno.test("loss matches the seeded link model datagram for datagram", async () => {
  const s = await sink();
  const spec = { loss: 0.2, seed: 42 };
  const relay = await startRelay({ target: s.addr, up: spec });
  const client = await udp();
  const n = 400;
  for (let i = 0; i < n; i++) {
    sendTo(client.socket, relay.addr, `${i}`);
    if (i % 50 === 49) await sleep(2); // keep loopback socket buffers from overflowing
  }
  const model = createLink(spec, { stream: 0 });
  const expected = Array.from({ length: n }, (_, i) => i).filter((i) => admit(model, i, 4).dropped === null);
  assert.ok(await waitFor(() => s.arrivals.length >= expected.length));
  await sleep(20);
  const got = s.arrivals.map((a) => Number(a.msg.toString()));
  assert.deepEqual(got, expected);
  assert.ok(Math.abs(1 - got.length / n - 0.2) < 0.05, `loss rate ${1 - got.length / n}`);
  assert.equal(relay.stats().up.lost, n - expected.length);
  await Promise.all([relay.close(), client.close(), s.close()]);
});

Deno.test("the rate cap holds and a full queue drops the excess", async () => {
  const s = await sink();
  // 1 MB/s = 1000 B/ms, offered in bursts of 20 kB (small enough for the relay's socket buffer) with a
  // pause of >= 1 ms between them: several times the rate even on a loaded machine.
  const relay = await startRelay({
    target: s.addr,
    up: { rateBytesPerSec: 1e6, burstBytes: 1000, queueBytes: 40_000 },
  });
  const client = await udp();
  const payload = Buffer.alloc(1000);
  const t0 = performance.now();
  for (let i = 0; i < 200; i++) {
    sendTo(client.socket, relay.addr, payload);
    if (i % 20 === 19) await sleep(1);
  }
  const sendEnd = performance.now();
  assert.ok(await waitFor(() => relay.stats().up.inFlight === 0));
  const st = relay.stats().up;
  assert.ok(st.queueDrops > 20, `offered 5x the rate, yet only ${st.queueDrops} queue drops`);
  assert.equal(st.delivered + st.queueDrops, st.packets);
  assert.ok(await waitFor(() => s.arrivals.length === st.delivered));
  // n datagrams of 1000 B cannot all be through before (n - 1) ms at 1000 B/ms (one goes as the burst).
  // Measured from the first send: a sink that reads late can only make this longer, never shorter.
  const n = s.arrivals.length;
  const span = s.arrivals[n - 1].t - t0;
  assert.ok(span >= n - 1 - 1, `${n} datagrams were through in ${span} ms, faster than the cap`);
  // And none waits longer than a full queue (40 ms at the rate) after the last send, plus slack.
  const bound = Math.max(n - 1, sendEnd - t0 + 40) + 25;
  assert.ok(span <= bound, `${n} datagrams took ${span} ms, more than ${bound}`);
  await Promise.all([relay.close(), client.close(), s.close()]);
});

Deno.test("replies route back to the client that sent the request", async () => {
  const echo = await echoServer();
  const relay = await startRelay({ target: echo.addr, up: { delayMs: 2 } });
  const got: Record<string, string[]> = { a: [], b: [] };
  const a = await udp((m) => got.a.push(m.toString()));
  const b = await udp((m) => got.b.push(m.toString()));
  for (let i = 0; i < 5; i++) {
    sendTo(a.socket, relay.addr, `a${i}`);
    sendTo(b.socket, relay.addr, `b${i}`);
  }
  assert.ok(await waitFor(() => got.a.length === 5 && got.b.length === 5));
  const bodies = (xs: string[]) => xs.map((x) => x.split("|")[1]);
  const seenAs = (xs: string[]) => new Set(xs.map((x) => x.split("|")[0]));
  assert.deepEqual(bodies(got.a), ["a0", "a1", "a2", "a3", "a4"]);
  assert.deepEqual(bodies(got.b), ["b0", "b1", "b2", "b3", "b4"]);
  // The echo server saw each client as one distinct upstream address, neither of them the client's own.
  const [sa, sb] = [seenAs(got.a), seenAs(got.b)];
  assert.equal(sa.size, 1);
  assert.equal(sb.size, 1);
  assert.notDeepEqual(sa, sb);
  assert.ok(!sa.has(a.addr) && !sb.has(b.addr));
  assert.equal(relay.stats().clients, 2);
  await Promise.all([relay.close(), a.close(), b.close(), echo.close()]);
});

Deno.test("closing releases the listen port and every upstream socket", async () => {
  const echo = await echoServer();
  const relay = await startRelay({ target: echo.addr, up: { delayMs: 50 } });
  const replies: string[] = [];
  const client = await udp((m) => replies.push(m.toString()));
  sendTo(client.socket, relay.addr, "first");
  assert.ok(await waitFor(() => replies.length === 1));
  const upstream = replies[0].split("|")[0];
  sendTo(client.socket, relay.addr, "in flight when closed");
  await sleep(5);
  await relay.close();
  await relay.close(); // idempotent
  // Both ports can be bound again, so the sockets are gone.
  for (const addr of [relay.addr, upstream]) {
    const s = dgram.createSocket("udp4");
    await new Promise<void>((resolve, reject) => {
      s.once("error", reject);
      s.bind(parseSocketAddr(addr).port, "127.0.0.1", resolve);
    });
    await new Promise<void>((r) => s.close(r));
  }
  await sleep(80);
  assert.deepEqual(replies.length, 1, "a datagram in flight at close must not be delivered");
  await Promise.all([client.close(), echo.close()]);
});

Deno.test("an idle client mapping is forgotten and its upstream socket closed", async () => {
  const echo = await echoServer();
  const relay = await startRelay({ target: echo.addr, idleTimeoutMs: 40 });
  const replies: string[] = [];
  const client = await udp((m) => replies.push(m.toString()));
  sendTo(client.socket, relay.addr, "hello");
  assert.ok(await waitFor(() => replies.length === 1));
  assert.equal(relay.stats().clients, 1);
  assert.ok(await waitFor(() => relay.stats().clients === 0, 1000), "the idle mapping was kept");
  // Traffic after that opens a fresh mapping with a new upstream port.
  sendTo(client.socket, relay.addr, "again");
  assert.ok(await waitFor(() => replies.length === 2));
  assert.notEqual(replies[0].split("|")[0], replies[1].split("|")[0]);
  await Promise.all([relay.close(), client.close(), echo.close()]);
});

Deno.test("bad options are rejected", async () => {
  await assert.rejects(startRelay({ target: "nope" }), { name: "TypeError", message: /host:port/ });
  await assert.rejects(startRelay({ target: "127.0.0.1:9", up: { loss: 2 } }), { name: "RangeError" });
});
