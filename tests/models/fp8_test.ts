// Block-scaled fp8 checkpoints (models/fp8.ts; DeepSeek-V3 / Kimi K2 / Qwen3 FP8 as released): the E4M3
// values, make_fp8.ts's encoder and --block auto, the dequantisation with partial edge blocks, the config's
// quantization_config, the errors, and a whole model: kimi-k2-tiny with every projection stored as fp8 gives
// exactly the logits of its twin that stores the dequantised values as F32, with f32 and with q4 weights on
// the GPU. Its stacks are whole row blocks, so the loader dequantises them on the GPU (kernels/convert.ts;
// tests/kernels/convert_test.ts holds that to the CPU bit for bit), and MLA's kv_b_proj is read through the
// CPU's dequantFp8. (Against transformers' own fp8 loader: the kimi-k2-fp8 and qwen3-moe-fp8 fixtures,
// tests/cli/families_test.ts.)
import assert from "node:assert/strict";
import { join } from "node:path";
import { parseModelConfig } from "../../models/family.ts";
import { dequantFp8, E4M3 } from "../../models/fp8.ts";
import { CheckpointError } from "../../models/errors.ts";
import { readSafetensorsHeader, readTensorBytes, writeSafetensors } from "../../models/safetensors.ts";
import type { TensorData } from "../../models/safetensors.ts";
import { readF32 } from "../../scripts/check_fixture.ts";
import { autoBlock, toE4M3, writeFp8 } from "../../scripts/fixtures/make_fp8.ts";
import { fixtureDir } from "../fixtures.ts";
import { gpuAvailable, needs } from "../support/needs.ts";
import { runCli } from "../cli/run.ts";

Deno.test("E4M3: zero, subnormals, one, the largest finite value, NaN, and monotone codes", () => {
  assert.equal(E4M3[0x00], 0);
  assert.ok(Object.is(E4M3[0x80], -0));
  assert.equal(E4M3[0x01], 2 ** -9); // the smallest subnormal: 1/8 of 2^-6
  assert.equal(E4M3[0x07], 7 * 2 ** -9);
  assert.equal(E4M3[0x08], 2 ** -6); // the smallest normal
  assert.equal(E4M3[0x38], 1);
  assert.equal(E4M3[0x40], 2);
  assert.equal(E4M3[0x3c], 1.5);
  assert.equal(E4M3[0x7e], 448);
  assert.equal(E4M3[0xfe], -448);
  assert.ok(Number.isNaN(E4M3[0x7f]) && Number.isNaN(E4M3[0xff]));
  for (let b = 1; b < 0x7f; b++) assert.ok(E4M3[b] > E4M3[b - 1], `code ${b} above code ${b - 1}`);
  for (let b = 0; b < 0x7f; b++) assert.ok(Object.is(E4M3[b | 0x80], -E4M3[b]), `code ${b}'s negative`);
});

Deno.test("make_fp8's encoder: every finite code is its own nearest, halfway values go to the lower", () => {
  for (let b = 0; b < 0x7f; b++) {
    assert.equal(toE4M3(E4M3[b]), b, `code ${b}`);
    assert.equal(toE4M3(-E4M3[b]), b | 0x80, `code ${b | 0x80}`);
  }
  assert.equal(toE4M3((E4M3[0x38] + E4M3[0x39]) / 2), 0x38);
  assert.equal(toE4M3(1e9), 0x7e);
});

