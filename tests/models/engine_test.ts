// The decode engine's contract on real models: batched readbacks stop exactly at eos, max tokens is exact,
// a request's sequence is released, every family's step path (what a pipeline stage runs) gives the same
// tokens as the loop, parts of the model chained by hand give the whole model's logits, and a long
// prompt's prefill leaves the event loop free between chunks.
import assert from "node:assert/strict";
import { join } from "node:path";
import { setImmediate } from "node:timers";
import { fixtureDir } from "../fixtures.ts";
import { needs } from "../support/needs.ts";
import {
  attentionDecodeFits,
  EnvError,
  getGpu,
  type KernelCall,
  type KvType,
  MLA_SHORT_KEYS,
  mlaDecodeFits,
  mlaFusedKeys,
  mlaLengthBucket,
  NoGpuError,
  readBack,
  writeBytes,
  writeStep,
} from "../../kernels/mod.ts";
import { Checkpoint } from "../../models/checkpoint.ts";
import {
  Engine,
  generate,
  loadEngine,
  NonFiniteLogitsError,
  prefillStats,
  wholeModel,
} from "../../models/engine.ts";
import { llamaMicroShapedCheckpoint } from "../../scripts/bench/random_checkpoint.ts";
import { kvCacheType, LOGITS_ROWS, Model, type Sequence } from "../../models/model.ts";
import { RandomWeights } from "../../models/random_weights.ts";
import { submit } from "../../models/engine.ts";
import { readSafetensorsHeader, readTensorBytes, writeSafetensors } from "../../models/safetensors.ts";
import { FIXTURE_TOLERANCE, readF32, worstRowError } from "../../scripts/check_fixture.ts";

const gpu = await getGpu().catch((e) => {
  if (e instanceof NoGpuError) return null;
  throw e;
});
/** Deno.test's name and ignore for a test that needs the GPU. */
const onGpu = (name: string) => needs(name, { "a WebGPU adapter": gpu });
const greedy = { temperature: 0, topP: 1, seed: 0 };

async function reference(dir: string) {
  const ref = JSON.parse(await Deno.readTextFile(join(dir, "reference.json")));
  return {
    prompt: ref.tokens.slice(0, ref.prompt_length) as number[],
    cont: ref.tokens.slice(ref.prompt_length) as number[],
  };
}

Deno.test(
  onGpu("generation stops exactly at an eos id and at max tokens, whatever the batching"),
  async () => {
    const { prompt, cont } = await reference(fixtureDir("llama-micro")!);
    const engine = await loadEngine(fixtureDir("llama-micro")!, { gpu: gpu!, weights: "f32" });
    try {
      for (const maxBatch of [1, 3, 16]) {
        // The 5th generated token as eos: output ends with it, even though later steps were already queued.
        const stopAt = cont.indexOf(cont[4]);
        const r = await generate(engine, prompt, {
          maxTokens: 12,
          sampling: greedy,
          eosTokenIds: [cont[4]],
          maxBatch,
        });
        assert.deepEqual(r.tokens, cont.slice(0, stopAt + 1));
        assert.equal(r.stopReason, "eos");
        for (const n of [1, 2, 7]) {
          const m = await generate(engine, prompt, { maxTokens: n, sampling: greedy, maxBatch });
          assert.deepEqual(m.tokens, cont.slice(0, n));
          assert.equal(m.stopReason, "max_tokens");
        }
      }
      // An aborted request stops at a batch boundary and says so.
      const abort = new AbortController();
      const r = await generate(engine, prompt, {
        maxTokens: 12,
        sampling: greedy,
        signal: abort.signal,
        onTokens: () => abort.abort(),
      });
      assert.equal(r.stopReason, "aborted");
      assert.ok(r.tokens.length >= 1 && r.tokens.length < 12);
      assert.deepEqual(r.tokens, cont.slice(0, r.tokens.length));
      assert.equal(engine.stats().active, 0, "every request was released");
    } finally {
      engine.close();
    }
  },
);

// The RoPE table is the model's: one per capacity class (Model.ropeTableFor: a power of two from 1,024, at most
// the model's positions), shared by its requests and kept when one is released, so requests of other lengths,
// before and after, still give the reference tokens.
Deno.test(onGpu("RoPE tables: one per capacity class, shared by a model's requests"), async () => {
  const { prompt, cont } = await reference(fixtureDir("llama-micro")!);
  const engine = await loadEngine(fixtureDir("llama-micro")!, { gpu: gpu!, weights: "f32" });
  try {
    const model = engine.weights;
    const row = (64 / 4 / 2) * 8; // llama-micro: head_dim 64 / 4, (cos, sin) f32 pairs a row
    const small = model.ropeTableFor(16);
    assert.equal(model.ropeTableFor(1024), small);
    const big = model.ropeTableFor(1025);
    assert.notEqual(big, small);
    assert.deepEqual([small.size, big.size], [1024 * row, 2048 * row]);
    assert.equal(
      model.ropeTableFor(4000).size,
      model.config.maxPositionEmbeddings * row,
      "at most the model's",
    );
    for (const room of [0, 2000, 0, 3000]) {
      const r = await generate(engine, prompt, { maxTokens: 8, sampling: greedy, room });
      assert.deepEqual(r.tokens, cont.slice(0, 8), `room ${room}`);
    }
    assert.equal(model.ropeTableFor(16), small, "a released request leaves the table");
  } finally {
    engine.close();
  }
});

