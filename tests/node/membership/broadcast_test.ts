import assert from "node:assert/strict";
import { BroadcastQueue } from "../../../node/membership/broadcast.ts";

const b = (s: string) => new TextEncoder().encode(s);
const s = (xs: Uint8Array[]) => xs.map((x) => new TextDecoder().decode(x));

Deno.test("retransmit limit is retransmitMult * ceil(log10(N+1))", () => {
  const q = new BroadcastQueue(4);
  assert.equal(q.limit(1), 4);
  assert.equal(q.limit(9), 4);
  assert.equal(q.limit(50), 8);
  q.queue("a", b("x"));
  let sends = 0;
  while (q.take(100, 4, 50).length > 0) sends++;
  assert.equal(sends, 8);
});

Deno.test("a newer broadcast with the same key replaces the older; fewest transmits go first", () => {
  const q = new BroadcastQueue(4);
  q.queue("a", b("a1"));
  q.queue("b", b("b1"));
  assert.deepEqual(s(q.take(100, 4, 5)), ["b1", "a1"]);
  q.queue("a", b("a2"));
  assert.equal(q.length, 2);
  assert.deepEqual(s(q.take(100, 4, 5)), ["a2", "b1"]);
});

Deno.test("take respects the byte budget", () => {
  const q = new BroadcastQueue(4);
  q.queue("a", b("aaaaaaaaaa"));
  q.queue("b", b("bbbbbbbbbb"));
  assert.equal(q.take(14, 4, 5).length, 1);
  assert.equal(q.take(3, 4, 5).length, 0);
});
