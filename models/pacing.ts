// How many decode steps the loop puts in each batch (models/engine.ts `generate`).
//
// The map call that reads a batch's tokens blocks until the GPU has run everything submitted, so the loop
// encodes batch n + 2 while the GPU runs batch n + 1 and submits it the moment n + 1's map returns. A batch
// whose encode (and the host's other work in that window: handing tokens out) takes longer than the batch
// running on the GPU leaves the GPU idle for the difference. Doubling the sizes (1, 2, 4, ... maxBatch) asks the
// host to encode two steps for every step the GPU runs, so where a step's encode is over half its GPU time
// (Llama-3.2-1B q4: ~0.35 against ~0.6 ms) every start-up batch left the GPU waiting. The pace grows the
// sizes only as fast as the host keeps up: by the ratio of the two per-step times, measured by the loop and
// kept by the engine for its next request.

/** A map call that took longer than this waited for the GPU: its batch ran from its submit to the return. */
export const BLOCKED_MS = 0.05;

/**
 * Per-step times measured by an engine's decode loops (0: none yet). The GPU's is the latest batch whose map
 * blocked (that batch's submit to the map's return, over its steps); the host's is the latest window between
 * a submit and the next map call (encoding the batch after, handing tokens out) over the steps it encoded.
 */
export class DecodePace {
  gpuMs = 0;
  hostMs = 0;

  /** The size of the batch after one of `size` steps (at most `max`). */
  next(size: number, max: number): number {
    return Math.min(max, grow(size, this.gpuMs > 0 && this.hostMs > 0 ? this.gpuMs / this.hostMs : 0));
  }

  /** Notes a batch's map call: `steps` steps submitted at `submitted`, the map called and returned. */
  noteRun(steps: number, submitted: number, called: number, returned: number): void {
    if (steps > 0 && returned - called > BLOCKED_MS) this.gpuMs = (returned - submitted) / steps;
  }

  /** Notes the host's window between a submit and the next map call, in which it encoded `steps` steps. */
  noteHost(steps: number, ms: number): void {
    if (steps > 0) this.hostMs = ms / steps;
  }
}

/**
 * The next batch size from the current one and the ratio of a step's GPU time to its host time (0: not
 * measured). The host keeping up at twice the GPU's rate or not keeping up at all, sizes double (fewest map
 * calls); in between they grow by the ratio, and at least by one step.
 */
export function grow(size: number, ratio: number): number {
  if (!(ratio >= 1 && ratio < 2)) return size * 2;
  return Math.max(size + 1, Math.floor(size * ratio));
}
