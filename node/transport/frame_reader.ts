// Reads whole frames from a QUIC receive stream: large reads (the binding's per-call cost is high), then the
// strict FrameDecoder. Shared by the handshake (one frame at a time) and the delivery loop.
import type { RecvStream } from "@number0/iroh";
import { type Frame, FrameDecoder } from "../wire/mod.ts";

const READ_BYTES = 1024 * 1024;

export class FrameReader {
  #decoder: FrameDecoder;
  #ready: Frame[] = [];

  constructor(readonly recv: RecvStream, messageMax: number) {
    this.#decoder = new FrameDecoder({ messageMax });
  }

  set messageMax(n: number) {
    this.#decoder.messageMax = n;
  }

  /** The next frame, or null when the stream ended cleanly. Throws WireError or the binding's error. */
  async next(): Promise<Frame | null> {
    while (this.#ready.length === 0) {
      const chunk = await this.recv.read(READ_BYTES);
      if (chunk.length === 0) {
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
