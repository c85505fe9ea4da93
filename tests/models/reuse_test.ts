// A released request's sequence serves the next request it fits, programs and buffers as they are
// (models/engine.ts SPARES, Sequence.reopen): the request's tokens and logits are bit for bit those of a new
// sequence, its sampling options are its own, and a request the spare does not fit gets a new sequence.
import assert from "node:assert/strict";
import { fixtureDir } from "../fixtures.ts";
import { needs } from "../support/needs.ts";
import {
  ATTENTION_LONG_KEYS,
  ATTENTION_SPLIT_KEYS,
  getGpu,
  NoGpuError,
  sameLengthBuckets,
} from "../../kernels/mod.ts";
import { type Engine, generate, loadEngine, prefillStats } from "../../models/engine.ts";
import { REUSE_SLACK, reuseCapacity, type SequenceShape, shapeServes } from "../../models/model.ts";

const gpu = await getGpu().catch((e) => {
  if (e instanceof NoGpuError) return null;
  throw e;
});

const shape = (maxSeq: number, maxChunk = 32, prefillChunk = 32, logitsRows = 32): SequenceShape => ({
  maxSeq,
  maxChunk,
  prefillChunk,
  logitsRows,
});

Deno.test("shapeServes: every position and row the request may use, bounded slack, the same buckets", () => {
  assert.ok(shapeServes(shape(100), shape(100)));
  assert.ok(shapeServes(shape(125), shape(100)));
  assert.ok(!shapeServes(shape(126), shape(100)), `more than ${REUSE_SLACK}x the positions`);
  assert.ok(!shapeServes(shape(99), shape(100)), "too few positions");
  assert.ok(!shapeServes(shape(100, 16), shape(100)), "steps too short");
  assert.ok(!shapeServes(shape(100, 32, 16), shape(100, 16, 32)), "prefill chunks too short");
  assert.ok(!shapeServes(shape(100, 32, 32, 8), shape(100)), "too few logits rows");
  assert.ok(shapeServes(shape(100, 64, 512, 64), shape(90, 32, 32, 17)), "larger buffers serve");
  // A capacity past a bucket's threshold builds other decode programs than one below it.
  const S = ATTENTION_SPLIT_KEYS, L = ATTENTION_LONG_KEYS;
  assert.ok(!sameLengthBuckets(S + 1, S) && !shapeServes(shape(S + 1), shape(S)));
  assert.ok(!sameLengthBuckets(L + 1, L - 10) && !shapeServes(shape(L + 1), shape(L - 10)));
  assert.ok(sameLengthBuckets(S + 200, S + 1) && shapeServes(shape(S + 200), shape(S + 1)));
});

Deno.test("reuseCapacity: four grid steps an octave, within the slack, never past a power of two", () => {
  assert.deepEqual([16, 17, 20, 21, 100, 1000, 1025, 5000].map((n) => reuseCapacity(n, 1 << 20)), [
    16,
    20,
    20,
    24,
    112,
    1024,
    1280,
    5120,
  ]);
  assert.equal(reuseCapacity(1000, 1010), 1010, "at most the model's positions");
  assert.equal(reuseCapacity(1000, 900), 1000, "a request past them is refused where it is checked");
  for (let n = 1; n <= 70_000; n += 37) {
    const c = reuseCapacity(n, 1 << 20);
    assert.ok(c >= n && c < n * REUSE_SLACK + 1 && c <= 2 ** Math.ceil(Math.log2(n)), `${n} -> ${c}`);
    assert.ok(sameLengthBuckets(c, n) && shapeServes(shape(c), shape(n)), `${n} -> ${c}`);
  }
});

/** Generates after `prompt` on `engine`: its tokens. */
async function tokensOf(
  engine: Engine,
  prompt: number[],
  maxTokens: number,
  sampling: { temperature: number; topP: number; seed: number },
): Promise<number[]> {
  return (await generate(engine, prompt, { maxTokens, sampling })).tokens;
}

