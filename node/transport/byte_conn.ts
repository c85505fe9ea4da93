// A TLS connection's two directions behind one small interface, whichever API made it: the dialer's side
// is Deno's own (`Deno.startTls` over a `Deno.TcpConn` with TCP_NODELAY), the listener's side is Deno's
// `node:tls` server, because a `Deno.listenTls` connection cannot turn Nagle's algorithm off: a write
// longer than one TLS record then leaves its last short record waiting for the peer's delayed ACK, and a
// 16 KiB message took 44 ms to echo instead of 0.1 ms (docs/WIRE.md, measured).
import type { TLSSocket } from "node:tls";
import type { ChunkSource } from "./frame_reader.ts";

export interface ByteConn {
  /** The next chunk received, or null once the peer ended the stream. */
  read: ChunkSource;
  /** Resolves once `bytes` are handed to the socket (the caller may then reuse them). */
  write(bytes: Uint8Array): Promise<void>;
  close(): void;
  /** The peer's address, "ip:port". */
  readonly remote: string;
}

/** A Deno connection (the dialer's TLS connection). */
export function denoByteConn(conn: Deno.Conn, readBytes = 1024 * 1024): ByteConn {
  const buf = new Uint8Array(readBytes);
  const a = conn.remoteAddr as Deno.NetAddr;
  return {
    remote: a.hostname.includes(":") ? `[${a.hostname}]:${a.port}` : `${a.hostname}:${a.port}`,
    async read() {
      const n = await conn.read(buf);
      return n === null ? null : buf.subarray(0, n);
    },
    async write(bytes) {
      let o = 0;
      while (o < bytes.length) o += await conn.write(bytes.subarray(o));
    },
    close() {
      try {
        conn.close();
      } catch { /* closed */ }
    },
  };
}

/**
 * A node:tls socket (the listener's side). Received chunks queue until read; past `highWaterBytes` the
 * socket is paused, so a reader that falls behind holds TCP's flow control instead of unbounded memory.
 */
export function nodeByteConn(socket: TLSSocket, highWaterBytes = 8 * 1024 * 1024): ByteConn {
  const queue: Uint8Array[] = [];
  let queued = 0;
  let ended = false;
  let failure: Error | undefined;
  let wake: (() => void) | undefined;
  const notify = () => {
    const w = wake;
    wake = undefined;
    w?.();
  };
  socket.on("data", (chunk: Uint8Array) => {
    queue.push(chunk);
    queued += chunk.length;
    if (queued > highWaterBytes) socket.pause();
    notify();
  });
  socket.on("end", () => {
    ended = true;
    notify();
  });
  socket.on("close", () => {
    ended = true;
    notify();
  });
  socket.on("error", (e: Error) => {
    failure = e;
    notify();
  });
  const host = socket.remoteAddress ?? "?";
  return {
    remote: host.includes(":") ? `[${host}]:${socket.remotePort}` : `${host}:${socket.remotePort}`,
    async read() {
      while (queue.length === 0) {
        if (failure) throw failure;
        if (ended) return null;
        await new Promise<void>((r) => (wake = r));
      }
      const chunk = queue.shift()!;
      queued -= chunk.length;
      if (socket.isPaused() && queued <= highWaterBytes / 2) socket.resume();
      return chunk;
    },
    write(bytes) {
      if (failure) return Promise.reject(failure);
      if (socket.destroyed) return Promise.reject(new Error("the connection is closed"));
      return new Promise<void>((resolve, reject) => {
        socket.write(bytes, (e?: Error | null) => (e ? reject(e) : resolve()));
      });
    },
    close() {
      socket.destroy();
    },
  };
}
