// Config parsing per family (models/families/): transformers' semantics and defaults, and errors that name
// the key, what was found and what was expected.
import assert from "node:assert/strict";
import { join } from "node:path";
import type { ModelConfig } from "../../models/config.ts";
import { parseModelConfig, readModelConfig, supportedModelTypes } from "../../models/family.ts";
import { CheckpointError } from "../../models/errors.ts";
import { tensorShapes } from "../../models/tensors.ts";
import { fixtureDir } from "../fixtures.ts";
import { ropeInvFreq } from "../../kernels/mod.ts";

const parse = (json: unknown) => parseModelConfig(json, "cfg.json");
/** Layer i's attention, which must be grouped-query attention. */
const gqa = (c: ModelConfig, i = 0) => {
  const a = c.layer(i).attention;
  if (a.kind !== "gqa") throw new Error(`layer ${i} has ${a.kind} attention`);
  return a;
};
/** The config's fields without the layer function, plus layer 0's blocks. */
const plain = (c: ModelConfig) => {
  const { layer, ...rest } = c;
  return { ...rest, layer0: layer(0) };
};

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
  assert.throws(() => parse(json), (e) => {
    assert.ok(e instanceof CheckpointError, `expected CheckpointError, got ${e}`);
    assert.match((e as Error).message, pattern);
    return true;
  });
}

Deno.test("llama3-tiny's config parses with llama3 rope scaling, all eos ids and its layer blocks", () => {
  assert.deepEqual(plain(parse(LLAMA3_TINY)), {
    family: "llama",
    modelType: "llama",
    architectures: ["LlamaForCausalLM"],
    vocabSize: 128256,
    hiddenSize: 64,
    numLayers: 4,
    mtpLayers: 0,
    rmsNormEps: 1e-5,
    rope: {
      theta: 500000,
      scaling: {
        type: "llama3",
        factor: 32,
        lowFreqFactor: 1,
        highFreqFactor: 4,
        originalMaxPositionEmbeddings: 8192,
      },
    },
    maxPositionEmbeddings: 131072,
    tieWordEmbeddings: true,
    bosTokenId: 128000,
    eosTokenIds: [128001, 128008, 128009],
    torchDtype: "bfloat16",
    weightQuant: null,
    layer0: {
      attention: {
        kind: "gqa",
        heads: 4,
        kvHeads: 2,
        headDim: 16,
        qkvBias: false,
        oBias: false,
        qkNorm: false,
      },
      ffn: { kind: "mlp", intermediate: 192 },
    },
  });
});

Deno.test("qwen2: q/k/v biases (none on o); qwen3: q/k norms, head_dim decoupled (128 by default)", async () => {
  const q2 = await readModelConfig(fixtureDir("qwen2-tiny")!);
  assert.equal(q2.family, "qwen2");
  assert.deepEqual(q2.layer(2).attention, {
    kind: "gqa",
    heads: 6,
    kvHeads: 2,
    headDim: 16,
    qkvBias: true,
    oBias: false,
    qkNorm: false,
  });
  assert.equal(q2.rope.theta, 1e6);
  assert.equal(q2.tieWordEmbeddings, false);
  const shapes = tensorShapes(q2);
  assert.deepEqual(shapes.get("model.layers.0.self_attn.k_proj.bias"), [32]);
  assert.equal(shapes.has("model.layers.0.self_attn.o_proj.bias"), false);
  const q3 = await readModelConfig(fixtureDir("qwen3-tiny")!);
  assert.deepEqual(q3.layer(0).attention, {
    kind: "gqa",
    heads: 4,
    kvHeads: 2,
    headDim: 24,
    qkvBias: false,
    oBias: false,
    qkNorm: true,
  });
  assert.equal(q3.tieWordEmbeddings, true);
  assert.deepEqual(tensorShapes(q3).get("model.layers.1.self_attn.q_norm.weight"), [24]);
  assert.deepEqual(tensorShapes(q3).get("model.layers.1.self_attn.q_proj.weight"), [96, 64]);
  const qwen3 = JSON.parse(await Deno.readTextFile(join(fixtureDir("qwen3-tiny")!, "config.json")));
  const { head_dim: _hd, tie_word_embeddings: _t, ...noHeadDim } = qwen3;
  const d = parse({ ...noHeadDim, attention_bias: true });
  assert.equal(gqa(d).headDim, 128, "Qwen3Config's head_dim default");
  assert.equal(d.tieWordEmbeddings, false);
  assert.equal(gqa(d).oBias, true);
  // Sliding windows as transformers' layer_types have them: only layers from max_window_layers on slide, and
  // any that does caps the context at the window (within it, sliding attention is full attention).
  const layers = qwen3.num_hidden_layers, maxPos = qwen3.max_position_embeddings;
  const windowed = { ...qwen3, use_sliding_window: true, sliding_window: 64 };
  assert.equal(
    parse({ ...windowed, max_window_layers: layers }).maxPositionEmbeddings,
    maxPos,
    "none slides",
  );
  assert.equal(parse({ ...windowed, max_window_layers: layers - 1 }).maxPositionEmbeddings, 64);
  const types = Array.from({ length: layers }, (_, i) => (i === 0 ? "sliding_attention" : "full_attention"));
  assert.equal(parse({ ...qwen3, sliding_window: 64, layer_types: types }).maxPositionEmbeddings, 64);
  assert.throws(() => parse({ ...qwen3, layer_types: ["full_attention"] }), /layer_types must list/);
  assert.throws(
    () => parse({ ...qwen3, architectures: ["Qwen2ForCausalLM"] }),
    /unsupported architecture 'Qwen2ForCausalLM' \(architectures\).*model_type "qwen3": supported: Qwen3ForCausalLM/,
  );
});

