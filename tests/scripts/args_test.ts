// scripts/args.ts through a real script: --help prints its header comment and exits 0; a bad option or a
// missing value is one line naming it and exit 2, not a stack trace.
import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
import { headerComment } from "../../scripts/args.ts";

const MOE = fileURLToPath(new URL("../../scripts/bench/moe.ts", import.meta.url));

async function run(...args: string[]) {
  const out = await new Deno.Command(Deno.execPath(), { args: ["run", "-A", "--quiet", MOE, ...args] })
    .output();
  const text = (b: Uint8Array) => new TextDecoder().decode(b);
  return { code: out.code, stdout: text(out.stdout), stderr: text(out.stderr) };
}

Deno.test("script --help: the header comment, exit 0", async () => {
  const r = await run("--help");
  assert.equal(r.code, 0, r.stderr);
  assert.equal(r.stdout.trim(), headerComment(MOE));
  assert.match(r.stdout, /^MoE decode benchmark/);
  assert.match(r.stdout, /deno run -A scripts\/bench\/moe.ts \[--shape/);
});

Deno.test("script with a bad option or a missing value: one line naming it, exit 2", async () => {
  const cases = [
    [["--bogus"], /--bogus/],
    [["--layers"], /--layers/],
    // A misspelt --tunings setting would time the default twice: it is refused by name before any GPU work.
    [
      ["--tunings", '[{}, {"attentionUnrol": 8}]'],
      /--tunings\[1\]: no kernel setting named "attentionUnrol"/,
    ],
    [["--tunings", '{"attentionUnroll": 8}'], /--tunings must be a JSON list/],
  ] as const;
  for (const [args, named] of cases) {
    const r = await run(...args);
    assert.equal(r.code, 2, r.stderr);
    assert.equal(r.stderr.trim().split("\n").length, 1, r.stderr);
    assert.match(r.stderr, /^moe\.ts: /);
    assert.match(r.stderr, named);
    assert.doesNotMatch(r.stderr, /\bat \w+ \(/, "no stack trace");
  }
});

Deno.test("headerComment: the leading // lines only, a shebang skipped", async () => {
  const f = await Deno.makeTempFile({ suffix: ".ts" });
  try {
    await Deno.writeTextFile(
      f,
      "#!/usr/bin/env -S deno run\n// one\n//   two\n//\nconst x = 1; // not this\n",
    );
    assert.equal(headerComment(f), "one\n  two");
  } finally {
    await Deno.remove(f);
  }
});
