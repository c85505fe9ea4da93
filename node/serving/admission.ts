// How many requests the OpenAI server runs at once, and the bounded queue beyond that. A request runs once
// a slot is free (`concurrency`) and the node's KV budget (node/api/kv_budget.ts, shared with the control
// API's POST /generate) has room for its prompt + max tokens; until then it waits in FIFO order. A full
// queue answers 429 at once; a request that waits longer than `waitMs` gets 503; one larger than the
// whole budget is a 400 (it could never run). A client that goes away while waiting leaves the queue.
import type { KvBudget } from "../api/kv_budget.ts";
import { ApiError } from "./errors.ts";

export interface AdmissionOptions {
  /** Requests generating at once (default 8); the chain interleaves their steps. */
  concurrency?: number;
  /** Requests that may wait for a slot or for KV room (default 64); beyond that: 429. */
  queue?: number;
  /** Longest wait in the queue, ms (default 60 000); then 503. */
  waitMs?: number;
}

interface Waiter {
  need: number;
  resolve(release: () => void): void;
  reject(e: unknown): void;
}

export class Admission {
  readonly concurrency: number;
  readonly queueLimit: number;
  readonly waitMs: number;
  #budget: KvBudget;
  #running = 0;
  #waiting: Waiter[] = [];

  constructor(budget: KvBudget, opts: AdmissionOptions = {}) {
    this.#budget = budget;
    this.concurrency = opts.concurrency ?? 8;
    this.queueLimit = opts.queue ?? 64;
    this.waitMs = opts.waitMs ?? 60_000;
    // The control API's requests free KV room too.
    budget.onRelease(() => this.#pump());
  }

  get running(): number {
    return this.#running;
  }

  get waiting(): number {
    return this.#waiting.length;
  }

  /** Resolves with the request's release once it may run; ApiError (400, 429, 503) or the signal's reason. */
  enter(need: number, signal?: AbortSignal): Promise<() => void> {
    signal?.throwIfAborted();
    const budget = this.#budget.tokens();
    if (need > budget) {
      return Promise.reject(
        new ApiError(
          400,
          `This model's context for a request is ${budget} tokens; the prompt plus max_tokens needs ${need}. ` +
            `Shorten the prompt or ask for fewer tokens.`,
          { param: "messages", code: "context_length_exceeded" },
        ),
      );
    }
    if (this.#waiting.length === 0) {
      const release = this.#tryRun(need);
      if (release) return Promise.resolve(release);
    }
    if (this.#waiting.length >= this.queueLimit) {
      return Promise.reject(
        new ApiError(
          429,
          `the server is busy: ${this.#running} request(s) running, ${this.#waiting.length} waiting`,
          {
            code: "queue_full",
            retryAfterS: 1,
          },
        ),
      );
    }
    return new Promise((resolve, reject) => {
      const leave = (e: unknown) => {
        const i = this.#waiting.indexOf(w);
        if (i < 0) return;
        this.#waiting.splice(i, 1);
        clearTimeout(timer);
        signal?.removeEventListener("abort", onAbort);
        reject(e);
        this.#pump(); // the head may have changed
      };
      const onAbort = () => leave(signal!.reason);
      const w: Waiter = {
        need,
        resolve: (release) => {
          clearTimeout(timer);
          signal?.removeEventListener("abort", onAbort);
          resolve(release);
        },
        reject: leave,
      };
      const timer = setTimeout(
        () =>
          leave(
            new ApiError(
              503,
              `the request waited ${Math.round(this.waitMs / 1000)} s in the queue without a slot`,
              {
                code: "queue_timeout",
                retryAfterS: 1,
              },
            ),
          ),
        this.waitMs,
      );
      signal?.addEventListener("abort", onAbort, { once: true });
      this.#waiting.push(w);
    });
  }

  #tryRun(need: number): (() => void) | undefined {
    if (this.#running >= this.concurrency) return undefined;
    const kv = this.#budget.admit(need);
    if (!kv.ok) return undefined;
    this.#running++;
    let done = false;
    return () => {
      if (done) return;
      done = true;
      this.#running--;
      kv.release(); // pumps through the budget's listener
      this.#pump();
    };
  }

  #pump(): void {
    while (this.#waiting.length > 0) {
      const head = this.#waiting[0];
      const release = this.#tryRun(head.need);
      if (!release) return;
      this.#waiting.shift();
      head.resolve(release);
    }
  }
}
