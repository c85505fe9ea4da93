// Speculative decoding's model side: the acceptance rule keeps the target's distribution (chi-square over
// 2,000 seeded draws at a fixed position, against the target's probabilities and against plain sampling),
// the drafters, and the single-node loop giving plain decoding's exact tokens for every drafter (the target
// itself, n-gram, a different random model with the target's vocabulary, a noisy one), greedy and sampled.
import assert from "node:assert/strict";
import { join } from "node:path";
import { fixtureDir } from "../fixtures.ts";
import { needs } from "../support/needs.ts";
import { getGpu, NoGpuError, sampleRef } from "../../kernels/mod.ts";
import { generate, loadEngine } from "../../models/engine.ts";
import {
  clipTokens,
  type Drafter,
  ModelDrafter,
  NgramDrafter,
  NoisyDrafter,
  speculativeGenerate,
  uniform,
  verifyRows,
} from "../../models/speculative.ts";
import { ensureRandomCheckpoint } from "../../scripts/bench/random_checkpoint.ts";

const gpu = await getGpu().catch((e) => {
  if (e instanceof NoGpuError) return null;
  throw e;
});

/** The target's probabilities after temperature and top-p, as kernels/sample.ts defines them. */
function targetProbs(row: Float32Array, temperature: number, topP: number): number[] {
  const mx = Math.max(...row);
  const e = Array.from(row, (l) => Math.exp((l - mx) / temperature));
  const sorted = [...e].sort((a, b) => b - a);
  const target = e.reduce((a, b) => a + b, 0) * topP;
  let acc = 0, tau = 0;
  for (const v of sorted) {
    acc += v;
    tau = v;
    if (acc >= target) break;
  }
  const kept = e.map((v) => (v >= tau ? v : 0));
  const z = kept.reduce((a, b) => a + b, 0);
  return kept.map((v) => v / z);
}

/** The chi-square critical value at p = 0.01 (Wilson-Hilferty; within 0.5% for df >= 3). */
function chi2Critical01(df: number): number {
  const z = 2.3263;
  return df * (1 - 2 / (9 * df) + z * Math.sqrt(2 / (9 * df))) ** 3;
}

function chiSquare(counts: number[], expected: number[]): { stat: number; df: number } {
  let stat = 0, df = -1;
  counts.forEach((o, i) => {
    if (expected[i] <= 0) return assert.equal(o, 0, `token ${i} has no mass but was drawn`);
    stat += (o - expected[i]) ** 2 / expected[i];
    df++;
  });
  return { stat, df };
}

Deno.test("acceptance rule: 2,000 seeded draws at a fixed position follow the target's distribution", () => {
  const V = 8;
  const pos0 = 40;
  // The target's next-token logits at positions pos0 (decides pos0 + 1) and pos0 + 1 (decides pos0 + 2).
  const rows = Float32Array.from([
    ...[2.0, 1.5, 1.1, 0.7, 0.2, -0.5, -3, -6],
    ...[0.1, 0.9, -0.4, 1.3, 0.5, 0.0, -1, -2],
  ]);
  const sampling = { temperature: 0.9, topP: 0.95 };
  const p = targetProbs(rows.subarray(0, V), sampling.temperature, sampling.topP);
  const N = 2000;
  const spec = new Array(V).fill(0), plain = new Array(V).fill(0);
  let accepted = 0;
  for (let seed = 0; seed < N; seed++) {
    // A draft with a distribution far from the target's (mostly the third-likeliest token).
    const u = uniform(seed, 1);
    const draft = u < 0.6 ? 2 : u < 0.8 ? 5 : Math.floor(uniform(seed, 2) * V);
    const v = verifyRows(rows, V, [draft], { ...sampling, seed }, pos0);
    const token = v.accepted === 1 ? draft : v.next;
    if (v.accepted === 1) accepted++;
    spec[token]++;
    plain[sampleRef(rows.subarray(0, V), { ...sampling, seed, tokOut: pos0 + 1 })]++;
  }
  const expected = p.map((x) => x * N);
  const s = chiSquare(spec, expected);
  assert.ok(s.df >= 3, `${s.df} degrees of freedom`);
  assert.ok(s.stat < chi2Critical01(s.df), `speculative vs target: chi2 ${s.stat} (df ${s.df})`);
  const q = chiSquare(plain, expected);
  assert.ok(q.stat < chi2Critical01(q.df), `plain vs target: chi2 ${q.stat}`);
  // Two-sample test of the speculative against the plain frequencies.
  let two = 0, df = -1;
  for (let i = 0; i < V; i++) {
    if (spec[i] + plain[i] === 0) continue;
    two += (spec[i] - plain[i]) ** 2 / (spec[i] + plain[i]);
    df++;
  }
  assert.ok(two < chi2Critical01(df), `speculative vs plain: chi2 ${two} (df ${df})`);
  // The rule did accept and reject (else the test proves nothing about it).
  assert.ok(accepted > 100 && accepted < N - 100, `${accepted} of ${N} drafts kept`);
  // What always keeping the draft would give is far off: the test can fail.
  const naive = new Array(V).fill(0);
  for (let seed = 0; seed < N; seed++) {
    const u = uniform(seed, 1);
    naive[u < 0.6 ? 2 : u < 0.8 ? 5 : Math.floor(uniform(seed, 2) * V)]++;
  }
  let bad = 0;
  naive.forEach((o, i) => expected[i] > 0 && (bad += (o - expected[i]) ** 2 / expected[i]));
  assert.ok(bad > chi2Critical01(s.df), `always keeping the draft: chi2 ${bad}`);
});

