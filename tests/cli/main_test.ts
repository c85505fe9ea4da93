// main()'s exit codes (issue 11, item 11): bad input (UsageError, CheckpointError, EnvError) exits 2; anything else,
// a TypeError or RangeError from a bug included, exits 1 (the stack under SWACTOR_DEBUG=1); messages are
// printed with control characters escaped.
import assert from "node:assert/strict";
import { main } from "../../main.ts";
import { commands } from "../../cli/mod.ts";
import { printable, UsageError } from "../../cli/command.ts";
import { CheckpointError } from "../../models/errors.ts";
import { EnvError } from "../../kernels/env.ts";

async function exitOf(
  error: unknown,
  env: Record<string, string> = {},
): Promise<{ code: number; err: string }> {
  const command = { name: "boom", summary: "", usage: "", run: () => Promise.reject(error) };
  commands.push(command);
  const lines: string[] = [];
  const original = console.error;
  console.error = (...a: unknown[]) => void lines.push(a.join(" "));
  const saved = Object.fromEntries(Object.keys(env).map((k) => [k, Deno.env.get(k)]));
  for (const [k, v] of Object.entries(env)) Deno.env.set(k, v);
  try {
    return { code: await main(["boom"]), err: lines.join("\n") };
  } finally {
    console.error = original;
    commands.splice(commands.indexOf(command), 1);
    for (const [k, v] of Object.entries(saved)) v === undefined ? Deno.env.delete(k) : Deno.env.set(k, v);
  }
}

Deno.test("main: UsageError and CheckpointError are bad input: exit 2, the message alone", async () => {
  assert.deepEqual(await exitOf(new UsageError("--x is wrong")), {
    code: 2,
    err: "swactor boom: --x is wrong",
  });
  assert.equal((await exitOf(new CheckpointError("model.safetensors: truncated"))).code, 2);
  assert.deepEqual(await exitOf(new EnvError('SWACTOR_KV must be f16 or f32, got "bf16"')), {
    code: 2,
    err: 'swactor boom: SWACTOR_KV must be f16 or f32, got "bf16"',
  });
});

Deno.test("main: a TypeError or RangeError (a bug) is exit 1, not blamed on the input", async () => {
  for (const e of [new TypeError("cannot read x of undefined"), new RangeError("offset out of bounds")]) {
    const { code, err } = await exitOf(e, { SWACTOR_DEBUG: "0" });
    assert.equal(code, 1);
    assert.match(err, /looks like a bug.*SWACTOR_DEBUG=1/);
  }
  assert.equal((await exitOf(new Error("the leader went away"))).code, 1);
});

Deno.test("main: SWACTOR_DEBUG=1 prints the stack of a runtime failure", async () => {
  const { code, err } = await exitOf(new TypeError("oops"), { SWACTOR_DEBUG: "1" });
  assert.equal(code, 1);
  assert.match(err, /TypeError: oops\n\s+at /);
});

Deno.test("main: control characters in a message are escaped", async () => {
  const { err } = await exitOf(new UsageError("bad \0token\x1b[2J"));
  assert.equal(err, "swactor boom: bad \\x00token\\x1b[2J");
  assert.equal(printable("tab\tand\nnewline stay"), "tab\tand\nnewline stay");
});

Deno.test("main: a lost GPU device exits 1 and says what usually causes it", async () => {
  const alone = await exitOf(new Error("Parent device is lost"));
  assert.equal(alone.code, 1);
  assert.match(alone.err, /^swactor boom: Parent device is lost\nswactor: the GPU dropped .*out of memory/);
  const stage = await exitOf(new Error("stage 0 could not load: Parent device is lost"));
  assert.match(stage.err, /nvidia-smi lists them/);
  assert.doesNotMatch((await exitOf(new Error("stage 0 could not load: no space"))).err, /dropped/);
});
