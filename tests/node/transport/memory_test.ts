import assert from "node:assert/strict";
import { FakeClock } from "../../../node/clock.ts";
import { MemoryNetwork } from "../../../node/transport/memory.ts";
import { PeerUnreachableError } from "../../../node/transport/errors.ts";

function setup(opts = {}) {
  const clock = new FakeClock();
  const net = new MemoryNetwork(clock, opts);
  const a = net.connect("a"), b = net.connect("b");
  const got: string[] = [];
  b.onMessage((from, msg, ch) => got.push(`${from.id}:${ch}:${msg[0]}`));
  return { clock, net, a, b, got };
}

Deno.test("memory transport delivers after the delay, in order despite jitter", async () => {
  const { clock, a, b, got } = setup({ link: { delayMs: 5, jitterMs: 20 } });
  for (let i = 0; i < 20; i++) assert.equal(await a.send(b.self, new Uint8Array([i])), true);
  clock.advance(4);
  assert.equal(got.length, 0);
  clock.advance(100);
  assert.deepEqual(got, Array.from({ length: 20 }, (_, i) => `a:control:${i}`));
});

Deno.test("memory transport: partitions refuse, loss drops, kill stops delivery", async () => {
  const { clock, net, a, b, got } = setup();
  net.partition([["a"], ["b"]]);
  assert.equal(await a.send(b.self, new Uint8Array([1])), false);
  net.heal();
  assert.equal(await a.send(b.self, new Uint8Array([2]), "data"), true);
  net.setLink("a", "b", { loss: 1 });
  assert.equal(await a.send(b.self, new Uint8Array([3])), true);
  clock.advance(10);
  assert.deepEqual(got, ["a:data:2"]);
  net.setLink("a", "b", { loss: 0 });
  await a.send(b.self, new Uint8Array([4]));
  net.kill("b");
  clock.advance(10);
  assert.deepEqual(got, ["a:data:2"]);
  assert.equal(await a.send(b.self, new Uint8Array([5])), false);
  assert.equal(net.stats.refused, 2);
});

Deno.test("memory transport: connect says at once whether a peer is reachable, like a dial", async () => {
  const { net, a, b } = setup();
  await a.connect(b.self);
  await assert.rejects(a.connect({ id: "nobody", addrs: [] }), PeerUnreachableError);
  net.partition([["a"], ["b"]]);
  await assert.rejects(a.connect(b.self), /cannot reach b/);
  net.heal();
  net.kill("b");
  await assert.rejects(a.connect(b.self), PeerUnreachableError);
  await a.close();
  await assert.rejects(a.connect(a.self), PeerUnreachableError);
});

Deno.test("memory transport rejects oversized messages with a RangeError", async () => {
  const { a, b } = setup({ maxMessageBytes: 8 });
  await assert.rejects(a.send(b.self, new Uint8Array(9)), RangeError);
});

Deno.test("memory network with the same seed replays the same losses", async () => {
  const run = async () => {
    const { clock, a, b, got } = setup({ seed: 42, link: { loss: 0.5, delayMs: 1, jitterMs: 3 } });
    for (let i = 0; i < 50; i++) await a.send(b.self, new Uint8Array([i]));
    clock.advance(100);
    return got.join(",");
  };
  const first = await run();
  assert.equal(await run(), first);
  assert.ok(first.split(",").length > 10 && first.split(",").length < 40);
});

Deno.test("a slow node's messages are sometimes late", async () => {
  const { clock, net, a, b, got } = setup();
  net.setSlow("a", { probability: 1, minMs: 500, maxMs: 600 });
  await a.send(b.self, new Uint8Array([1]));
  clock.advance(400);
  assert.equal(got.length, 0);
  clock.advance(300);
  assert.equal(got.length, 1);
});
