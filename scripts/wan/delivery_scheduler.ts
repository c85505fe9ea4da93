// Runs callbacks at given times with one timer for all of them: a binary min-heap ordered by due time
// (ties keep insertion order), and a single timer armed for the earliest entry.
//
// Why not one setTimeout per datagram: Deno's timers would bias every emulated delay upwards by about
// 1 ms. Measured on Deno 2.9.6: setTimeout(ms) fires after max(1, floor(ms)) + 1 + d ms, d ~ 0.25
// (8.3 and 8.7 both fire after ~9.25 ms, 9 after ~10.25, 0 after ~2.2). So the scheduler asks for the
// whole number of ms that lands nearest the due time under that model, learns d from each wake-up (an
// exponential average), and runs every entry due within `slackMs` of the wake-up. Deliveries then land
// within about +-0.5 ms of their due time, centred on it. The slack must be about half a tick: with
// less, an early wake-up re-arms and pays the 2.2 ms minimum delay. Entries due within the slack when
// scheduled run at once, synchronously. Entries due 0.5-2 ms ahead can be up to ~1.7 ms late (the
// minimum timer); that only happens between datagrams queued close together, not to a link's delay.

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
  /** Entries due within this many ms of a wake-up run in that wake-up. Default 0.5. */
  slackMs?: number;
  /** Starting estimate of d, the timer's lateness beyond max(1, floor(ms)) + 1, ms. Default 0.25. */
  initialTimerDeltaMs?: number;
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

  readonly #heap: Entry[] = [];
  #seq = 0;
  #timer: unknown;
  #armedFor = 0;
  #armedAt = 0;
  #armedTicks = 0;
  #deltaMs: number;
  #closed = false;

  constructor(options: DeliverySchedulerOptions = {}) {
    this.#clock = options.clock ?? realClock;
    this.#slackMs = options.slackMs ?? 0.5;
    this.#deltaMs = options.initialTimerDeltaMs ?? 0.25;
  }

  /** Entries waiting to run. */
  get size(): number {
    return this.#heap.length;
  }

  /** The learnt timer lateness d beyond max(1, floor(ms)) + 1 ms (see the file comment). */
  get timerDeltaMs(): number {
    return this.#deltaMs;
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
    this.#armedAt = now;
    this.#armedTicks = Math.max(1, Math.round(at - now - 1 - this.#deltaMs));
    this.#timer = this.#clock.setTimer(() => this.#wake(), this.#armedTicks);
  }

  #wake(): void {
    this.#timer = undefined;
    const now = this.#clock.now();
    const delta = now - this.#armedAt - this.#armedTicks - 1;
    // Learn slowly; one descheduled wake-up (a busy machine) should not move the estimate much.
    this.#deltaMs = Math.min(2, Math.max(-1, this.#deltaMs + 0.1 * (delta - this.#deltaMs)));
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
