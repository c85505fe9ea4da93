// The decode loop's contract on a real model: batched readbacks stop exactly at eos, max tokens is exact,
// and the request's sequence is released (checked through teacher-forced equality with generation).
import assert from "node:assert/strict";
import { join } from "node:path";
import { fixtureDir } from "../fixtures.ts";
import { getGpu, NoGpuError } from "../../kernels/mod.ts";
import { Checkpoint } from "../../models/checkpoint.ts";
import { generate } from "../../models/generate.ts";
import { LlamaModel } from "../../models/llama.ts";

const gpu = await getGpu().catch((e) => {
  if (e instanceof NoGpuError) return null;
  throw e;
});
if (!gpu) console.log("skipped: generate tests (no WebGPU adapter)");

Deno.test({
  name: "generation stops exactly at an eos id and at max tokens, whatever the batching",
  ignore: !gpu,
}, async () => {
  const dir = fixtureDir("llama-micro")!;
  const ref = JSON.parse(await Deno.readTextFile(join(dir, "reference.json")));
  const prompt: number[] = ref.tokens.slice(0, ref.prompt_length);
  const cont: number[] = ref.tokens.slice(ref.prompt_length);
  const model = await LlamaModel.load(gpu!, await Checkpoint.open(dir));
  try {
    const greedy = { temperature: 0, topP: 1, seed: 0 };
    for (const maxBatch of [1, 3, 16]) {
      // The 5th generated token as eos: output ends with it, even though later steps were already queued.
      const stopAt = cont.indexOf(cont[4]);
      const r = await generate(model, prompt, {
        maxTokens: 12,
        sampling: greedy,
        eosTokenIds: [cont[4]],
        maxBatch,
      });
      assert.deepEqual(r.tokens, cont.slice(0, stopAt + 1));
      assert.equal(r.stopReason, "eos");
      for (const n of [1, 2, 7]) {
        const m = await generate(model, prompt, { maxTokens: n, sampling: greedy, maxBatch });
        assert.deepEqual(m.tokens, cont.slice(0, n));
        assert.equal(m.stopReason, "max_tokens");
      }
    }
    // An aborted request stops at a batch boundary and says so.
    const abort = new AbortController();
    const r = await generate(model, prompt, {
      maxTokens: 12,
      sampling: greedy,
      signal: abort.signal,
      onTokens: () => abort.abort(),
    });
    assert.equal(r.stopReason, "aborted");
    assert.ok(r.tokens.length >= 1 && r.tokens.length < 12);
    assert.deepEqual(r.tokens, cont.slice(0, r.tokens.length));
  } finally {
    model.destroy();
  }
});
