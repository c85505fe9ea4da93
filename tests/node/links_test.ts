// The link table (node/links.ts): round trips from membership's own pings, a windowed minimum, gossiped with
// their age so every node holds every row; no packets of its own at rest; pings relayed through a helper do
// not count as the direct link.
import assert from "node:assert/strict";
import { membershipConfig, test as testPreset } from "../../node/membership/mod.ts";
import { Links } from "../../node/links.ts";
import type { DelegateHandle, GossipDelegate } from "../../node/membership/mod.ts";
import { SimCluster } from "../support/sim_cluster.ts";

const config = membershipConfig({}, testPreset);

function cluster(n: number, seed = 1) {
  const c = new SimCluster({ n, config, seed, links: {}, link: { delayMs: 1, jitterMs: 0.2 } });
  return c;
}

const rtt = (c: SimCluster, from: number, to: number, at = from) =>
  c.nodes[at].links!.of(c.nodes[from].id).get(c.nodes[to].id);

Deno.test("links: round trips from SWIM pings, every row on every node, slow pair seen as slow", () => {
  const c = cluster(5);
  c.net.setLink("n01", "n03", { delayMs: 10, jitterMs: 0.2 });
  c.joinAll();
  assert.ok(c.clock.runUntilTrue(() => c.converged(), { stepMs: 20, maxMs: 30_000 }) !== undefined);
  c.clock.advance(30_000);
  for (const holder of c.nodes) {
    assert.equal(holder.links!.rows().length, 5, `${holder.id} holds every node's row`);
    for (let a = 0; a < 5; a++) {
      for (let b = 0; b < 5; b++) {
        if (a === b) continue;
        const l = rtt(c, a, b, c.nodes.indexOf(holder));
        assert.ok(l, `${holder.id} knows ${a} -> ${b}`);
        const slow = (a === 1 && b === 3) || (a === 3 && b === 1);
        // Two one-way delays, plus jitter; the minimum of the window, so close to the floor.
        if (slow) assert.ok(l.rttMs >= 20 && l.rttMs < 21, `slow ${a}->${b}: ${l.rttMs}`);
        else assert.ok(l.rttMs >= 2 && l.rttMs < 3, `${a}->${b}: ${l.rttMs}`);
        assert.equal(l.mbps, null);
        assert.ok(l.samples >= 1);
      }
    }
  }
  // Ages: a node's own links were sampled within a few probe rounds.
  for (const [, l] of c.nodes[0].links!.of(c.nodes[0].id)) {
    assert.ok(l.ageMs < 5 * 4 * config.probeIntervalMs, `age ${l.ageMs}`);
  }
});

Deno.test("links: at rest nothing is gossiped, and the same probes go out as without the table", () => {
  const run = (links: boolean) => {
    const c = new SimCluster({ n: 4, config, seed: 3, links: links ? {} : undefined, link: { delayMs: 1 } });
    c.joinAll();
    assert.ok(c.clock.runUntilTrue(() => c.converged(), { stepMs: 20, maxMs: 30_000 }) !== undefined);
    c.clock.advance(20_000);
    const gossiped = c.nodes.map((n) => n.links?.stats.gossiped ?? 0);
    const probes = c.nodes.map((n) => n.membership.stats.probes);
    c.clock.advance(60_000);
    return {
      gossipedAtRest: c.nodes.map((n, i) => (n.links?.stats.gossiped ?? 0) - gossiped[i]),
      samples: c.nodes.map((n) => n.links?.stats.samples ?? 0),
      probesAtRest: c.nodes.map((n, i) => n.membership.stats.probes - probes[i]),
    };
  };
  const with_ = run(true), without = run(false);
  assert.deepEqual(with_.gossipedAtRest, [0, 0, 0, 0]);
  assert.ok(with_.samples.every((s) => s > 50), `samples ${with_.samples}`);
  // The probe schedule is membership's alone: the table adds no probe.
  assert.deepEqual(with_.probesAtRest, without.probesAtRest);
});

Deno.test("links: a slower link shows after a run of slow samples; a faster one at once", () => {
  const c = cluster(3, 5);
  c.joinAll();
  assert.ok(c.clock.runUntilTrue(() => c.converged(), { stepMs: 20, maxMs: 30_000 }) !== undefined);
  c.clock.advance(10_000);
  assert.ok(rtt(c, 0, 1)!.rttMs < 3);
  c.net.setLink("n00", "n01", { delayMs: 25 });
  c.clock.advance(20_000);
  const slower = rtt(c, 0, 1)!;
  assert.ok(slower.rttMs >= 50 && slower.rttMs < 52, `after the delay: ${slower.rttMs}`);
  assert.ok(rtt(c, 0, 1, 2)!.rttMs >= 50, "gossiped to the third node");
  c.net.setLink("n00", "n01", { delayMs: 1 });
  c.clock.advance(3 * 2 * config.probeIntervalMs);
  assert.ok(rtt(c, 0, 1)!.rttMs < 3, `back: ${rtt(c, 0, 1)!.rttMs}`);
});