Deno.test("llama-micro's config from disk: head_dim from hidden/heads, kv heads, single eos, no scaling", async () => {
  const c = await readModelConfig(fixtureDir("llama-micro")!);
  assert.equal(gqa(c).headDim, 16);
  assert.equal(gqa(c).kvHeads, 4);
  assert.deepEqual(c.eosTokenIds, [2]);
  assert.equal(c.bosTokenId, 1);
  assert.equal(c.rope.scaling, null);
  assert.equal(c.rope.theta, 10000);
  assert.equal(c.rmsNormEps, 1e-6);
  assert.equal(c.tieWordEmbeddings, false);
});

Deno.test("generation_config.json's eos_token_id replaces config.json's (transformers' generate() stops there)", async () => {
  const dir = await Deno.makeTempDir();
  try {
    await Deno.copyFile(join(fixtureDir("llama-micro")!, "config.json"), join(dir, "config.json"));
    assert.deepEqual(
      (await readModelConfig(dir)).eosTokenIds,
      [2],
      "no generation_config.json: config.json's",
    );
    const gen = (v: unknown) => Deno.writeTextFile(join(dir, "generation_config.json"), JSON.stringify(v));
    await gen({ bos_token_id: 1, eos_token_id: [2, 9] });
    assert.deepEqual((await readModelConfig(dir)).eosTokenIds, [2, 9]);
    await gen({ eos_token_id: 7 });
    assert.deepEqual((await readModelConfig(dir)).eosTokenIds, [7]);
    await gen({ eos_token_id: null, temperature: 0.6 });
    assert.deepEqual((await readModelConfig(dir)).eosTokenIds, [2], "null: config.json's stand");
    await gen({ eos_token_id: [2, 512] });
    await assert.rejects(() => readModelConfig(dir), /generation_config.json: eos_token_id .* 512/);
    await Deno.writeTextFile(join(dir, "generation_config.json"), "{ not json");
    await assert.rejects(() => readModelConfig(dir), /generation_config.json: invalid JSON/);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("transformers defaults: kv heads = heads, untied, rope_type default is plain RoPE, v5 rope_parameters", () => {
  const { num_key_value_heads: _kv, head_dim: _hd, tie_word_embeddings: _t, ...rest } = LLAMA3_TINY;
  const c = parse({ ...rest, rope_scaling: { rope_type: "default" }, eos_token_id: null });
  assert.equal(gqa(c).kvHeads, 4);
  assert.equal(gqa(c).headDim, 16);
  assert.equal(c.tieWordEmbeddings, false);
  assert.equal(c.rope.scaling, null);
  assert.deepEqual(c.eosTokenIds, []);
  const { rope_theta: _r, rope_scaling: _s, ...noRope } = LLAMA3_TINY;
  const v5 = parse({ ...noRope, rope_parameters: { rope_type: "default", rope_theta: 7000 } });
  assert.equal(v5.rope.theta, 7000);
  assert.equal(v5.rope.scaling, null);
  // head_dim given explicitly need not equal hidden / heads (Gemma-style shapes exist in Llama configs).
  assert.equal(gqa(parse({ ...LLAMA3_TINY, head_dim: 32 })).headDim, 32);
  // the older "type" key is accepted in place of rope_type
  const old = parse({
    ...LLAMA3_TINY,
    rope_scaling: { ...LLAMA3_TINY.rope_scaling, rope_type: undefined, type: "llama3" },
  });
  assert.equal(old.rope.scaling?.type, "llama3");
  // attention_bias puts biases on q, k, v and o
  const biased = gqa(parse({ ...LLAMA3_TINY, attention_bias: true }));
  assert.ok(biased.qkvBias && biased.oBias);
});

Deno.test("config values as transformers reads them: nulls, aliases, swish, linear and dynamic RoPE", () => {
  // null kv heads: multi-head attention; a null boolean reads as false (Python's `if config.x:`).
  const mha = parse({ ...LLAMA3_TINY, num_key_value_heads: null }).layer(0).attention;
  assert.ok(mha.kind === "gqa" && mha.kvHeads === mha.heads);
  assert.equal(parse({ ...LLAMA3_TINY, tie_word_embeddings: null }).tieWordEmbeddings, false);
  assert.equal(parse({ ...LLAMA3_TINY, hidden_act: "swish" }).family, "llama");
  // linear: every inverse frequency over factor; dynamic: plain RoPE within max_position_embeddings.
  const lin = parse({ ...LLAMA3_TINY, rope_scaling: { rope_type: "linear", factor: 4 } }).rope;
  assert.deepEqual(lin.scaling, { type: "linear", factor: 4 });
  const plain = ropeInvFreq(16, lin.theta, null), scaled = ropeInvFreq(16, lin.theta, lin.scaling);
  assert.ok(scaled.every((v, i) => Math.abs(v - Math.fround(plain[i] / 4)) <= 1e-12));
  assert.equal(parse({ ...LLAMA3_TINY, rope_scaling: { type: "dynamic", factor: 2 } }).rope.scaling, null);
  // rope_theta where transformers 5 also looks; llama3 without original_max_position_embeddings takes
  // max_position_embeddings, as transformers does.
  const { rope_theta: _t, ...noTheta } = LLAMA3_TINY;
  assert.equal(parse({ ...noTheta, rope_parameters: { rope_type: "default", rope_theta: 7 } }).rope.theta, 7);
  assert.equal(
    parse({ ...noTheta, rope_scaling: { ...LLAMA3_TINY.rope_scaling, rope_theta: 9 } }).rope.theta,
    9,
  );
  const { original_max_position_embeddings: _o, ...noOriginal } = LLAMA3_TINY.rope_scaling;
  const fallback = parse({ ...LLAMA3_TINY, rope_scaling: noOriginal }).rope.scaling;
  assert.ok(fallback?.type === "llama3");
  assert.equal(fallback.originalMaxPositionEmbeddings, LLAMA3_TINY.max_position_embeddings);
});

Deno.test("mistral: Llama's layer, 8 KV heads and head_dim by default; the sliding window (4096 unless null) caps the context", () => {
  const base = {
    model_type: "mistral",
    vocab_size: 100,
    hidden_size: 64,
    intermediate_size: 96,
    num_hidden_layers: 2,
    num_attention_heads: 8,
    max_position_embeddings: 32768,
  };
  const c = parse(base);
  const a = c.layer(0).attention;
  assert.ok(a.kind === "gqa" && a.kvHeads === 8 && a.headDim === 8 && !a.qkvBias && !a.oBias);
  assert.equal(c.maxPositionEmbeddings, 4096, "no sliding_window key: MistralConfig's 4096");
  assert.equal(parse({ ...base, sliding_window: null }).maxPositionEmbeddings, 32768);
  assert.equal(parse({ ...base, sliding_window: 1000 }).maxPositionEmbeddings, 1000);
  const hd = parse({ ...base, head_dim: 24, num_key_value_heads: 2 }).layer(0).attention;
  assert.ok(hd.kind === "gqa" && hd.headDim === 24 && hd.kvHeads === 2);
});

Deno.test("unknown architectures are refused by model_type and by architectures", async () => {
  const dir = await Deno.makeTempDir();
  try {
    await Deno.writeTextFile(
      join(dir, "config.json"),
      JSON.stringify({ ...LLAMA3_TINY, model_type: "gpt2" }),
    );
    await assert.rejects(readModelConfig(dir), (e: Error) => {
      assert.ok(e instanceof CheckpointError);
      assert.equal(
        e.message,
        `unsupported architecture 'gpt2' (model_type) in ${join(dir, "config.json")}: supported: ${
          supportedModelTypes().join(", ")
        }`,
      );
      return true;
    });
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
  assert.ok(["llama", "qwen2", "qwen3"].every((t) => supportedModelTypes().includes(t)));
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
  fails({ ...LLAMA3_TINY, num_hidden_layers: 1e12 }, /num_hidden_layers = 1000000000000 is absurd/);
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
    { ...LLAMA3_TINY, rope_scaling: { rope_type: "longrope", factor: 4 } },
    /unsupported rope_scaling type "longrope": supported: llama3, yarn, linear, dynamic, default, none/,
  );
  fails(
    { ...LLAMA3_TINY, rope_scaling: { rope_type: "linear" } },
    /rope_scaling.factor must be a positive number/,
  );
  fails(
    { ...LLAMA3_TINY, rope_theta: 10000, rope_parameters: { rope_type: "default", rope_theta: 500000 } },
    /rope_theta is given twice and differently: rope_theta = 10000, rope_parameters.rope_theta = 500000/,
  );
  fails(
    {
      ...LLAMA3_TINY,
      original_max_position_embeddings: 4096,
      rope_scaling: { ...LLAMA3_TINY.rope_scaling, original_max_position_embeddings: 8192 },
    },
    /original_max_position_embeddings is given twice and differently/,
  );
  fails(
    { ...LLAMA3_TINY, rope_scaling: { rope_type: "llama3", factor: 8 } },
    /rope_scaling.low_freq_factor must be a positive number/,
  );
  fails({ ...LLAMA3_TINY, hidden_act: "gelu" }, /unsupported hidden_act="gelu": supported: silu, swish/);
  fails({ ...LLAMA3_TINY, attention_bias: "yes" }, /attention_bias must be true or false/);
  fails({ ...LLAMA3_TINY, mlp_bias: true }, /unsupported mlp_bias=true/);
  fails(
    { ...LLAMA3_TINY, eos_token_id: [1, "2"] },
    /eos_token_id must be a non-negative integer token id, got "2"/,
  );
  fails({ ...LLAMA3_TINY, bos_token_id: -1 }, /bos_token_id must be a non-negative integer/);
  fails({ ...LLAMA3_TINY, tie_word_embeddings: "yes" }, /tie_word_embeddings must be true or false/);
});

Deno.test("readModelConfig: a missing config.json or invalid JSON names the file", async () => {
  const dir = await Deno.makeTempDir();
  try {
    await assert.rejects(
      readModelConfig(dir),
      (e: Error) => e instanceof CheckpointError && /config.json: file not found/.test(e.message),
    );
    await Deno.writeTextFile(join(dir, "config.json"), "{");
    await assert.rejects(
      readModelConfig(dir),
      (e: Error) => e instanceof CheckpointError && /config.json: invalid JSON/.test(e.message),
    );
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("mixtral: softmax top-k renormalised, w1/w3/w2 per expert; a sliding window caps the context", async () => {
  const c = await readModelConfig(fixtureDir("mixtral-tiny")!);
  const f = c.layer(0).ffn;
  assert.ok(f.kind === "moe");
  assert.deepEqual(f.routing, { experts: 8, topK: 2, scoring: "softmax", normTopK: true });
  assert.deepEqual(f.names.expert(7), {
    gate: "block_sparse_moe.experts.7.w1.weight",
    up: "block_sparse_moe.experts.7.w3.weight",
    down: "block_sparse_moe.experts.7.w2.weight",
  });
  assert.deepEqual(tensorShapes(c).get("model.layers.3.block_sparse_moe.experts.5.w2.weight"), [64, 96]);
  const json = JSON.parse(await Deno.readTextFile(join(fixtureDir("mixtral-tiny")!, "config.json")));
  assert.equal(parse({ ...json, sliding_window: 4096 }).maxPositionEmbeddings, 4096);
  assert.throws(() => parse({ ...json, num_experts_per_tok: 9 }), /num_experts_per_tok \(9\) exceeds/);
});

Deno.test("qwen3_moe: decoder_sparse_step and mlp_only_layers pick dense layers; norm_topk_prob off by default", () => {
  const base = {
    model_type: "qwen3_moe",
    vocab_size: 100,
    hidden_size: 32,
    intermediate_size: 64,
    moe_intermediate_size: 16,
    num_hidden_layers: 6,
    num_attention_heads: 4,
    num_key_value_heads: 2,
    num_experts: 8,
    num_experts_per_tok: 2,
  };
  const c = parse({ ...base, decoder_sparse_step: 2, mlp_only_layers: [3] });
  assert.deepEqual(
    Array.from({ length: 6 }, (_, i) => c.layer(i).ffn.kind),
    ["mlp", "moe", "mlp", "mlp", "mlp", "moe"],
  );
  const moe = c.layer(1).ffn;
  assert.ok(moe.kind === "moe" && moe.routing.normTopK === false && moe.intermediate === 16);
  assert.equal(gqa(c).headDim, 8, "no head_dim: hidden / heads (Qwen3MoeConfig has no default)");
  assert.ok(gqa(c).qkNorm);
  const n = parse({ ...base, norm_topk_prob: true }).layer(0).ffn;
  assert.ok(n.kind === "moe" && n.routing.normTopK);
  assert.equal(parse({ ...base, num_experts: 0 }).layer(0).ffn.kind, "mlp");
  // transformers 5 writes the expert count as num_local_experts (an alias of num_experts).
  const { num_experts: e, ...noNum } = base;
  const local = parse({ ...noNum, num_local_experts: e }).layer(0).ffn;
  assert.ok(local.kind === "moe" && local.routing.experts === e);
  assert.throws(
    () => parse({ ...base, num_local_experts: e + 1 }),
    /num_experts and num_local_experts name the same setting but differ/,
  );
});

Deno.test("deepseek_v3 / kimi_k2: MLA, dense layers first, grouped sigmoid routing; other methods exit 2", async () => {
  const json = JSON.parse(await Deno.readTextFile(join(fixtureDir("kimi-k2-tiny")!, "config.json")));
  const c = parse(json);
  const a = c.layer(0).attention;
  assert.ok(a.kind === "mla");
  assert.deepEqual({ ...a, scale: 0 }, {
    kind: "mla",
    heads: 4,
    qLoraRank: 48,
    kvLoraRank: 32,
    qkNopeHeadDim: 16,
    qkRopeHeadDim: 8,
    vHeadDim: 16,
    interleaved: true,
    scale: 0,
  });
  // 24^-0.5 * (0.1 * 1 * ln 32 + 1)^2: yarn's mscale_all_dim scales the softmax.
  assert.ok(Math.abs(a.scale - 24 ** -0.5 * (0.1 * Math.log(32) + 1) ** 2) < 1e-12);
  assert.equal(c.layer(0).ffn.kind, "mlp");
  const f = c.layer(1).ffn;
  assert.ok(f.kind === "moe");
  assert.deepEqual(f.routing, {
    experts: 16,
    topK: 4,
    scoring: "sigmoid",
    normTopK: true,
    groups: 4,
    topKGroups: 2,
    scale: 2.827,
  });
  assert.equal(f.sharedIntermediate, 32);
  assert.equal(parse({ ...json, model_type: "kimi_k2" }).family, "deepseek_v3");
  const noLora = parse({ ...json, q_lora_rank: null, moe_layer_freq: 2 });
  const q = noLora.layer(0).attention;
  assert.ok(q.kind === "mla" && q.qLoraRank === null);
  assert.ok(tensorShapes(noLora).has("model.layers.0.self_attn.q_proj.weight"));
  assert.equal(noLora.layer(2).ffn.kind, "moe", "moe_layer_freq is ignored, as transformers does");
  assert.throws(() => parse({ ...json, topk_method: "greedy" }), /unsupported topk_method="greedy"/);
  assert.throws(() => parse({ ...json, scoring_func: "softmax" }), /unsupported scoring_func="softmax"/);
  assert.throws(() => parse({ ...json, n_group: 3 }), /n_group \(3\) must divide n_routed_experts \(16\)/);
  assert.throws(() => parse({ ...json, attention_bias: true }), /unsupported attention_bias=true/);
  // null reads as false, as transformers' `if config.norm_topk_prob:` / `if config.rope_interleave:` do.
  const nulls = parse({ ...json, norm_topk_prob: null, rope_interleave: null });
  const nf = nulls.layer(1).ffn, na = nulls.layer(0).attention;
  assert.ok(nf.kind === "moe" && nf.routing.normTopK === false && na.kind === "mla" && !na.interleaved);
  const { n_routed_experts: n, ...noRouted } = json;
  const aliased = parse({ ...noRouted, num_local_experts: n }).layer(1).ffn;
  assert.ok(aliased.kind === "moe" && aliased.routing.experts === n);
});
