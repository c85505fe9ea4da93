// Reassembles frames from a byte stream that arrives in arbitrary chunks (QUIC stream reads). Strict: the
// first bad header throws WireError and the decoder is then unusable (the connection is closed).
import { WireError } from "./errors.ts";
import { checkHeader, DATA_MAX_BYTES, type Frame, type FrameKind, HEADER_BYTES } from "./frame.ts";

export class FrameDecoder {
  #buf = new Uint8Array(64 * 1024);
  #start = 0;
  #end = 0;
  #failed: WireError | undefined;
  /** The largest MESSAGE payload accepted; handshake frames are always limited to HANDSHAKE_MAX_BYTES. */
  messageMax: number;

  constructor(opts: { messageMax?: number } = {}) {
    this.messageMax = opts.messageMax ?? DATA_MAX_BYTES;
  }

  /** Bytes received but not yet returned as frames. */
  get pending(): number {
    return this.#end - this.#start;
  }

  /**
   * Appends a chunk (a Uint8Array, or the Array<number> the iroh binding returns) and returns every frame it
   * completes. Throws WireError on the first malformed header; later calls rethrow it.
   */
  push(chunk: ArrayLike<number>): Frame[] {
    if (this.#failed) throw this.#failed;
    this.#append(chunk);
    const frames: Frame[] = [];
    try {
      while (this.#end - this.#start >= HEADER_BYTES) {
        const length = checkHeader(this.#buf, this.#start, this.messageMax);
        const total = HEADER_BYTES + length;
        if (this.#end - this.#start < total) {
          this.#ensureCapacity(total);
          break;
        }
        const kind = this.#buf[this.#start + 3] as FrameKind;
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

  /** Call when the stream ended: throws WireError("truncated") if a partial frame is left over. */
  finish(): void {
    if (this.#failed) throw this.#failed;
    if (this.#end > this.#start) {
      throw new WireError("truncated", `stream ended inside a frame (${this.#end - this.#start} bytes left)`);
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