// A request's logits buffer holds verification's rows (LOGITS_ROWS: 32 of the vocabulary, not a prefill chunk's
// 512, 263 MB for Llama 3's), unless it asks for more: a longer "logits" step is refused, saying so, and
// teacher-forced logits over a longer prompt (Engine.logits asks for its rows) match one-token steps'.
Deno.test(onGpu("prompt rows: a request that names its prompt holds activations for it alone"), async () => {
  const dir = fixtureDir("llama-micro")!;
  const { prompt, cont } = await reference(dir);
  const engine = await loadEngine(dir, { gpu: gpu!, weights: "f32" });
  try {
    const model = engine.weights;
    const P = prompt.length, H = model.config.hiddenSize;
    const rows = Math.max(P, LOGITS_ROWS);
    const whole = model.newSequence({ maxSeq: 600, sampling: greedy, maxChunk: 256 });
    const named = model.newSequence({ maxSeq: 600, sampling: greedy, maxChunk: 256, prompt: P });
    try {
      assert.deepEqual([whole.maxChunk, whole.prefillChunk, whole.x.size], [256, 256, 256 * H * 4]);
      assert.deepEqual([named.maxChunk, named.prefillChunk, named.x.size], [rows, rows, rows * H * 4]);
      assert.ok(named.activationBytes < whole.activationBytes, `${named.activationBytes}`);
      assert.equal(named.kvBytes, whole.kvBytes);
      assert.throws(() => named.program(rows + 1, "hidden"), /at most/);
    } finally {
      whole.destroy();
      named.destroy();
    }
    // The same tokens (the fixture's) with and without the hint, and through generate, which gives it.
    for (const hint of [{}, { prompt: P }]) {
      engine.open("p", { maxSeq: P + cont.length, sampling: greedy, maxChunk: 256, ...hint });
      const r = await engine.generate("p", prompt, { maxTokens: cont.length, eos: [] });
      engine.release("p");
      assert.deepEqual(r.tokens, cont, JSON.stringify(hint));
    }
    const r = await generate(engine, prompt, { maxTokens: cont.length, sampling: greedy, room: 300 });
    assert.deepEqual(r.tokens, cont);
  } finally {
    engine.close();
  }
});

Deno.test(onGpu("logits rows: a request holds verification's unless it asks for more"), async () => {
  const engine = await loadEngine(fixtureDir("llama-micro")!, { gpu: gpu!, weights: "f32" });
  try {
    const model = engine.weights;
    const V = model.config.vocabSize;
    const seq = model.newSequence({ maxSeq: 600, sampling: greedy, maxChunk: 64 });
    try {
      assert.deepEqual([seq.logitsRows, seq.logits!.size], [LOGITS_ROWS, LOGITS_ROWS * V * 4]);
      assert.throws(() => seq.program(LOGITS_ROWS + 1, "logits"), /logitsRows/);
      seq.program(LOGITS_ROWS + 1, "hidden");
    } finally {
      seq.destroy();
    }
    const tokens = Array.from({ length: LOGITS_ROWS + 8 }, (_, i) => (i * 37 + 5) % V);
    const all = await engine.logits(tokens);
    engine.open("t", { maxSeq: tokens.length, sampling: greedy });
    for (let pos = 0; pos < tokens.length; pos++) {
      const r = await engine.run("t", {
        pos0: pos,
        T: 1,
        tokens: Uint32Array.of(tokens[pos]),
        output: "logits",
      });
      const row = all.subarray(pos * V, (pos + 1) * V);
      const err = Math.max(...r.logits!.map((v, j) => Math.abs(v - row[j])));
      assert.ok(err <= 1e-4 * Math.max(...row.map(Math.abs)), `row ${pos}: ${err}`);
    }
    engine.release("t");
  } finally {
    engine.close();
  }
});

for (const name of ["qwen2-tiny", "qwen3-tiny", "llama-micro"]) {
  Deno.test(onGpu(`${name}: the step path and the loop give the reference tokens`), async () => {
    const dir = fixtureDir(name)!;
    const { prompt, cont } = await reference(dir);
    const engine = await loadEngine(dir, { gpu: gpu!, weights: "f32" });
    try {
      const loop = await generate(engine, prompt, { maxTokens: cont.length, sampling: greedy });
      assert.deepEqual(loop.tokens, cont);
      // One step at a time, as a one-stage chain without the loop would: prefill in chunks of 4, then tokens.
      engine.open("steps", { maxSeq: prompt.length + cont.length, sampling: greedy, maxChunk: 4 });
      let token = -1;
      for (let p = 0; p < prompt.length; p += 4) {
        const T = Math.min(4, prompt.length - p);
        const last = p + T >= prompt.length;
        const r = await engine.run("steps", {
          pos0: p,
          T,
          tokens: Uint32Array.from(prompt.slice(p, p + T)),
          output: last ? "sample" : "hidden",
        });
        if (last) token = r.token!;
      }
      const out = [token];
      while (out.length < cont.length) {
        const pos = prompt.length + out.length - 1;
        out.push(
          (await engine.run("steps", { pos0: pos, T: 1, tokens: Uint32Array.of(token), output: "sample" }))
            .token!,
        );
        token = out.at(-1)!;
      }
      assert.deepEqual(out, cont);
      assert.ok(engine.release("steps"));
    } finally {
      engine.close();
    }
  });
}

// Decode steps (one token, the fused GEMVs) teacher-forced on the reference tokens: every row's logits
// within 1e-4 of transformers' (f32), with the MLP's gate/up paired in one GEMV (gpu.tuning.pairGateUp,
// the default) and not; and the same greedy tokens when steps of 2..16 rows verify them (the multi-token
// GEMV, paired too).
for (const name of ["llama-micro", "llama3-tiny", "qwen2-tiny", "qwen3-tiny"]) {
  for (const pairGateUp of [true, false]) {
    const fx = fixtureDir(name, { needs: "model.safetensors" });
    const what = `${name}: decode-step logits match the reference (pairGateUp ${pairGateUp})`;
    Deno.test(needs(what, { "a WebGPU adapter": gpu, [`the ${name} fixture`]: fx }), async () => {
      const dir = fx!;
      const ref = JSON.parse(await Deno.readTextFile(join(dir, "reference.json")));
      const tokens: number[] = ref.tokens;
      const want = await readF32(join(dir, "reference.safetensors"), "logits");
      const V = want.shape[1];
      gpu!.tuning.pairGateUp = pairGateUp;
      const engine = await loadEngine(dir, { gpu: gpu!, weights: "f32" });
      try {
        engine.open("d", { maxSeq: tokens.length, sampling: greedy });
        const got = new Float32Array(tokens.length * V);
        for (let pos = 0; pos < tokens.length; pos++) {
          const r = await engine.run("d", {
            pos0: pos,
            T: 1,
            tokens: Uint32Array.of(tokens[pos]),
            output: "logits",
          });
          got.set(r.logits!, pos * V);
        }
        const err = worstRowError(got, want.data, V);
        assert.ok(err <= FIXTURE_TOLERANCE.f32, `worst row's relative error ${err}`);
        engine.release("d");
        // Steps of k rows (verify) give the reference's greedy continuation.
        const P = ref.prompt_length;
        for (const k of [2, 5, 16]) {
          const n = Math.min(k, tokens.length - P);
          engine.open("v", { maxSeq: tokens.length, sampling: greedy });
          await engine.run("v", {
            pos0: 0,
            T: P - 1,
            tokens: Uint32Array.from(tokens.slice(0, P - 1)),
            output: "hidden",
          });
          const ids = await engine.verify("v", P - 1, tokens.slice(P - 1, P - 1 + n));
          assert.deepEqual([...ids], tokens.slice(P, P + n), `k = ${n}`);
          engine.release("v");
        }
      } finally {
        engine.close();
        delete gpu!.tuning.pairGateUp;
      }
    });
  }
}

