import assert from "node:assert/strict";
import { FakeClock } from "../../../node/clock.ts";
import { Suspicion, suspicionTimeout, suspicionTimeouts } from "../../../node/membership/suspicion.ts";
import { lan } from "../../../node/membership/config.ts";

Deno.test("suspicion timeouts follow memberlist: min = mult*log10(N)*interval, max = 6*min, k = mult-2 (at most N-2)", () => {
  const t = suspicionTimeouts(50, lan);
  assert.ok(Math.abs(t.minMs - 6 * Math.log10(50) * 500) < 1e-6);
  assert.equal(t.maxMs, 6 * t.minMs);
  assert.equal(t.k, 4);
  // Too few members for mult-2 confirmations: as many as there can be (memberlist drops to 0, which made a
  // lone accuser's suspicion final at min: 1-3 false deaths in 30 lossy minutes at N = 5, docs/RECOVERY.md).
  assert.equal(suspicionTimeouts(5, lan).k, 3);
  assert.equal(suspicionTimeouts(3, lan).k, 1);
  assert.equal(suspicionTimeouts(2, lan).k, 0);
  assert.equal(suspicionTimeouts(5, lan).minMs, 3000); // log10 scale floors at 1
  const classic = suspicionTimeouts(50, { ...lan, lifeguard: false });
  assert.deepEqual([classic.maxMs, classic.k], [classic.minMs, 0]);
});

Deno.test("the timeout shrinks on a log scale with confirmations, down to min", () => {
  const t = { minMs: 1000, maxMs: 6000, k: 3 };
  const xs = [0, 1, 2, 3, 4].map((c) => suspicionTimeout(c, t));
  assert.equal(xs[0], 6000);
  assert.equal(xs[3], 1000);
  assert.equal(xs[4], 1000);
  assert.ok(xs[1] < xs[0] && xs[2] < xs[1] && xs[1] - xs[2] < xs[0] - xs[1]);
});

Deno.test("Suspicion fires at max alone, earlier with independent confirmations, never after cancel", () => {
  const clock = new FakeClock();
  let fired = -1;
  const t = { minMs: 1000, maxMs: 6000, k: 2 };
  new Suspicion("a", t, clock, () => (fired = clock.now()));
  clock.advance(5999);
  assert.equal(fired, -1);
  clock.advance(1);
  assert.equal(fired, 6000);

  const c2 = new FakeClock();
  let f2 = -1;
  const s = new Suspicion("a", t, c2, () => (f2 = c2.now()));
  c2.advance(500);
  assert.equal(s.confirm("a"), false); // the accuser is not a confirmation
  assert.equal(s.confirm("b"), true);
  assert.equal(s.confirm("b"), false);
  assert.equal(s.confirm("c"), true);
  assert.equal(s.confirm("d"), false); // k reached
  c2.advance(499);
  assert.equal(f2, -1);
  c2.advance(1);
  assert.equal(f2, 1000); // min, measured from the start

  const c3 = new FakeClock();
  let f3 = false;
  const s3 = new Suspicion("a", t, c3, () => (f3 = true));
  s3.cancel();
  c3.advance(10_000);
  assert.equal(f3, false);
});
