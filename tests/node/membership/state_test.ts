import assert from "node:assert/strict";
import {
  apply,
  eventFromRemote,
  type Member,
  type MemberEvent,
  type MemberTable,
} from "../../../node/membership/state.ts";

const meta = { name: "x", version: "0.1.0", adapter: "", gpuMemoryBytes: 0, addrs: [] };
const ctx = { self: "me", now: 100 };
const member = (id: string, incarnation: number, state: Member["state"] = "alive"): Member => ({
  id,
  addrs: [],
  incarnation,
  state,
  meta,
  since: 0,
});
const table = (...ms: Member[]): MemberTable => new Map(ms.map((m) => [m.id, m]));

Deno.test("alive: new members join; only a higher incarnation updates; the table is not mutated", () => {
  const t0 = table(member("me", 0));
  const r = apply(t0, { type: "alive", id: "a", incarnation: 3, addrs: ["x"], meta }, ctx);
  assert.equal(r.table.get("a")?.state, "alive");
  assert.equal(r.rebroadcast, true);
  assert.equal(t0.has("a"), false);
  const same = apply(r.table, { type: "alive", id: "a", incarnation: 3, addrs: [], meta }, ctx);
  assert.equal(same.table, r.table);
  assert.equal(same.rebroadcast, false);
});

Deno.test("suspect/dead need an incarnation at least the local one; dead and left are final", () => {
  const t = table(member("me", 0), member("a", 5));
  assert.equal(apply(t, { type: "suspect", id: "a", incarnation: 4, from: "b" }, ctx).change, undefined);
  const s = apply(t, { type: "suspect", id: "a", incarnation: 5, from: "b" }, ctx);
  assert.equal(s.table.get("a")?.state, "suspect");
  assert.equal(apply(s.table, { type: "suspect", id: "a", incarnation: 5, from: "c" }, ctx).confirm, true);
  const d = apply(s.table, { type: "dead", id: "a", incarnation: 5, from: "b" }, ctx);
  assert.equal(d.table.get("a")?.state, "dead");
  assert.equal(
    apply(d.table, { type: "suspect", id: "a", incarnation: 9, from: "b" }, ctx).change,
    undefined,
  );
  assert.equal(apply(d.table, { type: "leave", id: "a", incarnation: 9 }, ctx).change, undefined);
  // A refutation (higher incarnation) revives it.
  const back = apply(d.table, { type: "alive", id: "a", incarnation: 6, addrs: [], meta }, ctx);
  assert.equal(back.table.get("a")?.state, "alive");
  // Alive with a higher incarnation also clears a suspicion.
  assert.equal(
    apply(s.table, { type: "alive", id: "a", incarnation: 6, addrs: [], meta }, ctx).table.get("a")?.state,
    "alive",
  );
});

Deno.test("accusations about self ask for a refutation instead of applying", () => {
  const t = table(member("me", 2));
  const events: MemberEvent[] = [
    { type: "suspect", id: "me", incarnation: 2, from: "b" },
    { type: "dead", id: "me", incarnation: 3, from: "b" },
    { type: "leave", id: "me", incarnation: 2 },
    { type: "alive", id: "me", incarnation: 7, addrs: [], meta },
  ];
  for (const e of events) {
    const r = apply(t, e, ctx);
    assert.equal(r.refute, e.incarnation);
    assert.equal(r.table, t);
  }
  assert.equal(apply(t, { type: "suspect", id: "me", incarnation: 1, from: "b" }, ctx).refute, undefined);
});

Deno.test("unknown members are not suspected or killed by hearsay; leave marks left", () => {
  const t = table(member("me", 0), member("a", 1));
  assert.equal(apply(t, { type: "dead", id: "zz", incarnation: 1, from: "b" }, ctx).change, undefined);
  assert.equal(apply(t, { type: "leave", id: "a", incarnation: 2 }, ctx).table.get("a")?.state, "left");
});

Deno.test("dead node reclaim: after the reclaim time a lower incarnation may come back", () => {
  const t = table(member("me", 0), { ...member("a", 9, "dead"), since: 0 });
  const e: MemberEvent = { type: "alive", id: "a", incarnation: 0, addrs: [], meta };
  assert.equal(apply(t, e, { ...ctx, deadNodeReclaimMs: 1000 }).change, undefined);
  assert.equal(apply(t, e, { ...ctx, now: 1000, deadNodeReclaimMs: 1000 }).table.get("a")?.state, "alive");
});

Deno.test("a remote dead becomes a suspicion (refutable), remote left stays left", () => {
  assert.equal(eventFromRemote(member("a", 1, "dead"), "b").type, "suspect");
  assert.equal(eventFromRemote(member("a", 1, "left"), "b").type, "leave");
});
