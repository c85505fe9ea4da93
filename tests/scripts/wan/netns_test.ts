// Needs root and iproute2 (skipped otherwise): namespaces are the only way to keep iroh on the relay.
import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
import { createNetns } from "../../../scripts/wan/netns.ts";
import { startRelay } from "../../../scripts/wan/relay.ts";
import type { DialResult } from "../../../scripts/wan/iroh_peer.ts";
import { needs } from "../../support/needs.ts";

// Root alone is not enough (a container may lack CAP_NET_ADMIN): probe by creating one namespace.
const canNetns = Deno.uid() === 0 &&
  await createNetns(1).then((n) => n.close().then(() => true), () => false);
const NETNS = "root with CAP_NET_ADMIN and iproute2";

async function run(argv: string[]): Promise<{ ok: boolean; out: string; err: string }> {
  const o = await new Deno.Command(argv[0], { args: argv.slice(1), stdout: "piped", stderr: "piped" })
    .output();
  return { ok: o.success, out: new TextDecoder().decode(o.stdout), err: new TextDecoder().decode(o.stderr) };
}

Deno.test({
  ...needs("a node reaches its own veth's root side, and no other node", { [NETNS]: canNetns }),
  fn: async () => {
    const net = await createNetns(2);
    try {
      const [a, b] = net.nodes;
      assert.ok((await run(net.command(0, ["ip", "route", "get", a.hostIp]))).ok);
      const other = await run(net.command(0, ["ip", "route", "get", b.nodeIp]));
      assert.ok(
        !other.ok && /unreachable/i.test(other.err),
        `route to the other node: ${other.out}${other.err}`,
      );
    } finally {
      await net.close();
    }
    const left = await run(["ip", "netns", "list"]);
    assert.ok(!net.nodes.some((n) => left.out.includes(n.ns)), "close must delete the namespaces");
  },
});

Deno.test({
  ...needs("iroh between two namespaces stays on the relay and sees its delay", { [NETNS]: canNetns }),
  fn: async () => {
    const net = await createNetns(2);
    const deno = Deno.execPath();
    const peer = fileURLToPath(new URL("../../../scripts/wan/iroh_peer.ts", import.meta.url));
    const cwd = fileURLToPath(new URL("../../../", import.meta.url));
    const [cmd, ...args] = net.command(1, [
      deno,
      "run",
      "-A",
      peer,
      "serve",
      "--bind",
      `${net.nodes[1].nodeIp}:0`,
    ]);
    const server = new Deno.Command(cmd, { args, cwd, stdin: "piped", stdout: "piped" }).spawn();
    const relay = { close: async () => {} } as { close(): Promise<void> };
    try {
      const reader = server.stdout.pipeThrough(new TextDecoderStream()).getReader();
      let line = "";
      while (!line.includes("\n")) line += (await reader.read()).value ?? "";
      reader.releaseLock();
      const { id, addr } = JSON.parse(line);
      const r = await startRelay({ listen: `${net.nodes[0].hostIp}:0`, target: addr, up: { delayMs: 15 } });
      relay.close = r.close;
      const dialArgv = [deno, "run", "-A", peer, "dial", "--bind", `${net.nodes[0].nodeIp}:0`, "--peer", id];
      dialArgv.push("--addr", r.addr, "--pings", "5");
      const out = await new Deno.Command(net.command(0, dialArgv)[0], {
        args: net.command(0, dialArgv).slice(1),
        cwd,
        stdout: "piped",
      }).output();
      assert.ok(out.success, "dialer failed");
      const result: DialResult = JSON.parse(new TextDecoder().decode(out.stdout).trim().split("\n").pop()!);
      assert.deepEqual(result.selected, [r.addr]);
      const fastest = Math.min(...result.rtts);
      // (The relay may deliver up to its 0.5 ms scheduling slack early in each direction.)
      assert.ok(fastest >= 28.9, `round trip ${fastest} ms is below 2 x 15 ms: iroh went around the relay`);
      assert.ok(r.stats().up.delivered > 0 && r.stats().down.delivered > 0);
    } finally {
      await relay.close();
      await server.stdin.close().catch(() => {});
      await server.stdout.cancel().catch(() => {});
      await server.status;
      await net.close();
    }
  },
});
