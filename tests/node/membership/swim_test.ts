import assert from "node:assert/strict";
import { membershipConfig, test as testPreset } from "../../../node/membership/mod.ts";
import { encodeMessage, packPacket } from "../../../node/membership/messages.ts";
import { SimCluster, type SimNode } from "../../support/sim_cluster.ts";

const config = membershipConfig({}, testPreset);
const live = (c: SimCluster) => c.nodes.filter((n) => c.up(n));
const stateOf = (observer: SimNode, id: string) => observer.membership.member(id)?.state;

function converged(n: number, seed = 1) {
  const c = new SimCluster({ n, config, seed });
  c.joinAll();
  const t = c.clock.runUntilTrue(() => c.converged(), { stepMs: 20, maxMs: 30_000 });
  assert.ok(t !== undefined, "cluster did not converge");
  return c;
}

Deno.test("10 nodes joining one seed converge, with every node's descriptor", () => {
  const c = converged(10);
  for (const n of c.nodes) {
    const ms = n.membership.members();
    assert.equal(ms.length, 10);
    assert.ok(ms.every((m) => m.state === "alive" && m.meta.name === m.id && m.meta.adapter === "fake"));
  }
});

Deno.test("a crashed node is marked dead by every other node within the bound", () => {
  const c = converged(10);
  const victim = c.nodes[4];
  c.kill(victim);
  // test preset: probe 200 ms; suspicion min = 3 * log10(10) * 200 = 600 ms, max 3.6 s.
  const t = c.clock.runUntilTrue(() => live(c).every((n) => stateOf(n, victim.id) === "dead"), {
    stepMs: 20,
    maxMs: 10_000,
  });
  assert.ok(t !== undefined && t < 3000, `detection took ${t} ms`);
  assert.ok(live(c).every((n) => n.membership.member(victim.id) !== undefined));
});

Deno.test("a suspected node refutes with a higher incarnation and is not declared dead", () => {
  const c = converged(6);
  const [accuser, accused] = [c.nodes[0], c.nodes[1]];
  const inc = accused.membership.member(accused.id)!.incarnation;
  const msg = packPacket([encodeMessage({ t: "suspect", id: accused.id, inc, from: accuser.id })]);
  for (const n of c.nodes.slice(2)) n.membership.receive(c.addr(accuser), msg);
  assert.equal(stateOf(c.nodes[2], accused.id), "suspect");
  c.clock.advance(10_000);
  assert.ok(accused.membership.stats.refuted >= 1);
  assert.ok(accused.membership.member(accused.id)!.incarnation > inc);
  assert.ok(c.converged());
});

Deno.test("leave is graceful: every node sees the member as left, not dead", async () => {
  const c = converged(8);
  const leaver = c.nodes[3];
  const done = leaver.membership.leave();
  c.clock.advance(1000);
  await done;
  c.kill(leaver);
  c.clock.advance(10_000);
  for (const n of live(c)) assert.equal(stateOf(n, leaver.id), "left");
});

Deno.test("a restarted node (lost incarnation) rejoins and is alive everywhere", async () => {
  const c = converged(6);
  const victim = c.nodes[2];
  c.kill(victim);
  c.clock.runUntilTrue(() => live(c).every((n) => stateOf(n, victim.id) === "dead"), { maxMs: 10_000 });
  const again = c.restart(victim);
  const joined = again.membership.join([c.addr(c.nodes[0])]);
  c.clock.advance(2000);
  assert.equal(await joined, 1);
  const t = c.clock.runUntilTrue(() => c.converged(), { maxMs: 20_000 });
  assert.ok(again.membership.member(again.id)!.incarnation > 0, "it refuted its own death");
  assert.ok(t !== undefined, "restarted node not alive everywhere");
});

