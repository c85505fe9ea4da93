// The acceptance checks of the single-node path, through the CLI: greedy generation and teacher-forced
// logits against transformers' reference outputs (fixtures/README.md), and bad input exiting with 2.
import assert from "node:assert/strict";
import { basename, join } from "node:path";
import { fixtureDir } from "../fixtures.ts";
import { gpuAvailable, needs } from "../support/needs.ts";
import { checkFixture } from "../../scripts/check_fixture.ts";
import { runCli } from "./run.ts";
import { loadTokenizer } from "../../models/tokenizer.ts";
import { readModelConfig } from "../../models/family.ts";

const GPU = "a WebGPU adapter";
const hasGpu = await gpuAvailable();
const micro = fixtureDir("llama-micro", { needs: "reference.safetensors" });
const tiny = fixtureDir("llama3-tiny", { needs: "reference.safetensors" });
const tinyText = fixtureDir("llama3-tiny", { needs: "tokenizer.json" });
const SHARED_TINY = "../shared/fixtures/llama3-tiny";

interface Reference {
  prompt_length: number;
  generated: number;
  tokens: number[];
}

async function reference(dir: string): Promise<Reference> {
  return JSON.parse(await Deno.readTextFile(join(dir, "reference.json")));
}

async function checkFixtureAt(dir: string, weights: "f32" | "f16", tolerance: number) {
  const name = basename(dir);
  const r = await checkFixture(dir, { weights });
  if (!r.tokensMatch) {
    throw new Error(`${name} ${weights}: generated ${r.generated}, reference ${r.expected}`);
  }
  if (!(r.logitsError <= tolerance)) {
    throw new Error(`${name} ${weights}: logits error ${r.logitsError} > ${tolerance}`);
  }
}

Deno.test(
  needs("llama-micro: reference continuation and logits within 1e-4 (f32)", { [GPU]: hasGpu }),
  async () => {
    await checkFixtureAt(micro!, "f32", 1e-4);
  },
);

Deno.test(
  needs("llama3-tiny: reference continuation and logits within 1e-4 (f32)", {
    [GPU]: hasGpu,
    [SHARED_TINY]: tiny,
  }),
  async () => {
    await checkFixtureAt(tiny!, "f32", 1e-4);
  },
);

Deno.test(
  needs("llama3-tiny: the text prompt gives the reference ids (tokenizer adds BOS)", {
    [GPU]: hasGpu,
    [SHARED_TINY]: tinyText,
  }),
  async () => {
    const dir = tinyText!;
    const ref = await reference(dir);
    const r = await runCli([
      "generate",
      "Once upon a time, in a village by the sea,",
      "--model",
      dir,
      "--max-tokens",
      "16",
      "--temperature",
      "0",
      "--json",
    ]);
    if (r.code !== 0) throw new Error(r.stderr);
    const json = JSON.parse(r.stdout);
    if (json.prompt_tokens !== ref.prompt_length) throw new Error(`prompt_tokens ${json.prompt_tokens}`);
    if (JSON.stringify(json.tokens) !== JSON.stringify(ref.tokens.slice(ref.prompt_length))) {
      throw new Error(`tokens ${json.tokens}`);
    }
  },
);

/** A copy of llama-micro in a temp dir, changed by `mutate`. */
async function brokenCopy(mutate: (dir: string) => Promise<void>): Promise<string> {
  const src = fixtureDir("llama-micro")!;
  const dir = await Deno.makeTempDir();
  for (const f of ["config.json", "model.safetensors"]) await Deno.copyFile(join(src, f), join(dir, f));
  await mutate(dir);
  return dir;
}

/** Exit 2 with `mention` in stderr, and not `absent` (what must not have happened first). */
async function expectUsageError(args: string[], mention: RegExp, absent?: RegExp) {
  const r = await runCli(args);
  if (r.code !== 2) throw new Error(`expected exit 2, got ${r.code}: ${r.stderr}`);
  if (!mention.test(r.stderr)) throw new Error(`stderr should match ${mention}: ${r.stderr}`);
  if (absent?.test(r.stderr)) throw new Error(`stderr should not match ${absent}: ${r.stderr}`);
}

/** What the CLI says once it has opened the GPU or started loading weights. */
const BEFORE_GPU = /GPU:|loading weights/;

