// up's HTTP server flags as bad input: exit 2 with one line naming the flag, before any node starts (no
// process left behind). None of these needs a GPU.
import assert from "node:assert/strict";
import { fixtureDir } from "../fixtures.ts";
import { childrenOf, spawnCli } from "./run.ts";

const micro = fixtureDir("llama-micro")!;

async function expectBadInput(args: string[], message: RegExp) {
  const p = spawnCli(["up", ...args], {
    env: { SWACTOR_NO_GPU: "1", SWACTOR_STATE_DIR: await Deno.makeTempDir() },
  });
  const timer = setTimeout(() => p.child.kill("SIGKILL"), 30_000);
  const code = await p.code();
  clearTimeout(timer);
  assert.equal(code, 2, `exit code of up ${args.join(" ")}:\n${p.stderr()}`);
  assert.match(p.stderr(), message);
  assert.equal(p.stderr().split("\n").filter((l) => l.startsWith("swactor ")).length, 1, p.stderr());
  assert.doesNotMatch(p.stderr(), /^ticket:/m, "no node started");
  assert.deepEqual(childrenOf(p.pid), []);
}

Deno.test("up's --http, --api-key, --insecure, --parallel, --queue: bad values exit 2 naming the flag", async (t) => {
  await t.step(
    "--http garbage",
    () => expectBadInput(["--model", micro, "--http", "garbage"], /--http expects IP:PORT/),
  );
  await t.step(
    "a non-loopback --http without a key",
    () =>
      expectBadInput(
        ["--model", micro, "--http", "0.0.0.0:0"],
        /--http 0\.0\.0\.0:0 is reachable from other machines.*--api-key/,
      ),
  );
  await t.step(
    "a key anyone could guess",
    () =>
      expectBadInput(
        ["--model", micro, "--http", "0.0.0.0:0", "--api-key", "abc"],
        /--api-key must be at least 8/,
      ),
  );
  await t.step(
    "--http without --model",
    () => expectBadInput(["--http", "127.0.0.1:0"], /--http .*needs --model/),
  );
  await t.step(
    "--parallel 0",
    () => expectBadInput(["--model", micro, "--parallel", "0"], /--parallel must be >= 1/),
  );
  await t.step(
    "--queue -1",
    () => expectBadInput(["--model", micro, "--queue", "-1"], /--queue must be >= 0/),
  );
  await t.step("a busy --http port", async () => {
    const busy = Deno.listen({ hostname: "127.0.0.1", port: 0 });
    try {
      const port = (busy.addr as Deno.NetAddr).port;
      await expectBadInput(
        ["--model", micro, "--http", `127.0.0.1:${port}`],
        new RegExp(`--http 127\\.0\\.0\\.1:${port}: cannot serve there`),
      );
    } finally {
      busy.close();
    }
  });
});