// gpu.tuning.direct and directPairs (the one-row f32 / f16 GEMVs, the paired gate/up too, read x in place,
// K split over warps: gemv_sg.ts) change only the sums' order: decode-step logits within 1e-4 (relative,
// worst row) of the staged kernels'.
for (const name of ["llama-micro", "qwen3-tiny"]) {
  const fx = fixtureDir(name, { needs: "model.safetensors" });
  const what = `${name}: decode-step logits with gpu.tuning.direct and directPairs equal the staged kernels'`;
  Deno.test(needs(what, { "a WebGPU adapter": gpu, [`the ${name} fixture`]: fx }), async () => {
    const ref = JSON.parse(await Deno.readTextFile(join(fx!, "reference.json")));
    const tokens: number[] = ref.tokens;
    const decode = async (direct: boolean): Promise<Float32Array> => {
      gpu!.tuning.direct = direct;
      gpu!.tuning.directPairs = direct;
      const engine = await loadEngine(fx!, { gpu: gpu!, weights: "f32" });
      try {
        engine.open("d", { maxSeq: tokens.length, sampling: greedy });
        const rows: Float32Array[] = [];
        for (let pos = 0; pos < tokens.length; pos++) {
          const r = await engine.run("d", {
            pos0: pos,
            T: 1,
            tokens: Uint32Array.of(tokens[pos]),
            output: "logits",
          });
          rows.push(r.logits!);
        }
        const out = new Float32Array(rows.length * rows[0].length);
        rows.forEach((r, i) => out.set(r, i * r.length));
        return out;
      } finally {
        engine.close();
        delete gpu!.tuning.direct;
        delete gpu!.tuning.directPairs;
      }
    };
    const want = await decode(false);
    const got = await decode(true);
    const err = worstRowError(got, want, got.length / tokens.length);
    assert.ok(err <= 1e-4, `worst row's relative error ${err}`);
  });
}

Deno.test(
  onGpu("three parts of qwen3-tiny chained by hand give the whole model's logits"),
  async () => {
    const dir = fixtureDir("qwen3-tiny")!;
    const { prompt } = await reference(dir);
    const ckpt = await Checkpoint.open(dir);
    const L = ckpt.config.numLayers;
    const whole = new Engine(wholeModel(L), await Model.load(gpu!, ckpt, { weights: "f32" }));
    const roles = [
      { index: 0, stages: 3, layers: [0, 1] as [number, number], embeds: true, head: false },
      { index: 1, stages: 3, layers: [1, 2] as [number, number], embeds: false, head: false },
      { index: 2, stages: 3, layers: [2, L] as [number, number], embeds: false, head: true },
    ];
    const parts = await Promise.all(
      roles.map((role) => loadEngine(dir, { gpu: gpu!, role, weights: "f32" })),
    );
    try {
      const want = await whole.logits(prompt);
      const T = prompt.length;
      for (const p of parts) p.open("r", { maxSeq: T, sampling: greedy, logitsRows: T });
      let hidden =
        (await parts[0].run("r", { pos0: 0, T, tokens: Uint32Array.from(prompt), output: "hidden" }))
          .hidden!;
      hidden = (await parts[1].run("r", { pos0: 0, T, hidden, output: "hidden" })).hidden!;
      const got = (await parts[2].run("r", { pos0: 0, T, hidden, output: "logits" })).logits!;
      let worst = 0;
      for (let i = 0; i < want.length; i++) worst = Math.max(worst, Math.abs(got[i] - want[i]));
      assert.ok(worst < 1e-5, `worst |difference| ${worst}`);
      for (const p of parts) assert.equal(p.stats().active, 1);
    } finally {
      whole.close();
      for (const p of parts) p.close();
    }
  },
);

Deno.test(
  onGpu("a stage's one-token steps encoded ahead give the hidden states of steps encoded in turn"),
  async () => {
    const dir = fixtureDir("llama-micro")!;
    const ckpt = await Checkpoint.open(dir);
    const L = ckpt.config.numLayers;
    const role = { index: 0, stages: 2, layers: [0, L - 1] as [number, number], embeds: true, head: false };
    const stage = await loadEngine(dir, { gpu: gpu!, role, weights: "f32" });
    const V = ckpt.config.vocabSize;
    const ids = (pos0: number, T: number) => Uint32Array.from({ length: T }, (_, i) => (pos0 + i) * 31 % V);
    // A prompt, one-token steps (each encoding the next), a two-token step, a rewind to an earlier position
    // (the step encoded ahead is for another position: same program), and one-token steps through several
    // of the attention's cache-length programs (the one encoded ahead is for the other program there).
    const steps: [number, number][] = [[0, 5], [5, 1], [6, 1], [7, 1], [8, 2], [10, 1], [11, 1], [9, 1]];
    for (let p = 10; p < 300; p++) steps.push([p, 1]);
    const run = async (encodeAhead: boolean) => {
      gpu!.tuning.encodeAhead = encodeAhead;
      stage.open("a", { maxSeq: 320, sampling: greedy });
      const out: Float32Array[] = [];
      for (const [pos0, T] of steps) {
        if (pos0 < stage.length("a")) stage.truncate("a", pos0);
        out.push((await stage.run("a", { pos0, T, tokens: ids(pos0, T), output: "hidden" })).hidden!);
        await new Promise((r) => setImmediate(r)); // a chain's gap: the next step is encoded in it
      }
      stage.release("a");
      return out;
    };
    try {
      const inTurn = await run(false);
      const ahead = await run(true);
      for (let i = 0; i < steps.length; i++) assert.deepEqual(ahead[i], inTurn[i], `step ${steps[i]}`);
    } finally {
      delete gpu!.tuning.encodeAhead;
      stage.close();
    }
  },
);