Deno.test(
  needs("one node: --trace writes the prefill and each decode batch", { [GPU]: hasGpu }),
  async () => {
    const dir = fixtureDir("llama-micro")!;
    const file = await Deno.makeTempFile({ suffix: ".json" });
    try {
      const r = await runCli([
        "generate",
        "--model",
        dir,
        "--tokens",
        "1,2,3",
        "--max-tokens",
        "9",
        "--json",
        "--trace",
        file,
      ]);
      if (r.code !== 0) throw new Error(r.stderr);
      // Every generated token is in one span (an end-of-sequence token may end the run before 9).
      const generated = (JSON.parse(r.stdout) as { tokens: number[] }).tokens.length;
      if (generated < 1 || generated > 9) throw new Error(`generated ${generated} tokens`);
      const { traceEvents } = JSON.parse(await Deno.readTextFile(file));
      const spans = traceEvents.filter((e: { ph: string }) => e.ph === "X");
      if (!spans[0].name.startsWith("prefill")) throw new Error(`first span ${spans[0].name}`);
      const tokens = spans.reduce((s: number, e: { args: { tokens: number } }) => s + e.args.tokens, 0);
      if (tokens !== generated) {
        throw new Error(`trace covers ${tokens} tokens, not the ${generated} generated`);
      }
    } finally {
      await Deno.remove(file);
    }
  },
);

