import assert from "node:assert/strict";
import dgram from "node:dgram";
import { Buffer } from "node:buffer";
import { fileURLToPath } from "node:url";

const script = fileURLToPath(new URL("../../../scripts/wan/relay.ts", import.meta.url));

function relayProcess(args: string[]) {
  return new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", script, ...args],
    stdout: "piped",
    stderr: "piped",
  });
}

Deno.test("the CLI rejects bad usage with exit code 2", async () => {
  const missing = await relayProcess(["--delay-ms", "3"]).output();
  assert.equal(missing.code, 2);
  assert.match(new TextDecoder().decode(missing.stderr), /--target HOST:PORT is required/);
  const bad = await relayProcess(["--target", "127.0.0.1:9", "--loss", "2"]).output();
  assert.equal(bad.code, 2);
  assert.match(new TextDecoder().decode(bad.stderr), /--loss must be <= 1/);
});

Deno.test("the CLI prints its address, relays with the given delay, and reports counters on SIGINT", async () => {
  const sink = dgram.createSocket("udp4");
  const got: number[] = [];
  sink.on("message", () => got.push(performance.now()));
  await new Promise<void>((r) => sink.bind(0, "127.0.0.1", r));
  const child = relayProcess(["--target", `127.0.0.1:${sink.address().port}`, "--delay-ms", "20"]).spawn();
  const reader = child.stdout.pipeThrough(new TextDecoderStream()).getReader();
  let line = "";
  while (!line.includes("\n")) line += (await reader.read()).value ?? "";
  reader.releaseLock();
  const [host, port] = [line.trim().split(":")[0], Number(line.trim().split(":")[1])];
  assert.equal(host, "127.0.0.1");
  const client = dgram.createSocket("udp4");
  const t0 = performance.now();
  await new Promise((r) => client.send(Buffer.from("x"), port, host, r));
  const end = performance.now() + 2000;
  while (got.length === 0 && performance.now() < end) await new Promise((r) => setTimeout(r, 2));
  assert.equal(got.length, 1);
  assert.ok(got[0] - t0 >= 19.4, `arrived after ${got[0] - t0} ms, expected >= 20 less the 0.5 ms slack`);
  child.kill("SIGINT");
  const [status, stderr] = await Promise.all([child.status, new Response(child.stderr).text()]);
  await child.stdout.cancel().catch(() => {});
  assert.equal(status.code, 0);
  assert.equal(JSON.parse(stderr.trim().split("\n").pop()!).up.delivered, 1);
  client.close();
  sink.close();
});
