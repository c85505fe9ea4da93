// Bad input through the CLI (issue 11, items 6 and 11): exit 2 and one clear line naming what was wrong,
// with no Rust backtrace or source path, no raw control characters, and nothing left running; a bad
// --plan is refused before anything starts. None of these needs a GPU.
import assert from "node:assert/strict";
import { join } from "node:path";
import { fixtureDir } from "../fixtures.ts";
import { spawnCli } from "./run.ts";

const micro = fixtureDir("llama-micro")!;
const env = { SWACTOR_NO_GPU: "1" };

/** Runs the CLI, killing it after `ms` (a hang is a failure too); its exit code and stderr. */
async function run(args: string[], ms = 30_000): Promise<{ code: number; stderr: string }> {
  const p = spawnCli(args, { env: { ...env, SWACTOR_STATE_DIR: await Deno.makeTempDir() } });
  const timer = setTimeout(() => p.child.kill("SIGKILL"), ms);
  const code = await p.code();
  clearTimeout(timer);
  return { code, stderr: p.stderr() };
}

async function expectBadInput(args: string[], message: RegExp) {
  const { code, stderr } = await run(args);
  assert.equal(code, 2, `exit code of ${args.join(" ")}:\n${stderr}`);
  assert.match(stderr, message);
  assert.doesNotMatch(stderr, /backtrace|\.rs:\d|\.cargo|\n {4}at /i, "no backtrace or source path");
  const errors = stderr.split("\n").filter((l) => l.startsWith("swactor "));
  assert.equal(errors.length, 1, `one error line:\n${stderr}`);
}

const ticket = "swactor1aetiy45mcaqqzzzz";

Deno.test("bad --listen and --api: exit 2 naming the flag, no Rust backtrace", async (t) => {
  await t.step(
    "garbage",
    () => expectBadInput(["join", ticket, "--listen", "garbage"], /--listen expects IP:PORT/),
  );
  await t.step(
    "an address not on this machine",
    () => expectBadInput(["up", "--listen", "10.254.254.254:0"], /--listen: cannot bind 10\.254\.254\.254:0/),
  );
  await t.step(
    "a port above 65535",
    () => expectBadInput(["up", "--api", "127.0.0.1:70000"], /--api .*65535/),
  );
  await t.step(
    "a host name",
    () => expectBadInput(["up", "--api", "example.com:80"], /--api expects IP:PORT/),
  );
});

