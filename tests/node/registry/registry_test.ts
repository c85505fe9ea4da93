import assert from "node:assert/strict";
import { membershipConfig, test as testPreset } from "../../../node/membership/mod.ts";
import { newer } from "../../../node/registry/mod.ts";
import { SimCluster } from "../../support/sim_cluster.ts";

const config = membershipConfig({}, testPreset);

function converged(n: number, tombstoneTtlMs?: number) {
  const c = new SimCluster({ n, config, registry: { tombstoneTtlMs } });
  c.joinAll();
  assert.ok(c.clock.runUntilTrue(() => c.converged(), { stepMs: 20, maxMs: 30_000 }) !== undefined);
  return c;
}
const views = (c: SimCluster) =>
  new Set(c.nodes.filter((n) => c.up(n)).map((n) => JSON.stringify(n.registry.entries())));

Deno.test("conflict rule: higher version, then higher writer id, then tombstone", () => {
  const e = (version: number, writer: string, owner: string | null = writer) => ({
    name: "x",
    owner,
    version,
    writer,
  });
  assert.ok(newer(e(2, "a"), e(1, "z")));
  assert.ok(newer(e(1, "b"), e(1, "a")));
  assert.ok(newer(e(1, "a", null), e(1, "a")));
  assert.ok(!newer(e(1, "a"), e(1, "a")));
});

Deno.test("register/resolve/watch replicate to every node; concurrent claims agree on the higher id", () => {
  const c = converged(8);
  const changes: string[] = [];
  c.nodes[7].registry.watch((name, owner) => changes.push(`${name}=${owner}`));
  c.nodes[1].registry.register("stage-3");
  c.nodes[2].registry.register("moe-expert-7-12");
  c.clock.advance(2000);
  assert.equal(views(c).size, 1);
  assert.equal(c.nodes[6].registry.resolve("stage-3"), "n01");
  assert.deepEqual(changes.sort(), ["moe-expert-7-12=n02", "stage-3=n01"]);
  // Same instant, same version: n05 > n04 wins everywhere.
  c.nodes[4].registry.register("stage-0");
  c.nodes[5].registry.register("stage-0");
  c.clock.advance(2000);
  assert.equal(views(c).size, 1);
  assert.equal(c.nodes[0].registry.resolve("stage-0"), "n05");
  assert.throws(() => c.nodes[0].registry.register(""), TypeError);
});

Deno.test("whenResolved: at once, or when a registration arrives by gossip; a timeout or an abort rejects", async () => {
  const c = converged(3);
  c.nodes[1].registry.register("stage-1");
  c.clock.advance(2000);
  assert.equal(await c.nodes[0].registry.whenResolved("stage-1", { timeoutMs: 1 }), "n01");
  // A host still loading: the wait ends when its name reaches this node.
  const later = c.nodes[0].registry.whenResolved("moe-host-n02", { timeoutMs: 5_000 });
  c.nodes[2].registry.register("moe-host-n02");
  c.clock.advance(2000);
  assert.equal(await later, "n02");
  await assert.rejects(
    c.nodes[0].registry.whenResolved("nobody", { timeoutMs: 10 }),
    /no node registered "nobody" within 10 ms/,
  );
  const abort = new AbortController();
  const waiting = c.nodes[0].registry.whenResolved("nobody", { timeoutMs: 5_000, signal: abort.signal });
  abort.abort(new Error("expert host n02 died"));
  await assert.rejects(waiting, /n02 died/);
});

Deno.test("unregister removes a name everywhere; only the owner may", () => {
  const c = converged(5);
  c.nodes[1].registry.register("stage-1");
  c.clock.advance(2000);
  assert.equal(c.nodes[2].registry.unregister("stage-1"), false);
  assert.equal(c.nodes[1].registry.unregister("stage-1"), true);
  c.clock.advance(2000);
  for (const n of c.nodes) assert.equal(n.registry.resolve("stage-1"), undefined);
});

Deno.test("a dead owner's entries vanish everywhere and are not resurrected by stale state", () => {
  const c = converged(8);
  c.nodes[3].registry.register("stage-3");
  c.nodes[4].registry.register("stage-4");
  c.clock.advance(2000);
  c.kill(c.nodes[3]);
  const t = c.clock.runUntilTrue(
    () => c.nodes.filter((n) => c.up(n)).every((n) => n.registry.resolve("stage-3") === undefined),
    { maxMs: 20_000 },
  );
  assert.ok(t !== undefined);
  c.clock.advance(10_000); // several push-pull rounds
  assert.equal(views(c).size, 1);
  assert.deepEqual(c.nodes[0].registry.entries(), [["stage-4", "n04"]]);
});

