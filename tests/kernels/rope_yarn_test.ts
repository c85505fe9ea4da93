// yarn RoPE (kernels/rope.ts) against what transformers 5.17 computes (tests/fixtures/mla/mla_reference.json,
// made by make_mla_reference.py there): inverse frequencies, attention factor and the rotary module's
// cos/sin, for the tiny and real Kimi K2 / DeepSeek-V3 settings and edge cases (mscale != mscale_all_dim,
// only mscale_all_dim, neither, an explicit attention_factor, truncate off, factor 1). CPU only.
import {
  ropeAttentionFactor,
  ropeInvFreq,
  ropeTable,
  yarnGetMscale,
  type YarnRopeScaling,
} from "../../kernels/mod.ts";
import { assertClose } from "./harness.ts";

interface YarnCase {
  rope_theta: number;
  rope_scaling: Record<string, number | boolean | string>;
  head_dim: number;
  inv_freq: number[];
  attention_factor: number;
  scaling: number;
  positions: number[];
  cos: number[];
  sin: number[];
}

const ref = JSON.parse(
  await Deno.readTextFile(new URL("../fixtures/mla/mla_reference.json", import.meta.url)),
);

/** A hub `rope_scaling` dict of type yarn, as the model's config parser maps it. */
function yarnFromHub(rs: Record<string, unknown>): YarnRopeScaling {
  const num = (k: string) => (typeof rs[k] === "number" ? rs[k] as number : undefined);
  return {
    type: "yarn",
    factor: num("factor")!,
    originalMaxPositionEmbeddings: num("original_max_position_embeddings")!,
    betaFast: num("beta_fast"),
    betaSlow: num("beta_slow"),
    mscale: num("mscale"),
    mscaleAllDim: num("mscale_all_dim"),
    attentionFactor: num("attention_factor"),
    truncate: typeof rs.truncate === "boolean" ? rs.truncate : undefined,
  };
}

Deno.test("yarn inverse frequencies match transformers (within one f32 rounding)", () => {
  for (const [name, c] of Object.entries(ref.yarn as Record<string, YarnCase>)) {
    const inv = ropeInvFreq(c.head_dim, c.rope_theta, yarnFromHub(c.rope_scaling));
    // f32 results of the same f32 steps: only pow may differ, by one rounding.
    assertClose(inv, Float32Array.from(c.inv_freq), 0, 2.5e-7, `inv_freq ${name}`);
  }
});

Deno.test("yarn attention factor matches transformers", () => {
  for (const [name, c] of Object.entries(ref.yarn as Record<string, YarnCase>)) {
    const af = ropeAttentionFactor(yarnFromHub(c.rope_scaling));
    if (Math.abs(af - c.attention_factor) > 1e-12) {
      throw new Error(`${name}: attention factor ${af}, transformers ${c.attention_factor}`);
    }
  }
});

Deno.test("yarn cos/sin tables carry the attention factor as transformers' rotary module does", () => {
  for (const [name, c] of Object.entries(ref.yarn as Record<string, YarnCase>)) {
    const s = yarnFromHub(c.rope_scaling);
    const half = c.head_dim / 2;
    const table = ropeTable(Float32Array.from(c.inv_freq), Math.max(...c.positions) + 1, {
      attentionFactor: ropeAttentionFactor(s),
    });
    c.positions.forEach((pos, k) => {
      const row = table.subarray(pos * half * 2, (pos + 1) * half * 2);
      const cos = Float32Array.from({ length: half }, (_, i) => row[2 * i]);
      const sin = Float32Array.from({ length: half }, (_, i) => row[2 * i + 1]);
      // cos / sin of the same f32 angle, torch's f32 cos against f64 rounded: one f32 ulp of 1.
      assertClose(
        cos,
        Float32Array.from(c.cos.slice(k * half, (k + 1) * half)),
        2.4e-7,
        2.4e-7,
        `cos ${name} @${pos}`,
      );
      assertClose(
        sin,
        Float32Array.from(c.sin.slice(k * half, (k + 1) * half)),
        2.4e-7,
        2.4e-7,
        `sin ${name} @${pos}`,
      );
    });
  }
});

Deno.test("yarn: a whole table matches row by row, and the factor defaults to 1", () => {
  const c = (ref.yarn as Record<string, YarnCase>)["mscale-ratio"];
  const s = yarnFromHub(c.rope_scaling);
  const inv = ropeInvFreq(c.head_dim, c.rope_theta, s);
  const table = ropeTable(inv, 301, { attentionFactor: ropeAttentionFactor(s) });
  const plain = ropeTable(inv, 301);
  const half = c.head_dim / 2;
  const k = c.positions.indexOf(300);
  const at = 300 * half * 2;
  const cos = Float32Array.from({ length: half }, (_, i) => table[at + 2 * i]);
  assertClose(cos, Float32Array.from(c.cos.slice(k * half, (k + 1) * half)), 2.4e-7, 2.4e-7, "cos @300");
  const ratio = table[at] / plain[at];
  if (Math.abs(ratio - c.attention_factor) > 1e-6) throw new Error(`factor not applied: ${ratio}`);
});

Deno.test("yarnGetMscale is 1 up to scale 1 and 0.1 m ln(s) + 1 above", () => {
  if (yarnGetMscale(1, 5) !== 1 || yarnGetMscale(0.5) !== 1) {
    throw new Error("mscale of scale <= 1 must be 1");
  }
  const want = 0.1 * 0.707 * Math.log(40) + 1;
  if (Math.abs(yarnGetMscale(40, 0.707) - want) > 1e-15) throw new Error("mscale(40, 0.707)");
});

Deno.test("yarn refuses a non-positive factor or original context, naming them", () => {
  for (
    const bad of [{ factor: 0, originalMaxPositionEmbeddings: 4096 }, {
      factor: 4,
      originalMaxPositionEmbeddings: 0,
    }]
  ) {
    let msg = "";
    try {
      ropeInvFreq(8, 10000, { type: "yarn", ...bad });
    } catch (e) {
      if (e instanceof RangeError) msg = e.message;
    }
    if (!msg.includes("factor") || !msg.includes("original_max_position_embeddings")) {
      throw new Error(`expected a RangeError naming the fields, got "${msg}"`);
    }
  }
});
