// The cost model's speculative terms (docs/SPECULATIVE.md): how many tokens a verification trip decides,
// and the tokens per second a chain makes with speculation, from the plain per-token (trip) time. Pure.

/**
 * Expected tokens one verification step decides with k drafts, each kept with probability `alpha` given the
 * ones before it were: the kept prefix plus the target's own next token, (1 - alpha^(k+1)) / (1 - alpha).
 */
export function tokensPerTrip(alpha: number, k: number): number {
  if (!(alpha >= 0 && alpha <= 1)) throw new RangeError(`acceptance must be in [0, 1], got ${alpha}`);
  if (!(Number.isInteger(k) && k >= 0)) throw new RangeError(`k must be an integer >= 0, got ${k}`);
  return alpha === 1 ? k + 1 : (1 - alpha ** (k + 1)) / (1 - alpha);
}

export interface SpeculativePrediction {
  /** Expected tokens decided per verification trip. */
  tokensPerTrip: number;
  /** Predicted ms per generated token. */
  msPerToken: number;
  /** Predicted speedup over plain decoding on the same chain. */
  speedup: number;
}

/**
 * Predicts speculative decoding on a chain whose plain decode takes `tripMs` per token (one trip around
 * the chain per token: hops + every stage's compute), with k drafts per chunk and `depth` chunks in flight.
 * A trip then costs tripMs plus the drafter's time for k tokens plus the extra compute of a k + 1 token step
 * (`extraStepMs`, 0 when the multi-token step costs what a one-token step does). With depth d, a chunk
 * behind the first is useful only if every chunk before it was kept whole (all k drafts and the guess of
 * the next token: alpha^(k+1) each), so a trip decides tokensPerTrip * (1 + b + ... + b^(d-1)), b =
 * alpha^(k+1), an upper estimate: it ignores that a cut-short chunk's successors are redrafted at once.
 */
export function predictSpeculative(o: {
  tripMs: number;
  alpha: number;
  k: number;
  depth?: number;
  draftMs?: number;
  extraStepMs?: number;
}): SpeculativePrediction {
  const depth = o.depth ?? 1;
  const e = tokensPerTrip(o.alpha, o.k);
  const b = o.alpha ** (o.k + 1);
  let chunks = 0;
  for (let i = 0; i < depth; i++) chunks += b ** i;
  const trip = o.tripMs + (o.draftMs ?? 0) + (o.extraStepMs ?? 0);
  const msPerToken = trip / (e * chunks);
  return { tokensPerTrip: e * chunks, msPerToken, speedup: o.tripMs / msPerToken };
}

/**
 * The k (drafts per chunk, 1..maxK) and depth (chunks in flight, 1..maxDepth) that predictSpeculative
 * rates fastest, given the measured acceptance, the plain trip time, the drafter's ms per drafted token and
 * what each extra token adds to a verification step (ms, all stages together).
 */
export function chooseSpeculation(o: {
  tripMs: number;
  alpha: number;
  draftMsPerToken: number;
  stepMsPerToken: number;
  maxK?: number;
  maxDepth?: number;
}): { k: number; depth: number; prediction: SpeculativePrediction } {
  let best: { k: number; depth: number; prediction: SpeculativePrediction } | undefined;
  for (let k = 1; k <= (o.maxK ?? 16); k++) {
    for (let depth = 1; depth <= (o.maxDepth ?? 1); depth++) {
      const prediction = predictSpeculative({
        tripMs: o.tripMs,
        alpha: o.alpha,
        k,
        depth,
        draftMs: o.draftMsPerToken * k,
        extraStepMs: o.stepMsPerToken * k,
      });
      if (!best || prediction.msPerToken < best.prediction.msPerToken - 1e-9) best = { k, depth, prediction };
    }
  }
  return best!;
}

/**
 * Chooses k and depth as a request goes (`--speculate auto`), from its own measurements: per verification
 * step its tokens T, its compute (all stages), its round trip and the drafting time. The step's compute is
 * fitted as a + b * T over the steps so far (T varies with k, and at the end); the plain trip time is a
 * round trip less b * (T - 1); acceptance is kept / (kept + rejections) with a uniform prior.
 */
export class SpeculationTuner {
  #fit = { n: 0, t: 0, c: 0, tt: 0, tc: 0 };
  #trips: number[] = [];
  #draft: number[] = [];
  #kept = 0;
  #rejections = 0;

  constructor(readonly opts: { maxK?: number; maxDepth?: number } = {}) {}

  /** Drafting `tokens` took `ms`. */
  drafted(tokens: number, ms: number): void {
    if (tokens > 0) this.#draft.push(ms / tokens);
  }

  /** A verification step of T tokens: its compute and round trip (ms), the drafts it kept, whether it rejected one. */
  verified(o: { T: number; computeMs: number; roundTripMs: number; kept: number; rejected: boolean }): void {
    const f = this.#fit;
    f.n++, f.t += o.T, f.c += o.computeMs, f.tt += o.T * o.T, f.tc += o.T * o.computeMs;
    this.#trips.push(o.roundTripMs - this.stepMsPerToken * (o.T - 1));
    this.#kept += o.kept;
    if (o.rejected) this.#rejections++;
  }

  /** The fitted b: what one more token adds to a verification step, ms. */
  get stepMsPerToken(): number {
    const f = this.#fit;
    const den = f.n * f.tt - f.t * f.t;
    return den > 0 ? Math.max(0, (f.n * f.tc - f.t * f.c) / den) : 0;
  }

  choose(): { k: number; depth: number } {
    const recent = (xs: number[]) => {
      const r = xs.slice(-8);
      return r.length ? r.reduce((a, x) => a + x, 0) / r.length : 0;
    };
    const c = chooseSpeculation({
      tripMs: Math.max(0.1, recent(this.#trips)),
      alpha: (this.#kept + 1) / (this.#kept + this.#rejections + 2),
      draftMsPerToken: recent(this.#draft),
      stepMsPerToken: this.stepMsPerToken,
      maxK: this.opts.maxK,
      maxDepth: this.opts.maxDepth,
    });
    return { k: c.k, depth: c.depth };
  }
}