for (const overlap of [true, false]) {
  Deno.test(
    onGpu(`a long prefill yields to the event loop between chunks (prefillOverlap ${overlap})`),
    async () => {
      gpu!.tuning.prefillOverlap = overlap;
      try {
        await longPrefill();
      } finally {
        delete gpu!.tuning.prefillOverlap;
      }
    },
  );
}

Deno.test(
  onGpu(
    "the decode loop yields to the event loop between its batches, so a stream's tokens go out as they come",
  ),
  async () => {
    const engine = await loadEngine(fixtureDir("llama-micro")!, { gpu: gpu!, weights: "f32" });
    try {
      // Each delivery of tokens notes how many times a timer ran by then: a loop that never yields (its map
      // calls block and its reads settle as microtasks) runs no timer before it returns.
      let ticks = 0;
      const timer = setInterval(() => ticks++, 0);
      const seen: number[] = [];
      engine.open("d", { maxSeq: 80, sampling: greedy });
      const r = await engine.generate("d", [1, 2, 3], {
        maxTokens: 64,
        eos: [],
        onTokens: () => seen.push(ticks),
      });
      clearInterval(timer);
      engine.release("d");
      assert.equal(r.tokens.length, 64);
      assert.ok(seen.length >= 5, `${seen.length} deliveries`);
      assert.ok(seen[seen.length - 1] > seen[0], `timers ran between deliveries: ${seen}`);
      // Released between batches (a timer's turn): the loop stops at the next one and says so.
      engine.open("cut", { maxSeq: 80, sampling: greedy });
      let delivered = 0;
      const cut = await engine.generate("cut", [1, 2, 3], {
        maxTokens: 64,
        eos: [],
        onTokens: (ids) => {
          if ((delivered += ids.length) >= 3) setTimeout(() => engine.release("cut"), 0);
        },
      });
      assert.equal(cut.stopReason, "aborted");
      assert.ok(cut.tokens.length < 64, `${cut.tokens.length} tokens`);
    } finally {
      engine.close();
    }
  },
);

Deno.test(
  onGpu("a new request's first chunk submitted layers at a time gives the one-submit tokens"),
  async () => {
    const g = gpu!;
    const ckpt = await Checkpoint.open(await llamaMicroShapedCheckpoint(9));
    // No spares: each request builds its programs, which is what is submitted early.
    const engine = new Engine(wholeModel(9), await Model.load(g, ckpt, { weights: "f32" }), { spares: 0 });
    try {
      const prompt = Array.from({ length: 70 }, (_, i) => (i * 37 + 5) % 500);
      const run = async (early: boolean, maxChunk: number, marks?: number[]) => {
        g.tuning.prefillEarlySubmit = early;
        g.tuning.prefillEarlyLayers = marks;
        const s0 = prefillStats.submits;
        engine.open("e", { maxSeq: 80, sampling: greedy, maxChunk });
        try {
          const r = await engine.generate("e", prompt, { maxTokens: 4, eos: [] });
          return { tokens: r.tokens, submits: prefillStats.submits - s0 };
        } finally {
          engine.release("e");
        }
      };
      for (const maxChunk of [128, 32]) {
        const chunks = Math.ceil(prompt.length / maxChunk);
        const one = await run(false, maxChunk);
        const early = await run(true, maxChunk);
        const early4 = await run(true, maxChunk, [4, 8]);
        assert.equal(one.submits, chunks);
        // 9 layers: after layers 1, 2, 4 and 8 (the default), then the rest (layer 9 and the head); after 4 and 8
        // only, then the rest.
        assert.equal(early.submits, chunks + 4);
        assert.equal(early4.submits, chunks + 2);
        assert.deepEqual(early.tokens, one.tokens);
        assert.deepEqual(early4.tokens, one.tokens);
      }
    } finally {
      delete g.tuning.prefillEarlySubmit;
      delete g.tuning.prefillEarlyLayers;
      engine.close();
    }
  },
);

Deno.test(
  onGpu(
    "a stage's prompt chunk submitted early (built now, or reused in pieces) gives the one-submit states",
  ),
  async () => {
    const g = gpu!;
    const ckpt = await Checkpoint.open(await llamaMicroShapedCheckpoint(9));
    const engine = new Engine(wholeModel(9), await Model.load(g, ckpt, { weights: "f32" }));
    try {
      const tokens = Uint32Array.from({ length: 40 }, (_, i) => (i * 37 + 5) % 500);
      const run = async (early: boolean) => {
        g.tuning.prefillEarlySubmit = early;
        const reuses = engine.stats().reuses ?? 0;
        engine.open("s", { maxSeq: 64, sampling: greedy, maxChunk: 64 });
        try {
          const r = await engine.run("s", { pos0: 0, T: 40, tokens, output: "hidden" });
          return { hidden: r.hidden!, reused: (engine.stats().reuses ?? 0) > reuses };
        } finally {
          engine.release("s");
        }
      };
      // A new sequence's program is submitted as it is built; the released one's, reused, in pieces.
      const fresh = await run(true);
      const reused = await run(true);
      const one = await run(false);
      assert.deepEqual([fresh.reused, reused.reused, one.reused], [false, true, true]);
      assert.deepEqual(fresh.hidden, one.hidden);
      assert.deepEqual(reused.hidden, one.hidden);
    } finally {
      delete g.tuning.prefillEarlySubmit;
      engine.close();
    }
  },
);

async function longPrefill(): Promise<void> {
  const dir = fixtureDir("llama-micro")!;
  const engine = await loadEngine(dir, { gpu: gpu!, weights: "f32" });
  try {
    const prompt = Array.from({ length: 700 }, (_, i) => (i * 37 + 5) % 500);
    let ticks = 0;
    const timer = setInterval(() => ticks++, 0);
    engine.open("long", { maxSeq: 702, sampling: greedy, maxChunk: 64 });
    const r = await engine.generate("long", prompt, { maxTokens: 2, eos: [] });
    clearInterval(timer);
    assert.equal(r.tokens.length, 2);
    assert.ok(ticks >= 5, `timers ran ${ticks} times during an 11-chunk prefill`);
    // Released mid-prefill: the loop stops at the next chunk and says so.
    engine.open("cut", { maxSeq: 702, sampling: greedy, maxChunk: 64 });
    const cut = engine.generate("cut", prompt, { maxTokens: 2, eos: [] });
    setTimeout(() => engine.release("cut"), 0);
    assert.equal((await cut).stopReason, "aborted");
    assert.equal(engine.stats().active, 1);
  } finally {
    engine.close();
  }
}

