// Time as a dependency. Membership, the registry and the in-memory network never read the wall clock or
// call setTimeout themselves: they take a Clock, so tests and simulations drive time with a FakeClock and
// run 30 simulated minutes in a few seconds, reproducibly.

/** Cancels a scheduled callback; calling it after the callback ran (or twice) does nothing. */
export type Cancel = () => void;

export interface Clock {
  /** Milliseconds since an arbitrary origin; never goes backwards. */
  now(): number;
  /** Runs `fn` once, `ms` (>= 0) milliseconds from now. */
  schedule(fn: () => void, ms: number): Cancel;
}

/** The real clock: performance.now() and setTimeout. */
export class SystemClock implements Clock {
  now(): number {
    return performance.now();
  }
  schedule(fn: () => void, ms: number): Cancel {
    const id = setTimeout(fn, Math.max(0, ms));
    return () => clearTimeout(id);
  }
}

interface Timer {
  at: number;
  seq: number;
  fn: () => void;
  cancelled: boolean;
}

/**
 * A clock that only moves when told to. Callbacks run synchronously inside advance()/runUntil(), in order
 * of due time, ties in order of scheduling. A callback may schedule more callbacks; those due within the
 * advanced window run too. Uses a binary heap so a 50-node simulation (millions of timers) stays fast.
 */
export class FakeClock implements Clock {
  #now: number;
  #seq = 0;
  #heap: Timer[] = [];
  #live = 0;

  constructor(start = 0) {
    this.#now = start;
  }

  now(): number {
    return this.#now;
  }

  schedule(fn: () => void, ms: number): Cancel {
    if (!Number.isFinite(ms)) throw new RangeError(`FakeClock.schedule: delay must be finite, got ${ms}`);
    const t: Timer = { at: this.#now + Math.max(0, ms), seq: this.#seq++, fn, cancelled: false };
    this.#push(t);
    this.#live++;
    return () => {
      if (!t.cancelled) {
        t.cancelled = true;
        this.#live--;
      }
    };
  }

  /** Number of scheduled, not yet run, not cancelled callbacks. */
  get pending(): number {
    return this.#live;
  }

  /** Moves time forward by `ms`, running every callback due on the way. */
  advance(ms: number): void {
    if (!(ms >= 0)) throw new RangeError(`FakeClock.advance: ms must be >= 0, got ${ms}`);
    this.runUntil(this.#now + ms);
  }

  /** Runs callbacks in order until time `t` (inclusive), then sets now to `t`. */
  runUntil(t: number): void {
    for (;;) {
      const top = this.#heap[0];
      if (top === undefined || top.at > t) break;
      this.#pop();
      if (top.cancelled) continue;
      top.cancelled = true;
      this.#live--;
      this.#now = top.at;
      top.fn();
    }
    if (t > this.#now) this.#now = t;
  }

  /**
   * Advances in steps of `stepMs` until `done()` is true or `maxMs` passed; returns the time it took
   * (from the call), or undefined when `done` never became true.
   */
  runUntilTrue(done: () => boolean, opts: { stepMs?: number; maxMs?: number } = {}): number | undefined {
    const step = opts.stepMs ?? 10;
    const start = this.#now;
    const end = start + (opts.maxMs ?? 600_000);
    while (!done()) {
      if (this.#now >= end) return undefined;
      this.runUntil(Math.min(end, this.#now + step));
    }
    return this.#now - start;
  }

  #less(a: Timer, b: Timer): boolean {
    return a.at < b.at || (a.at === b.at && a.seq < b.seq);
  }

  #push(t: Timer): void {
    const h = this.#heap;
    h.push(t);
    let i = h.length - 1;
    while (i > 0) {
      const p = (i - 1) >> 1;
      if (!this.#less(h[i], h[p])) break;
      [h[i], h[p]] = [h[p], h[i]];
      i = p;
    }
  }

  #pop(): void {
    const h = this.#heap;
    const last = h.pop()!;
    if (h.length === 0) return;
    h[0] = last;
    let i = 0;
    for (;;) {
      const l = 2 * i + 1, r = l + 1;
      let m = i;
      if (l < h.length && this.#less(h[l], h[m])) m = l;
      if (r < h.length && this.#less(h[r], h[m])) m = r;
      if (m === i) break;
      [h[i], h[m]] = [h[m], h[i]];
      i = m;
    }
  }
}
