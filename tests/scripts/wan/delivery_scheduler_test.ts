import assert from "node:assert/strict";
import { DeliveryScheduler, type SchedulerClock } from "../../../scripts/wan/delivery_scheduler.ts";

/**
 * A fake clock. With `denoLike`, a timer for `ms` fires after max(1, floor(ms)) + 1 + 0.3 ms, the shape
 * measured for Deno 2.9.6's setTimeout; otherwise exactly after `ms`.
 */
function fakeClock(denoLike = false) {
  let now = 0;
  let timers: { at: number; fn: () => void; id: number }[] = [];
  let nextId = 1;
  const clock: SchedulerClock = {
    now: () => now,
    setTimer: (fn, ms) => {
      timers.push({ at: now + (denoLike ? Math.max(1, Math.floor(ms)) + 1.3 : ms), fn, id: nextId });
      return nextId++;
    },
    clearTimer: (h) => {
      timers = timers.filter((t) => t.id !== h);
    },
  };
  const advance = (to: number) => {
    for (;;) {
      timers.sort((a, b) => a.at - b.at);
      const t = timers[0];
      if (!t || t.at > to) break;
      timers.shift();
      now = t.at;
      t.fn();
    }
    now = to;
  };
  return { clock, advance, pending: () => timers.length };
}

Deno.test("entries run in due order, ties in insertion order, with one timer", () => {
  const f = fakeClock();
  const s = new DeliveryScheduler({ clock: f.clock, slackMs: 0 });
  const ran: string[] = [];
  s.schedule(30, () => ran.push("c"));
  s.schedule(10, () => ran.push("a"));
  s.schedule(30, () => ran.push("d"));
  s.schedule(20, () => ran.push("b"));
  assert.deepEqual(f.pending(), 1);
  f.advance(25);
  assert.deepEqual(ran, ["a", "b"]);
  f.advance(100);
  assert.deepEqual(ran, ["a", "b", "c", "d"]);
  assert.deepEqual(s.size, 0);
});

Deno.test("an entry already due runs synchronously", () => {
  const f = fakeClock();
  const s = new DeliveryScheduler({ clock: f.clock });
  let ran = false;
  s.schedule(0, () => ran = true);
  assert(ran);
  assert.deepEqual(f.pending(), 0);
});

Deno.test("the scheduler learns Deno's timer rounding and lands within half a tick", () => {
  const f = fakeClock(true);
  const s = new DeliveryScheduler({ clock: f.clock, initialTimerDeltaMs: 0 });
  const errors: number[] = [];
  for (let i = 1; i <= 80; i++) {
    const due = i * 20 + (i * 0.37) % 1; // fractional due times, as datagram arrivals have
    s.schedule(due, () => errors.push(f.clock.now() - due));
    f.advance(due + 5);
  }
  assert.ok(Math.abs(s.timerDeltaMs - 0.3) < 0.05, `learnt delta ${s.timerDeltaMs}`);
  const tail = errors.slice(-40);
  assert.ok(tail.every((e) => Math.abs(e) <= 0.5 + 1e-9), `errors ${tail}`);
  const mean = tail.reduce((a, b) => a + b, 0) / tail.length;
  assert.ok(Math.abs(mean) < 0.15, `deliveries biased by ${mean} ms`);
  // A naive setTimeout(due - now) would be late by 1.3 ms on average here.
});

Deno.test("close drops pending entries and the timer", () => {
  const f = fakeClock();
  const s = new DeliveryScheduler({ clock: f.clock });
  let ran = false;
  s.schedule(10, () => ran = true);
  s.close();
  f.advance(100);
  assert(!ran);
  assert.deepEqual(f.pending(), 0);
});