Deno.test("links: an ack relayed by a helper (ping-req) does not time the direct link", () => {
  const c = cluster(3, 7);
  c.joinAll();
  assert.ok(c.clock.runUntilTrue(() => c.converged(), { stepMs: 20, maxMs: 30_000 }) !== undefined);
  c.clock.advance(5_000);
  const before = rtt(c, 0, 1)!.samples;
  // n00 -> n01 is lost one way: n00's pings to n01 never arrive, so n00 learns n01 is alive only through n02.
  c.net.setLink("n00", "n01", { loss: 1 }, { oneWay: true });
  c.clock.advance(10_000);
  assert.equal(rtt(c, 0, 1)!.samples, before, "no sample from relayed acks");
  assert.ok(rtt(c, 1, 0)!.samples > 0);
});

Deno.test("links: dead members' rows and links go; a restarted node's new row replaces the old", () => {
  const c = cluster(4, 9);
  c.joinAll();
  assert.ok(c.clock.runUntilTrue(() => c.converged(), { stepMs: 20, maxMs: 30_000 }) !== undefined);
  c.clock.advance(10_000);
  const victim = c.nodes[3];
  c.kill(victim);
  assert.ok(c.clock.runUntilTrue(() => c.converged(c.nodes.slice(0, 3)), { stepMs: 50, maxMs: 60_000 }));
  for (const n of c.nodes.slice(0, 3)) {
    assert.ok(!n.links!.rows().includes(victim.id));
    for (const from of n.links!.rows()) assert.ok(!n.links!.of(from).has(victim.id));
  }
  const again = c.restart(victim);
  void again.membership.join([c.addr(c.nodes[0])]);
  assert.ok(c.clock.runUntilTrue(() => c.converged(), { stepMs: 50, maxMs: 60_000 }) !== undefined);
  c.clock.advance(20_000);
  assert.ok(c.nodes[0].links!.of(again.id).size >= 1, "the new life's row arrived");
});

Deno.test("links: malformed payloads are counted and dropped; options are checked", () => {
  let delegate: GossipDelegate | undefined;
  const host = {
    id: "me",
    now: () => 0,
    member: () => undefined,
    onChange: () => () => {},
    onRtt: () => () => {},
    addDelegate: (_: string, d: GossipDelegate): DelegateHandle => {
      delegate = d;
      return { broadcast: () => {}, sendToMembers: () => {}, remove: () => {} };
    },
  };
  const links = new Links(host);
  const bad = [
    "not json",
    "{}",
    '[{"f":"a","b":1,"l":[["b",-1,null,0,1]]}]',
    '[{"f":"a","b":1,"l":[["b",1,null,0,0]]}]',
    '[{"f":"","b":1,"l":[]}]',
    '[{"f":"a","b":1,"l":[["b",1,"x",0,1]]}]',
  ];
  for (const b of bad) delegate!.notifyMsg(new TextEncoder().encode(b), "x");
  assert.equal(links.malformed, bad.length);
  delegate!.notifyMsg(new TextEncoder().encode('[{"f":"a","b":1,"l":[["b",1.5,null,10,2]]}]'), "x");
  assert.equal(links.of("a").get("b")?.rttMs, 1.5);
  assert.equal(links.of("a").get("b")?.ageMs, 10);
  // Our own row is ours: a gossiped copy of it is ignored.
  delegate!.notifyMsg(new TextEncoder().encode('[{"f":"me","b":1,"l":[["b",9,null,0,99]]}]'), "x");
  assert.equal(links.of("me").size, 0);
  // An earlier life of a node (lower boot) does not replace its current row; a fewer-samples copy neither.
  delegate!.notifyMsg(new TextEncoder().encode('[{"f":"a","b":0,"l":[["b",7,null,0,5]]}]'), "x");
  delegate!.notifyMsg(new TextEncoder().encode('[{"f":"a","b":1,"l":[["b",7,null,0,1]]}]'), "x");
  assert.equal(links.of("a").get("b")?.rttMs, 1.5);
  assert.throws(() => new Links(host, { window: 0 }), RangeError);
});

Deno.test("links: acks held up by a busy peer (a GPU step, a measurement) do not inflate the estimate", () => {
  const c = cluster(3, 11);
  c.joinAll();
  assert.ok(c.clock.runUntilTrue(() => c.converged(), { stepMs: 20, maxMs: 30_000 }) !== undefined);
  c.net.setSlow("n02", { probability: 0.3, minMs: 20, maxMs: 50 });
  const seen: number[] = [];
  for (let i = 0; i < 20; i++) {
    c.clock.advance(3_000);
    seen.push(rtt(c, 0, 2)!.rttMs);
  }
  seen.sort((a, b) => a - b);
  assert.ok(seen[10] < 3, `median estimate ${seen[10]} (all: ${seen})`);
});

Deno.test("links: a run of scattered slow samples (a busy peer) does not reset the window; a steady one does", () => {
  let onRtt: ((peer: string, ms: number) => void) | undefined;
  const host = {
    id: "me",
    now: () => 0,
    member: () => undefined,
    onChange: () => () => {},
    onRtt: (cb: (peer: string, ms: number) => void) => {
      onRtt = cb;
      return () => {};
    },
    addDelegate: (): DelegateHandle => ({ broadcast: () => {}, sendToMembers: () => {}, remove: () => {} }),
  };
  const links = new Links(host);
  for (const ms of [1, 1.1, 1, 14, 3, 9]) onRtt!("p", ms);
  assert.equal(links.of("me").get("p")!.rttMs, 1, "busy-peer samples scatter: still the link's floor");
  for (const ms of [51, 50, 52]) onRtt!("p", ms);
  assert.equal(links.of("me").get("p")!.rttMs, 50, "a steady run: the link got slower");
});
