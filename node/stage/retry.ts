// Retry with backoff for a hop's send: the first step of fault tolerance (ROADMAP rung 4). A send that
// fails because the next node is momentarily unreachable (a connection that dropped, a name still on its
// way by gossip) is tried again after 50, 100, 200 ... ms, ~3.2 s in all, unless membership already says
// the node is gone (then the request fails at once, and the client learns which stage died). Sending
// twice is safe: receivers drop a step they have seen (stage_actor.ts, "duplicate"), keyed by request id
// and step.
import { ActorNotFoundError, PeerUnreachableError } from "../actors/mod.ts";
import type { Clock } from "../clock.ts";

export interface RetryOptions {
  clock: Clock;
  /** Waits between attempts, ms. Default 50, 100, 200, 400, 800, 1600. */
  delaysMs?: readonly number[];
  /** True when `name`'s node is known to be gone (dead or left): give up without waiting. */
  gone?: (name: string) => boolean;
  /** True when the sender is shutting down: give up. */
  closed?: () => boolean;
  /** Called before each retry (for the log). */
  onRetry?: (name: string, attempt: number, error: Error) => void;
}

export const DEFAULT_RETRY_DELAYS_MS: readonly number[] = [50, 100, 200, 400, 800, 1600];

/** Whether a send error may pass if tried again. */
export function retryable(e: unknown): boolean {
  return e instanceof PeerUnreachableError || e instanceof ActorNotFoundError;
}

/** `send(name, body)`, tried again on transient errors as RetryOptions says; rethrows the last error. */
export async function sendWithRetry(
  send: (name: string, body: Uint8Array) => Promise<void>,
  name: string,
  body: Uint8Array,
  o: RetryOptions,
): Promise<void> {
  const delays = o.delaysMs ?? DEFAULT_RETRY_DELAYS_MS;
  for (let attempt = 0;; attempt++) {
    try {
      return await send(name, body);
    } catch (e) {
      if (!retryable(e) || attempt >= delays.length || o.gone?.(name) || o.closed?.()) throw e;
      o.onRetry?.(name, attempt + 1, e as Error);
      await new Promise<void>((r) => o.clock.schedule(r, delays[attempt]));
    }
  }
}
