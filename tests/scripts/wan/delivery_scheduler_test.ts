import assert from "node:assert/strict";
import { DeliveryScheduler, type SchedulerClock } from "../../../scripts/wan/delivery_scheduler.ts";

/** A fake clock whose timers fire `lateMs` after their due time, like Deno's real ones do. */
function fakeClock(lateMs = 0) {
  let now = 0;
  let timers: { at: number; fn: () => void; id: number }[] = [];
  let nextId = 1;
  const clock: SchedulerClock = {
    now: () => now,
    setTimer: (fn, ms) => {
      timers.push({ at: now + ms + lateMs, fn, id: nextId });
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

Deno.test("the scheduler learns timer lateness and arms early", () => {
  const f = fakeClock(1.5);
  const s = new DeliveryScheduler({ clock: f.clock, slackMs: 0.25 });
  const errors: number[] = [];
  for (let i = 1; i <= 60; i++) {
    const due = i * 10;
    s.schedule(due, () => errors.push(f.clock.now() - due));
    f.advance(due + 5);
  }
  assert(errors[0] >= 1.4, "the first wake-up is late by the timer's lateness");
  const tail = errors.slice(-10);
  assert(tail.every((e) => Math.abs(e) <= 0.3), `late by ${tail} after learning`);
  assert(Math.abs(s.compensationMs - 1.5) < 0.3, `compensation ${s.compensationMs}`);
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
