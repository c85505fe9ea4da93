// Lifeguard's suspicion timer (memberlist suspicion.go): a suspicion starts with a long timeout that
// shrinks, on a log scale, as independent members confirm it, down to a minimum that grows with log N.
// A lone accuser (perhaps itself slow or cut off) thus gives the accused plenty of time to refute, while
// a failure seen by many is declared quickly.
import type { Cancel, Clock } from "../clock.ts";
import type { PeerId } from "../transport/transport.ts";

export interface SuspicionTimeouts {
  /** Timeout once `k` confirmations arrived (and the fixed timeout of classic SWIM). */
  minMs: number;
  /** Timeout with no confirmation. */
  maxMs: number;
  /** Confirmations expected. */
  k: number;
}

/**
 * memberlist's numbers: min = suspicionMult * max(1, log10(max(1, n))) * probeInterval,
 * max = suspicionMaxTimeoutMult * min, k = suspicionMult - 2 (at most n - 2: memberlist uses 0 when fewer
 * than k other members can confirm). `n` counts live members including this node. With lifeguard off: max = min and k = 0.
 */
export function suspicionTimeouts(
  n: number,
  cfg: {
    suspicionMult: number;
    suspicionMaxTimeoutMult: number;
    probeIntervalMs: number;
    lifeguard: boolean;
  },
): SuspicionTimeouts {
  const scale = Math.max(1, Math.log10(Math.max(1, n)));
  const minMs = cfg.suspicionMult * scale * cfg.probeIntervalMs;
  if (!cfg.lifeguard) return { minMs, maxMs: minMs, k: 0 };
  let k = Math.max(0, cfg.suspicionMult - 2);
  // Fewer possible confirmers than k: wait for as many as there can be. (memberlist sets k = 0 here, so a
  // lone accuser's suspicion expires at min: with lan's 3 s min at N = 5 that gave 1-3 false deaths per 30
  // simulated minutes of 10% loss; capped, none. docs/RECOVERY.md.)
  if (n - 2 < k) k = Math.max(0, n - 2);
  return { minMs, maxMs: cfg.suspicionMaxTimeoutMult * minMs, k };
}

/** Timeout after `confirmations` of `k`: max(min, max - (max - min) * log(C + 1) / log(k + 1)). */
export function suspicionTimeout(confirmations: number, t: SuspicionTimeouts): number {
  if (t.k < 1) return t.minMs;
  const frac = Math.log(confirmations + 1) / Math.log(t.k + 1);
  return Math.max(t.minMs, Math.floor(t.maxMs - frac * (t.maxMs - t.minMs)));
}

/** One running suspicion of one member. */
export class Suspicion {
  readonly start: number;
  #t: SuspicionTimeouts;
  #clock: Clock;
  #onTimeout: () => void;
  #confirmers = new Set<PeerId>();
  #cancel: Cancel;
  #fired = false;

  /** `from` is the first accuser; it does not count as a confirmation. */
  constructor(from: PeerId, timeouts: SuspicionTimeouts, clock: Clock, onTimeout: () => void) {
    this.#t = timeouts;
    this.#clock = clock;
    this.#onTimeout = onTimeout;
    this.start = clock.now();
    this.#confirmers.add(from);
    this.#cancel = clock.schedule(() => this.#fire(), suspicionTimeout(0, timeouts));
  }

  /** Number of independent confirmations so far. */
  get confirmations(): number {
    return this.#confirmers.size - 1;
  }

  /**
   * Records a confirmation from `from`; returns true when it was new (and should be re-gossiped so that
   * others hear it too). The timer is rescheduled to the shorter timeout, relative to the start.
   */
  confirm(from: PeerId): boolean {
    if (this.#fired || this.confirmations >= this.#t.k || this.#confirmers.has(from)) return false;
    this.#confirmers.add(from);
    this.#cancel();
    const remaining = this.start + suspicionTimeout(this.confirmations, this.#t) - this.#clock.now();
    this.#cancel = this.#clock.schedule(() => this.#fire(), Math.max(0, remaining));
    return true;
  }

  /** Stops the timer (refuted, or the member was declared dead or left by someone else). */
  cancel(): void {
    this.#fired = true;
    this.#cancel();
  }

  #fire(): void {
    if (this.#fired) return;
    this.#fired = true;
    this.#onTimeout();
  }
}
