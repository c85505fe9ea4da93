// Name sets on their own (node/registry/name_set.ts) and through the registry: one entry per part stands
// for many names; every node resolves `moe-expert-{layer}-{idx}` from the sets; replicas, withdrawal,
// dead holders, bad input and bad wire entries.
import assert from "node:assert/strict";
import { membershipConfig, test as testPreset } from "../../../node/membership/mod.ts";
import { validateEntry } from "../../../node/registry/entry.ts";
import {
  decodePart,
  encodeParts,
  nameInSet,
  normalizeRanges,
  parseSetName,
  PART_CHARS,
  type Ranges,
  toGroups,
} from "../../../node/registry/name_set.ts";
import { seededRandom } from "../../../node/random.ts";
import { SimCluster } from "../../support/sim_cluster.ts";

const config = membershipConfig({}, testPreset);

function converged(n: number) {
  const c = new SimCluster({ n, config });
  c.joinAll();
  assert.ok(c.clock.runUntilTrue(() => c.converged(), { stepMs: 20, maxMs: 30_000 }) !== undefined);
  return c;
}

Deno.test("name sets: parts round-trip, stay under PART_CHARS, and split long groups", () => {
  const r = seededRandom(3);
  for (let t = 0; t < 60; t++) {
    const rec: Record<string, Ranges> = {};
    for (let g = 0; g < 1 + Math.floor(r() * 70); g++) {
      const runs: Ranges = [];
      for (let k = 0; k < 1 + Math.floor(r() * 40); k++) {
        const s = Math.floor(r() * 400);
        runs.push([s, s + 1 + Math.floor(r() * 3)]);
      }
      rec[String(g)] = runs;
    }
    const groups = toGroups(rec);
    const parts = encodeParts(groups);
    const back = new Map<string, Ranges>();
    for (const p of parts) {
      assert.ok(p.length <= PART_CHARS, `part of ${p.length} characters`);
      for (const [g, runs] of decodePart(p)!) back.set(g, normalizeRanges([...(back.get(g) ?? []), ...runs]));
    }
    assert.deepEqual(back, groups);
  }
  assert.deepEqual(encodeParts(toGroups({ "5": [[0, 48]], "6": [[0, 48], [60, 61]] })), ["5:0-47;6:0-47,60"]);
  assert.deepEqual(encodeParts(toGroups({})), []);
});

Deno.test("name sets: strict parsing of part texts, set names and member names", () => {
  for (const bad of ["", "5", "5:", "5:3-1", "a b:1", "5:01", "5:1,", ";5:1", "5:1-2-3", "5:-1"]) {
    assert.equal(decodePart(bad), undefined, JSON.stringify(bad));
  }
  assert.deepEqual(parseSetName("moe-expert-*3@n07"), { prefix: "moe-expert-", part: 3, holder: "n07" });
  assert.equal(parseSetName("moe-expert-5-17"), undefined);
  assert.deepEqual(nameInSet("moe-expert-5-17", "moe-expert-"), { group: "5", index: 17 });
  assert.deepEqual(nameInSet("moe-expert-a-b-3", "moe-expert-"), { group: "a-b", index: 3 });
  for (const bad of ["moe-expert-5-", "moe-expert-5-017", "moe-expert-17", "stage-5-1", "moe-expert-5-1x"]) {
    assert.equal(nameInSet(bad, "moe-expert-"), undefined, bad);
  }
  assert.throws(() => toGroups({ "5": [[3, 3]] }), RangeError);
  assert.throws(() => toGroups({ "a:b": [[0, 1]] }), TypeError);
  assert.deepEqual(normalizeRanges([[4, 6], [0, 2], [1, 3], [6, 7]]), [[0, 3], [4, 7]]);
});

Deno.test("name sets on the wire: a live set entry must name its owner and carry a valid set", () => {
  const ok = { name: "moe-expert-*0@n01", owner: "n01", version: 1, writer: "n01", set: "5:0-47" };
  assert.deepEqual(validateEntry(ok), ok);
  assert.equal(validateEntry({ ...ok, owner: "n02" }), undefined);
  assert.equal(validateEntry({ ...ok, set: "5:x" }), undefined);
  assert.equal(validateEntry({ ...ok, set: undefined }), undefined);
  assert.equal(
    validateEntry({ name: "stage-1", owner: "n01", version: 1, writer: "n01", set: "5:1" }),
    undefined,
  );
  const tomb = { name: "moe-expert-*0@n01", owner: null, version: 2, writer: "n01" };
  assert.deepEqual(validateEntry(tomb), tomb);
  assert.equal(validateEntry({ ...tomb, set: "5:0" }), undefined);
});

