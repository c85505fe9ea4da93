// One iroh endpoint of the WAN measurement, run as its own process (inside a network namespace, see
// netns.ts). `serve` prints {"id","addr"} and answers streams until stdin closes; `dial` connects to
// --peer at --addr (a relay's address), measures, prints one JSON line and exits.
//   deno run -A scripts/wan/iroh_peer.ts serve --bind 10.213.0.6:0
//   deno run -A scripts/wan/iroh_peer.ts dial --bind 10.213.0.2:0 --peer ID --addr 10.213.0.1:PORT \
//     --pings 50 --bytes 4000000
import { Endpoint, EndpointAddr, EndpointId, presetMinimal } from "@number0/iroh";
import type { BiStream, Connection } from "@number0/iroh";
import { parseFlags } from "../../cli/command.ts";
import { scriptArgs } from "../args.ts";

const ALPN = Array.from(new TextEncoder().encode("swactor/wan-bench/1"));
export const PING_BYTES = 32;
const CHUNK = 64 * 1024;
const MODE_ECHO = 1, MODE_SINK = 2;

/** What `dial` prints. */
export interface DialResult {
  /** Round trips of PING_BYTES-byte messages on one stream, ms. */
  rtts: number[];
  /** Bulk throughput, MB/s (null when --bytes is 0). */
  mbps: number | null;
  /** Remote addresses of the selected paths after the measurements (should be the relay's only). */
  selected: string[];
  /** QUIC's own counters for the connection. */
  lostPackets: number;
  udpTxDatagrams: number;
}

export async function endpoint(bind: string): Promise<Endpoint> {
  const b = Endpoint.builder();
  presetMinimal(b);
  b.alpns([ALPN]);
  b.bindAddr(bind);
  return await b.bind();
}

/** Serves every bi stream: echo mode answers each ping; sink mode reads N bytes, then acks one byte. */
export async function serve(ep: Endpoint): Promise<void> {
  for (;;) {
    const incoming = await ep.acceptNext();
    if (!incoming) return;
    (async () => {
      const conn = await (await incoming.accept()).connect();
      for (;;) {
        const bi = await conn.acceptBi().catch(() => null);
        if (!bi) return;
        handleStream(bi).catch(() => {});
      }
    })().catch(() => {});
  }
}

async function handleStream(bi: BiStream): Promise<void> {
  const [mode] = await bi.recv.readExact(1);
  if (mode === MODE_ECHO) {
    for (;;) await bi.send.writeAll(await bi.recv.readExact(PING_BYTES));
  }
  const header = await bi.recv.readExact(4);
  const total = new DataView(new Uint8Array(header).buffer).getUint32(0);
  let got = 0;
  while (got < total) got += (await bi.recv.read(CHUNK)).length;
  await bi.send.writeAll([1]);
}

/** `samples` sequential round trips on one stream (after 5 warm-up ones), ms. */
export async function pings(conn: Connection, samples: number): Promise<number[]> {
  const bi = await conn.openBi();
  await bi.send.writeAll([MODE_ECHO]);
  const msg = Array.from({ length: PING_BYTES }, (_, i) => i);
  const rtts: number[] = [];
  for (let i = 0; i < samples + 5; i++) {
    const t0 = performance.now();
    await bi.send.writeAll(msg);
    await bi.recv.readExact(PING_BYTES);
    if (i >= 5) rtts.push(performance.now() - t0);
    await new Promise((r) => setTimeout(r, 3));
  }
  return rtts;
}

/** Sends `bytes` on a fresh stream in 64 KiB writes; MB/s from the first write to the receiver's ack. */
export async function bulk(conn: Connection, bytes: number): Promise<number> {
  const bi = await conn.openBi();
  const header = new Uint8Array(5);
  header[0] = MODE_SINK;
  new DataView(header.buffer).setUint32(1, bytes);
  const chunk = Array.from({ length: CHUNK }, (_, i) => i & 255);
  const t0 = performance.now();
  await bi.send.writeAll(Array.from(header));
  for (let sent = 0; sent < bytes; sent += CHUNK) {
    await bi.send.writeAll(sent + CHUNK <= bytes ? chunk : chunk.slice(0, bytes - sent));
  }
  await bi.recv.readExact(1);
  return bytes / 1e6 / ((performance.now() - t0) / 1000);
}

/** Connects `ep` to `peer` at `addr`, then measures. */
export async function dial(
  ep: Endpoint,
  peer: string,
  opts: { addr: string; pings: number; bytes: number },
): Promise<DialResult> {
  const conn = await ep.connect(new EndpointAddr(EndpointId.fromString(peer), null, [opts.addr]), ALPN);
  const rtts = opts.pings > 0 ? await pings(conn, opts.pings) : [];
  const mbps = opts.bytes > 0 ? await bulk(conn, opts.bytes) : null;
  const selected = conn.paths().filter((p) => p.isSelected).map((p) => p.remoteAddr);
  const st = conn.stats();
  conn.close(0n, []);
  return { rtts, mbps, selected, lostPackets: st.lostPackets, udpTxDatagrams: st.udpTxDatagrams };
}

if (import.meta.main) {
  const [mode, ...rest] = Deno.args;
  const { values } = scriptArgs(import.meta.url, (args) =>
    parseFlags(args, {
      bind: { type: "string", default: "127.0.0.1:0" },
      peer: { type: "string" },
      addr: { type: "string" },
      pings: { type: "string", default: "50" },
      bytes: { type: "string", default: "0" },
    }), rest);
  const ep = await endpoint(values.bind);
  if (mode === "serve") {
    const host = values.bind.slice(0, values.bind.lastIndexOf(":"));
    const addr = ep.boundSockets().find((s) => s.startsWith(`${host}:`)) ?? ep.boundSockets()[0];
    console.log(JSON.stringify({ id: ep.id().toString(), addr }));
    serve(ep).catch(() => {});
    // Serve until the parent closes our stdin.
    for await (const _ of Deno.stdin.readable) { /* drain */ }
  } else if (mode === "dial") {
    if (!values.peer || !values.addr) throw new TypeError("dial needs --peer ID and --addr HOST:PORT");
    const result = await dial(ep, values.peer, {
      addr: values.addr,
      pings: Number(values.pings),
      bytes: Number(values.bytes),
    });
    console.log(JSON.stringify(result));
  } else {
    console.error(
      "Usage: iroh_peer.ts serve|dial [--bind HOST:0] [--peer ID --addr HOST:PORT --pings N --bytes B]",
    );
    Deno.exit(2);
  }
  await ep.close();
  Deno.exit(0); // iroh's native threads can keep the process alive after the endpoint closes
}