Deno.test(onGpu("NaN weights fail with a message that names non-finite logits"), async () => {
  const src = fixtureDir("llama-micro")!;
  const dir = await Deno.makeTempDir();
  try {
    const header = await readSafetensorsHeader(join(src, "model.safetensors"));
    const tensors = [];
    for (const [name, info] of header) {
      const data = (await readTensorBytes(info)).slice();
      if (name === "model.norm.weight") new Float32Array(data.buffer).fill(NaN);
      tensors.push({ name, dtype: info.dtype, shape: info.shape, data });
    }
    await writeSafetensors(join(dir, "model.safetensors"), tensors);
    await Deno.copyFile(join(src, "config.json"), join(dir, "config.json"));
    const engine = await loadEngine(dir, { gpu: gpu!, weights: "f32" });
    try {
      await assert.rejects(
        generate(engine, [1, 2, 3], { maxTokens: 3, sampling: greedy }),
        (e: Error) => e instanceof NonFiniteLogitsError && /non-finite logits/.test(e.message),
      );
      engine.open("s", { maxSeq: 8, sampling: greedy });
      await assert.rejects(
        engine.run("s", { pos0: 0, T: 3, tokens: Uint32Array.of(1, 2, 3), output: "sample" }),
        NonFiniteLogitsError,
      );
    } finally {
      engine.close();
    }
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test(
  onGpu("a config claiming more layers than the weights hold fails before anything is built"),
  async () => {
    const src = fixtureDir("llama-micro")!;
    const dir = await Deno.makeTempDir();
    try {
      await Deno.copyFile(join(src, "model.safetensors"), join(dir, "model.safetensors"));
      const config = JSON.parse(await Deno.readTextFile(join(src, "config.json")));
      await Deno.writeTextFile(
        join(dir, "config.json"),
        JSON.stringify({ ...config, num_hidden_layers: 1e12 }),
      );
      await assert.rejects(loadEngine(dir, { gpu: gpu! }), /num_hidden_layers = 1000000000000 is absurd/);
      await Deno.writeTextFile(
        join(dir, "config.json"),
        JSON.stringify({ ...config, num_hidden_layers: 5_000_000 }),
      );
      // Checked against the weights before the 5M layers' tensor table is built (that took minutes and GBs).
      await assert.rejects(
        loadEngine(dir, { gpu: gpu! }),
        /num_hidden_layers = 5000000, but the weights hold 2 layers/,
      );
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  },
);

// The f16 KV cache (the default with f16 / q8 / q4 weights where the adapter has shader-f16): the same f16
// weights decode the same greedy tokens with either cache type, through prefill (rope_kv, then flash
// attention over the cache) and decode steps (the fused decode attention), and the cache costs half the
// bytes. f32 weights keep f32. kimi-k2-tiny: MLA's latent cache the same (kernels/mla*.ts). Then the opt-in q8
// cache the same way. (llama3-tiny is in ../shared/fixtures when present: tests/fixtures.ts.)
for (const name of ["llama-micro", "qwen3-tiny", "kimi-k2-tiny", "llama3-tiny"]) {
  Deno.test(
    needs(
      `${name}: an f16 KV cache gives the f32 cache's greedy tokens at half the bytes, q8 the reference's`,
      {
        "a WebGPU adapter with shader-f16": gpu?.hasF16 ? gpu : null,
        [`the ${name} fixture`]: fixtureDir(name),
      },
    ),
    async () => {
      const g = gpu!;
      const dir = fixtureDir(name)!;
      const { prompt, cont } = await reference(dir);
      const saved = g.tuning;
      const run = async (kv: KvType | undefined, weights: "f16" | "f32") => {
        g.tuning = { ...saved, kv };
        try {
          const engine = await loadEngine(dir, { gpu: g, weights });
          try {
            let kvBytes = 0;
            const r = await generate(engine, prompt, {
              maxTokens: 24,
              sampling: greedy,
              maxBatch: 4,
              onTokens: () => kvBytes = Math.max(kvBytes, engine.stats().kvBytes),
            });
            return {
              tokens: r.tokens,
              kvType: engine.weights.kvType,
              kvBytes,
              perToken: engine.weights.kvBytesPerToken(),
              attention: engine.weights.config.layer(0).attention,
            };
          } finally {
            engine.close();
          }
        } finally {
          g.tuning = saved;
        }
      };
      const f16 = await run(undefined, "f16");
      const f32 = await run("f32", "f16");
      assert.equal(f16.kvType, "f16", "f16 weights default to an f16 cache");
      assert.equal(f32.kvType, "f32");
      assert.deepEqual(f16.tokens, f32.tokens);
      assert.equal(f16.perToken * 2, f32.perToken);
      assert.equal(f16.kvBytes * 2, f32.kvBytes);
      assert.ok(f16.kvBytes > 0);
      assert.equal((await run(undefined, "f32")).kvType, "f32", "f32 weights keep an f32 cache");
      if (!g.hasDp4) return;
      // The opt-in q8 cache (kernels/kv.ts): int8 GQA rows with an f32 scale each; MLA's latent rows stay f16.
      // It keeps the reference's greedy tokens, as q8 weights do; not all 24 (a row's step is 0.4% of its
      // largest value, so near ties of these random models move: docs/KERNELS.md "The 8-bit KV cache").
      const q8 = await run("q8", "f16");
      assert.equal(q8.kvType, "q8");
      assert.deepEqual(q8.tokens.slice(0, cont.length), cont, "q8 cache: the reference's tokens");
      // A row of head_dim values: head_dim bytes and a 4-byte scale, against 2 * head_dim in f16.
      const a = q8.attention;
      const ratio = a.kind === "gqa" ? (a.headDim + 4) / (2 * a.headDim) : 1;
      assert.equal(q8.perToken, f16.perToken * ratio);
      assert.equal(q8.kvBytes, f16.kvBytes * ratio);
    },
  );
}

Deno.test(
  onGpu("kvCacheType: the load's kv (--kv), else gpu.tuning.kv, else SWACTOR_KV, else by the weights"),
  () => {
    const g = { ...gpu!, tuning: {} };
    const saved = Deno.env.get("SWACTOR_KV");
    try {
      Deno.env.delete("SWACTOR_KV");
      assert.equal(kvCacheType(g, "f32"), "f32");
      for (const w of ["f16", "q8", "q4"] as const) assert.equal(kvCacheType(g, w), g.hasF16 ? "f16" : "f32");
      assert.equal(kvCacheType({ ...g, hasF16: false }, "q4"), "f32");
      Deno.env.set("SWACTOR_KV", "f32");
      assert.equal(kvCacheType(g, "q4"), "f32");
      if (g.hasF16) assert.equal(kvCacheType({ ...g, tuning: { kv: "f16" } }, "f32"), "f16", "tuning first");
      if (g.hasF16) {
        assert.equal(
          kvCacheType({ ...g, tuning: { kv: "f32" } }, "f32", "f16"),
          "f16",
          "the load's kv first",
        );
      }
      Deno.env.set("SWACTOR_KV", "bf16");
      assert.throws(() => kvCacheType(g, "q4"), (e) => e instanceof EnvError && /SWACTOR_KV/.test(e.message));
      assert.equal(kvCacheType(g, "q4", "f32"), "f32", "a bad SWACTOR_KV is not read when --kv is given");
      Deno.env.set("SWACTOR_KV", "f16");
      assert.throws(() => kvCacheType({ ...g, hasF16: false }, "q4"), /shader-f16/);
      Deno.env.set("SWACTOR_KV", "q8");
      if (g.hasF16 && g.hasDp4) assert.equal(kvCacheType(g, "f32"), "q8", "q8 is asked for, never a default");
      assert.throws(() => kvCacheType({ ...g, hasF16: true, hasDp4: false }, "q4"), /packed_4x8/);
    } finally {
      if (saved === undefined) Deno.env.delete("SWACTOR_KV");
      else Deno.env.set("SWACTOR_KV", saved);
    }
  },
);

/** Five tokens of prefill on `seq`, then the step at position 5 by `calls` (a program of seq's): its logits. */
async function stepAfterPrefill(seq: Sequence, calls: KernelCall[]): Promise<Float32Array> {
  const g = gpu!, P = 5;
  writeBytes(g, seq.tokens, 0, Uint32Array.from([3, 14, 15, 92, 65, 35]));
  writeStep(g, seq.step, { pos0: 0, T: P, tokOut: P });
  submit(g, seq.program(P, "hidden"));
  writeStep(g, seq.step, { pos0: P, T: 1, tokOut: P + 1 });
  submit(g, calls);
  return new Float32Array(await readBack(g, seq.logits!, seq.model.config.vocabSize * 4));
}

// A one-token step of an MLA model takes the program built for its cache's length bucket (StepOptions.keys;
// kernels/mla_attention.ts mlaLengthBucket): the whole attention in one dispatch up to mlaFusedKeys(heads)
// keys (kernels/mla_decode.ts, where it fits), the split path past it and where the length is unknown (with
// many heads one head a workgroup up to MLA_SHORT_KEYS, four past it). Every program computes the same step.
Deno.test(
  onGpu("MLA: a decode program per cache length, one partials buffer, the same logits"),
  async () => {
    const g = gpu!;
    const kimi = JSON.parse(await Deno.readTextFile(join(fixtureDir("kimi-k2-tiny")!, "config.json")));
    const labels = (calls: { label?: string }[]) => calls.map((c) => c.label).join(",");
    const attention = (calls: KernelCall[]) => calls.filter((c) => c.label === "mla_attention");
    for (const heads of [64, 4]) {
      const cfg = { ...kimi, num_attention_heads: heads, num_key_value_heads: heads, num_hidden_layers: 2 };
      const model = await Model.load(g, new RandomWeights(cfg, 3), { weights: "f32" });
      const fits = mlaDecodeFits(g, {
        heads,
        kvLoraRank: cfg.kv_lora_rank,
        qkNopeHeadDim: cfg.qk_nope_head_dim,
        qkRopeHeadDim: cfg.qk_rope_head_dim,
        vHeadDim: cfg.v_head_dim,
        maxSeq: 16,
        T: 1,
      });
      const saved = g.tuning;
      const newSeq = () => model.newSequence({ maxSeq: 16, sampling: { temperature: 0, topP: 1, seed: 0 } });
      const seq = newSeq();
      const split = newSeq();
      try {
        const most = mlaFusedKeys(heads);
        assert.equal(most, heads === 64 ? 1024 : 48);
        const fused = seq.program(1, "logits", { keys: 10 });
        const long = seq.program(1, "logits", { keys: most + 1 });
        // The split path's program for short caches: the fused kernel switched off while it is built.
        g.tuning = { ...saved, mlaFused: false };
        const short = split.program(1, "logits", { keys: 10 });
        g.tuning = saved;
        assert.equal(seq.program(1, "logits"), long, "unknown length: the long caches' program");
        // The buckets nest: with many heads the fused kernel's up to MLA_SHORT_KEYS (whose split path, where
        // the fused kernel does not fit, cuts one head a workgroup) and past it up to `most` (four heads).
        const upper = seq.program(1, "logits", { keys: most });
        assert.equal(seq.program(1, "logits", { keys: MLA_SHORT_KEYS }), heads >= 64 ? fused : long);
        assert.equal(upper === fused, mlaLengthBucket(heads, 10) === mlaLengthBucket(heads, most));
        assert.equal(labels(upper), labels(fused));
        assert.equal(labels(fused).includes("mla_decode"), fits, "the fused kernel where it fits");
        if (fits) assert.equal(attention(fused).length, 0);
        assert.equal(
          labels(short),
          labels(long),
          `the split path's programs: the same kernels: ${labels(short)} / ${labels(long)}`,
        );
        if (heads >= 64) {
          assert.notEqual(short, long);
          const [a, b] = [attention(short), attention(long)];
          assert.equal(a.length, 2);
          // 64 heads a workgroup each against 16 groups of 4.
          assert.deepEqual([a[0].workgroups[0], b[0].workgroups[0]], [64, 16]);
          // One buffer of split partials serves every layer of a sequence's programs (and none owns it).
          for (const x of [a, b]) {
            assert.equal(new Set(x.map((c) => c.buffers[5])).size, 1, "one partials buffer");
          }
          const other = attention(seq.program(1, "logits", { keys: most + 1, embed: false }));
          assert.equal(new Set([...b, ...other].map((c) => c.buffers[5])).size, 1, "one for the programs");
          assert.ok([...a, ...b].every((c) => !c.owned?.length));
        }
        // The step at position 5 by each program (each sequence its own cache).
        const logits: Float32Array[] = [];
        for (const [s, calls] of [[seq, fused], [seq, long], [split, short]] as const) {
          logits.push(await stepAfterPrefill(s, calls));
        }
        const scale = Math.max(...logits[1].map(Math.abs));
        for (const [i, what] of [[0, "fused"], [2, "short"]] as const) {
          const err = Math.max(...logits[i].map((v, j) => Math.abs(v - logits[1][j])));
          assert.ok(
            err <= 1e-5 * scale,
            `${heads} heads, ${what}: logits ${err} from the long program's (scale ${scale})`,
          );
        }
        assert.ok(logits[1].every(Number.isFinite) && new Set(logits[1]).size > 100, "real logits");
      } finally {
        g.tuning = saved;
        seq.destroy();
        split.destroy();
        model.destroy();
      }
    }
  },
);

// A decode step of a GQA model takes the program built for its cache-length bucket (StepOptions.keys;
// kernels/attention_decode.ts attentionLengthBucket): no flash-decoding splits for its first 1,024 keys however
// long the cache, per-head splits up to 4,096, the capacity's program past it (here the grouped kernel: head_dim
// 128, groups of 4). k-steps too; a cache of at most 1,024 positions has one program. Every program computes
// the same step.
Deno.test(onGpu("GQA: a decode program per cache length, the same logits"), async () => {
  const g = gpu!;
  const base = JSON.parse(await Deno.readTextFile(join(fixtureDir("llama-micro")!, "config.json")));
  const cfg = {
    ...base,
    hidden_size: 128,
    num_attention_heads: 8,
    num_key_value_heads: 2,
    head_dim: 128,
    max_position_embeddings: 8192,
  };
  const model = await Model.load(g, new RandomWeights(cfg, 7), { weights: "f32" });
  const seq = model.newSequence({ maxSeq: 8192, sampling: greedy });
  const small = model.newSequence({ maxSeq: 1024, sampling: greedy });
  const labels = (calls: KernelCall[]) => calls.map((c) => c.label).join(",");
  const attention = (calls: KernelCall[]) => calls.filter((c) => c.label === "attention");
  try {
    const short = seq.program(1, "logits", { keys: 6 });
    const mid = seq.program(1, "logits", { keys: 2000 });
    const long = seq.program(1, "logits", { keys: 5000 });
    assert.equal(seq.program(1, "logits"), long, "unknown length: the capacity's program");
    assert.equal(seq.program(1, "logits", { keys: 1024 }), short);
    assert.equal(seq.program(1, "logits", { keys: 1025 }), mid);
    assert.notEqual(short, mid);
    assert.notEqual(
      seq.program(4, "logits", { keys: 10 }),
      seq.program(4, "logits"),
      "k-steps by bucket too",
    );
    assert.equal(small.program(1, "logits", { keys: 6 }), small.program(1, "logits"), "one program");
    // The programs' layers share their uniform parameter buffers (kernels/gpu.ts withSharedUniforms).
    const uniforms = new Set(
      [...short, ...long].flatMap((c) => c.buffers.filter((b) => b.usage & GPUBufferUsage.UNIFORM)),
    );
    assert.ok(uniforms.size < short.length, `${uniforms.size} uniform buffers for ${short.length} calls`);
    const fits = attentionDecodeFits(g, { heads: 8, kvHeads: 2, headDim: 128, maxSeq: 8192 });
    if (fits) {
      assert.ok(!labels(short).includes("attention_combine"), labels(short));
      assert.ok(labels(mid).includes("attention_combine"), labels(mid));
      // 8 heads of 32 splits against (where its workgroup memory fits) one workgroup per kv head.
      assert.deepEqual(attention(mid)[0].workgroups, [8, 32, 1]);
      assert.deepEqual(attention(short)[0].workgroups.slice(1), [1, 1]);
    }
    // The step at position 5 by each program.
    const logits: Float32Array[] = [];
    for (const calls of [long, mid, short]) logits.push(await stepAfterPrefill(seq, calls));
    const scale = Math.max(...logits[0].map(Math.abs));
    for (const [i, what] of [[1, "split"], [2, "unsplit"]] as const) {
      const err = Math.max(...logits[i].map((v, j) => Math.abs(v - logits[0][j])));
      assert.ok(err <= 1e-5 * scale, `${what}: logits ${err} from the capacity's program's (scale ${scale})`);
    }
    assert.ok(logits[0].every(Number.isFinite) && new Set(logits[0]).size > 100, "real logits");
  } finally {
    seq.destroy();
    small.destroy();
    model.destroy();
  }
});

// Before a MoE block whose experts run as the fused kernel, o_proj writes the block's int8 input and the
// router's partial logits (kernels/moe_ffn.ts moeInputCopy), so no router GEMV runs: a Qwen3-MoE model with q4
// weights computes the same logits either way, for one token and k-steps.
Deno.test(
  onGpu("MoE: o_proj writes the fused expert kernel's input, no router GEMV, the same logits"),
  async () => {
    const g = gpu!;
    const base = JSON.parse(await Deno.readTextFile(join(fixtureDir("qwen3-moe-norm")!, "config.json")));
    const cfg = {
      ...base,
      // o_proj's K (heads x head_dim) a multiple of 32 lanes' q4 units, so it takes the int8 direct mode.
      hidden_size: 256,
      num_attention_heads: 8,
      num_key_value_heads: 2,
      head_dim: 128,
      moe_intermediate_size: 64,
      num_experts: 16,
      num_experts_per_tok: 4,
      num_hidden_layers: 3,
      decoder_sparse_step: 1,
      mlp_only_layers: [],
    };
    const model = await Model.load(g, new RandomWeights(cfg, 3), { weights: "q4" });
    const saved = g.tuning;
    const V = model.config.vocabSize, P = 5;
    try {
      for (const T of [1, 3]) {
        const logits: Float32Array[] = [];
        for (const moeCopyIn of [true, false]) {
          g.tuning = { ...saved, moeCopyIn };
          const seq = model.newSequence({ maxSeq: 32, sampling: greedy });
          try {
            const calls = seq.program(T, "logits");
            g.tuning = saved;
            const labels = calls.map((c) => c.label).join();
            const routers = calls.filter((c) => c.label === "moe_router_gemv").length;
            assert.equal(routers, moeCopyIn ? 0 : 3, `T ${T}, moeCopyIn ${moeCopyIn}: ${labels}`);
            assert.equal(calls.filter((c) => c.label === "moe_fused").length, 3, labels);
            writeBytes(g, seq.tokens, 0, Uint32Array.from([3, 14, 15, 92, 65, 35, 8, 9]));
            writeStep(g, seq.step, { pos0: 0, T: P, tokOut: P });
            submit(g, seq.program(P, "hidden"));
            writeStep(g, seq.step, { pos0: P, T, tokOut: P + T });
            submit(g, calls);
            logits.push(new Float32Array(await readBack(g, seq.logits!, T * V * 4)));
          } finally {
            seq.destroy();
          }
        }
        const scale = Math.max(...logits[1].map(Math.abs));
        const err = Math.max(...logits[0].map((v, j) => Math.abs(v - logits[1][j])));
        assert.ok(err <= 1e-4 * scale, `T ${T}: logits ${err} from the router GEMV's (scale ${scale})`);
        assert.ok(logits[1].every(Number.isFinite) && new Set(logits[1]).size > 100, "real logits");
      }
    } finally {
      g.tuning = saved;
      model.destroy();
    }
  },
);

Deno.test(
  onGpu("an allocation that fails while a request runs fails the request with GpuMemoryError, not garbage"),
  async () => {
    const dir = fixtureDir("llama-micro")!;
    const engine = await loadEngine(dir, { gpu: gpu!, weights: "f32" });
    const device = gpu!.device;
    // WebGPU reports a buffer no error scope was around (a program's uniforms, say) as an uncaptured error,
    // and skips the work that uses it; this one comes as the device would report a real one.
    const outOfMemory = () =>
      device.dispatchEvent(
        new GPUUncapturedErrorEvent("uncapturederror", {
          error: new GPUOutOfMemoryError("not enough memory left"),
        }),
      );
    const failed = (e: Error) =>
      e.name === "GpuMemoryError" &&
      e.message.startsWith(`${gpu!.adapterName} ran out of memory during a request (not enough memory left)`);
    try {
      engine.open("a", { maxSeq: 64, sampling: greedy });
      await engine.run("a", { pos0: 0, T: 2, tokens: Uint32Array.of(1, 2), output: "sample" });
      outOfMemory();
      await assert.rejects(
        () => engine.run("a", { pos0: 2, T: 1, tokens: Uint32Array.of(3), output: "sample" }),
        failed,
      );
      assert.equal(engine.release("a"), false, "no longer open");
      // The decode loop: after its first tokens went out, none more.
      engine.open("b", { maxSeq: 64, sampling: greedy });
      const got: number[] = [];
      await assert.rejects(
        () =>
          engine.generate("b", [1, 2, 3], {
            maxTokens: 40,
            eos: [],
            onTokens: (ids) => {
              if (got.length === 0) outOfMemory();
              got.push(...ids);
            },
          }),
        failed,
      );
      assert.ok(got.length >= 1 && got.length < 40, `${got.length} tokens went out`);
      assert.equal(engine.release("b"), false, "no longer open");
      assert.deepEqual(
        [engine.stats().active, engine.stats().spareBytes],
        [0, 0],
        "nothing open, nothing kept",
      );
      // A request opened after it runs.
      engine.open("c", { maxSeq: 64, sampling: greedy });
      const r = await engine.run("c", { pos0: 0, T: 2, tokens: Uint32Array.of(1, 2), output: "sample" });
      assert.ok(r.token !== undefined && r.token < engine.model.vocab);
      engine.release("c");
    } finally {
      engine.close();
    }
  },
);

Deno.test(
  onGpu(
    "a request whose buffers the GPU could not allocate fails with GpuMemoryError and leaves nothing open",
  ),
  async () => {
    const dir = fixtureDir("llama-micro")!;
    const engine = await loadEngine(dir, { gpu: gpu!, weights: "f32" });
    const device = gpu!.device;
    const popErrorScope = device.popErrorScope;
    try {
      // WebGPU reports a buffer it could not allocate to the error scope around it (Engine.open's); this
      // one reports the sequence's as the device would.
      device.popErrorScope = () => Promise.resolve(new GPUOutOfMemoryError("not enough memory left"));
      engine.open("big", { maxSeq: 64, sampling: greedy });
      device.popErrorScope = popErrorScope;
      await assert.rejects(
        () => engine.run("big", { pos0: 0, T: 2, tokens: Uint32Array.of(1, 2), output: "sample" }),
        (e: Error) =>
          e.name === "GpuMemoryError" && e.message.includes(gpu!.adapterName) &&
          /a request of 64 positions \(KV cache \d+ MiB, .*not enough memory left\): ask for fewer tokens/
            .test(e.message),
      );
      assert.equal(engine.release("big"), false, "no longer open");
      assert.deepEqual(
        [engine.stats().active, engine.stats().spareBytes],
        [0, 0],
        "nothing open, nothing kept",
      );
      // The next request is whole (a sequence of its own) and runs.
      engine.open("next", { maxSeq: 64, sampling: greedy });
      const r = await engine.run("next", { pos0: 0, T: 2, tokens: Uint32Array.of(1, 2), output: "sample" });
      assert.ok(r.token !== undefined && r.token < engine.model.vocab);
      assert.equal(engine.stats().reuses, 0, "a sequence of its own");
      engine.release("next");
    } finally {
      device.popErrorScope = popErrorScope;
      engine.close();
    }
  },
);
