// cli/runtime_dir.ts: a swactor process started without XDG_RUNTIME_DIR gets a private one before any
// command runs, so the graphics stack does not print its "XDG_RUNTIME_DIR is invalid" error lines and every
// command finds the same state folder; a folder of that name that is not ours alone is not used. Each case
// runs in a child process with a clean environment (PATH, HOME, TMPDIR only).
import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
import { fixtureDir } from "../fixtures.ts";
import { gpuAvailable, needs } from "../support/needs.ts";

const ROOT = fileURLToPath(new URL("../..", import.meta.url));
const hasGpu = await gpuAvailable();
const linux = Deno.build.os === "linux";
const micro = fixtureDir("llama-micro");

async function run(args: string[], tmp: string): Promise<{ stdout: string; stderr: string }> {
  const out = await new Deno.Command(Deno.execPath(), {
    args,
    clearEnv: true,
    env: { PATH: Deno.env.get("PATH") ?? "", TMPDIR: tmp, HOME: Deno.env.get("HOME") ?? tmp },
    cwd: ROOT,
  }).output();
  const text = (b: Uint8Array) => new TextDecoder().decode(b);
  assert.equal(out.code, 0, text(out.stderr));
  return { stdout: text(out.stdout), stderr: text(out.stderr) };
}

/** Runs `code` with `rd` the imported cli/runtime_dir.ts, printing what ensureRuntimeDir left in the env. */
const probe = (tmp: string, before = "") =>
  run([
    "eval",
    "--quiet",
    `import * as rd from "./cli/runtime_dir.ts"; ${before}
     rd.ensureRuntimeDir(); console.log(Deno.env.get("XDG_RUNTIME_DIR") ?? "");`,
  ], tmp).then((r) => r.stdout.trim());

async function inTmp(fn: (tmp: string) => Promise<void>) {
  const tmp = await Deno.makeTempDir({ prefix: "swactor-xdg-test" });
  try {
    await fn(tmp);
  } finally {
    await Deno.remove(tmp, { recursive: true });
  }
}

Deno.test({
  ...needs(
    "ensureRuntimeDir: unset or missing -> $TMPDIR/swactor-xdg-UID, made 0700; a real folder is kept",
    {
      Linux: linux,
    },
  ),
  fn: () =>
    inTmp(async (tmp) => {
      const dir = `${tmp}/swactor-xdg-${Deno.uid()}`;
      assert.equal(await probe(tmp), dir);
      assert.equal(Deno.statSync(dir).mode! & 0o777, 0o700);
      assert.equal(await probe(tmp, `Deno.env.set("XDG_RUNTIME_DIR", "${tmp}/gone");`), dir);
      assert.equal(await probe(tmp, `Deno.env.set("XDG_RUNTIME_DIR", "${tmp}");`), tmp);
    }),
});

Deno.test({
  ...needs("ensureRuntimeDir: a folder of that name others may enter is not used (a fresh private one is)", {
    Linux: linux,
  }),
  fn: () =>
    inTmp(async (tmp) => {
      const planted = `${tmp}/swactor-xdg-${Deno.uid()}`;
      await Deno.mkdir(planted);
      await Deno.chmod(planted, 0o777);
      const got = await probe(tmp);
      assert.notEqual(got, planted);
      assert.ok(got.startsWith(`${tmp}/swactor-xdg-`), got);
      assert.equal(Deno.statSync(got).mode! & 0o777, 0o700);
    }),
});

Deno.test({
  ...needs("generate without XDG_RUNTIME_DIR: no error lines from the graphics stack", {
    Linux: linux,
    "a WebGPU adapter": hasGpu,
    "the llama-micro fixture": micro,
  }),
  fn: () =>
    inTmp(async (tmp) => {
      const args = [
        "generate",
        "--model",
        micro!,
        "--tokens",
        "1,2",
        "--max-tokens",
        "2",
        "--temperature",
        "0",
      ];
      const { stdout, stderr } = await run(["run", "-A", "--quiet", "main.ts", ...args], tmp);
      assert.match(stdout, /\d+ \d+/);
      assert.doesNotMatch(stderr, /XDG_RUNTIME_DIR/);
    }),
});
