// `deno task bench` runs on the software adapter too (issue 6: CI smoke-tests the benchmark).
import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
import { gpuAvailable, needs } from "../../support/needs.ts";
import { runScript } from "../../support/run_script.ts";

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

Deno.test(
  needs("decode benchmark: --k --marginal gives each kind of dispatch's share of each step", {
    "a WebGPU adapter": hasGpu,
  }),
  async () => {
    const dir = await Deno.makeTempDir();
    try {
      const r = await runScript("bench/decode.ts", [
        ..."--shape demo --weights f32 --k 2 --skip-decode --marginal --prompt 4 --new 4 --dir".split(" "),
        dir,
      ]);
      assert.equal(r.code, 0, r.stderr);
      assert.equal(r.json.length, 1, r.stdout);
      const m = r.json[0].k_marginal_ms as Record<string, Record<string, number>>;
      for (const step of ["decode", "2"]) {
        const kinds = Object.keys(m[step] ?? {});
        // embed, per layer qkv / attention / o_proj / gate-up / down, the head, the argmax or sampler
        assert.ok(kinds.length >= 6, `${step}: ${kinds.join(", ")}`);
        assert.ok(kinds.some((k) => k.startsWith("attention@")), kinds.join(", "));
        assert.ok(Object.values(m[step]).every(Number.isFinite), JSON.stringify(m[step]));
      }
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  },
);

Deno.test(
  needs("decode benchmark: --rounds times the baseline and each --tunings setting in turn, lines tagged", {
    "a WebGPU adapter": hasGpu,
  }),
  async () => {
    // The tiniest Llama fixture (a copy: the script must not touch the fixtures), not the demo shape, whose
    // 128k-row LM head made this the slowest test of the run on the software adapter (58 s, 2026-12-05).
    const dir = await Deno.makeTempDir();
    const fixture = fileURLToPath(new URL("../../fixtures/llama-micro", import.meta.url));
    for await (const e of Deno.readDir(fixture)) {
      if (e.isFile) await Deno.copyFile(`${fixture}/${e.name}`, `${dir}/${e.name}`);
    }
    try {
      const r = await runScript("bench/decode.ts", [
        ..."--weights f32 --k 2 --skip-decode --rounds 2 --prompt 4 --new 4 --dir".split(" "),
        dir,
        "--tunings",
        '[{"multiUnroll":1}]',
      ]);
      assert.equal(r.code, 0, r.stderr);
      // Round 0: the baseline, then the setting; round 1 the same.
      assert.deepEqual(
        r.json.map((l) => [l.bench, l.round, (l.tuning as Record<string, unknown>).multiUnroll ?? null]),
        [["swactor-k-step", 0, null], ["swactor-k-step", 0, 1], ["swactor-k-step", 1, null], [
          "swactor-k-step",
          1,
          1,
        ]],
      );
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  },
);
