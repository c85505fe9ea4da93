// `generate --draft ... --speculate K` as users run it: the same tokens as plain decoding on one node and
// through `--local 5 --wire f32` for the target as its own draft, n-gram lookup and a different (random)
// model with the target's vocabulary; the --json fields; and bad flags exit 2 naming what was wrong.
import assert from "node:assert/strict";
import { join } from "node:path";
import { fixtureDir } from "../fixtures.ts";
import { needs } from "../support/needs.ts";
import { runCli } from "./run.ts";
import { ensureRandomCheckpoint } from "../../scripts/bench/random_checkpoint.ts";
import { makeMtpCheckpoint } from "../../scripts/fixtures/make_mtp.ts";

const micro = fixtureDir("llama-micro")!;
const tiny = fixtureDir("llama3-tiny", { needs: "model.safetensors" });
const PROMPT = "1,5,9,23,44,5,9,23,44,5,9";

async function gen(args: string[]) {
  const r = await runCli([
    "generate",
    "--tokens",
    PROMPT,
    "--temperature",
    "0",
    "--json",
    "--weights",
    "f32",
    ...args,
  ]);
  assert.equal(r.code, 0, r.stderr);
  return JSON.parse(r.stdout);
}

/** A random one-layer model with `dir`'s config (and so its vocabulary) unless `vocab` says otherwise. */
async function smallDraft(dir: string, vocab?: number): Promise<string> {
  const out = join(await Deno.makeTempDir(), "draft");
  const config = JSON.parse(await Deno.readTextFile(join(dir, "config.json")));
  await ensureRandomCheckpoint(out, {
    ...config,
    num_hidden_layers: 1,
    ...(vocab ? { vocab_size: vocab } : {}),
  });
  return out;
}

Deno.test("generate --draft: bad flags exit 2 naming the flag", async () => {
  const cases: [string[], RegExp][] = [
    [["--speculate", "4"], /--speculate needs --draft/],
    [["--draft", "ngram", "--speculate", "0"], /--speculate must be >= 1/],
    [["--draft", "ngram", "--speculate", "17"], /--speculate must be <= 16/],
    [["--draft", "ngram", "--draft-noise", "1.5"], /--draft-noise must be <= 1/],
    [["--draft", "/nonexistent/model"], /--draft \/nonexistent\/model/],
  ];
  for (const [flags, re] of cases) {
    const r = await runCli(["generate", "--model", micro, "--tokens", "1,2", "--max-tokens", "4", ...flags]);
    assert.equal(r.code, 2, `${flags.join(" ")}: ${r.stderr}`);
    assert.match(r.stderr, re);
  }
  const other = await smallDraft(micro, 520);
  const r = await runCli([
    "generate",
    "--model",
    micro,
    "--tokens",
    "1,2",
    "--max-tokens",
    "4",
    "--draft",
    other,
  ]);
  assert.equal(r.code, 2, r.stderr);
  assert.match(r.stderr, /vocabulary has 520 tokens, the target's 512/);
});

Deno.test("generate --draft on one node: plain decoding's tokens, trips and accepted_per_trip", async () => {
  const plain = await gen(["--model", micro, "--max-tokens", "24"]);
  const small = await smallDraft(micro);
  for (const draft of [micro, "ngram", small]) {
    const j = await gen(["--model", micro, "--max-tokens", "24", "--draft", draft, "--speculate", "4"]);
    assert.deepEqual(j.tokens, plain.tokens, `--draft ${draft}`);
    assert.equal(j.speculate, 4);
    assert.ok(j.trips >= 1 && j.accepted_per_trip > 0);
    if (draft === micro) {
      assert.ok(j.accepted_per_trip >= 3, `${j.accepted_per_trip} per trip`);
      assert.ok(j.trips <= Math.ceil(24 / 3) + 1, `${j.trips} trips`);
      assert.equal(j.acceptance, 1);
    }
  }
});

Deno.test("generate --draft mtp: plain decoding's tokens on one node; exit 2 without a module or on a chain", async () => {
  const plainDir = fixtureDir("deepseek-v3-plain")!;
  const dir = join(await Deno.makeTempDir(), "mtp");
  await makeMtpCheckpoint(plainDir, dir);
  const plain = await gen(["--model", dir, "--max-tokens", "12"]);
  const j = await gen(["--model", dir, "--max-tokens", "12", "--draft", "mtp", "--speculate", "3"]);
  assert.deepEqual(j.tokens, plain.tokens);
  assert.equal(j.draft, "mtp");
  assert.ok(j.trips >= 1 && j.trips <= 12 && j.drafted > 0, JSON.stringify(j));
  // The config names a module the weights lack.
  const bare = join(await Deno.makeTempDir(), "bare");
  await Deno.mkdir(bare);
  const config = JSON.parse(await Deno.readTextFile(join(plainDir, "config.json")));
  await Deno.writeTextFile(
    join(bare, "config.json"),
    JSON.stringify({ ...config, num_nextn_predict_layers: 1 }),
  );
  await Deno.copyFile(join(plainDir, "model.safetensors"), join(bare, "model.safetensors"));
  const cases: [string[], RegExp][] = [
    [["--model", plainDir], /--draft mtp: .* ships no multi-token-prediction module/],
    [["--model", bare], /num_nextn_predict_layers = 1, but the weights lack the module/],
    [["--model", micro], /--draft mtp: .* ships no multi-token-prediction module/],
    [["--model", dir, "--local", "2"], /--draft mtp .* runs on one node only/],
  ];
  for (const [flags, re] of cases) {
    const r = await runCli(["generate", "--tokens", "1,2", "--max-tokens", "4", "--draft", "mtp", ...flags]);
    assert.equal(r.code, 2, `${flags.join(" ")}: ${r.stderr}`);
    assert.match(r.stderr, re);
  }
});

Deno.test(
  needs("generate --draft --local 5 --wire f32: plain decoding's tokens for every drafter", {
    "llama3-tiny's weights": tiny,
  }),
  async () => {
    const common = ["--model", tiny!, "--max-tokens", "12", "--local", "5", "--wire", "f32"];
    const plain = await gen(common);
    const small = await smallDraft(tiny!);
    for (const draft of [tiny!, "ngram", small]) {
      const j = await gen([...common, "--draft", draft, "--speculate", "4", "--speculate-depth", "2"]);
      assert.deepEqual(j.tokens, plain.tokens, `--draft ${draft}`);
      assert.equal(j.stages.length, 5);
      if (draft === tiny) {
        assert.ok(j.accepted_per_trip >= 3, `${j.accepted_per_trip} per trip`);
        assert.ok(j.trips <= Math.ceil(12 / 3) + 1, `${j.trips} trips`);
      }
    }
  },
);
