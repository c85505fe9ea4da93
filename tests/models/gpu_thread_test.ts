// The model runtime on its own thread (models/gpu_thread.ts): stages and expert hosts loaded on the GPU
// thread compute what the same code computes on this one, bit for bit; the sync calls (open, release, stats)
// answer without a round trip; errors keep their class; a remote-expert stage calls back for its experts.
import assert from "node:assert/strict";
import { fixtureDir } from "../fixtures.ts";
import { gpuAvailable, needs } from "../support/needs.ts";
import { Checkpoint } from "../../models/checkpoint.ts";
import { loadExpertHost, loadStage, wholeModel } from "../../models/engine.ts";
import { gpuThread, threadExpertLoader, threadStageLoader } from "../../models/gpu_thread.ts";
import { RequestError } from "../../models/errors.ts";
import type { StageBackend, StageRole } from "../../models/backend.ts";

const hasGpu = await gpuAvailable();
const greedy = { temperature: 0, topP: 1, seed: 0 };
const micro = fixtureDir("llama-micro");
const mixtral = fixtureDir("mixtral-tiny");

/** Prefill in the stage's chunks then `steps` one-token steps, the logits of every step, through `stages`. */
async function logitsThrough(
  stages: StageBackend[],
  prompt: number[],
  steps: number[],
): Promise<Float32Array[]> {
  const id = `t-${crypto.randomUUID().slice(0, 6)}`;
  const chunk = Math.min(...stages.map((s) => s.open(id, { maxSeq: 64, sampling: greedy }).chunk));
  const out: Float32Array[] = [];
  const step = async (pos0: number, tokens: number[]) => {
    let hidden: Float32Array | undefined;
    for (const [i, s] of stages.entries()) {
      const last = i === stages.length - 1;
      const r = await s.run(id, {
        pos0,
        T: tokens.length,
        tokens: i === 0 ? Uint32Array.from(tokens) : undefined,
        hidden,
        output: last ? "logits" : "hidden",
      });
      if (last) out.push(r.logits!);
      else hidden = r.hidden;
    }
  };
  for (let p = 0; p < prompt.length; p += chunk) await step(p, prompt.slice(p, p + chunk));
  for (const [k, t] of steps.entries()) await step(prompt.length + k, [t]);
  for (const s of stages) assert.equal(s.release(id), true);
  return out;
}

Deno.test(
  needs("GPU thread: a model split in two stages there gives the in-thread stages' logits bit for bit", {
    "a WebGPU adapter": hasGpu,
    "the llama-micro fixture": micro,
  }),
  async () => {
    const model = { dir: micro!, weights: "f32" };
    const L = (await Checkpoint.open(micro!)).config.numLayers;
    const half = Math.floor(L / 2);
    const roles: StageRole[] = [
      { index: 0, stages: 2, layers: [0, half], embeds: true, head: false },
      { index: 1, stages: 2, layers: [half, L], embeds: false, head: true },
    ];
    const here = [await loadStage(roles[0], { model }), await loadStage(roles[1], { model })];
    const there = [
      await threadStageLoader(roles[0], { model }),
      await threadStageLoader(roles[1], { model }),
    ];
    try {
      const prompt = [1, 5, 9, 2, 7, 3, 11, 4, 6];
      const want = await logitsThrough(here, prompt, [8, 10, 12]);
      const got = await logitsThrough(there, prompt, [8, 10, 12]);
      assert.equal(got.length, want.length);
      for (const [i, w] of want.entries()) assert.deepEqual(got[i], w, `step ${i}`);
      assert.deepEqual(there.map((p) => p.model), here.map((p) => p.model));
      assert.deepEqual(there.map((p) => p.stats().active), [0, 0]);
    } finally {
      for (const p of [...here, ...there]) p.close();
    }
    // The thread ends with its last object, once that object's close is done there.
    for (let i = 0; i < 100 && gpuThread().running; i++) await new Promise((r) => setTimeout(r, 20));
    assert.equal(gpuThread().running, false);
  },
);

