import assert from "node:assert/strict";
import { join } from "node:path";
import { Checkpoint, openShards } from "../../models/checkpoint.ts";
import { CheckpointError } from "../../models/errors.ts";
import { tensorShapes } from "../../models/tensors.ts";
import { writeSafetensors } from "../../models/safetensors.ts";
import { fixtureDir } from "../fixtures.ts";
import { needs } from "../support/needs.ts";
import { countFileReads } from "../support/file_reads.ts";

async function rejects(p: Promise<unknown>, pattern: RegExp) {
  await assert.rejects(p, (e: Error) => {
    assert.ok(e instanceof CheckpointError, `expected CheckpointError, got ${e}`);
    assert.match(e.message, pattern);
    return true;
  });
}

const MICRO_CONFIG = await Deno.readTextFile(join(fixtureDir("llama-micro")!, "config.json"));

/** A temp model dir with llama-micro's config and whatever files `files` writes. */
async function withDir(f: (dir: string) => Promise<void>) {
  const dir = await Deno.makeTempDir();
  try {
    await f(dir);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

function f32Bytes(values: number[]): Uint8Array {
  return new Uint8Array(Float32Array.from(values).buffer);
}

Deno.test("llama-micro: every expected tensor with its shape, F32, and values read back as floats", async () => {
  const ckpt = await Checkpoint.open(fixtureDir("llama-micro")!);
  const want = tensorShapes(ckpt.config);
  assert.deepEqual(new Set(ckpt.tensors.keys()), new Set(want.keys()));
  for (const [name, shape] of want) {
    assert.deepEqual(ckpt.info(name).shape, shape, name);
    assert.equal(ckpt.info(name).dtype, "F32");
  }
  const norm = await ckpt.readF32("model.norm.weight", [64]);
  assert.equal(norm.length, 64);
  const emb = await ckpt.readF32("model.embed_tokens.weight", [512, 64]);
  assert.equal(emb.length, 512 * 64);
  assert.ok(emb.some((x) => x !== 0) && emb.every(Number.isFinite));
  const half = await ckpt.readF16("model.norm.weight");
  assert.equal(half.length, 64);
});

const LLAMA3_TINY = fixtureDir("llama3-tiny", { needs: "model.safetensors" });
Deno.test(
  needs("llama3-tiny: tied embeddings, GQA k/v shapes, BF16 converted to f32 and f16", {
    "../shared/fixtures/llama3-tiny": LLAMA3_TINY,
  }),
  async () => {
    const dir = LLAMA3_TINY!;
    const ckpt = await Checkpoint.open(dir);
    const want = tensorShapes(ckpt.config);
    assert.equal(want.has("lm_head.weight"), false);
    assert.deepEqual(new Set(ckpt.tensors.keys()), new Set(want.keys()));
    for (const [name, shape] of want) assert.deepEqual(ckpt.info(name).shape, shape, name);
    assert.deepEqual(ckpt.info("model.layers.3.self_attn.k_proj.weight").shape, [32, 64]);
    const { dtype, bytes } = await ckpt.read("model.layers.0.self_attn.k_proj.weight");
    assert.equal(dtype, "BF16");
    const f32 = await ckpt.readF32("model.layers.0.self_attn.k_proj.weight");
    const bits = new Uint16Array(bytes.buffer, bytes.byteOffset, bytes.length / 2);
    for (let i = 0; i < 8; i++) {
      assert.equal(
        new Uint32Array(Float32Array.of(f32[i]).buffer)[0],
        (bits[i] << 16) >>> 0,
        "bf16 widening is exact",
      );
    }
    assert.equal((await ckpt.readF16("model.norm.weight")).length, 64);
  },
);

Deno.test("reads touch only the tensor's own bytes", async () => {
  await withDir(async (dir) => {
    await Deno.writeTextFile(join(dir, "config.json"), MICRO_CONFIG);
    const path = join(dir, "model.safetensors");
    await writeSafetensors(path, [
      { name: "a", dtype: "F32", shape: [2], data: f32Bytes([1, 2]) },
      { name: "big", dtype: "F32", shape: [1000], data: new Uint8Array(4000) },
      { name: "b", dtype: "F32", shape: [3], data: f32Bytes([3, 4, 5]) },
    ]);
    const ckpt = await Checkpoint.open(dir);
    // Overwrite everything but "b" with garbage: reading "b" must still give exactly its values.
    const raw = await Deno.readFile(path);
    const bInfo = ckpt.info("b");
    raw.fill(0xff, ckpt.info("big").begin, bInfo.begin);
    await Deno.writeFile(path, raw);
    // Count the bytes read through FsFile.read while reading "b".
    const { result, bytes } = await countFileReads(() => ckpt.readF32("b", [3]));
    assert.deepEqual([...result], [3, 4, 5]);
    assert.equal(bytes, 12);
  });
});

Deno.test("missing dir, missing config, missing weights, missing tensor, wrong shape", async () => {
  await rejects(Checkpoint.open("/nonexistent/model"), /model directory \/nonexistent\/model not found/);
  await rejects(openShards("/nonexistent/model"), /not found/);
  await withDir(async (dir) => {
    await rejects(Checkpoint.open(join(dir, "config.json")), /not found/);
    await rejects(Checkpoint.open(dir), /config.json: file not found/);
    await Deno.writeTextFile(join(dir, "config.json"), MICRO_CONFIG);
    await rejects(Checkpoint.open(dir), /no weights: expected model.safetensors/);
    await Deno.writeTextFile(join(dir, "file"), "");
    await rejects(Checkpoint.open(join(dir, "file")), /is not a directory/);
  });
  const ckpt = await Checkpoint.open(fixtureDir("llama-micro")!);
  assert.equal(ckpt.has("model.layers.7.mlp.up_proj.weight"), false);
  await rejects(
    ckpt.read("model.layers.0.mlp.upproj.weight"),
    /missing tensor model.layers.0.mlp.upproj.weight \(similar: model.layers.0.mlp.up_proj.weight, /,
  );
  await rejects(
    ckpt.readF32("model.layers.0.mlp.up_proj.weight", [64, 160]),
    /model.safetensors: tensor model.layers.0.mlp.up_proj.weight has shape \[160, 64\], expected \[64, 160\]/,
  );
});

Deno.test("unsupported dtype names the tensor; an unknown architecture is refused before the weights", async () => {
  await withDir(async (dir) => {
    await Deno.writeTextFile(join(dir, "config.json"), MICRO_CONFIG);
    await writeSafetensors(join(dir, "model.safetensors"), [
      { name: "ids", dtype: "I32", shape: [2], data: new Uint8Array(8) },
    ]);
    const ckpt = await Checkpoint.open(dir);
    await rejects(ckpt.readF32("ids"), /tensor ids: unsupported dtype I32: expected F32, F16 or BF16/);
    await rejects(ckpt.readF16("ids"), /tensor ids: unsupported dtype I32/);
    await Deno.writeTextFile(
      join(dir, "config.json"),
      JSON.stringify({ ...JSON.parse(MICRO_CONFIG), model_type: "gpt2", architectures: ["GPT2LMHeadModel"] }),
    );
    await rejects(Checkpoint.open(dir), /unsupported architecture 'gpt2' \(model_type\)/);
  });
});

Deno.test("a truncated model.safetensors is refused when opened", async () => {
  await withDir(async (dir) => {
    await Deno.writeTextFile(join(dir, "config.json"), MICRO_CONFIG);
    const src = await Deno.readFile(join(fixtureDir("llama-micro")!, "model.safetensors"));
    await Deno.writeFile(join(dir, "model.safetensors"), src.subarray(0, src.length - 100));
    await rejects(
      Checkpoint.open(dir),
      /model.safetensors: truncated: tensor \S+ needs bytes \d+\.\.\d+ but file has \d+/,
    );
  });
});

const KIMI_TINY = fixtureDir("kimi-k2-tiny", { needs: "model.safetensors.index.json" });
Deno.test(
  needs("kimi-k2-tiny: the index maps 5 shards; each tensor is read from its own shard", {
    "../shared/fixtures/kimi-k2-tiny": KIMI_TINY,
  }),
  async () => {
    const dir = KIMI_TINY!;
    const shards = await openShards(dir);
    const index = JSON.parse(await Deno.readTextFile(join(dir, "model.safetensors.index.json")));
    assert.equal(shards.files.length, 5);
    assert.deepEqual(new Set(shards.tensors.keys()), new Set(Object.keys(index.weight_map)));
    for (const [name, info] of shards.tensors) assert.equal(info.file, join(dir, index.weight_map[name]));
    assert.deepEqual(shards.tensors.get("model.layers.0.self_attn.kv_b_proj.weight")!.shape, [128, 32]);
    // Its config is deepseek_v3: the family reads it, and a tensor is read from its own shard.
    const ckpt = await Checkpoint.open(dir);
    assert.equal(ckpt.config.family, "deepseek_v3");
    assert.equal((await ckpt.readF32("model.layers.2.mlp.gate.e_score_correction_bias")).length, 16);
  },
);

Deno.test("sharded layouts: index with a missing shard or a wrong mapping; shards without an index", async () => {
  await withDir(async (dir) => {
    await Deno.writeTextFile(join(dir, "config.json"), MICRO_CONFIG);
    await writeSafetensors(join(dir, "model-00001-of-00002.safetensors"), [
      { name: "a", dtype: "F32", shape: [2], data: f32Bytes([1, 2]) },
    ]);
    await writeSafetensors(join(dir, "model-00002-of-00002.safetensors"), [
      { name: "b", dtype: "F32", shape: [1], data: f32Bytes([3]) },
    ]);
    // No index: every *.safetensors is read.
    const plain = await Checkpoint.open(dir);
    assert.deepEqual([...plain.tensors.keys()].sort(), ["a", "b"]);
    assert.deepEqual([...await plain.readF32("b")], [3]);

    const index = join(dir, "model.safetensors.index.json");
    const writeIndex = (map: Record<string, string>) =>
      Deno.writeTextFile(index, JSON.stringify({ weight_map: map }));
    await writeIndex({ a: "model-00001-of-00002.safetensors", b: "model-00002-of-00002.safetensors" });
    const indexed = await Checkpoint.open(dir);
    assert.deepEqual([...await indexed.readF32("a", [2])], [1, 2]);
    assert.equal(indexed.files.length, 2);

    await writeIndex({ a: "model-00001-of-00002.safetensors", b: "model-00009-of-00009.safetensors" });
    await rejects(Checkpoint.open(dir), /shard model-00009-of-00009.safetensors \(holding b\) not found/);
    await writeIndex({ a: "model-00002-of-00002.safetensors" });
    await rejects(
      Checkpoint.open(dir),
      /maps tensor a to model-00002-of-00002.safetensors, which does not hold it/,
    );
    await writeIndex({ a: "../escape.safetensors" });
    await rejects(Checkpoint.open(dir), /tensor a maps to "..\/escape.safetensors", expected a file name/);
    await Deno.writeTextFile(index, "[]");
    await rejects(Checkpoint.open(dir), /expected an object with weight_map/);

    await Deno.remove(index);
    await writeSafetensors(join(dir, "extra.safetensors"), [
      { name: "a", dtype: "F32", shape: [1], data: f32Bytes([9]) },
    ]);
    await rejects(Checkpoint.open(dir), /tensor a is in both/);
  });
});