Deno.test(
  needs("one node: the load and the first token's pipeline builds, in --json and on stderr", {
    [GPU]: hasGpu,
  }),
  async () => {
    const args = [
      "generate",
      "--model",
      micro!,
      "--tokens",
      "1,2,3",
      "--max-tokens",
      "3",
      "--temperature",
      "0",
    ];
    const r = await runCli([...args, "--json"]);
    if (r.code !== 0) throw new Error(r.stderr);
    const json = JSON.parse(r.stdout);
    // A fresh process builds every pipeline of its request.
    const builds = json.first_token_builds as { pipelines: number; ms: number };
    assert.ok(
      builds.pipelines > 0 && builds.ms > 0 && builds.ms <= json.first_token_ms,
      JSON.stringify(json),
    );
    // The load: every tensor of the checkpoint read (the file less its header).
    const file = (await Deno.stat(`${micro}/model.safetensors`)).size;
    assert.ok(
      json.load_ms > 0 && json.load_bytes > file * 0.95 && json.load_bytes < file,
      JSON.stringify(json),
    );
    const plain = await runCli(args);
    if (plain.code !== 0) throw new Error(plain.stderr);
    assert.match(plain.stderr, /after a first token at \d+ ms, \d+ ms of it building \d+ GPU pipelines \(/);
    assert.match(plain.stderr, /swactor: \d+\.\d MB of weights read in \d+\.\d\d s \(\d+\.\d\d GB\/s\)\n/);
  },
);

Deno.test(needs("bad input exits with 2 and says what was wrong", { [GPU]: hasGpu }), async (t) => {
  const micro = fixtureDir("llama-micro")!;
  await t.step(
    "missing model dir",
    () =>
      expectUsageError(
        ["generate", "--model", "/nonexistent/model", "--tokens", "1"],
        /not found/,
        BEFORE_GPU,
      ),
  );
  await t.step(
    "token id outside the vocabulary",
    () =>
      expectUsageError(
        ["generate", "--model", micro, "--tokens", "1,512", "--temperature", "0"],
        /512.*vocabulary/,
        BEFORE_GPU,
      ),
  );
  await t.step(
    "garbled token list",
    () => expectUsageError(["generate", "--model", micro, "--tokens", "1,x"], /"x"/),
  );
  await t.step("unknown flag", () => expectUsageError(["generate", "--modle", micro], /modle/));
  await t.step(
    "bad number",
    () =>
      expectUsageError(["generate", "--model", micro, "--tokens", "1", "--max-tokens", "-3"], /max-tokens/),
  );
  await t.step("truncated safetensors", async () => {
    const dir = await brokenCopy(async (d) => {
      const f = join(d, "model.safetensors");
      await Deno.truncate(f, (await Deno.stat(f)).size - 1000);
    });
    await expectUsageError(["generate", "--model", dir, "--tokens", "1"], /truncated/, BEFORE_GPU);
  });
  await t.step("wrong config (a missing size)", async () => {
    const dir = await brokenCopy(async (d) => {
      const c = JSON.parse(await Deno.readTextFile(join(d, "config.json")));
      delete c.hidden_size;
      await Deno.writeTextFile(join(d, "config.json"), JSON.stringify(c));
    });
    await expectUsageError(["generate", "--model", dir, "--tokens", "1"], /hidden_size/, BEFORE_GPU);
  });
  await t.step("config that disagrees with the weights", async () => {
    const dir = await brokenCopy(async (d) => {
      const c = JSON.parse(await Deno.readTextFile(join(d, "config.json")));
      c.intermediate_size = 128;
      await Deno.writeTextFile(join(d, "config.json"), JSON.stringify(c));
    });
    await expectUsageError(
      ["logits", "--model", dir, "--tokens", "1", "--out", "/tmp/x.safetensors"],
      /shape/,
      BEFORE_GPU,
    );
  });
  await t.step("unknown architecture", async () => {
    const dir = await brokenCopy(async (d) => {
      const c = JSON.parse(await Deno.readTextFile(join(d, "config.json")));
      c.model_type = "gpt2";
      c.architectures = ["GPT2LMHeadModel"];
      await Deno.writeTextFile(join(d, "config.json"), JSON.stringify(c));
    });
    await expectUsageError(
      ["generate", "--model", dir, "--tokens", "1"],
      /unsupported architecture 'gpt2' \(model_type\).*supported: llama, mistral, qwen2, qwen3/,
      BEFORE_GPU,
    );
  });
  await t.step(
    "--experts spread on a dense model (before any node starts)",
    () =>
      expectUsageError(
        ["generate", "--model", micro, "--tokens", "1", "--local", "2", "--experts", "spread"],
        /no mixture-of-experts layers/,
      ),
  );
  await t.step(
    "text prompt for a model without tokenizer (before the GPU opens)",
    () => expectUsageError(["generate", "hello", "--model", micro], /has no tokenizer.*--tokens/, BEFORE_GPU),
  );
});

Deno.test(
  needs("a Kimi-shaped model with tiktoken.model: a text prompt in, its ids through the model, text out", {
    [GPU]: hasGpu,
  }),
  async () => {
    // kimi-k2-tiny's 1,024 ids as Kimi lays them out: 766 ranked tokens (the bytes, then 510 letter pairs),
    // then 258 special tokens.
    const src = fixtureDir("kimi-k2-tiny")!;
    const dir = await Deno.makeTempDir();
    try {
      for await (const e of Deno.readDir(src)) {
        if (e.name !== "reference.json" && e.name !== "reference.safetensors") {
          await Deno.copyFile(join(src, e.name), join(dir, e.name));
        }
      }
      const b64 = (s: string) => btoa(s);
      const letters = "abcdefghijklmnopqrstuvwxyz ";
      const pairs = [...letters].flatMap((a) => [...letters].map((b) => a + b)).slice(0, 510);
      const lines = [
        ...Array.from({ length: 256 }, (_, b) => `${b64(String.fromCharCode(b))} ${b}`),
        ...pairs.map((p, i) => `${b64(p)} ${256 + i}`),
      ];
      await Deno.writeTextFile(join(dir, "tiktoken.model"), lines.join("\n"));
      await Deno.writeTextFile(
        join(dir, "tokenizer_config.json"),
        JSON.stringify({
          tokenizer_class: "TikTokenTokenizer",
          added_tokens_decoder: { "766": { content: "[BOS]" }, "767": { content: "[EOS]" } },
        }),
      );
      const prompt = "hello world, bonjour le monde";
      const r = await runCli([
        "generate",
        prompt,
        "--model",
        dir,
        "--max-tokens",
        "6",
        "--temperature",
        "0",
        "--weights",
        "f32",
        "--json",
      ]);
      if (r.code !== 0) throw new Error(r.stderr);
      const out = JSON.parse(r.stdout) as { tokens: number[]; text: string; prompt_tokens: number };
      // The CLI read the prompt with the tiktoken tokenizer: letter pairs merged, no BOS; text out is the
      // tokenizer's decode of the generated ids.
      const tok = (await loadTokenizer(dir, await readModelConfig(dir)))!;
      const ids = tok.encode(prompt);
      if (ids.length >= prompt.length || ids[0] === 766) throw new Error(`prompt ids ${ids}`);
      if (out.prompt_tokens !== ids.length) {
        throw new Error(`prompt of ${out.prompt_tokens} tokens, not ${ids.length}`);
      }
      if (out.tokens.length !== 6) throw new Error(`generated ${out.tokens.length} tokens`);
      if (out.text !== tok.decode(out.tokens)) throw new Error(`text ${JSON.stringify(out.text)}`);
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  },
);

Deno.test(
  needs("generate --local 2 twice: the second run reuses the first's measurement of this GPU, and says so", {
    [GPU]: hasGpu,
  }),
  async () => {
    const state = await Deno.makeTempDir();
    const env = { SWACTOR_STATE_DIR: state, SWACTOR_DEBUG: "1" }; // debug: the workers' lines too
    const args = [
      "generate",
      "--model",
      micro!,
      "--tokens",
      "1,2,3",
      "--max-tokens",
      "2",
      "--temperature",
      "0",
      "--local",
      "2",
      "--json",
    ];
    try {
      const first = await runCli(args, { env });
      assert.equal(first.code, 0, first.stderr);
      assert.match(first.stderr, /^swactor: measured: /m);
      assert.match(first.stderr, /\[worker 1\] swactor: adopted the measurement of this machine's GPU/);
      const again = await runCli(args, { env });
      assert.equal(again.code, 0, again.stderr);
      assert.doesNotMatch(again.stderr, /^swactor: measured: /m);
      assert.match(
        again.stderr,
        /^swactor: measured \d+ s ago: .*measurement\.json; remove it to measure again/m,
      );
      assert.deepEqual(JSON.parse(again.stdout).tokens, JSON.parse(first.stdout).tokens);
    } finally {
      await Deno.remove(state, { recursive: true });
    }
  },
);