Deno.test("a late joiner gets the registry through push-pull; a restarted owner withdraws stale claims", async () => {
  const c = converged(5);
  c.nodes[2].registry.register("stage-2");
  c.clock.advance(3000);
  // n02 crashes and restarts so fast that nobody noticed; its new life holds nothing.
  c.kill(c.nodes[2]);
  const again = c.restart(c.nodes[2]);
  const joined = again.membership.join([c.addr(c.nodes[0])]);
  c.clock.advance(3000);
  assert.equal(await joined, 1);
  c.clock.advance(5000);
  assert.equal(views(c).size, 1);
  for (const n of c.nodes) assert.equal(n.registry.resolve("stage-2"), undefined);
  assert.ok(again.registry.entries().length === 0);
});

/** A registry gossip payload as membership would deliver it from `from` to `to`. */
function deliver(c: SimCluster, from: number, to: number, payload: string): void {
  const bytes = new TextEncoder().encode(payload);
  const b64 = btoa(String.fromCharCode(...bytes));
  const pkt = new Uint8Array([0x4d, 1, 0, 0, 0, 0]);
  const msg = new TextEncoder().encode(JSON.stringify({ t: "user", ch: "registry", data: b64 }));
  const full = new Uint8Array(pkt.length + msg.length);
  full.set(pkt);
  new DataView(full.buffer).setUint32(2, msg.length);
  full.set(msg, 6);
  c.nodes[to].membership.receive(c.addr(c.nodes[from]), full);
}

Deno.test("malformed registry payloads are counted, not thrown", () => {
  const c = converged(3);
  const r = c.nodes[0].registry;
  deliver(c, 1, 0, '[{"name":5}]');
  assert.equal(r.malformed, 1);
  deliver(c, 1, 0, '[{"name":"x","owner":null,"version":1,"writer":"n01","age":-5}]');
  assert.equal(r.malformed, 2);
});

Deno.test("tombstones are forgotten everywhere after their TTL, and no node teaches them back", () => {
  const ttl = 20_000;
  const c = converged(8, ttl);
  for (let i = 0; i < 10; i++) c.nodes[1].registry.register(`client-${i}`);
  c.clock.advance(2000);
  for (let i = 0; i < 10; i++) c.nodes[1].registry.unregister(`client-${i}`);
  c.clock.advance(2000);
  for (const n of c.nodes) assert.equal(n.registry.tombstones(), 10, n.id);
  // A late joiner learns them by push-pull, dated by their age, and forgets them with everyone else.
  const late = c.spawn("n99");
  c.nodes.push(late);
  void late.membership.join([c.addr(c.nodes[0])]);
  c.clock.advance(6000);
  assert.equal(late.registry.tombstones(), 10);
  // Past the TTL plus a push-pull round: gone everywhere, and many more push-pulls do not bring them back.
  c.clock.advance(ttl);
  for (let k = 0; k < 5; k++) {
    c.clock.advance(10_000);
    for (const n of c.nodes) assert.equal(n.registry.tombstones(), 0, `${n.id} after ${k} more rounds`);
  }
  assert.equal(views(c).size, 1);
  assert.deepEqual(c.nodes[0].registry.entries(), []);
});

Deno.test("an owner that sees a tombstone for a name it holds claims it again, above that version", () => {
  const c = converged(5, 20_000);
  c.nodes[1].registry.register("stage-1");
  c.clock.advance(2000);
  // Another node still holds an old tombstone of this name at a higher version (say, from before the
  // owner forgot its own): it reaches a third node, then spreads.
  deliver(c, 3, 2, '[{"name":"stage-1","owner":null,"version":7,"writer":"n03","age":1000}]');
  c.clock.advance(5000);
  assert.equal(views(c).size, 1);
  for (const n of c.nodes) assert.equal(n.registry.resolve("stage-1"), "n01", n.id);
  // A tombstone already older than the TTL is ignored outright.
  deliver(c, 3, 2, '[{"name":"stage-1","owner":null,"version":99,"writer":"n03","age":20000}]');
  c.clock.advance(5000);
  for (const n of c.nodes) assert.equal(n.registry.resolve("stage-1"), "n01", n.id);
});
