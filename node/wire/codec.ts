// A strict little binary writer/reader for message payloads: big-endian integers, length-prefixed bytes and
// UTF-8 strings. The reader throws WireError("malformed") on any read past the end, on invalid UTF-8 and on
// trailing bytes (`end()`), so a payload either parses exactly or is rejected.
import { WireError } from "./errors.ts";

const utf8 = new TextEncoder();
const strictUtf8 = new TextDecoder("utf-8", { fatal: true });

/** Accumulates fields into a growing buffer. */
export class Writer {
  #buf = new Uint8Array(64);
  #view = new DataView(this.#buf.buffer);
  #len = 0;

  #reserve(n: number): void {
    if (this.#len + n <= this.#buf.length) return;
    let cap = this.#buf.length * 2;
    while (cap < this.#len + n) cap *= 2;
    const next = new Uint8Array(cap);
    next.set(this.#buf.subarray(0, this.#len));
    this.#buf = next;
    this.#view = new DataView(next.buffer);
  }

  u8(v: number): this {
    this.#reserve(1);
    this.#view.setUint8(this.#len, v);
    this.#len += 1;
    return this;
  }

  u32(v: number): this {
    this.#reserve(4);
    this.#view.setUint32(this.#len, v);
    this.#len += 4;
    return this;
  }

  /** A non-negative integer up to 2^53 - 1, as 8 bytes. */
  u64(v: number): this {
    if (!Number.isSafeInteger(v) || v < 0) {
      throw new RangeError(`u64 expects a safe non-negative integer, got ${v}`);
    }
    this.#reserve(8);
    this.#view.setBigUint64(this.#len, BigInt(v));
    this.#len += 8;
    return this;
  }

  /** Raw bytes with no length prefix (fixed-size fields such as nonces). */
  raw(bytes: Uint8Array): this {
    this.#reserve(bytes.length);
    this.#buf.set(bytes, this.#len);
    this.#len += bytes.length;
    return this;
  }

  /** Bytes with a u32 length prefix. */
  bytes(bytes: Uint8Array): this {
    return this.u32(bytes.length).raw(bytes);
  }

  /** A UTF-8 string with a u32 length prefix. */
  str(s: string): this {
    return this.bytes(utf8.encode(s));
  }

  finish(): Uint8Array {
    return this.#buf.slice(0, this.#len);
  }
}

/** Reads fields in order from one payload; every read is bounds-checked. */
export class Reader {
  #view: DataView;
  #pos = 0;

  constructor(readonly buf: Uint8Array, readonly what: string) {
    this.#view = new DataView(buf.buffer, buf.byteOffset, buf.byteLength);
  }

  #need(n: number, field: string): void {
    if (this.#pos + n > this.buf.length) {
      throw new WireError(
        "malformed",
        `${this.what}: ${field} needs ${n} bytes at offset ${this.#pos}, only ${
          this.buf.length - this.#pos
        } left`,
      );
    }
  }

  u8(field: string): number {
    this.#need(1, field);
    return this.#view.getUint8(this.#pos++);
  }

  u32(field: string): number {
    this.#need(4, field);
    const v = this.#view.getUint32(this.#pos);
    this.#pos += 4;
    return v;
  }

  u64(field: string): number {
    this.#need(8, field);
    const v = this.#view.getBigUint64(this.#pos);
    this.#pos += 8;
    if (v > BigInt(Number.MAX_SAFE_INTEGER)) {
      throw new WireError("malformed", `${this.what}: ${field} too large`);
    }
    return Number(v);
  }

  raw(n: number, field: string): Uint8Array {
    this.#need(n, field);
    const out = this.buf.subarray(this.#pos, this.#pos + n);
    this.#pos += n;
    return out;
  }

  bytes(field: string): Uint8Array {
    return this.raw(this.u32(field), field);
  }

  str(field: string, maxBytes = 4096): string {
    const n = this.u32(field);
    if (n > maxBytes) {
      throw new WireError("malformed", `${this.what}: ${field} is ${n} bytes, limit ${maxBytes}`);
    }
    try {
      return strictUtf8.decode(this.raw(n, field));
    } catch (e) {
      if (e instanceof WireError) throw e;
      throw new WireError("malformed", `${this.what}: ${field} is not valid UTF-8`);
    }
  }

  /** Asserts the whole payload was consumed. */
  end(): void {
    if (this.#pos !== this.buf.length) {
      throw new WireError("malformed", `${this.what}: ${this.buf.length - this.#pos} trailing bytes`);
    }
  }
}