Deno.test("registerSet: every node resolves each name of the set; replicas list every holder", () => {
  const c = converged(8);
  const changes: string[] = [];
  c.nodes[7].registry.watch((name, owner) => changes.push(`${name}=${owner}`));
  c.nodes[1].registry.registerSet("moe-expert-", { "5": [[0, 48]], "6": [[0, 16], [40, 48]] });
  c.nodes[2].registry.registerSet("moe-expert-", { "5": [[48, 96], [3, 4]] }); // expert 3: a replica
  c.nodes[3].registry.register("stage-1");
  c.clock.advance(3000);
  for (const n of c.nodes) {
    const r = n.registry;
    assert.equal(r.resolve("moe-expert-5-0"), "n01", n.id);
    assert.equal(r.resolve("moe-expert-5-95"), "n02", n.id);
    assert.equal(r.resolve("moe-expert-6-47"), "n01", n.id);
    assert.equal(r.resolve("moe-expert-6-20"), undefined, n.id);
    assert.equal(r.resolve("moe-expert-7-0"), undefined, n.id);
    assert.deepEqual(r.owners("moe-expert-5-3"), ["n01", "n02"], n.id);
    assert.deepEqual(r.entries(), [["stage-1", "n03"]], "sets stay out of entries()");
    assert.deepEqual(r.sets(), [
      { prefix: "moe-expert-", owner: "n01", groups: { "5": [[0, 48]], "6": [[0, 16], [40, 48]] } },
      { prefix: "moe-expert-", owner: "n02", groups: { "5": [[3, 4], [48, 96]] } },
    ]);
  }
  assert.deepEqual(changes.sort(), ["moe-expert-*0@n01=n01", "moe-expert-*0@n02=n02", "stage-1=n03"]);
  // An entry of the exact name wins over the sets.
  c.nodes[4].registry.register("moe-expert-5-10");
  c.clock.advance(3000);
  assert.equal(c.nodes[0].registry.resolve("moe-expert-5-10"), "n04");
  assert.deepEqual(c.nodes[0].registry.owners("moe-expert-5-10"), ["n01", "n04"]);
  assert.throws(() => c.nodes[0].registry.register("moe-expert-*0@n01"), TypeError);
  assert.throws(() => c.nodes[0].registry.registerSet("moe*", {}), TypeError);
});

Deno.test("registerSet again replaces the set everywhere (fewer parts: the rest withdrawn); unregisterSet clears it", () => {
  const c = converged(6);
  // Every other id: 200 single runs, several parts.
  const striped: Ranges = Array.from({ length: 200 }, (_, i) => [2 * i, 2 * i + 1]);
  c.nodes[1].registry.registerSet("moe-expert-", { "1": striped, "2": striped });
  c.clock.advance(4000);
  const parts = (n: number) => c.nodes[n].registry.sets()[0]?.groups;
  for (let n = 0; n < 6; n++) assert.deepEqual(parts(n), { "1": striped, "2": striped }, `node ${n}`);
  assert.equal(c.nodes[5].registry.resolve("moe-expert-2-398"), "n01");
  assert.equal(c.nodes[5].registry.resolve("moe-expert-2-399"), undefined);
  c.nodes[1].registry.registerSet("moe-expert-", { "1": [[0, 8]] });
  c.clock.advance(4000);
  for (let n = 0; n < 6; n++) assert.deepEqual(parts(n), { "1": [[0, 8]] }, `node ${n}`);
  assert.equal(c.nodes[5].registry.resolve("moe-expert-2-398"), undefined);
  assert.equal(c.nodes[1].registry.unregisterSet("moe-expert-"), true);
  assert.equal(c.nodes[1].registry.unregisterSet("moe-expert-"), false);
  c.clock.advance(4000);
  for (const n of c.nodes) assert.deepEqual(n.registry.sets(), [], n.id);
  assert.equal(c.nodes[3].registry.resolve("moe-expert-1-0"), undefined);
});

Deno.test("a dead holder's sets vanish everywhere; a restarted holder withdraws its old claims", () => {
  const c = converged(6);
  c.nodes[2].registry.registerSet("moe-expert-", { "3": [[0, 8]] });
  c.nodes[4].registry.registerSet("moe-expert-", { "3": [[8, 16]] });
  c.clock.advance(3000);
  c.kill(c.nodes[2]);
  const t = c.clock.runUntilTrue(
    () => c.nodes.filter((n) => c.up(n)).every((n) => n.registry.resolve("moe-expert-3-0") === undefined),
    { maxMs: 20_000 },
  );
  assert.ok(t !== undefined);
  c.clock.advance(10_000);
  for (const n of c.nodes.filter((x) => c.up(x))) {
    assert.deepEqual(n.registry.sets().map((s) => s.owner), ["n04"], n.id);
  }
  // n04 restarts unnoticed: its new life holds nothing, and its old set is withdrawn everywhere.
  c.kill(c.nodes[4]);
  const again = c.restart(c.nodes[4]);
  void again.membership.join([c.addr(c.nodes[0])]);
  c.clock.advance(8000);
  for (const n of c.nodes.filter((x) => c.up(x))) assert.deepEqual(n.registry.sets(), [], n.id);
});

Deno.test("a set reaches every member directly, not only by gossip's rounds (no push-pull tail)", () => {
  const c = new SimCluster({ n: 12, config: membershipConfig({}, testPreset) });
  c.joinAll();
  assert.ok(c.clock.runUntilTrue(() => c.converged(), { stepMs: 20, maxMs: 30_000 }) !== undefined);
  // A gossip round is 50 ms here and reaches 3 members; one direct message each arrives within 2 ms.
  c.nodes[3].registry.registerSet("moe-expert-", { "1": [[0, 4]] });
  c.clock.advance(5);
  for (const n of c.nodes) assert.equal(n.registry.resolve("moe-expert-1-3"), "n03", n.id);
  // A dead member is not sent to.
  c.kill(c.nodes[7]);
  c.clock.runUntilTrue(() => c.nodes[0].membership.member("n07")?.state === "dead", { maxMs: 30_000 });
  c.clock.advance(3000);
  const sent = c.net.stats.sent;
  c.nodes[3].registry.registerSet("moe-expert-", { "1": [[0, 8]] });
  assert.equal(c.net.stats.sent - sent, 10, "one message to each of the 10 other live members");
  c.clock.advance(5);
  for (const n of c.nodes.filter((x) => c.up(x))) {
    assert.equal(n.registry.resolve("moe-expert-1-7"), "n03", n.id);
  }
});
