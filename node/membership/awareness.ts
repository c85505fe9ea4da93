// Lifeguard's local health multiplier (memberlist awareness.go). A node that misses acks it should have
// got, misses nacks from its indirect probers, or has to refute suspicions about itself is probably the
// slow one: it raises its score and stretches its own probe interval and timeout, so it accuses others
// less eagerly. Successful probes lower the score again.

export class Awareness {
  readonly max: number;
  #score = 0;

  /** `max` is MembershipConfig.awarenessMaxMultiplier; 1 disables awareness (scale is always 1x). */
  constructor(max: number) {
    if (!(max >= 1)) throw new RangeError(`Awareness max must be >= 1, got ${max}`);
    this.max = max;
  }

  /** Current score in [0, max - 1]. */
  get score(): number {
    return this.#score;
  }

  /** Adds `delta` to the score, clamped to [0, max - 1]. */
  applyDelta(delta: number): void {
    this.#score = Math.min(this.max - 1, Math.max(0, this.#score + delta));
  }

  /** Scales a timeout by (score + 1). */
  scale(ms: number): number {
    return ms * (this.#score + 1);
  }
}
