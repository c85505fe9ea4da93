// Runs callbacks at given times with one timer for all of them: a binary min-heap ordered by due time
// (ties keep insertion order), and a single timer armed for the earliest entry.
//
// Why not one setTimeout per datagram: Deno's timers fire about 1-2 ms late (measured p50 1.2 ms on the
// 2-core VM), which would bias every emulated delay upwards. The scheduler learns that lateness (an
// exponential average of how late each wake-up was) and arms the timer that much early, then runs every
// entry due within `slackMs` of the wake-up. Entries already due when scheduled run at once, synchronously.

/** The clock and timer the scheduler uses; tests pass a fake one. */
export interface SchedulerClock {
  /** Milliseconds on a monotonic clock. */
  now(): number;
  /** Calls `fn` after about `ms` milliseconds; returns a handle for `clearTimer`. */
  setTimer(fn: () => void, ms: number): unknown;
  clearTimer(handle: unknown): void;
}

/** Options of `DeliveryScheduler`. */
export interface DeliverySchedulerOptions {
  /** Default: performance.now() and setTimeout. */
  clock?: SchedulerClock;
  /** Entries due within this many ms of a wake-up run in that wake-up. Default 0.25. */
  slackMs?: number;
  /** Upper bound of the learnt early-arming compensation, ms. Default 3. */
  maxCompensationMs?: number;
}

interface Entry {
  at: number;
  seq: number;
  fn: () => void;
}

export const realClock: SchedulerClock = {
  now: () => performance.now(),
  setTimer: (fn, ms) => setTimeout(fn, ms),
  clearTimer: (h) => clearTimeout(h as number),
};

export class DeliveryScheduler {
  readonly #clock: SchedulerClock;
  readonly #slackMs: number;
  readonly #maxCompMs: number;
  readonly #heap: Entry[] = [];
  #seq = 0;
  #timer: unknown;
  #armedFor = 0;
  #compMs = 0;
  #closed = false;

  constructor(options: DeliverySchedulerOptions = {}) {
    this.#clock = options.clock ?? realClock;
    this.#slackMs = options.slackMs ?? 0.25;
    this.#maxCompMs = options.maxCompensationMs ?? 3;
  }

  /** Entries waiting to run. */
  get size(): number {
    return this.#heap.length;
  }

  /** The current early-arming compensation, ms (what the scheduler learnt about timer lateness). */
  get compensationMs(): number {
    return this.#compMs;
  }

  /** Runs `fn` at time `at` (ms on the scheduler's clock), after every entry scheduled earlier for `at`. */
  schedule(at: number, fn: () => void): void {
    if (this.#closed) return;
    this.#push({ at, seq: this.#seq++, fn });
    this.#runDue(this.#clock.now());
  }

  /** Drops every pending entry and stops the timer. */
  close(): void {
    this.#closed = true;
    this.#heap.length = 0;
    if (this.#timer !== undefined) this.#clock.clearTimer(this.#timer);
    this.#timer = undefined;
  }

  #runDue(now: number): void {
    while (this.#heap.length > 0 && this.#heap[0].at <= now + this.#slackMs && !this.#closed) {
      this.#pop().fn();
    }
    this.#arm(now);
  }

  #arm(now: number): void {
    if (this.#closed || this.#heap.length === 0) return;
    const at = this.#heap[0].at;
    if (this.#timer !== undefined) {
      if (this.#armedFor <= at) return; // the armed wake-up comes first anyway
      this.#clock.clearTimer(this.#timer);
    }
    this.#armedFor = at;
    this.#timer = this.#clock.setTimer(() => this.#wake(), Math.max(0, at - now - this.#compMs));
  }

  #wake(): void {
    this.#timer = undefined;
    const now = this.#clock.now();
    const late = now - this.#armedFor;
    // Learn slowly from each wake-up; a single descheduled wake-up should not move the estimate much.
    this.#compMs = Math.min(this.#maxCompMs, Math.max(0, this.#compMs + 0.1 * late));
    this.#runDue(now);
  }

  #push(e: Entry): void {
    const h = this.#heap;
    h.push(e);
    let i = h.length - 1;
    while (i > 0) {
      const p = (i - 1) >> 1;
      if (!before(h[i], h[p])) break;
      [h[i], h[p]] = [h[p], h[i]];
      i = p;
    }
  }

  #pop(): Entry {
    const h = this.#heap;
    const top = h[0];
    const last = h.pop()!;
    if (h.length > 0) {
      h[0] = last;
      let i = 0;
      for (;;) {
        const l = 2 * i + 1, r = l + 1;
        let m = i;
        if (l < h.length && before(h[l], h[m])) m = l;
        if (r < h.length && before(h[r], h[m])) m = r;
        if (m === i) break;
        [h[i], h[m]] = [h[m], h[i]];
        i = m;
      }
    }
    return top;
  }
}

function before(a: Entry, b: Entry): boolean {
  return a.at < b.at || (a.at === b.at && a.seq < b.seq);
}
