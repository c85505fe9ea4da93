// Proves the relay with iroh and measures it: round trips of small messages on one stream, and bulk
// throughput, through emulated links (delay, jitter, loss, rate cap). Markdown tables go to stdout;
// docs/WAN.md holds a run.
//
// Default (needs root): the two endpoints run as processes in two isolated network namespaces
// (netns.ts) and can reach each other only through the relay in the root namespace. With --loopback,
// both run in this process on 127.0.0.1, which shows why the namespaces are needed: iroh learns the
// peer's real address in the handshake and leaves a slower relay at once (the script flags it).
//   deno run -A scripts/wan/iroh_rtt.ts [--samples 50] [--delays 0,10,25] [--mbytes 4] [--quick] [--loopback]
import { fileURLToPath as fromFileUrl } from "node:url";
import { parseFlags } from "../../cli/command.ts";
import type { LinkSpec } from "./link.ts";
import { dial, type DialResult, endpoint, PING_BYTES, serve } from "./iroh_peer.ts";
import { createNetns, type NetnsSet } from "./netns.ts";
import { type RelayStats, startRelay } from "./relay.ts";
import { summarize } from "./summary.ts";
import { scriptArgs } from "../args.ts";

const repoRoot = fromFileUrl(new URL("../../", import.meta.url));
const peerScript = fromFileUrl(new URL("./iroh_peer.ts", import.meta.url));

/** Runs one dial through a relay with `link` (or directly when null): the result, relay counters and address. */
type Measure = (
  link: LinkSpec | null,
  pings: number,
  bytes: number,
) => Promise<[DialResult, RelayStats | null, string | null]>;

/** The selected path, flagged when a relay was there and iroh went around it. */
function pathColumn(r: DialResult, relayAddr: string | null): string {
  const path = r.selected.join(" ");
  return relayAddr && (r.selected.length !== 1 || r.selected[0] !== relayAddr)
    ? `${path} (BYPASSED the relay)`
    : path;
}

/** Both endpoints in this process on loopback. */
async function loopbackMeasure(): Promise<{ measure: Measure; close: () => Promise<void> }> {
  const server = await endpoint("127.0.0.1:0");
  serve(server).catch(() => {});
  const serverAddr = server.boundSockets().find((s) => s.startsWith("127.0.0.1"))!;
  const measure: Measure = async (link, pings, bytes) => {
    const relay = link ? await startRelay({ target: serverAddr, up: link }) : null;
    const client = await endpoint("127.0.0.1:0"); // fresh, so no address is remembered between runs
    try {
      const r = await dial(client, server.id().toString(), { addr: relay?.addr ?? serverAddr, pings, bytes });
      return [r, relay?.stats() ?? null, relay?.addr ?? null];
    } finally {
      await client.close();
      await relay?.close();
    }
  };
  return { measure, close: () => server.close() };
}

/** Server in namespace 1, a fresh dialer process per measurement in namespace 0, relays in the root. */
async function netnsMeasure(): Promise<{ measure: Measure; close: () => Promise<void> }> {
  const net: NetnsSet = await createNetns(2);
  const deno = Deno.execPath();
  const server = new Deno.Command(net.command(1, [])[0], {
    args: [
      ...net.command(1, [deno, "run", "-A", peerScript, "serve", "--bind", `${net.nodes[1].nodeIp}:0`])
        .slice(1),
    ],
    cwd: repoRoot,
    stdin: "piped",
    stdout: "piped",
  }).spawn();
  const reader = server.stdout.pipeThrough(new TextDecoderStream()).getReader();
  let first = "";
  while (!first.includes("\n")) {
    const { value, done } = await reader.read();
    if (done) throw new Error("iroh server process exited before printing its address");
    first += value;
  }
  const { id, addr: serverAddr } = JSON.parse(first.split("\n")[0]);
  const measure: Measure = async (link, pings, bytes) => {
    // A null link still goes through a relay: in namespaces there is no other way across.
    const relay = await startRelay({
      listen: `${net.nodes[0].hostIp}:0`,
      target: serverAddr,
      up: link ?? {},
    });
    try {
      const argv = [
        deno,
        "run",
        "-A",
        peerScript,
        "dial",
        "--bind",
        `${net.nodes[0].nodeIp}:0`,
        "--peer",
        id,
      ];
      argv.push("--addr", relay.addr, "--pings", `${pings}`, "--bytes", `${bytes}`);
      const [cmd, ...args] = net.command(0, argv);
      const out = await new Deno.Command(cmd, { args, cwd: repoRoot, stdout: "piped" }).output();
      if (!out.success) throw new Error(`dialer failed with code ${out.code}`);
      const result: DialResult = JSON.parse(new TextDecoder().decode(out.stdout).trim().split("\n").pop()!);
      return [result, relay.stats(), relay.addr];
    } finally {
      await relay.close();
    }
  };
  return {
    measure,
    close: async () => {
      await server.stdin.close().catch(() => {});
      await server.status;
      await net.close();
    },
  };
}

