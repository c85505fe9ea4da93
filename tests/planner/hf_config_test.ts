import assert from "node:assert/strict";
import { join } from "node:path";
import { fixtureDir } from "../fixtures.ts";
import { needs } from "../support/needs.ts";
import { compileHfConfig } from "../../planner/hf_config.ts";
import { activeParams, moeOf, totalParams } from "../../planner/model_graph.ts";

function throwsWith(f: () => unknown, cls: new (...a: never[]) => Error, text: string) {
  assert.throws(f, (e) => e instanceof cls && e.message.includes(text));
}

const data = (name: string) =>
  JSON.parse(Deno.readTextFileSync(new URL(`./data/${name}.json`, import.meta.url)));

Deno.test("Kimi K2: about 1.03 T total and 32 B active parameters, with its exact structure", () => {
  const g = compileHfConfig(data("kimi-k2"));
  assert.deepEqual(totalParams(g), 1_026_408_232_448);
  assert.deepEqual(activeParams(g), 32_861_500_928);
  assert.deepEqual(g.layers.length, 61);
  assert.deepEqual(moeOf(g.layers[0]), undefined, "first_k_dense_replace = 1: layer 0 is dense");
  const moe = moeOf(g.layers[1])!;
  assert.deepEqual([moe.experts, moe.topK, moe.shared, moe.expertParams], [384, 8, 1, 3 * 7168 * 2048]);
  assert.deepEqual(g.layers[1].ops.find((o) => o.kind === "attention")?.kind, "attention");
  assert.deepEqual(g.dtype.experts, 1, "fp8 quantization_config: 1 byte per expert weight");
});

Deno.test("DeepSeek-V3 layers: MoE from first_k_dense_replace on, moe_layer_freq ignored as transformers does", () => {
  const g = compileHfConfig({
    ...data("kimi-k2"),
    num_hidden_layers: 5,
    first_k_dense_replace: 2,
    moe_layer_freq: 2,
  });
  assert.deepEqual(g.layers.map((l) => moeOf(l) !== undefined), [false, false, true, true, true]);
});

Deno.test("Llama 3.2 1B: 1.236 B parameters, tied head counted once", () => {
  const g = compileHfConfig(data("llama-3.2-1b"));
  assert.deepEqual(totalParams(g), 1_235_814_400);
  assert.ok(g.tied);
});

Deno.test("Mixtral 8x7B (46.7 B, 12.9 B active) and Qwen3-30B-A3B (30.5 B, 3.3 B active)", () => {
  const m = compileHfConfig(data("mixtral-8x7b"));
  assert.deepEqual(totalParams(m), 46_702_792_704);
  assert.deepEqual(activeParams(m), 12_879_925_248);
  const q = compileHfConfig(data("qwen3-30b-a3b"));
  assert.deepEqual(totalParams(q), 30_532_122_624);
  assert.deepEqual(activeParams(q), 3_353_032_704);
});

/** Counts the elements of every tensor in a safetensors file from its header. */
function safetensorsParams(path: string): number {
  const f = Deno.openSync(path);
  try {
    const len = new Uint8Array(8);
    f.readSync(len);
    const n = Number(new DataView(len.buffer).getBigUint64(0, true));
    const buf = new Uint8Array(n);
    let off = 0;
    while (off < n) off += f.readSync(buf.subarray(off))!;
    const header = JSON.parse(new TextDecoder().decode(buf));
    let total = 0;
    for (const [k, v] of Object.entries(header)) {
      if (k !== "__metadata__") total += (v as { shape: number[] }).shape.reduce((a, b) => a * b, 1);
    }
    return total;
  } finally {
    f.close();
  }
}

for (const name of ["llama-micro", "llama3-tiny", "mixtral-tiny", "kimi-k2-tiny"]) {
  const dir = fixtureDir(name);
  Deno.test({
    ...needs(`${name}: the config compiles to exactly the parameter count its safetensors store`, {
      [`../shared/fixtures/${name}`]: dir,
    }),
    fn() {
      const g = compileHfConfig(JSON.parse(Deno.readTextFileSync(join(dir!, "config.json"))));
      let stored = 0;
      for (const e of Deno.readDirSync(dir!)) {
        if (e.name.startsWith("model") && e.name.endsWith(".safetensors")) {
          stored += safetensorsParams(join(dir!, e.name));
        }
      }
      assert.ok(stored > 0, `no model*.safetensors in ${dir}`);
      assert.deepEqual(totalParams(g), stored, name);
    },
  });
}

Deno.test("compileHfConfig rejects unknown families and bad fields with a message naming them", () => {
  throwsWith(
    () => compileHfConfig({ model_type: "gpt2" }),
    TypeError,
    "unsupported architecture 'gpt2' (model_type)",
  );
  throwsWith(
    () => compileHfConfig({ ...data("llama-3.2-1b"), hidden_size: "big" }),
    TypeError,
    "hidden_size",
  );
  throwsWith(() => compileHfConfig([]), TypeError, "JSON object");
});

Deno.test("the graph follows the runtime's reading of the config: defaults, aliases, o_proj's bias", () => {
  // DeepseekV3Config's defaults where the keys are absent (256 experts, 3 dense layers first, 1 shared).
  const k2 = data("kimi-k2");
  const { n_routed_experts: _n, first_k_dense_replace: _f, n_shared_experts: _s, ...bare } = k2;
  const g = compileHfConfig({ ...bare, num_hidden_layers: 4 });
  assert.deepEqual(g.layers.map((l) => moeOf(l)?.experts ?? 0), [0, 0, 0, 256]);
  assert.deepEqual(moeOf(g.layers[3])!.shared, 1);
  // transformers 5's name for Qwen3-MoE's expert count.
  const q = data("qwen3-30b-a3b");
  const { num_experts: e, ...renamed } = q;
  assert.deepEqual(moeOf(compileHfConfig({ ...renamed, num_local_experts: e }).layers[0])!.experts, e);
  // attention_bias: q, k, v and o biases (the o one is hidden_size elements).
  const llama = data("llama-3.2-1b");
  const plain = totalParams(compileHfConfig(llama));
  const biased = totalParams(compileHfConfig({ ...llama, attention_bias: true }));
  const { hidden_size: h, num_hidden_layers: n, num_attention_heads: heads, num_key_value_heads: kv } = llama;
  const hd = h / heads;
  assert.deepEqual(biased - plain, n * (heads * hd + 2 * kv * hd + h));
});

Deno.test("dtype overrides: 4-bit experts shrink only the experts", () => {
  const g = compileHfConfig(data("kimi-k2"), { dtype: { experts: 0.5 } });
  assert.deepEqual(g.dtype.experts, 0.5);
  assert.deepEqual(g.dtype.dense, 1);
});