Deno.test("make_fp8 --block auto: the largest powers of 2 up to 128 dividing every projection's rows, columns", async () => {
  // kimi-k2-tiny's projections: rows 48, 40 (kv_a_proj_with_mqa), 96, 128, 64, 32; columns 64, 48, 32, 128.
  assert.deepEqual(await autoBlock(fixtureDir("kimi-k2-tiny", { needs: "config.json" })!), [8, 16]);
  const dir = await Deno.makeTempDir();
  try {
    const w = (name: string, shape: number[]): TensorData => ({
      name,
      dtype: "F32",
      shape,
      data: new Uint8Array(4 * shape[0] * shape[1]),
    });
    // The router and the head are not projections: their odd shapes do not count.
    await writeSafetensors(join(dir, "model.safetensors"), [
      w("model.layers.0.self_attn.q_proj.weight", [384, 256]),
      w("model.layers.0.block_sparse_moe.experts.0.w2.weight", [256, 640]),
      w("model.layers.0.block_sparse_moe.gate.weight", [7, 256]),
      w("lm_head.weight", [999, 256]),
    ]);
    assert.deepEqual(await autoBlock(dir), [128, 128]);
    await writeSafetensors(join(dir, "model.safetensors"), [
      w("model.layers.0.mlp.down_proj.weight", [96, 40]),
    ]);
    assert.deepEqual(await autoBlock(dir), [32, 8]);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("dequantFp8: each block's scale, partial edge blocks, f32 products; a wrong scale shape is named", () => {
  // [5, 7] in blocks of [2, 3]: scales [3, 3], the last row and column of blocks partial.
  const N = 5, K = 7;
  const codes = Uint8Array.from({ length: N * K }, (_, i) => (i * 37 + 11) % 0x7f);
  const scales = Float32Array.from({ length: 9 }, (_, i) => 0.1 + i / 3);
  const got = dequantFp8("w", codes, [N, K], scales, [3, 3], { method: "fp8", block: [2, 3] });
  for (let n = 0; n < N; n++) {
    for (let k = 0; k < K; k++) {
      const want = Math.fround(E4M3[codes[n * K + k]] * scales[Math.floor(n / 2) * 3 + Math.floor(k / 3)]);
      assert.equal(got[n * K + k], want, `[${n}, ${k}]`);
    }
  }
  assert.throws(
    () => dequantFp8("w", codes, [N, K], scales, [3, 2], { method: "fp8", block: [2, 3] }),
    (e) =>
      e instanceof CheckpointError && /w_scale_inv has shape \[3, 2\], expected \[3, 3\]/.test(e.message),
  );
  assert.throws(
    () => dequantFp8("v", codes, [N * K], scales, [3, 3], { method: "fp8", block: [2, 3] }),
    (e) => e instanceof CheckpointError && /v: fp8 weights must be matrices/.test(e.message),
  );
});

const BASE = {
  model_type: "llama",
  hidden_size: 8,
  num_hidden_layers: 1,
  num_attention_heads: 2,
  vocab_size: 16,
};

Deno.test("quantization_config: fp8 blocks read; other methods, formats and block sizes refused by name", () => {
  const cfg = (q: unknown) =>
    parseModelConfig({ ...BASE, intermediate_size: 16, quantization_config: q }, "c");
  assert.equal(cfg(undefined).weightQuant, null);
  assert.equal(cfg(null).weightQuant, null);
  assert.deepEqual(cfg({ quant_method: "fp8" }).weightQuant, { method: "fp8", block: [128, 128] });
  assert.deepEqual(
    cfg({ quant_method: "fp8", fmt: "e4m3", activation_scheme: "dynamic", weight_block_size: [64, 32] })
      .weightQuant,
    { method: "fp8", block: [64, 32] },
  );
  const refused = (q: unknown, re: RegExp) =>
    assert.throws(() => cfg(q), (e) => e instanceof CheckpointError && re.test(e.message));
  refused({ quant_method: "gptq", bits: 4 }, /quantization_config\.quant_method "gptq" is not supported/);
  refused({ quant_method: "fp8", fmt: "e5m2" }, /quantization_config\.fmt must be "e4m3", got "e5m2"/);
  refused({ quant_method: "fp8", weight_block_size: [128] }, /weight_block_size must be \[rows, columns\]/);
  refused({ quant_method: "fp8", weight_block_size: [0, 128] }, /weight_block_size/);
  refused("fp8", /quantization_config must be an object/);
});

const k2 = fixtureDir("kimi-k2-tiny", { needs: "reference.json" });
const slow = { sanitizeOps: false, sanitizeResources: false };

/** kimi-k2-tiny's fp8 copy in blocks of [16, 24] under `root`, and with `twin` its F32 twin: their folders. */
async function fp8Copy(root: string, twin = false): Promise<{ fp8: string; twin: string; n: number }> {
  const dirs = { fp8: join(root, "fp8"), twin: join(root, "twin") };
  await Deno.mkdir(dirs.fp8);
  if (twin) await Deno.mkdir(dirs.twin);
  const n = await writeFp8(k2!, dirs.fp8, { block: [16, 24], ...(twin ? { twin: dirs.twin } : {}) });
  return { ...dirs, n };
}

/** `swactor logits` of `model` (extra args after), written to `out`: its run and the logits. */
async function logitsOf(model: string, tokens: string, out: string, ...extra: string[]) {
  const run = await runCli(["logits", "--model", model, "--tokens", tokens, "--out", out, ...extra]);
  assert.equal(run.code, 0, run.stderr);
  return { run, logits: (await readF32(out, "logits")).data };
}

Deno.test({
  ...needs(
    "kimi-k2-tiny as fp8 (blocks [16, 24]): the logits of its dequantised F32 twin, f32 and q4 weights",
    {
      "a WebGPU adapter": await gpuAvailable(),
      "the kimi-k2-tiny fixture": k2,
    },
  ),
  ...slow,
}, async () => {
  const root = await Deno.makeTempDir();
  try {
    const dirs = await fp8Copy(root, true);
    assert.ok(dirs.n >= 40, `${dirs.n} projections stored as fp8`);
    const tokens = JSON.parse(await Deno.readTextFile(join(k2!, "reference.json"))).tokens.join(",");
    let fp8F32: Float32Array = new Float32Array();
    for (const weights of ["f32", "q4"]) {
      const at = (dir: string) => join(root, `${weights}-${dir === dirs.fp8 ? "fp8" : "twin"}.safetensors`);
      const a = (await logitsOf(dirs.fp8, tokens, at(dirs.fp8), "--weights", weights)).logits;
      const b = (await logitsOf(dirs.twin, tokens, at(dirs.twin), "--weights", weights)).logits;
      assert.equal(a.length, b.length);
      const i = a.findIndex((v, i) => !Object.is(v, b[i]));
      assert.equal(i, -1, `${weights} weights: logit ${i} is ${a[i]}, its twin's ${b[i]}`);
      if (weights === "f32") fp8F32 = a;
    }
    // With --weights auto the user hears what the fp8 weights become.
    const { run } = await logitsOf(dirs.fp8, "1,2", join(root, "a.safetensors"));
    assert.match(run.stderr, /fp8 weights: stored as f(16|32), .* \(--weights q8 keeps about their size\)/);
    // The original (bf16) weights give other logits: the fp8 codes were read, not the originals.
    const orig = (await logitsOf(k2!, tokens, join(root, "orig.safetensors"), "--weights", "f32")).logits;
    assert.ok(orig.some((v, i) => v !== fp8F32[i]), "the fp8 model's logits are the bf16 model's");
  } finally {
    await Deno.remove(root, { recursive: true });
  }
});

Deno.test({
  ...needs("an fp8 checkpoint with a scale missing, or no quantization_config: exit 2 naming what", {
    "the kimi-k2-tiny fixture": k2,
  }),
  ...slow,
}, async () => {
  const root = await Deno.makeTempDir();
  try {
    const fp8Dir = (await fp8Copy(root)).fp8;
    // No quantization_config: the F8_E4M3 tensors have nothing to say how they are scaled.
    const config = JSON.parse(await Deno.readTextFile(join(fp8Dir, "config.json")));
    delete config.quantization_config;
    await Deno.writeTextFile(join(fp8Dir, "config.json"), JSON.stringify(config));
    const args = ["logits", "--model", fp8Dir, "--tokens", "1,2,3", "--out", join(root, "x.safetensors")];
    let r = await runCli([...args, "--weights", "f32"]);
    assert.equal(r.code, 2, r.stderr);
    assert.match(r.stderr, /is F8_E4M3, but config\.json has no quantization_config/);
    // A scale tensor missing: named.
    config.quantization_config = { quant_method: "fp8", weight_block_size: [16, 24] };
    await Deno.writeTextFile(join(fp8Dir, "config.json"), JSON.stringify(config));
    const header = await readSafetensorsHeader(join(fp8Dir, "model.safetensors"));
    const kept: TensorData[] = [];
    for (const [name, info] of header) {
      if (name === "model.layers.0.self_attn.o_proj.weight_scale_inv") continue;
      kept.push({ name, dtype: info.dtype, shape: info.shape, data: await readTensorBytes(info) });
    }
    await writeSafetensors(join(fp8Dir, "model.safetensors"), kept);
    r = await runCli([...args, "--weights", "f32"]);
    assert.equal(r.code, 2, r.stderr);
    assert.match(r.stderr, /missing tensor model\.layers\.0\.self_attn\.o_proj\.weight_scale_inv/);
  } finally {
    await Deno.remove(root, { recursive: true });
  }
});