const micro = fixtureDir("llama-micro");
Deno.test(
  needs("a request's pipeline builds before its first token: counted, and none for the next request", {
    "a WebGPU adapter": gpu,
    "tests/fixtures/llama-micro": micro,
  }),
  async () => {
    const engine = await loadEngine(micro!, { gpu: gpu!, weights: "f32" });
    try {
      const opts = { maxTokens: 4, sampling: { temperature: 0, topP: 1, seed: 0 } };
      const before = { ...gpu!.builds };
      const first = (await generate(engine, [1, 2, 3], opts)).firstTokenBuilds!;
      // This process's earlier tests may have built some of the programs' pipelines already.
      assert.ok(first.count >= 0 && first.count <= gpu!.builds.count - before.count, JSON.stringify(first));
      assert.ok(first.ms >= 0 && first.ms <= gpu!.builds.ms - before.ms + 1e-9);
      assert.deepEqual((await generate(engine, [1, 2, 3], opts)).firstTokenBuilds, { count: 0, ms: 0 });
    } finally {
      engine.close();
    }
  },
);

// Llama (GQA), Kimi K2 (MLA, MoE with a shared expert), Mixtral (MoE without one).
for (const name of ["llama3-tiny", "kimi-k2-tiny", "mixtral-tiny"]) {
  const dir = fixtureDir(name);
  Deno.test(
    needs(`${name}: a request on a released sequence gives a new sequence's tokens and logits`, {
      "a WebGPU adapter": gpu,
      [`tests/fixtures/${name}`]: dir,
    }),
    async () => {
      const engine = await loadEngine(dir!, { gpu: gpu!, weights: "f32" });
      try {
        const vocab = engine.model.vocab;
        const ids = (n: number, from: number) => Array.from({ length: n }, (_, i) => (from + 7 * i) % vocab);
        const a = ids(9, 3), b = ids(6, 11);
        const sampled = { temperature: 0.9, topP: 0.95, seed: 1234 };
        const greedy = { temperature: 0, topP: 1, seed: 0 };
        // b (16 positions) on a new sequence; a (17) does not fit b's, so it builds its own (of 20: the
        // grid's, reuseCapacity) and releases it; b again takes a's, its sampling options written over a's.
        const fresh = await tokensOf(engine, b, 10, sampled);
        assert.equal(engine.stats().reuses, 0);
        await tokensOf(engine, a, 8, greedy);
        assert.equal(engine.stats().reuses, 0);
        assert.ok(engine.stats().spareBytes! > 0, "a's sequence is kept");
        const submits = prefillStats.submits;
        const reused = await tokensOf(engine, b, 10, sampled);
        assert.equal(engine.stats().reuses, 1, "b took a's sequence");
        assert.ok(prefillStats.submits - submits > 1, "its built prefill program is submitted in pieces");
        assert.deepEqual(reused, fresh);
        assert.notDeepEqual(
          await tokensOf(engine, b, 10, { ...sampled, seed: 99 }),
          fresh,
          "another seed, other tokens (the options are the request's)",
        );
        // Teacher-forced logits, every row: on a new sequence, then on the released one of a longer request.
        const x = ids(9, 5), y = ids(10, 2);
        const logitsFresh = await engine.logits(x);
        await engine.logits(y);
        const before = engine.stats().reuses!;
        const logitsReused = await engine.logits(x);
        assert.equal(engine.stats().reuses, before + 1, "x took y's sequence");
        assert.deepEqual(logitsReused, logitsFresh);
        assert.equal(engine.stats().active, 0);
      } finally {
        engine.close();
      }
    },
  );
}

Deno.test(
  needs("a request released while it runs is not handed on, and spares: 0 keeps none", {
    "a WebGPU adapter": gpu,
    "tests/fixtures/llama3-tiny": fixtureDir("llama3-tiny"),
  }),
  async () => {
    const dir = fixtureDir("llama3-tiny")!;
    const engine = await loadEngine(dir, { gpu: gpu!, weights: "f32" });
    const none = await loadEngine(dir, { gpu: gpu!, weights: "f32", spares: 0 });
    try {
      const greedy = { temperature: 0, topP: 1, seed: 0 };
      engine.open("r", { maxSeq: 64, sampling: greedy });
      const running = engine.generate("r", [1, 2, 3], { maxTokens: 60, eos: [] });
      engine.release("r");
      const r = await running;
      assert.equal(r.stopReason, "aborted");
      assert.equal(engine.stats().spareBytes, 0, "its sequence was freed, not kept");
      await generate(none, [1, 2, 3], { maxTokens: 4, sampling: greedy });
      await generate(none, [1, 2, 3], { maxTokens: 4, sampling: greedy });
      assert.deepEqual([none.stats().spareBytes, none.stats().reuses], [0, 0]);
    } finally {
      engine.close();
      none.close();
    }
  },
);
