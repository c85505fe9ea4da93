import assert from "node:assert/strict";
import { join } from "node:path";
import { Checkpoint } from "../../models/checkpoint.ts";
import { defaultCacheDir, DEMO_CONFIG, DEMO_VERSION, ensureDemoModel } from "../../models/demo.ts";
import { tensorShapes } from "../../models/tensors.ts";
import { loadTokenizer } from "../../models/tokenizer.ts";

/**
 * The hash of demo-v1's weights. The cache folder is named by DEMO_VERSION, so a change to the
 * generator or config must bump the version (and this hash), or old caches would serve stale weights.
 */
const DEMO_V1_SHA256 = "aa3d956afe8b1e035cdd0f979f02cf423de9f413461d2acdf9aa8c20449e06ee";

async function sha256(path: string): Promise<string> {
  const digest = await crypto.subtle.digest("SHA-256", await Deno.readFile(path));
  return [...new Uint8Array(digest)].map((b) => b.toString(16).padStart(2, "0")).join("");
}

Deno.test("demo config: Llama 3.2 shapes in miniature with the Llama 3 vocabulary", () => {
  assert.equal(DEMO_CONFIG.vocabSize, 128256);
  assert.equal(DEMO_CONFIG.hiddenSize, 128);
  assert.equal(DEMO_CONFIG.family, "llama");
  assert.deepEqual(DEMO_CONFIG.layer(3).ffn, { kind: "mlp", intermediate: 384 });
  assert.equal(DEMO_CONFIG.numLayers, 4);
  const a = DEMO_CONFIG.layer(0).attention;
  assert.ok(a.kind === "gqa");
  assert.deepEqual([a.heads, a.kvHeads, a.headDim], [4, 2, 32]);
  assert.equal(DEMO_CONFIG.rope.theta, 500000);
  assert.deepEqual(DEMO_CONFIG.rope.scaling, {
    type: "llama3",
    factor: 32,
    lowFreqFactor: 1,
    highFreqFactor: 4,
    originalMaxPositionEmbeddings: 8192,
  });
  assert.equal(DEMO_CONFIG.tieWordEmbeddings, true);
  assert.equal(DEMO_CONFIG.bosTokenId, 128000);
  assert.deepEqual(DEMO_CONFIG.eosTokenIds, [128001, 128008, 128009]);
});

Deno.test("ensureDemoModel: generated once (replacing an incomplete folder), deterministic, then reused", async () => {
  const cacheDir = await Deno.makeTempDir();
  try {
    // An incomplete folder where the model should be (as a crash in an older version could leave).
    await Deno.mkdir(join(cacheDir, DEMO_VERSION));
    await Deno.writeTextFile(join(cacheDir, DEMO_VERSION, "config.json"), "{}");
    const progress: [number, number][] = [];
    const dir = await ensureDemoModel({
      cacheDir,
      onProgress: (done, total) => progress.push([done, total]),
    });
    assert.equal(dir, join(cacheDir, DEMO_VERSION));
    assert.deepEqual(
      [...Deno.readDirSync(cacheDir)].map((e) => e.name),
      [DEMO_VERSION],
      "no temp folder left",
    );
    assert.deepEqual(progress.at(-1), [progress[0][1], progress[0][1]]);
    assert.ok(progress.every(([d], i) => i === 0 || d >= progress[i - 1][0]), "progress only goes up");

    assert.equal(await sha256(join(dir, "model.safetensors")), DEMO_V1_SHA256);
    const ckpt = await Checkpoint.open(dir);
    const { layer: _l, ...config } = ckpt.config;
    const { layer: _d, ...demo } = DEMO_CONFIG;
    assert.deepEqual(config, demo);
    const shapes = tensorShapes(DEMO_CONFIG);
    assert.deepEqual(new Set(ckpt.tensors.keys()), new Set(shapes.keys()));
    for (const [name, shape] of shapes) {
      assert.deepEqual(ckpt.info(name).shape, shape);
      assert.equal(ckpt.info(name).dtype, "BF16");
    }
    assert.ok((await ckpt.readF32("model.layers.2.post_attention_layernorm.weight")).every((x) => x === 1));
    const w = await ckpt.readF32("model.layers.1.mlp.down_proj.weight");
    const mean = w.reduce((a, b) => a + b, 0) / w.length;
    const std = Math.sqrt(w.reduce((a, b) => a + (b - mean) ** 2, 0) / w.length);
    assert.ok(Math.abs(mean) < 1e-3, `mean ${mean}`);
    assert.ok(Math.abs(std - 0.02) < 1e-3, `std ${std}`);
    const q = await ckpt.readF32("model.layers.1.self_attn.q_proj.weight");
    assert.notDeepEqual(q.subarray(0, 16), w.subarray(0, 16), "each tensor has its own random stream");

    // The built-in Llama 3 tokenizer serves it (no tokenizer.json is written).
    const tok = await loadTokenizer(dir, ckpt.config);
    assert.match(tok!.source, /built-in Llama 3/);

    const mtime = (await Deno.stat(join(dir, "model.safetensors"))).mtime;
    let called = false;
    assert.equal(await ensureDemoModel({ cacheDir, onProgress: () => called = true }), dir);
    assert.equal(called, false, "the cached model is reused, not regenerated");
    assert.deepEqual((await Deno.stat(join(dir, "model.safetensors"))).mtime, mtime);
  } finally {
    await Deno.remove(cacheDir, { recursive: true });
  }
});

Deno.test("defaultCacheDir: $XDG_CACHE_HOME/swactor, else ~/.cache/swactor", () => {
  const saved = { xdg: Deno.env.get("XDG_CACHE_HOME"), home: Deno.env.get("HOME") };
  const restore = (k: string, v: string | undefined) =>
    v === undefined ? Deno.env.delete(k) : Deno.env.set(k, v);
  try {
    Deno.env.set("XDG_CACHE_HOME", "/x/cache");
    assert.equal(defaultCacheDir(), "/x/cache/swactor");
    Deno.env.delete("XDG_CACHE_HOME");
    Deno.env.set("HOME", "/home/u");
    assert.equal(defaultCacheDir(), "/home/u/.cache/swactor");
  } finally {
    restore("XDG_CACHE_HOME", saved.xdg);
    restore("HOME", saved.home);
  }
});
