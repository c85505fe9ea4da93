import assert from "node:assert/strict";
import { FakeClock } from "../../node/clock.ts";

Deno.test("FakeClock runs callbacks in due order, ties in scheduling order, and nested ones in the window", () => {
  const c = new FakeClock();
  const seen: string[] = [];
  c.schedule(() => seen.push("b@20"), 20);
  c.schedule(() => seen.push("a@10"), 10);
  c.schedule(() => seen.push("a2@10"), 10);
  c.schedule(() => c.schedule(() => seen.push(`nested@${c.now()}`), 5), 12);
  c.advance(15);
  assert.deepEqual(seen, ["a@10", "a2@10"]);
  assert.equal(c.now(), 15);
  c.advance(10);
  assert.deepEqual(seen, ["a@10", "a2@10", "nested@17", "b@20"]);
  assert.equal(c.pending, 0);
});

Deno.test("FakeClock cancel prevents the callback and is idempotent", () => {
  const c = new FakeClock();
  let ran = 0;
  const cancel = c.schedule(() => ran++, 5);
  assert.equal(c.pending, 1);
  cancel();
  cancel();
  assert.equal(c.pending, 0);
  c.advance(10);
  assert.equal(ran, 0);
});

Deno.test("FakeClock.runUntilTrue reports the time taken or undefined", () => {
  const c = new FakeClock();
  let flag = false;
  c.schedule(() => (flag = true), 95);
  assert.equal(c.runUntilTrue(() => flag, { stepMs: 10 }), 100);
  assert.equal(c.runUntilTrue(() => false, { maxMs: 50 }), undefined);
  assert.throws(() => c.advance(-1), RangeError);
});