Deno.test(
  needs("GPU thread: generate streams the in-thread engine's tokens; open, release, stats and errors", {
    "a WebGPU adapter": hasGpu,
    "the llama-micro fixture": micro,
  }),
  async () => {
    const model = { dir: micro!, weights: "f32" };
    const L = (await Checkpoint.open(micro!)).config.numLayers;
    const here = await loadStage(wholeModel(L), { model });
    const progress: number[] = [];
    const there = await threadStageLoader(wholeModel(L), {
      model,
      onProgress: (done) => progress.push(done),
    });
    try {
      assert.ok(progress.length > 0, "load progress crosses the thread");
      const prompt = [3, 1, 4, 1, 5, 9, 2, 6];
      here.open("a", { maxSeq: 40, sampling: greedy });
      const want = await here.generate!("a", prompt, { maxTokens: 24, eos: [] });
      const { chunk } = there.open("a", { maxSeq: 40, sampling: greedy });
      assert.equal(chunk, here.open("b", { maxSeq: 40, sampling: greedy }).chunk, "the same step chunk");
      const streamed: number[] = [];
      const got = await there.generate!("a", prompt, {
        maxTokens: 24,
        eos: [],
        onTokens: (ids) => streamed.push(...ids),
      });
      assert.deepEqual(got.tokens, want.tokens);
      assert.deepEqual(streamed, want.tokens);
      const s = there.stats();
      assert.equal(s.active, 1);
      assert.equal(s.kvBytes, here.stats().kvBytes / 2, "one open request's KV, as the thread reported it");
      assert.equal(s.weightBytes, here.stats().weightBytes);
      // A second request: each counts its own KV once (its first step waits for its open on the thread).
      there.open("b", { maxSeq: 40, sampling: greedy });
      await there.run("b", { pos0: 0, T: 1, tokens: Uint32Array.of(3), output: "sample" });
      assert.deepEqual(
        [there.stats().active, there.stats().kvBytes],
        [2, here.stats().kvBytes],
        "two requests' KV, as the in-thread engine holds for the same two",
      );
      assert.equal(there.release("b"), true);
      // Errors keep their class and message.
      await assert.rejects(
        there.run("a", { pos0: 0, T: 1, tokens: Uint32Array.of(10 ** 6), output: "sample" }),
        (e) => e instanceof RequestError && /outside the vocabulary/.test(e.message),
      );
      await assert.rejects(
        there.run("nope", { pos0: 0, T: 1, tokens: Uint32Array.of(1), output: "sample" }),
        /not open/,
      );
      assert.throws(() => there.open("big", { maxSeq: 10 ** 7, sampling: greedy }), RequestError);
      assert.throws(() => there.open("a", { maxSeq: 8, sampling: greedy }), /already open/);
      assert.equal(there.release("a"), true);
      assert.equal(there.release("a"), false);
      assert.equal(there.stats().active, 0);
    } finally {
      here.close();
      there.close();
    }
    await assert.rejects(
      there.run("a", { pos0: 0, T: 1, tokens: Uint32Array.of(1), output: "sample" }),
      /not open|closed/,
    );
  },
);

Deno.test(
  needs("GPU thread: a stage whose experts are remote calls back for them; expert hosts there too", {
    "a WebGPU adapter": hasGpu,
    "the mixtral-tiny fixture": mixtral,
  }),
  async () => {
    const model = { dir: mixtral!, weights: "f32" };
    const c = (await Checkpoint.open(mixtral!)).config;
    const moe: number[] = [];
    const hold = new Map<number, number[]>();
    for (let l = 0; l < c.numLayers; l++) {
      const f = c.layer(l).ffn;
      if (f.kind !== "moe") continue;
      moe.push(l);
      hold.set(l, Array.from({ length: f.routing.experts }, (_, e) => e));
    }
    const role = wholeModel(c.numLayers);
    const here = await loadStage(role, { model });
    const localHost = await loadExpertHost(hold, { model });
    const host = await threadExpertLoader(hold, { model });
    const asked: number[] = [];
    const split = await threadStageLoader(role, {
      model,
      experts: {
        remote: moe,
        fanout: (layer, input) => {
          asked.push(layer);
          return host.compute(layer, input);
        },
      },
    });
    try {
      assert.deepEqual([...host.held()], [...localHost.held()]);
      assert.equal(host.weightBytes, localHost.weightBytes);
      const prompt = [2, 7, 1, 8, 2, 8];
      const want = await logitsThrough([here], prompt, [4, 5]);
      const got = await logitsThrough([split], prompt, [4, 5]);
      for (const [i, w] of want.entries()) {
        let worst = 0, scale = 0;
        for (let j = 0; j < w.length; j++) {
          worst = Math.max(worst, Math.abs(got[i][j] - w[j]));
          scale = Math.max(scale, Math.abs(w[j]));
        }
        assert.ok(worst <= 1e-5 * scale, `step ${i}: ${worst} of ${scale}`);
      }
      assert.ok(moe.every((l) => asked.includes(l)), "every MoE layer called back");
    } finally {
      here.close();
      localHost.close();
      split.close();
      host.close();
    }
  },
);

Deno.test(
  needs("GPU thread: a load that fails rejects with the loader's error and holds no thread", {
    "a WebGPU adapter": hasGpu,
  }),
  async () => {
    const dir = await Deno.makeTempDir();
    try {
      await assert.rejects(
        threadStageLoader(wholeModel(1), { model: { dir, weights: "f32" } }),
        (e) => e instanceof Error && e.name === "CheckpointError" && /config\.json/.test(e.message),
      );
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
    gpuThread().terminate(); // nothing held: a no-op past the worker, which the failed load already ended
  },
);

Deno.test(
  needs("GPU thread: when the thread stops, a call in flight fails with an error saying so", {
    "a WebGPU adapter": hasGpu,
    "the llama-micro fixture": micro,
  }),
  async () => {
    const model = { dir: micro!, weights: "f32" };
    const L = (await Checkpoint.open(micro!)).config.numLayers;
    const stage = await threadStageLoader(wholeModel(L), { model });
    stage.open("a", { maxSeq: 64, sampling: greedy });
    const running = stage.generate!("a", [1, 2, 3], { maxTokens: 40, eos: [] });
    gpuThread().terminate();
    await assert.rejects(running, /the GPU thread was stopped/);
    stage.close(); // after the thread: nothing to wait for, no error
    assert.equal(gpuThread().running, false, "closing an object of a stopped thread starts no new one");
  },
);