Deno.test("acceptance rule: greedy keeps drafts while they are the argmax, then gives the argmax", () => {
  const V = 4;
  const rows = Float32Array.from([0, 5, 1, 2, /**/ 3, 0, 0, 0, /**/ 0, 0, 9, 1, /**/ 1, 1, 1, 1]);
  const greedy = { temperature: 0, topP: 1, seed: 0 };
  assert.deepEqual(verifyRows(rows, V, [1, 0, 2], greedy, 10), { accepted: 3, next: 0 }); // ties: lowest
  assert.deepEqual(verifyRows(rows, V, [1, 3, 2], greedy, 10), { accepted: 1, next: 0 });
  assert.deepEqual(verifyRows(rows, V, [2], greedy, 10), { accepted: 0, next: 1 });
  assert.deepEqual(verifyRows(rows, V, [], greedy, 10), { accepted: 0, next: 1 });
  assert.throws(() => verifyRows(rows.subarray(0, 4), V, [1], greedy, 0), RangeError);
  const nan = rows.slice();
  nan[1] = NaN;
  assert.throws(() => verifyRows(nan, V, [1], greedy, 0), /non-finite logits/);
});

Deno.test("n-gram drafter: continues the latest earlier match of the longest suffix", async () => {
  const d = new NgramDrafter(3);
  assert.deepEqual(await d.draft([1, 2, 3, 4, 1, 2, 3], 3), [4, 1, 2]);
  assert.deepEqual(await d.draft([7, 8, 9, 7, 5, 7], 2), [5, 7], "the latest match of [7] wins");
  assert.deepEqual(await d.draft([1, 2, 3], 4), [], "nothing repeats: no draft");
  assert.deepEqual(await d.draft([5, 5], 3), [5, 5, 5]);
});

Deno.test("clipTokens: stops after eos (kept) and at max tokens", () => {
  assert.deepEqual(clipTokens([4, 2, 9], 0, { maxTokens: 10, eos: [2] }), { keep: [4, 2], done: "eos" });
  assert.deepEqual(clipTokens([4, 5, 9], 8, { maxTokens: 10, eos: [] }), {
    keep: [4, 5],
    done: "max_tokens",
  });
  assert.deepEqual(clipTokens([4], 1, { maxTokens: 10, eos: [] }), { keep: [4], done: undefined });
});

Deno.test("noisy drafter: replaces about the asked share of tokens, always by another token", async () => {
  const base: Drafter = {
    kind: "const",
    draft: (_c, k) => Promise.resolve(new Array(k).fill(3)),
    close() {},
  };
  const d = new NoisyDrafter(base, 0.3, { vocab: 16, seed: 5 });
  let changed = 0;
  for (let i = 0; i < 500; i++) changed += (await d.draft([1], 4)).filter((t) => t !== 3).length;
  assert.ok(Math.abs(changed / 2000 - 0.3) < 0.04, `${changed / 2000}`);
});

