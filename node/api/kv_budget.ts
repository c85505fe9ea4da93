// The KV memory a node admits requests against. Each request holds prompt + maxTokens positions of KV
// cache on every stage for as long as it runs; a node takes requests only while the positions held by
// those in flight stay within its budget, by default the context the Plan sized each stage's memory for
// (the Plan's `context`, docs/PLAN_FORMAT.md). A request larger than the whole budget is bad input (400);
// one that does not fit beside those in flight is refused at once (503, try later), never accepted and
// left to fail on a stage.

/** The budget when the Plan names no context: the planner's default context. */
export const DEFAULT_KV_TOKENS = 4096;

export type Admission =
  | { ok: true; release(): void }
  | { ok: false; status: 400 | 503; error: string };

export class KvBudget {
  #held = 0;
  #requests = 0;
  #onRelease = new Set<() => void>();

  /** `tokens()`: the budget in KV positions, read at each admission (the Plan may change). */
  constructor(readonly tokens: () => number) {}

  /** Positions held by the requests in flight, and how many requests that is. */
  get held(): { tokens: number; requests: number } {
    return { tokens: this.#held, requests: this.#requests };
  }

  /** Calls `f` whenever a request gives its positions back (a queue waiting for room listens); returns the unsubscribe. */
  onRelease(f: () => void): () => void {
    this.#onRelease.add(f);
    return () => this.#onRelease.delete(f);
  }

  /** Admits a request needing `need` positions, or says why not. */
  admit(need: number): Admission {
    const budget = this.tokens();
    if (need > budget) {
      return {
        ok: false,
        status: 400,
        error: `the prompt plus maxTokens needs ${need} KV positions; this node's budget is ${budget} ` +
          `(the context its Plan reserves): shorten the prompt or ask fewer tokens`,
      };
    }
    if (this.#held + need > budget) {
      return {
        ok: false,
        status: 503,
        error:
          `KV budget exhausted: ${this.#requests} request(s) in flight hold ${this.#held} of ${budget} ` +
          `positions and this one needs ${need}; retry when they finish`,
      };
    }
    this.#held += need;
    this.#requests++;
    let released = false;
    return {
      ok: true,
      release: () => {
        if (released) return;
        released = true;
        this.#held -= need;
        this.#requests--;
        for (const f of this.#onRelease) f();
      },
    };
  }
}

/** The budget a Plan gives: its `context` when it has one, else DEFAULT_KV_TOKENS. */
export function planKvTokens(plan: unknown): number {
  const context = (plan as { context?: unknown } | undefined)?.context;
  return Number.isInteger(context) && (context as number) > 0 ? context as number : DEFAULT_KV_TOKENS;
}
