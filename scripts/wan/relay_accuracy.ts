// Measures what the relay itself adds: UDP ping-pong round trips direct, and through a relay at several
// one-way delays. Results go into docs/WAN.md.
//   deno run -A scripts/wan/relay_accuracy.ts [--samples 200] [--delays 0,10,25] [--jitter-ms 0]
import dgram from "node:dgram";
import { Buffer } from "node:buffer";
import { parseFlags } from "../../cli/command.ts";
import { startRelay } from "./relay.ts";
import { parseSocketAddr } from "./socket_addr.ts";
import { summarize } from "./summary.ts";
import { scriptArgs } from "../args.ts";

async function bound(onMessage: (m: Buffer, r: dgram.RemoteInfo, s: dgram.Socket) => void) {
  const s = dgram.createSocket("udp4");
  s.on("message", (m, r) => onMessage(m, r, s));
  await new Promise<void>((res) => s.bind(0, "127.0.0.1", res));
  return s;
}

/** Round trips of `samples` sequential pings to `addr`, ms. */
async function pingPong(addr: string, samples: number): Promise<number[]> {
  let wake: (() => void) | undefined;
  const client = await bound(() => wake?.());
  const a = parseSocketAddr(addr);
  const rtts: number[] = [];
  for (let i = 0; i < samples + 5; i++) {
    const t0 = performance.now();
    await new Promise<void>((res) => {
      wake = res;
      client.send(Buffer.alloc(64), a.port, a.host);
    });
    if (i >= 5) rtts.push(performance.now() - t0); // the first few warm up sockets and the scheduler
    await new Promise((r) => setTimeout(r, 2)); // sparse pings, like request/response traffic
  }
  await new Promise<void>((r) => client.close(r));
  return rtts;
}

if (import.meta.main) {
  const { values } = scriptArgs(import.meta.url, (args) =>
    parseFlags(args, {
      samples: { type: "string", default: "200" },
      delays: { type: "string", default: "0,10,25" },
      "jitter-ms": { type: "string", default: "0" },
    }));
  const samples = Number(values.samples);
  const echo = await bound((m, r, s) => s.send(m, r.port, r.address));
  const echoAddr = `127.0.0.1:${echo.address().port}`;
  const rows: string[] = [];
  const direct = summarize(await pingPong(echoAddr, samples));
  rows.push(`| direct (no relay) | ${direct.p50} | ${direct.p10} | ${direct.p90} | ${direct.max} | - |`);
  for (const delayMs of values.delays.split(",").map(Number)) {
    const relay = await startRelay({
      target: echoAddr,
      up: { delayMs, jitterMs: Number(values["jitter-ms"]) },
    });
    const s = summarize(await pingPong(relay.addr, samples));
    const added = (s.p50Raw - 2 * delayMs - direct.p50Raw).toFixed(3);
    rows.push(`| relay, ${delayMs} ms one-way | ${s.p50} | ${s.p10} | ${s.p90} | ${s.max} | ${added} |`);
    await relay.close();
  }
  echo.close();
  console.log(`UDP round trips, ${samples} samples each, ms (${new Date().toISOString()})`);
  console.log("| path | p50 | p10 | p90 | max | p50 - 2 x delay - direct p50 |");
  console.log("|---|---|---|---|---|---|");
  for (const r of rows) console.log(r);
}
