// The event-loop hold monitor (node/loop_lag.ts): counted and logged from how late its ticks run.
import assert from "node:assert/strict";
import { isWorkerWarning } from "../../cli/workers.ts";
import type { Cancel, Clock } from "../../node/clock.ts";
import { SystemClock } from "../../node/clock.ts";
import { LoopLag } from "../../node/loop_lag.ts";

/** A clock whose one pending tick the test fires by hand, at a time it chooses (a late tick is a hold). */
class HandClock implements Clock {
  t = 0;
  pending: (() => void) | undefined;
  now(): number {
    return this.t;
  }
  schedule(fn: () => void, _ms: number): Cancel {
    this.pending = fn;
    return () => {
      if (this.pending === fn) this.pending = undefined;
    };
  }
  /** Time moves to `at`, then the tick runs. */
  fire(at: number): void {
    this.t = at;
    const fn = this.pending!;
    this.pending = undefined;
    fn();
  }
}

Deno.test("LoopLag: a tick that runs late counts as a hold; past warnMs it is logged, at most once a quietMs", () => {
  const clock = new HandClock();
  const lines: string[] = [];
  const lag = new LoopLag(clock, { tickMs: 100, warnMs: 1000, quietMs: 10_000, log: (m) => lines.push(m) })
    .start();
  clock.fire(100); // on time
  clock.fire(450); // 250 ms late: the longest so far, not a hold to warn of
  assert.deepEqual(lag.stats(), { maxMs: 250, holds: 0, lastMs: 0 });
  assert.equal(lines.length, 0);
  clock.fire(450 + 100 + 1800); // held 1.8 s
  assert.deepEqual(lag.stats(), { maxMs: 1800, holds: 1, lastMs: 1800 });
  assert.equal(lines.length, 1);
  assert.match(lines[0], /held for 1\.8 s .*pipeline compiles or a GPU wait.*\(1 such hold/);
  // A --local / --cluster parent passes it on from its workers, as it does the transport's warnings, and
  // keeps the rest of their output to itself (cli/workers.ts).
  const shown = [
    `swactor: ${lines[0]}`,
    "[transport 3a0d9b] data to 5c3d8be74b stays on iroh (a few MB/s): x",
  ];
  const hidden = [
    "api: 127.0.0.1:33035",
    "swactor join: joined d80599d066 (2 live)",
    "swactor: measured: 7.3 GiB",
  ];
  assert.deepEqual(shown.map(isWorkerWarning), [true, true]);
  assert.deepEqual(hidden.map(isWorkerWarning), [false, false, false]);
  clock.fire(clock.t + 100 + 1200); // 1.2 s more, within quietMs of the line: counted, not logged
  assert.deepEqual(lag.stats(), { maxMs: 1800, holds: 2, lastMs: 1200 });
  assert.equal(lines.length, 1);
  clock.fire(clock.t + 100 + 12_000); // past quietMs: logged again
  assert.equal(lines.length, 2);
  assert.equal(lag.stats().maxMs, 12_000);
  lag.stop();
  assert.equal(clock.pending, undefined, "stop cancels the tick");
  assert.throws(() => new LoopLag(clock, { tickMs: 0 }), RangeError);
});

Deno.test("LoopLag: on the real clock, a busy thread shows as a hold", async () => {
  const lag = new LoopLag(new SystemClock(), { tickMs: 20, warnMs: 300 }).start();
  try {
    await new Promise((r) => setTimeout(r, 60));
    const until = performance.now() + 500;
    while (performance.now() < until) {
      // Holds the event loop, as a synchronous pipeline compile or GPU wait does.
    }
    await new Promise((r) => setTimeout(r, 60));
    const s = lag.stats();
    assert.ok(s.holds >= 1 && s.maxMs >= 400, JSON.stringify(s));
  } finally {
    lag.stop();
  }
});
