// One authenticated connection to a peer: the iroh connection with its control stream, and the data
// channel on the iroh connection's second stream or on the TLS path (node/transport/tls_path.ts); each
// channel has a write coalescer and a delivery loop. Only MESSAGE frames are legal after the handshake;
// anything else, or a frame the decoder rejects, closes the link (logged), and never reaches the handlers.
import type { BiStream, Connection } from "@number0/iroh";
import { DATA_MAX_BYTES, type DataPath, FrameKind, WireError } from "../wire/mod.ts";
import { Coalescer, type CoalescerOptions, type WriteSink } from "./coalescer.ts";
import type { FrameReader } from "./frame_reader.ts";
import { irohSink } from "./iroh_handshake.ts";
import type { TlsStream } from "./tls_path.ts";
import type { Channel, PeerAddr } from "./transport.ts";

export type Deliver = (from: PeerAddr, msg: Uint8Array, channel: Channel) => void;
export type Log = (level: "info" | "warn", msg: string) => void;

/** One channel's ordered byte stream, whichever path carries it. */
export interface ChannelPipe {
  path: DataPath;
  write: WriteSink;
  reader: FrameReader;
  /** How the coalescer feeds this pipe. */
  writer: CoalescerOptions;
  /** Closes what closing the iroh connection does not (the TLS connection). */
  close?(): void;
}

export interface LinkStreams {
  control: ChannelPipe;
  data: ChannelPipe;
}

/** An iroh stream as a pipe: writes of at most 1 MiB, with a timer between them (see Coalescer). */
export function irohPipe(stream: BiStream, reader: FrameReader): ChannelPipe {
  return { path: "iroh", write: irohSink(stream), reader, writer: {} };
}

/**
 * A TLS connection as the data channel's pipe: writes of up to 256 KiB, handed straight to the socket.
 * Smaller writes let encryption, the kernel and the receiver overlap: 4 MiB messages went at ~550 MB/s
 * with 1-8 MiB writes and ~1000 MB/s with 64-256 KiB ones (scripts/bench/transport.ts, loopback).
 */
export function tlsPipe(s: TlsStream): ChannelPipe {
  s.reader.messageMax = DATA_MAX_BYTES;
  return {
    path: "tls",
    write: (b) => s.conn.write(b),
    reader: s.reader,
    writer: { maxWriteBytes: 256 * 1024, yieldBetweenWrites: false },
    close: () => s.conn.close(),
  };
}

export interface LinkOptions extends CoalescerOptions {
  deliver: Deliver;
  onClosed: (link: IrohLink) => void;
  log: Log;
}

/**
 * A binding error as one readable line. Their messages carry a Rust backtrace, the build's source paths
 * ("(/root/.cargo/registry/.../socket.rs:946:24)") and the causes on "Caused by:" lines: this keeps the
 * first line and the causes, joined with ": ", without the paths.
 */
export function shortError(e: unknown): string {
  const text = (e instanceof Error ? e.message : String(e)).split(/\n\s*Stack backtrace:/)[0];
  const [head, ...rest] = text.split("\n");
  const causes = rest.map((l) => l.trim().replace(/^\d+: /, "")).filter((l) => l && l !== "Caused by:");
  return [head, ...causes].map((l) => l.replace(/\s*\(?[^\s()]*\.rs:\d+(:\d+)?\)?/g, "").trim())
    .filter((l) => l).join(": ");
}

export class IrohLink {
  #closed = false;
  readonly #writers: Record<Channel, Coalescer>;

  constructor(
    readonly conn: Connection,
    /** The peer, with the addresses it was reached at. */
    readonly peer: PeerAddr,
    /** Identifies the peer's process run (see BOOT_BYTES in wire/messages.ts). */
    readonly peerBoot: string,
    /** True when this node dialed the connection. */
    readonly dialedBySelf: boolean,
    readonly streams: LinkStreams,
    readonly opts: LinkOptions,
  ) {
    const fail = (e: Error) => this.close(`write failed: ${shortError(e)}`);
    const writer = (p: ChannelPipe) =>
      new Coalescer(p.write, fail, { ...p.writer, flushBytes: opts.flushBytes });
    this.#writers = { control: writer(streams.control), data: writer(streams.data) };
    this.#readLoop(streams.control.reader, "control");
    this.#readLoop(streams.data.reader, "data");
    conn.closed().then(
      (why) => this.close(`connection closed: ${why}`),
      (e) => this.close(`connection lost: ${shortError(e)}`),
    );
  }

  get closed(): boolean {
    return this.#closed;
  }

  /** Which path the data channel takes. */
  get dataPath(): DataPath {
    return this.streams.data.path;
  }

  /** Queues one encoded MESSAGE frame; false when the connection is gone. */
  send(channel: Channel, frame: Uint8Array): Promise<boolean> {
    if (this.#closed) return Promise.resolve(false);
    return this.#writers[channel].enqueue(frame);
  }

  close(reason: string, code = 0n): void {
    if (this.#closed) return;
    this.#closed = true;
    for (const w of Object.values(this.#writers)) w.fail(new Error(reason));
    try {
      this.conn.close(code, Array.from(new TextEncoder().encode(reason.slice(0, 100))));
    } catch { /* already closed */ }
    this.streams.data.close?.();
    this.opts.log("info", `link to ${this.peer.id.slice(0, 10)} closed: ${reason}`);
    this.opts.onClosed(this);
  }

  async #readLoop(reader: FrameReader, channel: Channel): Promise<void> {
    try {
      for (;;) {
        const first = await reader.next();
        if (first === null || this.#closed) break;
        for (const f of [first, ...reader.takeReady()]) {
          if (f.kind !== FrameKind.MESSAGE) {
            throw new WireError("malformed", `frame kind ${f.kind} after the handshake`);
          }
          try {
            this.opts.deliver(this.peer, f.payload, channel);
          } catch (e) {
            this.opts.log(
              "warn",
              `handler threw on a ${channel} message from ${this.peer.id.slice(0, 10)}: ${e}`,
            );
          }
        }
      }
      this.close(`${channel} stream ended`);
    } catch (e) {
      if (e instanceof WireError) {
        this.opts.log("warn", `protocol error from ${this.peer.id}: ${e.message}`);
        this.close(`protocol error: ${e.code}`, 2n);
      } else {
        this.close(`${channel} stream lost: ${shortError(e)}`);
      }
    }
  }
}
