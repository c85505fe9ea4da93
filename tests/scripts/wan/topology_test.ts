import assert from "node:assert/strict";
import dgram from "node:dgram";
import { Buffer } from "node:buffer";
import { startChain, startTopology } from "../../../scripts/wan/topology.ts";
import { parseSocketAddr } from "../../../scripts/wan/socket_addr.ts";

/** A UDP "node" that answers every datagram with its own index. */
async function node(index: number) {
  const s = dgram.createSocket("udp4");
  const inbox: string[] = [];
  s.on("message", (m, r) => {
    inbox.push(m.toString());
    if (!m.toString().startsWith("reply")) s.send(Buffer.from(`reply from ${index}`), r.port, r.address);
  });
  await new Promise<void>((r) => s.bind(0, "127.0.0.1", r));
  return { socket: s, addr: `127.0.0.1:${s.address().port}`, inbox };
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

Deno.test("a chain puts a relay on each hop in both dial directions, and none elsewhere", async () => {
  const nodes = await Promise.all([0, 1, 2, 3].map(node));
  const addrs = nodes.map((n) => n.addr);
  const topo = await startChain(addrs, { hops: [{ delayMs: 5 }, { delayMs: 10 }, { delayMs: 15 }] });
  assert.equal(topo.relays.length, 6);
  for (let i = 0; i < 4; i++) {
    for (let j = 0; j < 4; j++) {
      const direct = Math.abs(i - j) !== 1;
      assert.equal(topo.dialAddr(i, j) === addrs[j], direct, `dial ${i} -> ${j}`);
    }
  }
  // Node 2 reaches node 3 through the 15 ms hop and gets the reply back through it: >= 30 ms.
  const t0 = performance.now();
  const to3 = parseSocketAddr(topo.dialAddr(2, 3));
  nodes[2].socket.send(Buffer.from("hello 3"), to3.port, to3.host);
  while (!nodes[2].inbox.includes("reply from 3") && performance.now() - t0 < 1000) await sleep(1);
  const rtt = performance.now() - t0;
  assert.ok(rtt >= 28.9 && rtt < 60, `round trip over the 15 ms hop took ${rtt} ms`);
  assert.deepEqual(nodes[3].inbox, ["hello 3"]);
  // The traffic crossed exactly the relay that 2 dials for 3.
  const used = topo.stats().filter((s) => s.up.packets > 0).map((s) => [s.from, s.to]);
  assert.deepEqual(used, [[2, 3]]);
  await topo.close();
  await Promise.all(nodes.map((n) => new Promise<void>((r) => n.socket.close(r))));
});

Deno.test("setLink retunes both dial directions of a live link; unlinked pairs are refused", async () => {
  const nodes = await Promise.all([0, 1, 2].map(node));
  const topo = await startChain(nodes.map((n) => n.addr), { hops: { delayMs: 0 } });
  const roundTrip = async (from: number, to: number) => {
    const t0 = performance.now();
    const dst = parseSocketAddr(topo.dialAddr(from, to));
    const want = `reply from ${to}`;
    const seen = nodes[from].inbox.filter((m) => m === want).length;
    nodes[from].socket.send(Buffer.from(`hello ${to}`), dst.port, dst.host);
    while (nodes[from].inbox.filter((m) => m === want).length === seen && performance.now() - t0 < 1000) {
      await sleep(1);
    }
    return performance.now() - t0;
  };
  try {
    await roundTrip(0, 1); // opens the relay's upstream socket on the 0 ms link
    topo.setLink(0, 1, { delayMs: 10 }, { delayMs: 5 });
    // Both dial directions cross the same two link states: 10 ms one way, 5 ms the other.
    for (const [from, to] of [[0, 1], [1, 0]]) {
      const rtt = await roundTrip(from, to);
      assert.ok(rtt >= 14.9 && rtt < 1000, `${from} -> ${to} round trip after setLink took ${rtt} ms`);
    }
    topo.setLink(1, 0, { delayMs: 20 });
    const rtt = await roundTrip(0, 1);
    assert.ok(rtt >= 39.9 && rtt < 1000, `round trip after the second setLink took ${rtt} ms`);
    assert.throws(() => topo.setLink(0, 2, { delayMs: 1 }), RangeError);
  } finally {
    await topo.close();
    await Promise.all(nodes.map((n) => new Promise<void>((r) => n.socket.close(r))));
  }
});

Deno.test("a ring also links the last node to the first", async () => {
  const addrs = ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"];
  const topo = await startChain(addrs, { ring: true });
  assert.equal(topo.relays.length, 6);
  assert.notEqual(topo.dialAddr(2, 0), addrs[0]);
  assert.notEqual(topo.dialAddr(0, 2), addrs[2]);
  await topo.close();
  const two = await startChain(addrs.slice(0, 2), { ring: true });
  assert.equal(two.relays.length, 2, "two nodes share one link even in a ring");
  await two.close();
});

Deno.test("both dial directions of a link share one rate cap", async () => {
  // a->b holds 100 kB/s with no burst: a 1000-byte datagram occupies it for 10 ms.
  const nodes = await Promise.all([0, 1].map(node));
  const topo = await startTopology(nodes.map((n) => n.addr), [
    { a: 0, b: 1, spec: { rateBytesPerSec: 1e5, burstBytes: 0, queueBytes: 1e6 } },
  ]);
  const to1 = parseSocketAddr(topo.dialAddr(0, 1));
  const to0 = parseSocketAddr(topo.dialAddr(1, 0));
  const t0 = performance.now();
  // Node 0 dials node 1 and sends 1000 bytes a->b (relay (0,1), its "up" direction).
  nodes[0].socket.send(Buffer.alloc(1000, 1), to1.port, to1.host);
  // Node 1 dials node 0; node 0's reply also travels a->b, through the other relay (1,0), "down".
  nodes[1].socket.send(Buffer.from("ping"), to0.port, to0.host);
  while (!nodes[1].inbox.includes("reply from 0") && performance.now() - t0 < 1000) await sleep(0);
  const replyAt = performance.now() - t0;
  // The reply queued behind the 1000 bytes on the shared a->b state: >= 10 ms, not ~0.
  assert.ok(replyAt >= 9, `reply after ${replyAt} ms: the two relays did not share the a->b cap`);
  const st = topo.stats();
  assert.deepEqual([st[0].from, st[0].to, st[0].up.delivered], [0, 1, 1]);
  assert.deepEqual([st[1].from, st[1].to, st[1].down.delivered], [1, 0, 1]);
  await topo.close();
  await Promise.all(nodes.map((n) => new Promise<void>((r) => n.socket.close(r))));
});

Deno.test("otherPairs relays every unlinked pair; listenHosts picks where each dialer's relays listen", async () => {
  const addrs = ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"];
  const topo = await startChain(addrs, {
    hops: { delayMs: 5 },
    otherPairs: {},
    listenHosts: ["127.0.0.1", "127.0.0.2", "127.0.0.3"],
  });
  assert.equal(topo.relays.length, 6); // 0-1, 1-2 and the extra 0-2
  for (let i = 0; i < 3; i++) {
    for (let j = 0; j < 3; j++) {
      if (i === j) continue;
      assert.notEqual(topo.dialAddr(i, j), addrs[j]);
      assert.ok(
        topo.dialAddr(i, j).startsWith(`127.0.0.${i + 1}:`),
        `node ${i} dials ${topo.dialAddr(i, j)}`,
      );
    }
  }
  const extra = topo.relays.find((r) => r.from === 0 && r.to === 2)!;
  assert.ok(extra);
  await topo.close();
  await assert.rejects(startChain(addrs, { listenHosts: ["127.0.0.1"] }), /listenHosts/);
});

Deno.test("bad topologies are rejected before any relay starts", async () => {
  const addrs = ["127.0.0.1:1", "127.0.0.1:2"];
  await assert.rejects(startTopology(addrs, [{ a: 0, b: 2 }]), RangeError);
  await assert.rejects(startTopology(addrs, [{ a: 1, b: 1 }]), RangeError);
  await assert.rejects(startTopology(addrs, [{ a: 0, b: 1 }, { a: 1, b: 0 }]), /linked twice/);
  assert.throws(() => startChain(addrs.slice(0, 1)), RangeError);
  assert.throws(() => startChain(addrs, { hops: [{}, {}] }), /expected 1 hop/);
  await assert.rejects(startTopology(["nope"], []), TypeError);
});
