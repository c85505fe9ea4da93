// Driving a FakeClock from a test: a fake millisecond a macrotask, so that timers, message deliveries and the
// promises they settle interleave as they would in real time.
import type { FakeClock } from "../../node/clock.ts";

async function tick(clock: FakeClock): Promise<void> {
  clock.advance(1);
  await new Promise((r) => setTimeout(r, 0));
}

/** Advances `clock` until `p` settles (at most `maxMs` fake milliseconds), then returns or throws as `p` does. */
export async function pumpUntil<T>(clock: FakeClock, p: Promise<T>, maxMs = 100_000): Promise<T> {
  let settled = false;
  p.then(() => (settled = true), () => (settled = true));
  for (let i = 0; i < maxMs && !settled; i++) await tick(clock);
  return await p;
}

/** Advances `clock` by `ms` fake milliseconds, letting what they wake run. */
export async function advanceIdle(clock: FakeClock, ms = 50): Promise<void> {
  for (let i = 0; i < ms; i++) await tick(clock);
}
