// What one node's transport moves to another node process on this machine, per message size and path:
//   tls   swactor's transport as configured by default: the data channel on the TLS path (node/transport/
//         tls_path.ts), authenticated by the ticket secret;
//   iroh  swactor's transport with the TLS path off: the data channel on the iroh stream (the fallback for
//         relayed peers, and the only path before issue 14), authenticated the same way;
//   tcp   bare loopback TCP between the same two processes (a length prefix, no TLS, no proof): the floor.
// Throughput: messages sent back to back on the data channel (each `send` resolves once queued) until
// `--seconds` have passed, timed until the peer acknowledges the last one. Round trip: one message of the
// size echoed back, one at a time; the median.
//
// Usage: deno run -A scripts/bench/transport.ts [--seconds 2] [--sizes 64,4096,...] [--paths tls,iroh,tcp]
//        [--json]     (--json: one JSON line per path and size, as in docs/WIRE.md; otherwise a table)
// The peer is this script run with --peer (it reads its setup from stdin, so the secret is not in argv).
import { parseArgs } from "node:util";
import { scriptArgs } from "../args.ts";
import { createIrohTransport, type IrohTransport } from "../../node/transport/iroh.ts";
import type { PeerAddr } from "../../node/transport/transport.ts";
import { bytesToHex, hexToBytes, newSecret } from "../../node/ticket.ts";

const { values } = scriptArgs(import.meta.url, (args) =>
  parseArgs({
    args,
    options: {
      seconds: { type: "string", default: "2" },
      sizes: { type: "string", default: `64,${4 << 10},${16 << 10},${256 << 10},${4 << 20}` },
      paths: { type: "string", default: "tls,iroh,tcp" },
      json: { type: "boolean", default: false },
      peer: { type: "boolean", default: false },
    },
  }));

type Path = "tls" | "iroh" | "tcp";
const PING = 1, BULK = 2, END = 3, ACK = 4;

/** A message: kind byte, then padding to the size. */
function message(kind: number, size: number): Uint8Array {
  const m = new Uint8Array(Math.max(1, size));
  m[0] = kind;
  return m;
}

if (values.peer) await peer();
else await main();

// ---- the peer process ----------------------------------------------------------------------------------

async function peer(): Promise<void> {
  const setup = JSON.parse(await firstLine(Deno.stdin.readable)) as { path: Path; secret: string };
  if (setup.path === "tcp") return await tcpPeer();
  const t = await createIrohTransport({
    secret: hexToBytes(setup.secret),
    tls: setup.path === "tls" ? undefined : false,
    log: () => {},
  });
  let bulk = 0;
  t.onMessage((from, msg) => {
    if (msg[0] === PING) void t.send(from, msg, "data");
    else if (msg[0] === BULK) bulk++;
    else if (msg[0] === END) {
      const ack = new Uint8Array(5);
      ack[0] = ACK;
      new DataView(ack.buffer).setUint32(1, bulk);
      bulk = 0;
      void t.send(from, ack, "data");
    }
  });
  console.log(JSON.stringify(t.self));
  await new Promise(() => {}); // until killed
}

async function tcpPeer(): Promise<void> {
  const l = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  console.log(JSON.stringify({ port: (l.addr as Deno.NetAddr).port }));
  const conn = await l.accept();
  conn.setNoDelay(true);
  const r = lengthPrefixed(conn);
  let bulk = 0;
  for (;;) {
    const msg = await r.next();
    if (!msg) return;
    if (msg[0] === PING) await r.write(msg);
    else if (msg[0] === BULK) bulk++;
    else if (msg[0] === END) {
      const ack = new Uint8Array(5);
      ack[0] = ACK;
      new DataView(ack.buffer).setUint32(1, bulk);
      bulk = 0;
      await r.write(ack);
    }
  }
}

