// The engine's own prefill chunk (models/model.ts prefillChunkFor), a step's (stepChunk) and where the
// prefill GEMMs may multiply in f16 (denseFor): pure rules, checked without a GPU.
import assert from "node:assert/strict";
import { fixtureDir } from "../fixtures.ts";
import { readModelConfig } from "../../models/family.ts";
import { denseFor, LOGITS_ROWS, type Model, prefillChunkFor, stepChunk } from "../../models/model.ts";

/** What prefillChunkFor reads of a model: its adapter, its weights' storage and their bytes. */
const model = (weightType: string, weightBytes: number, isSoftware = false) =>
  ({ gpu: { isSoftware }, weightType, weightBytes }) as unknown as Model;

Deno.test("prefill chunk: 2048 for a 1B model, 1024 for a 3B, the step's 512 for an 8B", () => {
  assert.equal(prefillChunkFor(model("f16", 2.47e9), false, 512), 2048); // Llama-3.2-1B
  assert.equal(prefillChunkFor(model("q4", 0.695e9), false, 512), 2048); // the same at 4 bits
  assert.equal(prefillChunkFor(model("f16", 6.4e9), false, 512), 1024); // 3.2B parameters
  assert.equal(prefillChunkFor(model("q8", 3.4e9), false, 512), 1024); // 3.2B at 8 bits
  assert.equal(prefillChunkFor(model("f16", 16e9), false, 512), 512); // 8B: never below the step's chunk
  assert.equal(prefillChunkFor(model("f32", 0.2e9), false, 512), 2048); // tiny: the cap
});

Deno.test("prefill chunk: MoE parts and software adapters keep the step's chunk", () => {
  assert.equal(prefillChunkFor(model("f16", 2.47e9), true, 512), 512);
  assert.equal(prefillChunkFor(model("f16", 2.47e9, true), false, 32), 32);
});

Deno.test("step chunk: a named prompt cuts it at a power of two >= max(prompt, LOGITS_ROWS), never splitting the prompt more", () => {
  const limits = { base: 512, cap: 4096 };
  assert.equal(stepChunk(1100, limits), 512);
  assert.equal(stepChunk(1100, limits, 100), 128); // a chat request: its prompt in one step, as before
  assert.equal(stepChunk(1100, limits, 128), 128); // (rows to a power of two: reuse by the next request)
  assert.equal(stepChunk(1100, limits, 33), 64);
  assert.equal(stepChunk(1100, limits, 5), LOGITS_ROWS); // verification's k + 1 rows still fit
  assert.equal(stepChunk(1100, limits, 900), 512); // longer than a chunk: the chunks unchanged
  assert.equal(stepChunk(20, limits, 10), 20); // never past the sequence
  assert.equal(stepChunk(1100, { base: 512, cap: 64 }, 100), 64); // nor past the binding
});

Deno.test("f16 prefill GEMMs for dense models, not for models with MoE layers", async () => {
  assert.equal(denseFor(await readModelConfig(fixtureDir("llama-micro")!)), true);
  assert.equal(denseFor(await readModelConfig(fixtureDir("qwen3-tiny")!)), true);
  assert.equal(denseFor(await readModelConfig(fixtureDir("mixtral-tiny")!)), false);
  // Kimi K2: its first layer is dense, the rest route to experts.
  assert.equal(denseFor(await readModelConfig(fixtureDir("kimi-k2-tiny")!)), false);
});
