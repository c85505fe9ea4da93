// The serving load benchmark (scripts/bench/serve_load.ts) against a real one-node `up --model` server on the
// software adapter: a line per wave, every request answered; and the server streams each request's tokens
// as they come (its decode loop yields to the event loop between batches; before, a one-node server sent
// every token of a request at its end, so the first token took the whole request's time).
import assert from "node:assert/strict";
import { fixtureDir } from "../../fixtures.ts";
import { gpuAvailable, needs } from "../../support/needs.ts";
import { runScript } from "../../support/run_script.ts";
import { runCli, spawnCli } from "../../cli/run.ts";

const hasGpu = await gpuAvailable();
const tiny = fixtureDir("llama3-tiny", { needs: "tokenizer.json" });

Deno.test({
  ...needs("serve_load benchmark: a line per wave against up --model, tokens streamed as they come", {
    "a WebGPU adapter": hasGpu,
    "../shared/fixtures/llama3-tiny (with tokenizer.json)": tiny,
  }),
  sanitizeResources: false,
  sanitizeOps: false,
  async fn() {
    const env = { SWACTOR_STATE_DIR: await Deno.makeTempDir() };
    const up = spawnCli(["up", "--membership", "test", "--model", tiny!, "--http", "127.0.0.1:0"], { env });
    try {
      const base = (await up.waitFor(/http: (http:\/\/127\.0\.0\.1:\d+)/, 60_000))[1];
      const r = await runScript("bench/serve_load.ts", [
        "--url",
        base,
        "--concurrency",
        "1,2",
        "--tokens",
        "24",
        "--prompt",
        "6",
        "--rounds",
        "2",
      ]);
      assert.equal(r.code, 0, r.stderr);
      assert.deepEqual(r.json.map((l) => [l.concurrency, l.round, l.failed, l.completion_tokens]), [
        [1, 0, 0, 24],
        [1, 1, 0, 24],
        [2, 0, 0, 48],
        [2, 1, 0, 48],
      ]);
      // A lone request's second round (its programs built): the first token long before the last.
      const lone = r.json[1] as Record<string, number>;
      assert.ok(
        lone.ttft_ms_median < lone.wall_ms / 2,
        `first token at ${lone.ttft_ms_median} of ${lone.wall_ms} ms`,
      );
      const bad = await runScript("bench/serve_load.ts", ["--url", "localhost:8080"]);
      assert.equal(bad.code, 2);
      assert.match(bad.stderr, /--url takes http:\/\/HOST:PORT/);
    } finally {
      const down = await runCli(["down"], { env });
      if (down.code !== 0) up.child.kill("SIGKILL");
      await up.code();
      await Deno.remove(env.SWACTOR_STATE_DIR, { recursive: true }).catch(() => {});
    }
  },
});