const describe = (l: LinkSpec | null) =>
  l === null ? "direct (no relay)" : Object.keys(l).length === 0 ? "relay, no impairment" : [
    `${l.delayMs ?? 0} ms`,
    l.jitterMs ? `jitter ${l.jitterMs} ms` : "",
    l.loss ? `loss ${(l.loss * 100).toFixed(0)}%` : "",
    l.rateBytesPerSec ? `${l.rateBytesPerSec * 8 / 1e6} Mbit/s` : "",
  ].filter(Boolean).join(", ");

if (import.meta.main) {
  const { values } = scriptArgs(import.meta.url, (args) =>
    parseFlags(args, {
      samples: { type: "string", default: "50" },
      delays: { type: "string", default: "0,10,25" },
      mbytes: { type: "string", default: "4" },
      quick: { type: "boolean" },
      loopback: { type: "boolean" },
    }));
  const samples = values.quick ? 10 : Number(values.samples);
  const bytes = Math.round(Number(values.mbytes) * 1e6 / (values.quick ? 4 : 1));
  const delays = values.delays.split(",").map(Number);
  const mode = values.loopback ? "loopback, one process" : "two network namespaces, relay in the root one";
  const env = values.loopback ? await loopbackMeasure() : await netnsMeasure();
  const cleanup = () => env.close().finally(() => Deno.exit(130));
  Deno.addSignalListener("SIGINT", cleanup);
  try {
    console.log(`# iroh through the WAN relay (${new Date().toISOString()}; ${mode})\n`);
    console.log(`Round trips of ${PING_BYTES}-byte messages on one open stream, ${samples} samples, ms.\n`);
    console.log("| link (each direction) | p50 | p10 | p90 | max | p50 - 2 x delay | relay drops | path |");
    console.log("|---|---|---|---|---|---|---|---|");
    const rttLinks: (LinkSpec | null)[] = [
      ...(values.loopback ? [null] : []),
      ...delays.map((d) => ({ delayMs: d })),
      { delayMs: 10, jitterMs: 2 },
      { delayMs: 10, loss: 0.01 },
      { delayMs: 10, loss: 0.05 },
    ];
    for (const link of rttLinks) {
      const [r, st, relayAddr] = await env.measure(link, samples, 0);
      const s = summarize(r.rtts);
      const excess = (s.p50Raw - 2 * (link?.delayMs ?? 0)).toFixed(3);
      const drops = st ? `${st.up.lost + st.down.lost + st.up.queueDrops + st.down.queueDrops}` : "-";
      const path = pathColumn(r, relayAddr);
      console.log(
        `| ${describe(link)} | ${s.p50} | ${s.p10} | ${s.p90} | ${s.max} | ${excess} | ${drops} | ${path} |`,
      );
    }
    console.log(
      `\nBulk: ${(bytes / 1e6).toFixed(1)} MB on one stream in 64 KiB writes, first write to ack.\n`,
    );
    console.log(
      "| link (each direction) | MB/s | Mbit/s | relay datagrams up / down | queue drops | lost | path |",
    );
    console.log("|---|---|---|---|---|---|---|");
    const bulkLinks: (LinkSpec | null)[] = [
      ...(values.loopback ? [null] : []),
      {},
      { delayMs: 10 },
      { delayMs: 10, rateBytesPerSec: 50e6 / 8 },
      { delayMs: 10, rateBytesPerSec: 20e6 / 8 },
      { delayMs: 25, rateBytesPerSec: 20e6 / 8 },
      { delayMs: 10, loss: 0.01 },
      { delayMs: 10, loss: 0.05 },
    ];
    for (const link of bulkLinks) {
      const [r, st, relayAddr] = await env.measure(link, 0, bytes);
      const relayCols = st
        ? `${st.up.packets} / ${st.down.packets} | ${st.up.queueDrops + st.down.queueDrops} | ${
          st.up.lost + st.down.lost
        }`
        : "- | - | -";
      const mbps = r.mbps!;
      console.log(
        `| ${describe(link)} | ${mbps.toFixed(2)} | ${(mbps * 8).toFixed(1)} | ${relayCols} | ${
          pathColumn(r, relayAddr)
        } |`,
      );
    }
  } finally {
    await env.close();
  }
  Deno.exit(0); // iroh's native threads can keep the process alive after the endpoints close
}
