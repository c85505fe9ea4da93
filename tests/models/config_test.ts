import assert from "node:assert/strict";
import { join } from "node:path";
import { parseLlamaConfig, readConfig } from "../../models/config.ts";
import { CheckpointError } from "../../models/errors.ts";
import { fixtureDir } from "../fixtures.ts";

const LLAMA3_TINY = {
  architectures: ["LlamaForCausalLM"],
  model_type: "llama",
  vocab_size: 128256,
  hidden_size: 64,
  intermediate_size: 192,
  num_hidden_layers: 4,
  num_attention_heads: 4,
  num_key_value_heads: 2,
  head_dim: 16,
  hidden_act: "silu",
  max_position_embeddings: 131072,
  rms_norm_eps: 1e-05,
  rope_theta: 500000.0,
  rope_scaling: {
    factor: 32.0,
    high_freq_factor: 4.0,
    low_freq_factor: 1.0,
    original_max_position_embeddings: 8192,
    rope_type: "llama3",
  },
  tie_word_embeddings: true,
  attention_bias: false,
  mlp_bias: false,
  bos_token_id: 128000,
  eos_token_id: [128001, 128008, 128009],
  torch_dtype: "bfloat16",
};

function fails(json: unknown, pattern: RegExp) {
  assert.throws(() => parseLlamaConfig(json, "cfg.json"), (e) => {
    assert.ok(e instanceof CheckpointError, `expected CheckpointError, got ${e}`);
    assert.match((e as Error).message, pattern);
    return true;
  });
}

Deno.test("llama3-tiny's config parses to camelCase with llama3 rope scaling and all eos ids", () => {
  assert.deepEqual(parseLlamaConfig(LLAMA3_TINY, "cfg.json"), {
    modelType: "llama",
    architectures: ["LlamaForCausalLM"],
    vocabSize: 128256,
    hiddenSize: 64,
    intermediateSize: 192,
    numLayers: 4,
    numHeads: 4,
    numKvHeads: 2,
    headDim: 16,
    rmsNormEps: 1e-5,
    ropeTheta: 500000,
    ropeScaling: {
      type: "llama3",
      factor: 32,
      lowFreqFactor: 1,
      highFreqFactor: 4,
      originalMaxPositionEmbeddings: 8192,
    },
    maxPositionEmbeddings: 131072,
    tieWordEmbeddings: true,
    bosTokenId: 128000,
    eosTokenIds: [128001, 128008, 128009],
    torchDtype: "bfloat16",
    hiddenAct: "silu",
  });
});

Deno.test("llama-micro's config from disk: head_dim from hidden/heads, kv heads, single eos, no scaling", async () => {
  const c = await readConfig(fixtureDir("llama-micro")!);
  assert.equal(c.headDim, 16);
  assert.equal(c.numKvHeads, 4);
  assert.deepEqual(c.eosTokenIds, [2]);
  assert.equal(c.bosTokenId, 1);
  assert.equal(c.ropeScaling, null);
  assert.equal(c.ropeTheta, 10000);
  assert.equal(c.rmsNormEps, 1e-6);
  assert.equal(c.tieWordEmbeddings, false);
});

Deno.test("transformers defaults: kv heads = heads, untied, rope_type default is plain RoPE, v5 rope_parameters", () => {
  const { num_key_value_heads: _kv, head_dim: _hd, tie_word_embeddings: _t, ...rest } = LLAMA3_TINY;
  const c = parseLlamaConfig({ ...rest, rope_scaling: { rope_type: "default" }, eos_token_id: null }, "x");
  assert.equal(c.numKvHeads, 4);
  assert.equal(c.headDim, 16);
  assert.equal(c.tieWordEmbeddings, false);
  assert.equal(c.ropeScaling, null);
  assert.deepEqual(c.eosTokenIds, []);
  const { rope_theta: _r, rope_scaling: _s, ...noRope } = LLAMA3_TINY;
  const v5 = parseLlamaConfig(
    { ...noRope, rope_parameters: { rope_type: "default", rope_theta: 7000 } },
    "x",
  );
  assert.equal(v5.ropeTheta, 7000);
  assert.equal(v5.ropeScaling, null);
  // head_dim given explicitly need not equal hidden / heads (Gemma-style shapes exist in Llama configs).
  assert.equal(parseLlamaConfig({ ...LLAMA3_TINY, head_dim: 32 }, "x").headDim, 32);
  // the older "type" key is accepted in place of rope_type
  const old = parseLlamaConfig({
    ...LLAMA3_TINY,
    rope_scaling: { ...LLAMA3_TINY.rope_scaling, rope_type: undefined, type: "llama3" },
  }, "x");
  assert.equal(old.ropeScaling?.type, "llama3");
});

