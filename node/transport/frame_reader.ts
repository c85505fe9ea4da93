// Reads whole frames from a byte stream (an iroh receive stream, or a TLS connection: byte_conn.ts): large reads (the iroh
// binding's per-call cost is high), then the strict FrameDecoder. Shared by the handshakes (one frame at a
// time) and the delivery loop.
import type { RecvStream } from "@number0/iroh";
import { type Frame, FrameDecoder } from "../wire/mod.ts";

/** How much one read asks for. */
export const READ_BYTES = 1024 * 1024;

/**
 * Where a reader's bytes come from: the next chunk, or null once the stream ended cleanly. A chunk may be
 * reused by the source after the next call (the decoder copies what it keeps).
 */
export type ChunkSource = () => Promise<ArrayLike<number> | null>;

/** An iroh receive stream as a source (the binding answers an empty array at the end). */
export function irohSource(recv: RecvStream): ChunkSource {
  return async () => {
    const chunk = await recv.read(READ_BYTES);
    return chunk.length === 0 ? null : chunk;
  };
}

export class FrameReader {
  #decoder: FrameDecoder;
  #ready: Frame[] = [];

  constructor(readonly source: ChunkSource, messageMax: number) {
    this.#decoder = new FrameDecoder({ messageMax });
  }

  set messageMax(n: number) {
    this.#decoder.messageMax = n;
  }

  /** The next frame, or null when the stream ended cleanly. Throws WireError or the source's error. */
  async next(): Promise<Frame | null> {
    while (this.#ready.length === 0) {
      const chunk = await this.source();
      if (chunk === null) {
        this.#decoder.finish();
        return null;
      }
      this.#ready = this.#decoder.push(chunk);
    }
    return this.#ready.shift()!;
  }

  /** Frames already decoded and waiting, handed over in bulk to avoid a promise per frame. */
  takeReady(): Frame[] {
    return this.#ready.splice(0);
  }
}
