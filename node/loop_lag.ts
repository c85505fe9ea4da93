// How long this process's event loop was held: a tick every `tickMs` that measures how late it ran. The
// event loop is where membership answers its probes, so a hold longer than a peer's suspicion timeout
// (3 s at least with the `lan` preset) gets a live node declared dead. Two things on this thread hold it:
// a first program's pipeline compiles (Deno's createComputePipeline is synchronous, ~10-160 ms each on
// llvmpipe, tens of them a program), and the GPU waits (Deno's mapAsync and onSubmittedWorkDone block the
// thread until all submitted work is done: kernels/readback.ts). Measured on the 2-core CI machine,
// kimi-k2-tiny on llvmpipe: 0.2-0.7 s holds in one process, up to 2 s in a `--local 5` chain beside four
// busy loops (docs/RECOVERY.md, "Known limits"). The node logs each hold past `warnMs` (at most one line a
// `quietMs`) and keeps counts for `status --json`.
import type { Cancel, Clock } from "./clock.ts";

/** The words every held-loop warning carries (what a parent that hides its workers' output looks for). */
export const LOOP_HELD = "event loop was held";

export interface LoopLagOptions {
  /** Tick period, ms (default 100). */
  tickMs?: number;
  /** A hold this long or longer is counted and logged, ms (default 1000). */
  warnMs?: number;
  /** Least time between two log lines, ms (default 10 000): a loaded machine holds often. */
  quietMs?: number;
  /** Where the warnings go (default: none). */
  log?: (msg: string) => void;
}

/** What `status --json` shows as `loop`. */
export interface LoopLagStats {
  /** The longest hold since the node started, ms. */
  maxMs: number;
  /** Holds of warnMs or longer. */
  holds: number;
  /** The last such hold, ms (0: none yet). */
  lastMs: number;
}

/** Watches the event loop on `clock` (the SystemClock in a node; a FakeClock in tests). */
export class LoopLag {
  readonly #clock: Clock;
  readonly #tick: number;
  readonly #warn: number;
  readonly #quiet: number;
  readonly #log?: (msg: string) => void;
  #expected = 0;
  #loggedAt = -Infinity;
  #cancel: Cancel | undefined;
  #stats: LoopLagStats = { maxMs: 0, holds: 0, lastMs: 0 };

  constructor(clock: Clock, opts: LoopLagOptions = {}) {
    this.#clock = clock;
    this.#tick = opts.tickMs ?? 100;
    this.#warn = opts.warnMs ?? 1000;
    this.#quiet = opts.quietMs ?? 10_000;
    this.#log = opts.log;
    if (!(this.#tick > 0 && this.#warn > 0 && this.#quiet >= 0)) {
      throw new RangeError("LoopLag: tickMs and warnMs must be > 0, quietMs >= 0");
    }
  }

  start(): this {
    if (this.#cancel) return this;
    this.#schedule();
    return this;
  }

  stop(): void {
    this.#cancel?.();
    this.#cancel = undefined;
  }

  stats(): LoopLagStats {
    return { ...this.#stats };
  }

  #schedule(): void {
    this.#expected = this.#clock.now() + this.#tick;
    this.#cancel = this.#clock.schedule(() => this.#ran(), this.#tick);
  }

  #ran(): void {
    const now = this.#clock.now();
    const held = Math.max(0, now - this.#expected);
    const s = this.#stats;
    s.maxMs = Math.max(s.maxMs, Math.round(held));
    if (held >= this.#warn) {
      s.holds++;
      s.lastMs = Math.round(held);
      if (this.#log && now - this.#loggedAt >= this.#quiet) {
        this.#loggedAt = now;
        this.#log(
          `this node's ${LOOP_HELD} for ${(held / 1000).toFixed(1)} s (GPU work on this thread: ` +
            `pipeline compiles or a GPU wait); peers may suspect a node that does not answer for ~3 s ` +
            `(${s.holds} such hold(s) so far)`,
        );
      }
    }
    this.#schedule();
  }
}
