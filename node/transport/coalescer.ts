// The write coalescer: frames queued in one tick (or until `flushBytes`) go out as one native write. The
// iroh binding costs tens of microseconds per call and takes bytes as Array<number>, so one large write
// beats many small ones by orders of magnitude (docs/WIRE.md, throughput). One coalescer per stream keeps
// the stream's order.

/** Where flushed bytes go: the binding's SendStream.writeAll, or a fake in tests. */
export type WriteSink = (bytes: number[]) => Promise<void>;

export interface CoalescerOptions {
  /** Flush at once when this many bytes are queued (default 256 KiB); otherwise on the next microtask. */
  flushBytes?: number;
  /** `enqueue` waits while more than this many bytes are queued or in flight (default 16 MiB). */
  highWaterBytes?: number;
}

export class Coalescer {
  #queue: Uint8Array[] = [];
  #queued = 0;
  #inFlight = 0;
  #writing = false;
  #scheduled = false;
  #failed: Error | undefined;
  #drainWaiters: Array<() => void> = [];
  readonly #flushBytes: number;
  readonly #highWater: number;

  /** `onError` is told once when a write fails; the coalescer then drops everything. */
  constructor(readonly sink: WriteSink, readonly onError: (e: Error) => void, opts: CoalescerOptions = {}) {
    this.#flushBytes = opts.flushBytes ?? 256 * 1024;
    this.#highWater = opts.highWaterBytes ?? 16 * 1024 * 1024;
  }

  get failed(): boolean {
    return this.#failed !== undefined;
  }

  /** Queues one encoded frame. Resolves once the queue is below the high-water mark; false if failed. */
  async enqueue(frame: Uint8Array): Promise<boolean> {
    if (this.#failed) return false;
    this.#queue.push(frame);
    this.#queued += frame.length;
    if (this.#queued >= this.#flushBytes) this.#flush();
    else if (!this.#scheduled) {
      this.#scheduled = true;
      queueMicrotask(() => {
        this.#scheduled = false;
        this.#flush();
      });
    }
    while (!this.#failed && this.#queued + this.#inFlight > this.#highWater) {
      await new Promise<void>((r) => this.#drainWaiters.push(r));
    }
    return !this.#failed;
  }

  /** Stops accepting frames and wakes anyone waiting. */
  fail(e: Error): void {
    if (this.#failed) return;
    this.#failed = e;
    this.#queue = [];
    this.#queued = 0;
    for (const w of this.#drainWaiters.splice(0)) w();
    this.onError(e);
  }

  #flush(): void {
    if (this.#writing || this.#queued === 0 || this.#failed) return;
    const frames = this.#queue;
    const total = this.#queued;
    this.#queue = [];
    this.#queued = 0;
    this.#inFlight = total;
    this.#writing = true;
    // A preallocated loop is ~5x faster than Array.from for the Uint8Array -> Array<number> the binding needs.
    const out = new Array<number>(total);
    let o = 0;
    for (const f of frames) for (let i = 0; i < f.length; i++) out[o++] = f[i];
    this.sink(out).then(
      () => {
        this.#writing = false;
        this.#inFlight = 0;
        for (const w of this.#drainWaiters.splice(0)) w();
        this.#flush();
      },
      (e) => {
        this.#writing = false;
        this.#inFlight = 0;
        this.fail(e instanceof Error ? e : new Error(String(e)));
      },
    );
  }
}