Deno.test("bad tickets and flag values: exit 2 with one line", async (t) => {
  await t.step("a mangled ticket", () => expectBadInput(["join", ticket], /the ticket: ticket/));
  await t.step("no ticket", () => expectBadInput(["join"], /join expects one ticket/));
  await t.step(
    "a missing ticket file",
    () =>
      expectBadInput(
        ["join", "--ticket-file", "/nonexistent/t"],
        /--ticket-file \/nonexistent\/t: no such file/,
      ),
  );
  await t.step(
    "--max-tokens -5 (a negative number, not a flag)",
    () =>
      expectBadInput(
        ["generate", "--tokens", "1", "--max-tokens", "-5"],
        /--max-tokens must be >= 1, got -5/,
      ),
  );
  await t.step(
    "a flag without its value",
    () => expectBadInput(["generate", "--tokens", "1", "--max-tokens"], /--max-tokens expects a value/),
  );
  await t.step(
    "--routing-out without spread experts, or without a chain",
    async () => {
      const out = join(await Deno.makeTempDir(), "routing.json");
      await expectBadInput(
        ["generate", "--model", micro, "--tokens", "1", "--local", "2", "--routing-out", out],
        /--routing-out needs --experts spread/,
      );
      await expectBadInput(
        ["generate", "--model", micro, "--tokens", "1", "--routing-out", out],
        /--routing-out needs a chain/,
      );
    },
  );
  await t.step(
    "up --wire bf16 (the chain's activations are f16 or f32)",
    () =>
      expectBadInput(
        ["up", "--peers", "2", "--model", micro, "--wire", "bf16"],
        /--wire expects f16 or f32, got "bf16"/,
      ),
  );
  await t.step(
    "up --wire without --model (no chain to set)",
    () => expectBadInput(["up", "--wire", "f32"], /--wire .*needs --model/),
  );
  await t.step(
    "--kv bf16, and --kv where there is no KV cache to set",
    async () => {
      await expectBadInput(
        ["generate", "--model", micro, "--tokens", "1", "--kv", "bf16"],
        /--kv expects auto, f32, f16, q8, got "bf16"/,
      );
      await expectBadInput(["up", "--kv", "q8"], /--kv .*needs --model/);
      const cluster = join(await Deno.makeTempDir(), "c.txt");
      await Deno.writeTextFile(
        cluster,
        "cluster c {\n  node a { mem = 8 GiB; mem_bw = 100 GB/s; flops = 10 TFLOP/s }\n}\n",
      );
      await expectBadInput(
        ["plan", "--model", micro, "--cluster", cluster, "--kv", "q8"],
        /--kv needs --live or --experts regional/,
      );
    },
  );
  await t.step("up --model whose weights do not match its config.json (before any node starts)", async () => {
    const dir = await Deno.makeTempDir();
    try {
      await Deno.copyFile(join(micro, "model.safetensors"), join(dir, "model.safetensors"));
      const config = JSON.parse(await Deno.readTextFile(join(micro, "config.json")));
      await Deno.writeTextFile(
        join(dir, "config.json"),
        JSON.stringify({ ...config, intermediate_size: 128 }),
      );
      await expectBadInput(
        ["up", "--peers", "2", "--model", dir],
        /tensor model\.layers\.0\.mlp\.gate_proj\.weight has shape \[160,64\], expected \[128,64\]/,
      );
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  });
});

Deno.test("a corrupt tokenizer's NUL bytes are escaped in the message, not echoed raw", async () => {
  const dir = await Deno.makeTempDir();
  for (const f of ["config.json", "model.safetensors"]) await Deno.copyFile(join(micro, f), join(dir, f));
  await Deno.writeTextFile(join(dir, "tokenizer.json"), "\0\0\x1b[2Jgarbage");
  const { code, stderr } = await run(["generate", "hello", "--model", dir, "--local", "2"]);
  assert.equal(code, 2, stderr);
  assert.match(stderr, /tokenizer/);
  // deno-lint-ignore no-control-regex
  assert.doesNotMatch(stderr, /[\x00\x1b]/, "no raw NUL or escape");
  assert.match(stderr, /\\x00/);
});

/** A plan for llama-micro (2 layers) on 2 nodes, changed by `edit`, written to a file. */
async function planFile(edit: (p: Record<string, unknown>) => void): Promise<string> {
  const plan: Record<string, unknown> = {
    version: 1,
    stages: [
      { index: 0, node: "a", layers: [0, 1], embeds: true, head: false },
      { index: 1, node: "b", layers: [1, 2], embeds: false, head: true },
    ],
  };
  edit(plan);
  const path = join(await Deno.makeTempDir(), "plan.json");
  await Deno.writeTextFile(path, JSON.stringify(plan));
  return path;
}

Deno.test({
  name: "a bad --plan exits 2 with the reason before anything starts (generate --local, up)",
  sanitizeOps: false,
  sanitizeResources: false,
}, async (t) => {
  const stages = (p: Record<string, unknown>) => p.stages as Record<string, unknown>[];
  const cases: [string, string | Promise<string>, RegExp][] = [
    ["a missing file", "/nonexistent/plan.json", /--plan \/nonexistent\/plan\.json: no such file/],
    [
      "not JSON",
      (async () => {
        const f = join(await Deno.makeTempDir(), "p.json");
        await Deno.writeTextFile(f, "{stages: oops");
        return f;
      })(),
      /not JSON/,
    ],
    ["an unknown version", planFile((p) => (p.version = 2)), /version 2 is not one this swactor reads/],
    ["no version", planFile((p) => delete p.version), /has no "version"/],
    ["layers outside the model", planFile((p) => (stages(p)[1].layers = [1, 3])), /the model has 2/],
    ["a node running two stages", planFile((p) => (stages(p)[1].node = "a")), /node "a" runs stages 0 and 1/],
    ["a stage without its fields", planFile((p) => (stages(p)[0] = { node: "a" })), /stage 0 must be/],
  ];
  for (const [what, file, message] of cases) {
    await t.step(`generate --local 2: ${what}`, async () => {
      await expectBadInput(
        ["generate", "--model", micro, "--tokens", "1,2", "--local", "2", "--plan", await file],
        message,
      );
    });
  }
  await t.step("generate --local 1 with a plan for 2 nodes", async () => {
    await expectBadInput(
      ["generate", "--model", micro, "--tokens", "1,2", "--local", "1", "--plan", await planFile(() => {})],
      /--plan .*: the Plan names 2 nodes; the cluster has 1/,
    );
  });
  await t.step("up --peers 2 --model with layers outside the model", async () => {
    const file = await planFile((p) => (stages(p)[1].layers = [1, 3]));
    await expectBadInput(["up", "--peers", "2", "--model", micro, "--plan", file], /the model has 2/);
  });
});

Deno.test("up --model with a folder that holds no checkpoint exits 2 before any node starts", async () => {
  const dir = await Deno.makeTempDir();
  await expectBadInput(["up", "--peers", "2", "--model", dir], /config\.json/);
});

Deno.test("a non-loopback --api is refused unless --expose-api says it is meant", async () => {
  await expectBadInput(
    ["up", "--api", "0.0.0.0:0"],
    /--api 0\.0\.0\.0:0 is reachable from other machines.*--expose-api/,
  );
  await expectBadInput(["join", "-", "--api", "[::]:0"], /--expose-api/);
});
