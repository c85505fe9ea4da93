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

/** Largest single write handed to the binding. */
export const MAX_WRITE = 1024 * 1024;

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
    // At most MAX_WRITE bytes per native write: converting to Array<number> and handing it to the binding
    // blocks the event loop, so a 15 MB message written whole would stall membership pings for a second.
    const total = Math.min(this.#queued, MAX_WRITE);
    const out = new Array<number>(total);
    let o = 0;
    while (o < total) {
      const f = this.#queue[0];
      const take = Math.min(f.length, total - o);
      // A preallocated loop is ~5x faster than Array.from for the Uint8Array -> Array<number> the binding needs.
      for (let i = 0; i < take; i++) out[o++] = f[i];
      if (take === f.length) this.#queue.shift();
      else this.#queue[0] = f.subarray(take);
    }
    this.#queued -= total;
    this.#inFlight = total;
    this.#writing = true;
    this.sink(out).then(
      () => {
        this.#writing = false;
        this.#inFlight = 0;
        for (const w of this.#drainWaiters.splice(0)) w();
        // Let timers and other streams' work run between the pieces of a large message.
        if (this.#queued > 0) setTimeout(() => this.#flush(), 0);
      },
      (e) => {
        this.#writing = false;
        this.#inFlight = 0;
        this.fail(e instanceof Error ? e : new Error(String(e)));
      },
    );
  }
}