const FIXTURES = ["llama-micro", "qwen3-tiny"];
for (const fixture of FIXTURES) {
  const dir = fixtureDir(fixture);
  Deno.test(
    needs(`speculative on one node (${fixture}): every drafter gives plain decoding's tokens`, {
      "a WebGPU adapter": gpu,
      [fixture]: dir,
    }),
    async () => {
      const engine = await loadEngine(dir!, { gpu: gpu!, weights: "f32" });
      const V = engine.model.vocab;
      // A different, smaller model with the target's vocabulary (random weights: it rarely agrees).
      const draftDir = join(await Deno.makeTempDir(), "draft");
      await ensureRandomCheckpoint(draftDir, {
        ...JSON.parse(await Deno.readTextFile(join(dir!, "config.json"))),
        num_hidden_layers: 1,
      });
      const small = await loadEngine(draftDir, { gpu: gpu!, weights: "f32" });
      const ref = JSON.parse(await Deno.readTextFile(join(dir!, "reference.json")));
      const prompt: number[] = ref.tokens.slice(0, ref.prompt_length);
      try {
        const drafters: [string, () => Drafter][] = [
          ["target", () => new ModelDrafter(engine, { maxSeq: 128, vocab: V })],
          ["ngram", () => new NgramDrafter()],
          ["small random model", () => new ModelDrafter(small, { maxSeq: 128, vocab: V })],
          [
            "target+noise",
            () =>
              new NoisyDrafter(new ModelDrafter(engine, { maxSeq: 128, vocab: V }), 0.3, {
                vocab: V,
                seed: 2,
              }),
          ],
        ];
        for (
          const sampling of [{ temperature: 0, topP: 1, seed: 0 }, { temperature: 1, topP: 0.9, seed: 5 }]
        ) {
          const plain = await generate(engine, prompt, { maxTokens: 30, sampling, eosTokenIds: [] });
          for (const [name, make] of drafters) {
            const d = make();
            try {
              const r = await speculativeGenerate(engine, d, prompt, {
                k: 4,
                maxTokens: 30,
                eos: [],
                sampling,
              });
              assert.deepEqual(r.tokens, plain.tokens, `${name}, temperature ${sampling.temperature}`);
              if (name === "target" && sampling.temperature === 0) {
                assert.equal(r.acceptedDrafts, r.drafted);
                assert.ok(r.trips <= Math.ceil(30 / 3) + 1 && 30 / r.trips >= 3, `${r.trips} trips`);
              }
            } finally {
              d.close();
            }
          }
        }
        // auto: k chosen per step from the request's measurements; the tokens stay plain decoding's.
        for (
          const sampling of [{ temperature: 0, topP: 1, seed: 0 }, { temperature: 1, topP: 0.9, seed: 5 }]
        ) {
          const plain = await generate(engine, prompt, { maxTokens: 30, sampling, eosTokenIds: [] });
          const d = new NoisyDrafter(new ModelDrafter(engine, { maxSeq: 128, vocab: V }), 0.3, {
            vocab: V,
            seed: 4,
          });
          const r = await speculativeGenerate(engine, d, prompt, {
            k: 4,
            auto: true,
            maxTokens: 30,
            eos: [],
            sampling,
          });
          d.close();
          assert.deepEqual(r.tokens, plain.tokens, `auto, temperature ${sampling.temperature}`);
        }
        // Stops exactly at an eos id inside an accepted run of drafts.
        const greedy = { temperature: 0, topP: 1, seed: 0 };
        const plain = await generate(engine, prompt, { maxTokens: 30, sampling: greedy, eosTokenIds: [] });
        const eos = plain.tokens[6];
        const d = new ModelDrafter(engine, { maxSeq: 128, vocab: V });
        const r = await speculativeGenerate(engine, d, prompt, {
          k: 4,
          maxTokens: 30,
          eos: [eos],
          sampling: greedy,
        });
        d.close();
        assert.deepEqual(r.tokens, plain.tokens.slice(0, plain.tokens.indexOf(eos) + 1));
        assert.equal(r.stopReason, "eos");
        assert.equal(engine.stats().active, 0, "every sequence freed");
        // A draft model with another vocabulary is refused, naming both sizes.
        const other = join(await Deno.makeTempDir(), "other");
        await ensureRandomCheckpoint(other, {
          ...JSON.parse(await Deno.readTextFile(join(dir!, "config.json"))),
          num_hidden_layers: 1,
          vocab_size: V + 8,
        });
        const wrong = await loadEngine(other, { gpu: gpu!, weights: "f32" });
        assert.throws(() => new ModelDrafter(wrong, { maxSeq: 64, vocab: V }), /vocabulary has \d+ tokens/);
        wrong.close();
      } finally {
        small.close();
        engine.close();
      }
    },
  );
}

