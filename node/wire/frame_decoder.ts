// Reassembles frames from a byte stream that arrives in arbitrary chunks (QUIC stream reads). Strict: the
// first bad header throws WireError and the decoder is then unusable (the connection is closed).
import { WireError } from "./errors.ts";
import { checkHeader, DATA_MAX_BYTES, type Frame, type FrameKind, HEADER_BYTES } from "./frame.ts";

/** Payloads at least this large are read straight into their own buffer (one copy instead of two). */
const DIRECT_BYTES = 64 * 1024;

export class FrameDecoder {
  #buf = new Uint8Array(64 * 1024);
  #start = 0;
  #end = 0;
  #failed: WireError | undefined;
  /** A large frame being filled in place: its header is checked, its payload partly here. */
  #big: { kind: FrameKind; payload: Uint8Array; filled: number } | undefined;
  /** The largest MESSAGE payload accepted; handshake frames are always limited to HANDSHAKE_MAX_BYTES. */
  messageMax: number;

  constructor(opts: { messageMax?: number } = {}) {
    this.messageMax = opts.messageMax ?? DATA_MAX_BYTES;
  }

  /** Bytes received but not yet returned as frames. */
  get pending(): number {
    return this.#end - this.#start + (this.#big ? HEADER_BYTES + this.#big.filled : 0);
  }

  /**
   * Appends a chunk (a Uint8Array, or the Array<number> the iroh binding returns) and returns every frame it
   * completes. Throws WireError on the first malformed header; later calls rethrow it.
   */
  push(chunk: ArrayLike<number>): Frame[] {
    if (this.#failed) throw this.#failed;
    const frames: Frame[] = [];
    let at = 0;
    if (this.#big) {
      at = this.#fillBig(chunk, 0, frames);
      if (this.#big) return frames;
    }
    this.#append(at === 0 ? chunk : subarray(chunk, at));
    try {
      while (this.#end - this.#start >= HEADER_BYTES) {
        const length = checkHeader(this.#buf, this.#start, this.messageMax);
        const total = HEADER_BYTES + length;
        const kind = this.#buf[this.#start + 3] as FrameKind;
        if (this.#end - this.#start < total) {
          if (length >= DIRECT_BYTES) {
            // Give the payload its own buffer now and fill it as chunks arrive.
            const payload = new Uint8Array(length);
            const have = this.#end - this.#start - HEADER_BYTES;
            payload.set(this.#buf.subarray(this.#start + HEADER_BYTES, this.#end));
            this.#big = { kind, payload, filled: have };
            this.#start = this.#end = 0;
            return frames;
          }
          this.#ensureCapacity(total);
          break;
        }
        const payload = this.#buf.slice(this.#start + HEADER_BYTES, this.#start + total);
        this.#start += total;
        frames.push({ kind, payload });
      }
    } catch (e) {
      if (e instanceof WireError) this.#failed = e;
      throw e;
    }
    if (this.#start === this.#end) this.#start = this.#end = 0;
    return frames;
  }

  /** Copies from `chunk[at..]` into the large frame; emits it when full. Returns where the copy stopped. */
  #fillBig(chunk: ArrayLike<number>, at: number, frames: Frame[]): number {
    const big = this.#big!;
    const take = Math.min(big.payload.length - big.filled, chunk.length - at);
    big.payload.set(at === 0 && take === chunk.length ? chunk : subarray(chunk, at, at + take), big.filled);
    big.filled += take;
    if (big.filled === big.payload.length) {
      frames.push({ kind: big.kind, payload: big.payload });
      this.#big = undefined;
    }
    return at + take;
  }

  /** Call when the stream ended: throws WireError("truncated") if a partial frame is left over. */
  finish(): void {
    if (this.#failed) throw this.#failed;
    if (this.#end > this.#start || this.#big) {
      throw new WireError("truncated", `stream ended inside a frame (${this.pending} bytes left)`);
    }
  }

  #append(chunk: ArrayLike<number>): void {
    this.#ensureCapacity(this.#end - this.#start + chunk.length);
    this.#buf.set(chunk, this.#end);
    this.#end += chunk.length;
  }

  /** Makes room for `need` unread bytes from #start, compacting or growing the buffer. */
  #ensureCapacity(need: number): void {
    if (this.#start + need <= this.#buf.length) return;
    const unread = this.#end - this.#start;
    if (need <= this.#buf.length) {
      this.#buf.copyWithin(0, this.#start, this.#end);
    } else {
      let cap = this.#buf.length;
      while (cap < need) cap *= 2;
      const next = new Uint8Array(cap);
      next.set(this.#buf.subarray(this.#start, this.#end));
      this.#buf = next;
    }
    this.#start = 0;
    this.#end = unread;
  }
}

/** A view (typed arrays) or a copy (the binding's plain arrays) of part of a chunk. */
function subarray(chunk: ArrayLike<number>, from: number, to = chunk.length): ArrayLike<number> {
  return chunk instanceof Uint8Array ? chunk.subarray(from, to) : Array.prototype.slice.call(chunk, from, to);
}
