// `deno task bench` runs on the software adapter too (issue 6: CI smoke-tests the benchmark).
import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
import { gpuAvailable, needs } from "../../support/needs.ts";

const hasGpu = await gpuAvailable();

Deno.test(
  needs("decode benchmark: one JSON line per weight type, with timings", { "a WebGPU adapter": hasGpu }),
  async () => {
    const script = fileURLToPath(new URL("../../../scripts/bench/decode.ts", import.meta.url));
    const dir = await Deno.makeTempDir();
    try {
      const out = await new Deno.Command(Deno.execPath(), {
        args: [
          "run",
          "-A",
          script,
          "--shape",
          "demo",
          "--dir",
          dir,
          "--weights",
          "f32",
          "--runs",
          "1",
          "--prompt",
          "4",
          "--new",
          "4",
        ],
        stdin: "null",
      }).output();
      const text = new TextDecoder().decode(out.stdout);
      assert.equal(out.code, 0, new TextDecoder().decode(out.stderr));
      const lines = text.trim().split("\n").map((l) => JSON.parse(l));
      assert.equal(lines.length, 1);
      const r = lines[0];
      assert.equal(r.bench, "swactor-decode");
      assert.equal(r.weights, "f32");
      assert.ok(r.decode_tok_s > 0 && r.first_token_ms > 0 && r.dispatches_per_token > 0);
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  },
);