/** u32 length + bytes over a TCP connection (the floor: no TLS, no frame checks, no proof). */
function lengthPrefixed(conn: Deno.Conn) {
  let buf = new Uint8Array(1 << 20);
  let start = 0, end = 0;
  let writing = Promise.resolve();
  const fill = async (need: number) => {
    while (end - start < need) {
      if (start + need > buf.length) {
        const next = new Uint8Array(Math.max(buf.length, need * 2));
        next.set(buf.subarray(start, end));
        end -= start;
        start = 0;
        buf = next;
      }
      const n = await conn.read(buf.subarray(end));
      if (n === null) return false;
      end += n;
    }
    return true;
  };
  return {
    async next(): Promise<Uint8Array | null> {
      if (!(await fill(4))) return null;
      const n = new DataView(buf.buffer, buf.byteOffset + start).getUint32(0);
      if (!(await fill(4 + n))) return null;
      const msg = buf.slice(start + 4, start + 4 + n);
      start += 4 + n;
      if (start === end) start = end = 0;
      return msg;
    },
    /** Writes one message after the ones before it (concurrent writes would interleave their bytes). */
    write(msg: Uint8Array): Promise<void> {
      const out = new Uint8Array(4 + msg.length);
      new DataView(out.buffer).setUint32(0, msg.length);
      out.set(msg, 4);
      writing = writing.then(async () => {
        let o = 0;
        while (o < out.length) o += await conn.write(out.subarray(o));
      });
      return writing;
    },
  };
}

/** The first line of a stream ("" if it ends first); the rest of the stream is left unread. */
async function firstLine(stream: ReadableStream<Uint8Array>): Promise<string> {
  const reader = stream.getReader();
  let text = "";
  const dec = new TextDecoder();
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    text += dec.decode(value, { stream: true });
    const i = text.indexOf("\n");
    if (i >= 0) {
      text = text.slice(0, i);
      break;
    }
  }
  reader.releaseLock();
  return text;
}

// ---- the measuring process -----------------------------------------------------------------------------

interface Result {
  path: Path;
  bytes: number;
  msgs_s: number;
  mb_s: number;
  rtt_ms: number;
  default: boolean;
  authenticated: boolean;
}

/** One path's link to a fresh peer process: send, and wait for the next message back. */
interface Link {
  send(msg: Uint8Array): Promise<unknown>;
  next(): Promise<Uint8Array>;
  /** The path this link's data takes (for the transport: what it chose). */
  path: Path;
  close(): Promise<void>;
}

async function startPeer(path: Path, secret: Uint8Array) {
  const self = new URL(import.meta.url).pathname;
  const child = new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", "--quiet", self, "--peer"],
    stdin: "piped",
    stdout: "piped",
    stderr: "inherit",
  }).spawn();
  const w = child.stdin.getWriter();
  await w.write(new TextEncoder().encode(JSON.stringify({ path, secret: bytesToHex(secret) }) + "\n"));
  const first = await firstLine(child.stdout);
  if (!first) throw new Error(`the ${path} peer exited before it started`);
  return {
    info: JSON.parse(first),
    async stop() {
      child.kill("SIGKILL");
      await child.status;
      await w.close().catch(() => {});
    },
  };
}

async function connect(path: Path): Promise<Link> {
  const secret = newSecret();
  const p = await startPeer(path, secret);
  const inbox: Uint8Array[] = [];
  let wake: (() => void) | undefined;
  const push = (m: Uint8Array) => {
    inbox.push(m);
    wake?.();
  };
  const next = async () => {
    while (inbox.length === 0) await new Promise<void>((r) => (wake = r));
    return inbox.shift()!;
  };
  if (path === "tcp") {
    const conn = await Deno.connect({ hostname: "127.0.0.1", port: p.info.port });
    conn.setNoDelay(true);
    const r = lengthPrefixed(conn);
    (async () => {
      for (let m = await r.next(); m; m = await r.next()) push(m);
    })().catch(() => {});
    return {
      path,
      send: (m) => r.write(m),
      next,
      async close() {
        conn.close();
        await p.stop();
      },
    };
  }
  const t: IrohTransport = await createIrohTransport({
    secret,
    tls: path === "tls" ? undefined : false,
    log: () => {},
  });
  t.onMessage((_, m) => push(m));
  const to = p.info as PeerAddr;
  await t.connect(to);
  const chosen = t.dataPath(to.id);
  if (chosen !== path) throw new Error(`asked for the ${path} path, the transport chose ${chosen}`);
  return {
    path,
    send: (m) => t.send(to, m, "data"),
    next,
    async close() {
      await t.close();
      await p.stop();
    },
  };
}

