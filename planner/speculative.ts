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