Deno.test("unknown architectures are refused by model_type and by architectures", async () => {
  const mixtral = fixtureDir("bad/mixtral-config")!;
  await assert.rejects(readConfig(mixtral), (e: Error) => {
    assert.ok(e instanceof CheckpointError);
    assert.equal(
      e.message,
      `unsupported architecture 'mixtral' (model_type) in ${join(mixtral, "config.json")}: supported: llama`,
    );
    return true;
  });
  fails(
    { ...LLAMA3_TINY, architectures: ["LlamaForSequenceClassification"] },
    /unsupported architecture 'LlamaForSequenceClassification'/,
  );
  fails({ ...LLAMA3_TINY, model_type: undefined }, /unsupported architecture 'undefined'/);
});

Deno.test("bad configs name the field and what was expected", () => {
  fails("nope", /cfg.json: config is not a JSON object/);
  const { vocab_size: _v, ...noVocab } = LLAMA3_TINY;
  fails(noVocab, /cfg.json: missing vocab_size \(expected a positive integer\)/);
  fails({ ...LLAMA3_TINY, hidden_size: 0 }, /hidden_size must be a positive integer, got 0/);
  fails({ ...LLAMA3_TINY, num_hidden_layers: 2.5 }, /num_hidden_layers must be a positive integer, got 2.5/);
  fails(
    { ...LLAMA3_TINY, intermediate_size: "192" },
    /intermediate_size must be a positive integer, got "192"/,
  );
  fails(
    { ...LLAMA3_TINY, num_key_value_heads: 3 },
    /num_attention_heads \(4\) must be a multiple of num_key_value_heads \(3\)/,
  );
  fails(
    { ...LLAMA3_TINY, head_dim: undefined, hidden_size: 66 },
    /hidden_size \(66\) must be a multiple of num_attention_heads/,
  );
  fails({ ...LLAMA3_TINY, rms_norm_eps: -1 }, /rms_norm_eps must be a positive number, got -1/);
  fails({ ...LLAMA3_TINY, rope_theta: "big" }, /rope_theta must be a positive number/);
  fails(
    { ...LLAMA3_TINY, rope_scaling: { rope_type: "yarn", factor: 4 } },
    /unsupported rope_scaling type "yarn"/,
  );
  fails(
    { ...LLAMA3_TINY, rope_scaling: { rope_type: "llama3", factor: 8 } },
    /rope_scaling.low_freq_factor must be a positive number/,
  );
  fails({ ...LLAMA3_TINY, hidden_act: "gelu" }, /unsupported hidden_act "gelu": supported: silu/);
  fails({ ...LLAMA3_TINY, attention_bias: true }, /unsupported attention_bias=true/);
  fails({ ...LLAMA3_TINY, mlp_bias: true }, /unsupported mlp_bias=true/);
  fails(
    { ...LLAMA3_TINY, eos_token_id: [1, "2"] },
    /eos_token_id must be a non-negative integer token id, got "2"/,
  );
  fails({ ...LLAMA3_TINY, bos_token_id: -1 }, /bos_token_id must be a non-negative integer/);
  fails({ ...LLAMA3_TINY, tie_word_embeddings: "yes" }, /tie_word_embeddings must be true or false/);
});

Deno.test("readConfig: a missing config.json or invalid JSON names the file", async () => {
  const dir = await Deno.makeTempDir();
  try {
    await assert.rejects(
      readConfig(dir),
      (e: Error) => e instanceof CheckpointError && /config.json: file not found/.test(e.message),
    );
    await Deno.writeTextFile(join(dir, "config.json"), "{");
    await assert.rejects(
      readConfig(dir),
      (e: Error) => e instanceof CheckpointError && /config.json: invalid JSON/.test(e.message),
    );
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
