// Reading a checkpoint's tensors ahead of the loader, so the disk (or the page cache) works while the GPU
// converts and the host stages the tensor before. The loader asks for one tensor (or one stack) at a time and
// uploads it before asking for the next; with nothing read ahead every tensor's read waits on the upload
// before it and the reads themselves run one at a time, which Deno's async file reads do at ~1.1-1.4 GB/s
// from the page cache (2 cores, 2026-12-08; four at once ~2.4-2.7). docs/CHECKPOINTS.md, "Reading ahead".
import { readTensorBytes, type TensorInfo } from "./safetensors.ts";

/** What a read-ahead may hold: bytes read or being read but not yet taken, and reads at once. */
export interface ReadAheadLimits {
  /** Bytes read ahead and not yet taken, at most (one tensor larger than this is still read, alone). */
  bytes: number;
  /** Reads in flight at once, at most. Default 4. */
  reads?: number;
}

/** Reads ahead of the loader by default: 512 MiB (a layer or more of most models) and 4 reads at once. */
export const READ_AHEAD: Readonly<ReadAheadLimits> = { bytes: 512 * 2 ** 20, reads: 4 };

/**
 * Reads `order`'s tensors in that order, ahead of their use, within `limits`. `take` hands over a tensor
 * read (or being read) ahead, or undefined for one it has not started (which it then no longer reads: the
 * caller does). A read that fails rejects the promise `take` hands over, as a direct read would; one never
 * taken is dropped silently (`stop`, or when the reader is dropped).
 */
export class ReadAhead {
  #queue: TensorInfo[];
  #started = new Map<string, { bytes: Promise<Uint8Array>; size: number }>();
  #held = 0;
  #inFlight = 0;
  readonly #reads: number;

  constructor(
    order: Iterable<TensorInfo>,
    readonly limits: ReadAheadLimits,
    /** The read itself (a test's fake); default readTensorBytes. */
    readonly read: (info: TensorInfo) => Promise<Uint8Array> = readTensorBytes,
  ) {
    if (!(limits.bytes >= 0)) throw new RangeError(`read-ahead bytes must be >= 0, got ${limits.bytes}`);
    this.#reads = limits.reads ?? READ_AHEAD.reads!;
    if (!(Number.isInteger(this.#reads) && this.#reads >= 1)) {
      throw new RangeError(`read-ahead reads must be a whole number >= 1, got ${limits.reads}`);
    }
    const seen = new Set<string>();
    this.#queue = [...order].filter((i) => !seen.has(i.name) && seen.add(i.name)).reverse();
    this.#pump();
  }

  /** Bytes read or being read ahead and not yet taken. */
  get held(): number {
    return this.#held;
  }

  /** Reads in flight now. */
  get inFlight(): number {
    return this.#inFlight;
  }

  /** `info`'s bytes if read ahead (or being read), else undefined; either way this reader is done with it. */
  take(info: TensorInfo): Promise<Uint8Array> | undefined {
    const s = this.#started.get(info.name);
    if (s === undefined) {
      const i = this.#queue.findIndex((q) => q.name === info.name);
      if (i >= 0) this.#queue.splice(i, 1);
      return undefined;
    }
    this.#started.delete(info.name);
    this.#held -= s.size;
    this.#pump();
    return s.bytes;
  }

  /** Starts nothing more and lets go of what was read ahead and not taken. */
  stop(): void {
    this.#queue = [];
    this.#started.clear();
    this.#held = 0;
  }

  #pump(): void {
    while (this.#queue.length > 0 && this.#inFlight < this.#reads) {
      const next = this.#queue[this.#queue.length - 1];
      const size = next.end - next.begin;
      if (this.#held > 0 && this.#held + size > this.limits.bytes) return;
      if (this.limits.bytes === 0) return;
      this.#queue.pop();
      this.#held += size;
      this.#inFlight++;
      const bytes = this.read(next);
      // Handled here so a read that fails and is never taken is no unhandled rejection; the taker still
      // awaits `bytes` itself and sees the error.
      bytes.catch(() => {}).finally(() => {
        this.#inFlight--;
        this.#pump();
      });
      this.#started.set(next.name, { bytes, size });
    }
  }
}