async function measure(
  link: Link,
  size: number,
  seconds: number,
): Promise<{ msgs: number; s: number; rtt: number }> {
  const bulk = message(BULK, size);
  const window = Math.max(1, Math.floor((1 << 20) / size));
  // Warm up (connection windows, JIT), then the timed run.
  for (const ms of [Math.min(200, seconds * 100), seconds * 1000]) {
    let sent = 0;
    const t0 = performance.now();
    while (performance.now() - t0 < ms) {
      const batch: Promise<unknown>[] = [];
      for (let i = 0; i < window; i++) batch.push(link.send(bulk));
      await Promise.all(batch);
      sent += window;
    }
    await link.send(message(END, 1));
    const ack = await link.next();
    const s = (performance.now() - t0) / 1000;
    const got = new DataView(ack.buffer, ack.byteOffset).getUint32(1);
    if (ack[0] !== ACK || got !== sent) {
      throw new Error(`${link.path}: the peer got ${got} of ${sent} messages`);
    }
    if (ms === seconds * 1000) {
      const rtts: number[] = [];
      const ping = message(PING, size);
      const r0 = performance.now();
      while (rtts.length < 5 || (rtts.length < 500 && performance.now() - r0 < seconds * 500)) {
        const t = performance.now();
        await link.send(ping);
        const back = await link.next();
        rtts.push(performance.now() - t);
        if (back.length !== ping.length) {
          throw new Error(`${link.path}: echo of ${back.length} bytes, sent ${size}`);
        }
      }
      rtts.sort((a, b) => a - b);
      return { msgs: sent, s, rtt: rtts[rtts.length >> 1] };
    }
  }
  throw new Error("unreachable");
}

async function main(): Promise<void> {
  const seconds = Number(values.seconds);
  const sizes = values.sizes.split(",").map(Number);
  const paths = values.paths.split(",") as Path[];
  for (const p of paths) {
    if (!["tls", "iroh", "tcp"].includes(p)) throw new Error(`--paths: unknown path "${p}" (tls, iroh, tcp)`);
  }
  // The default: what two nodes on this machine, configured as `up`/`join` configure them, choose.
  const defaultPath = await (async () => {
    const l = await connect("tls").catch(() => undefined);
    await l?.close();
    return l ? "tls" : "iroh";
  })();
  if (!values.json) {
    console.log(`path  size        msg/s        MB/s   rtt ms   (default path: ${defaultPath})`);
  }
  for (const path of paths) {
    for (const size of sizes) {
      const link = await connect(path);
      try {
        const r = await measure(link, size, seconds);
        const res: Result = {
          path,
          bytes: size,
          msgs_s: Math.round(r.msgs / r.s),
          mb_s: Number((r.msgs * size / r.s / 1e6).toFixed(2)),
          rtt_ms: Number(r.rtt.toFixed(3)),
          default: path === defaultPath,
          authenticated: path !== "tcp",
        };
        if (values.json) console.log(JSON.stringify(res));
        else {
          console.log(
            `${path.padEnd(5)} ${String(size).padEnd(9)} ${String(res.msgs_s).padStart(8)} ${
              res.mb_s.toFixed(1).padStart(10)
            } ${res.rtt_ms.toFixed(3).padStart(8)}`,
          );
        }
      } finally {
        await link.close();
      }
    }
  }
}
