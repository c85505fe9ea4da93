// The write coalescer: frames queued in one tick (or until `flushBytes`) go out as one write. The iroh
// binding costs tens of microseconds per call and takes bytes as Array<number>, so one large write beats
// many small ones by orders of magnitude (docs/WIRE.md, throughput); a TLS connection's writes are cheap
// but still pay a syscall each. One coalescer per stream keeps the stream's order.

/**
 * Where flushed bytes go: the iroh stream's writeAll (converting to Array<number>), a TLS connection, or a
 * fake in tests. The bytes may be a view of a queued frame: the sink must be done with them when it resolves.
 */
export type WriteSink = (bytes: Uint8Array) => Promise<void>;

export interface CoalescerOptions {
  /** Flush at once when this many bytes are queued (default 256 KiB); otherwise on the next microtask. */
  flushBytes?: number;
  /** `enqueue` waits while more than this many bytes are queued or in flight (default 16 MiB). */
  highWaterBytes?: number;
  /** Largest single write (default MAX_WRITE). */
  maxWriteBytes?: number;
  /**
   * Wait for a timer between the pieces of a large message (default true). The iroh sink converts bytes
   * on the event loop, so without this a big message would starve timers (membership pings) until it is
   * all converted; a TLS write is a real async operation and needs no help.
   */
  yieldBetweenWrites?: boolean;
}

/** Default largest single write: what the iroh binding converts without stalling the event loop for long. */
export const MAX_WRITE = 1024 * 1024;

export class Coalescer {
  /** Frames waiting, from #head on (an index, not shift(): shift is O(n) and a window may hold 16k frames). */
  #queue: Uint8Array[] = [];
  #head = 0;
  #queued = 0;
  #inFlight = 0;
  #writing = false;
  #scheduled = false;
  #failed: Error | undefined;
  #drainWaiters: Array<() => void> = [];
  readonly #flushBytes: number;
  readonly #highWater: number;
  readonly #maxWrite: number;
  readonly #yield: boolean;

  /** `onError` is told once when a write fails; the coalescer then drops everything. */
  constructor(readonly sink: WriteSink, readonly onError: (e: Error) => void, opts: CoalescerOptions = {}) {
    this.#flushBytes = opts.flushBytes ?? 256 * 1024;
    this.#highWater = opts.highWaterBytes ?? 16 * 1024 * 1024;
    this.#maxWrite = opts.maxWriteBytes ?? MAX_WRITE;
    this.#yield = opts.yieldBetweenWrites ?? true;
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
    this.#head = 0;
    this.#queued = 0;
    for (const w of this.#drainWaiters.splice(0)) w();
    this.onError(e);
  }

  #flush(): void {
    if (this.#writing || this.#queued === 0 || this.#failed) return;
    const total = Math.min(this.#queued, this.#maxWrite);
    let out: Uint8Array;
    const q = this.#queue;
    if (q[this.#head].length >= total) {
      // One frame fills the write: hand over a view of it, no copy.
      const f = q[this.#head];
      out = f.subarray(0, total);
      if (total === f.length) this.#head++;
      else q[this.#head] = f.subarray(total);
    } else {
      out = new Uint8Array(total);
      let o = 0;
      while (o < total) {
        const f = q[this.#head];
        const take = Math.min(f.length, total - o);
        out.set(take === f.length ? f : f.subarray(0, take), o);
        o += take;
        if (take === f.length) this.#head++;
        else q[this.#head] = f.subarray(take);
      }
    }
    if (this.#head === q.length) {
      this.#queue = [];
      this.#head = 0;
    } else if (this.#head > 1024 && this.#head * 2 > q.length) {
      this.#queue = q.slice(this.#head);
      this.#head = 0;
    }
    this.#queued -= total;
    this.#inFlight = total;
    this.#writing = true;
    this.sink(out).then(
      () => {
        this.#writing = false;
        this.#inFlight = 0;
        for (const w of this.#drainWaiters.splice(0)) w();
        if (this.#queued === 0) return;
        // Let timers and other streams' work run between the pieces of a large message (see yieldBetweenWrites).
        if (this.#yield) setTimeout(() => this.#flush(), 0);
        else this.#flush();
      },
      (e) => {
        this.#writing = false;
        this.#inFlight = 0;
        this.fail(e instanceof Error ? e : new Error(String(e)));
      },
    );
  }
}

/** Uint8Array -> the Array<number> the iroh binding takes (a preallocated loop: ~5x faster than Array.from). */
export function toNumberArray(bytes: Uint8Array): number[] {
  const out = new Array<number>(bytes.length);
  for (let i = 0; i < bytes.length; i++) out[i] = bytes[i];
  return out;
}
