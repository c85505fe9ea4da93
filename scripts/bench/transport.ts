// Throughput one node can push to another over the iroh binding on loopback:
//  (1) plain: one binding write per message (writeAll of a length-prefixed frame, awaited), the binding's
//      raw per-message cost;
//  (2) swactor's transport: frames coalesced per microtask/256 KiB into one write, read in 1 MiB chunks.
// Usage: deno run -A scripts/bench/transport.ts [--seconds 3]. Results go into docs/WIRE.md by hand.
import iroh from "@number0/iroh";
import { createIrohTransport } from "../../node/transport/iroh.ts";
import { newSecret } from "../../node/ticket.ts";
import { encodeFrame, FrameKind } from "../../node/wire/mod.ts";

const { Endpoint, EndpointAddr, presetMinimal } = iroh;
const seconds = Number(Deno.args[Deno.args.indexOf("--seconds") + 1] || 3) || 3;
const ALPN = Array.from(new TextEncoder().encode("bench"));

async function plain(size: number): Promise<{ msgs: number; bytes: number; s: number }> {
  const bind = async () => {
    const b = Endpoint.builder();
    presetMinimal(b);
    b.alpns([ALPN]);
    b.bindAddr("127.0.0.1:0");
    return await b.bind();
  };
  const [a, b] = [await bind(), await bind()];
  let got = 0;
  const server = (async () => {
    const conn = await (await (await b.acceptNext())!.accept()).connect();
    const bi = await conn.acceptBi();
    for (;;) {
      const chunk = await bi.recv.read(1 << 20).catch(() => []);
      if (chunk.length === 0) break;
      got += chunk.length;
    }
  })();
  const conn = await a.connect(new EndpointAddr(b.id(), null, b.boundSockets().slice(0, 1)), ALPN);
  const bi = await conn.openBi();
  const frame = Array.from(encodeFrame(FrameKind.MESSAGE, new Uint8Array(size)));
  const t0 = performance.now();
  let sent = 0;
  while (performance.now() - t0 < seconds * 1000) {
    await bi.send.writeAll(Array.from(frame)); // a fresh Array per message, as a naive caller would
    sent++;
  }
  await bi.send.finish();
  while (got < sent * frame.length) await new Promise((r) => setTimeout(r, 5));
  const s = (performance.now() - t0) / 1000;
  conn.close(0n, []);
  await server;
  await a.close();
  await b.close();
  return { msgs: sent, bytes: sent * size, s };
}

async function swactor(size: number): Promise<{ msgs: number; bytes: number; s: number }> {
  const secret = newSecret();
  const a = await createIrohTransport({ secret, log: () => {} });
  const b = await createIrohTransport({ secret, log: () => {} });
  let got = 0;
  b.onMessage(() => void got++);
  await a.send(b.self, new Uint8Array(1), "data");
  while (got < 1) await new Promise((r) => setTimeout(r, 5));
  got = 0;
  const msg = new Uint8Array(size);
  const t0 = performance.now();
  let sent = 0;
  while (performance.now() - t0 < seconds * 1000) {
    // A window of sends per turn: send() resolves once queued, so this measures the pipelined rate.
    const batch: Promise<boolean>[] = [];
    for (let i = 0; i < Math.max(1, Math.floor(256 * 1024 / size)); i++) {
      batch.push(a.send(b.self, msg, "data"));
    }
    await Promise.all(batch);
    sent += batch.length;
  }
  while (got < sent) await new Promise((r) => setTimeout(r, 5));
  const s = (performance.now() - t0) / 1000;
  await a.close();
  await b.close();
  return { msgs: sent, bytes: sent * size, s };
}

const fmt = (r: { msgs: number; bytes: number; s: number }) =>
  `${Math.round(r.msgs / r.s).toString().padStart(8)} msg/s ${
    (r.bytes / r.s / 1e6).toFixed(2).padStart(7)
  } MB/s`;

console.log(`size      plain (one write per message)      swactor (coalesced)`);
for (const size of [64, 1024, 16 * 1024, 256 * 1024]) {
  const p = await plain(size);
  const s = await swactor(size);
  console.log(`${String(size).padEnd(8)}  ${fmt(p)}     ${fmt(s)}`);
}