Deno.test(
  needs("Engine.truncate: rejected positions are written over; truncating past the length is refused", {
    "a WebGPU adapter": gpu,
    "llama-micro": fixtureDir("llama-micro"),
  }),
  async () => {
    const engine = await loadEngine(fixtureDir("llama-micro")!, { gpu: gpu!, weights: "f32" });
    try {
      const sampling = { temperature: 0, topP: 1, seed: 0 };
      engine.open("a", { maxSeq: 32, sampling });
      engine.open("b", { maxSeq: 32, sampling });
      const run = (id: string, pos0: number, tokens: number[]) =>
        engine.run(id, { pos0, T: tokens.length, tokens: Uint32Array.from(tokens), output: "logits" });
      // a: the prompt, then wrong drafts at 4..6, dropped, then the right tokens; b: the right tokens only.
      await run("a", 0, [1, 5, 9, 23]);
      await run("a", 4, [300, 301, 302]);
      engine.truncate("a", 4);
      const a = (await run("a", 4, [44, 5])).logits!;
      const b = (await run("b", 0, [1, 5, 9, 23, 44, 5])).logits!.subarray(4 * 512);
      let worst = 0;
      for (let i = 0; i < a.length; i++) worst = Math.max(worst, Math.abs(a[i] - b[i]));
      assert.ok(worst < 1e-4, `logits after a rollback differ by ${worst}`);
      assert.equal(engine.length("a"), 6);
      assert.throws(() => engine.truncate("a", 7), /truncate to 7: the request holds 6 positions/);
    } finally {
      engine.close();
    }
  },
);

// Every family (MoE and MLA blocks included) verifies drafts with the same multi-token step.
const FAMILIES = [
  "qwen2-tiny",
  "qwen3-bias",
  "mixtral-tiny",
  "mixtral-e6k3",
  "qwen3-moe-norm",
  "qwen3-moe-raw",
  "deepseek-v3-plain",
  "deepseek-v3-groups",
  "kimi-k2-tiny",
];
for (const fixture of FAMILIES) {
  const dir = fixtureDir(fixture);
  Deno.test(
    needs(`speculative on one node (${fixture}): the target and n-gram drafts give plain decoding's tokens`, {
      "a WebGPU adapter": gpu,
      [fixture]: dir,
    }),
    async () => {
      const engine = await loadEngine(dir!, { gpu: gpu!, weights: "f32" });
      try {
        const ref = JSON.parse(await Deno.readTextFile(join(dir!, "reference.json")));
        const prompt: number[] = ref.tokens.slice(0, ref.prompt_length);
        for (
          const sampling of [{ temperature: 0, topP: 1, seed: 0 }, { temperature: 0.9, topP: 0.9, seed: 7 }]
        ) {
          const plain = await generate(engine, prompt, { maxTokens: 12, sampling, eosTokenIds: [] });
          for (
            const d of [
              new ModelDrafter(engine, { maxSeq: 64, vocab: engine.model.vocab }),
              new NgramDrafter(),
            ]
          ) {
            const r = await speculativeGenerate(engine, d, prompt, {
              k: 4,
              maxTokens: 12,
              eos: [],
              sampling,
            });
            d.close();
            assert.deepEqual(r.tokens, plain.tokens, `${d.kind}, temperature ${sampling.temperature}`);
          }
        }
      } finally {
        engine.close();
      }
    },
  );
}