Deno.test("a 5/5 partition splits into two groups, and re-merges after healing", () => {
  const c = converged(10);
  const a = c.nodes.slice(0, 5), b = c.nodes.slice(5);
  c.net.partition([a.map((n) => n.id), b.map((n) => n.id)]);
  c.clock.advance(15_000);
  for (const n of a) assert.equal(stateOf(n, b[0].id), "dead");
  for (const n of b) assert.equal(stateOf(n, a[0].id), "dead");
  c.net.heal();
  const t = c.clock.runUntilTrue(() => c.converged(), { stepMs: 50, maxMs: 30_000 });
  assert.ok(t !== undefined, "did not re-merge");
});

Deno.test("no false death over 3 simulated minutes with 10% loss and one slow node", () => {
  const c = converged(10);
  c.net.setDefaultLink({ loss: 0.1 });
  c.net.setSlow(c.nodes[9].id, { probability: 0.3, minMs: 120, maxMs: 300 });
  let deaths = 0;
  for (const n of c.nodes) n.membership.onChange(({ member }) => member.state === "dead" && deaths++);
  c.clock.advance(180_000);
  assert.equal(deaths, 0);
});

Deno.test("garbage input is dropped and counted, never thrown", () => {
  const c = converged(3);
  const m = c.nodes[0].membership;
  const before = m.stats.malformed;
  m.receive(c.addr(c.nodes[1]), new Uint8Array([1, 2, 3]));
  m.receive(c.addr(c.nodes[1]), packPacket([new TextEncoder().encode('{"t":"ping"}')]));
  m.receive(c.addr(c.nodes[1]), null as unknown as Uint8Array);
  assert.equal(m.stats.malformed, before + 3);
  c.clock.advance(2000);
  assert.ok(c.converged());
});

Deno.test("setMetadata reaches every node", () => {
  const c = converged(6);
  const n = c.nodes[5];
  n.membership.setMetadata({ ...n.membership.member(n.id)!.meta, gpuMemoryBytes: 123 });
  c.clock.advance(3000);
  for (const o of c.nodes) assert.equal(o.membership.member(n.id)!.meta.gpuMemoryBytes, 123);
});

Deno.test("a member that missed a newcomer's alive broadcasts learns it from the newcomer's first packet", () => {
  const c = converged(5);
  const deaf = c.nodes[3];
  // deaf hears nobody but the newcomer: every alive broadcast about the newcomer is lost on the way.
  for (const n of c.nodes) if (n !== deaf) c.net.setLink(n.id, deaf.id, { loss: 1 }, { oneWay: true });
  const newcomer = c.spawn("n99");
  c.nodes.push(newcomer);
  void newcomer.membership.join([c.addr(c.nodes[0])]);
  // The newcomer probes deaf within a few probe rounds; deaf pulls its state instead of waiting for
  // its 30 s-class periodic push-pull (test preset: push-pull every 6 s; this must be well before).
  const t = c.clock.runUntilTrue(() => stateOf(deaf, newcomer.id) === "alive", { stepMs: 20, maxMs: 3000 });
  assert.ok(t !== undefined, "deaf did not learn the newcomer");
  assert.ok(deaf.membership.stats.strangerPulls >= 1);
});

Deno.test("a gossip round sends each broadcast once per target, so its transmits reach distinct members", () => {
  // 3 members, retransmitMult 2: a broadcast's limit is 2 transmits, which one round spends on the 2 others.
  const c = new SimCluster({
    n: 3,
    config: membershipConfig({ retransmitMult: 2, gossipNodes: 3 }, testPreset),
  });
  c.joinAll();
  assert.ok(c.clock.runUntilTrue(() => c.converged(), { stepMs: 20, maxMs: 30_000 }) !== undefined);
  const got = new Map<string, number>();
  const handles = c.nodes.map((n) =>
    n.membership.addDelegate("probe-news", {
      localState: () => undefined,
      mergeRemoteState: () => {},
      notifyMsg: () => void got.set(n.id, (got.get(n.id) ?? 0) + 1),
    })
  );
  handles[0].broadcast("k", new Uint8Array([1]));
  c.nodes[0].membership.gossip();
  c.clock.advance(10);
  assert.deepEqual(Object.fromEntries(got), { [c.nodes[1].id]: 1, [c.nodes[2].id]: 1 });
});
