// Logit error of weight-quantisation schemes on fixtures, without writing a kernel for each: every matrix
// (2-D, rows a multiple of 32) is quantised and dequantised on the CPU, the result written as an f32
// checkpoint beside the fixture's reference, and checked through the CLI with --weights f32. This is how
// docs/KERNELS.md chose q4's scheme; "q8" / "q4" here are kernels/quant.ts's, so their numbers should
// match `scripts/check_fixture.ts --weights q8|q4` (the in-kernel path) up to f32 accumulation order.
//   deno run -A scripts/quant_error.ts DIR... [--schemes q8,q4,q4_sym7,q4_1]
import { join } from "node:path";
import { parseArgs } from "node:util";
import { scriptArgs } from "./args.ts";
import { dequantize, QUANT_GROUP, quantize } from "../kernels/quant.ts";
import { Checkpoint } from "../models/checkpoint.ts";
import { tensorShapes } from "../models/tensors.ts";
import { writeSafetensors } from "../models/safetensors.ts";
import { checkFixture } from "./check_fixture.ts";

type Scheme = (w: Float32Array, N: number, K: number) => Float32Array;

/** Symmetric 4-bit with 15 levels: scale = amax / 7, q in -7..7 (f32 scale). */
function q4Sym7(w: Float32Array): Float32Array {
  const out = new Float32Array(w.length);
  for (let g = 0; g < w.length; g += QUANT_GROUP) {
    let amax = 0;
    for (let i = g; i < g + QUANT_GROUP; i++) amax = Math.max(amax, Math.abs(w[i]));
    const s = amax / 7;
    for (let i = g; i < g + QUANT_GROUP; i++) out[i] = s === 0 ? 0 : Math.round(w[i] / s) * s;
  }
  return out;
}

/** Asymmetric 4-bit like llama.cpp's Q4_1: x = q * d + min, q in 0..15 (f32 d and min: its best case). */
function q4Asym(w: Float32Array): Float32Array {
  const out = new Float32Array(w.length);
  for (let g = 0; g < w.length; g += QUANT_GROUP) {
    let lo = Infinity, hi = -Infinity;
    for (let i = g; i < g + QUANT_GROUP; i++) [lo, hi] = [Math.min(lo, w[i]), Math.max(hi, w[i])];
    const d = (hi - lo) / 15;
    for (let i = g; i < g + QUANT_GROUP; i++) out[i] = d === 0 ? lo : Math.round((w[i] - lo) / d) * d + lo;
  }
  return out;
}

const SCHEMES: Record<string, Scheme> = {
  q8: (w, N, K) => dequantize(quantize(w, { N, K }, "q8"), { N, K }, "q8"),
  q4: (w, N, K) => dequantize(quantize(w, { N, K }, "q4"), { N, K }, "q4"),
  q4_sym7: q4Sym7,
  q4_1: q4Asym,
};

/** A copy of the fixture `dir` whose matrices went through `scheme` and back to f32 (a temp dir). */
export async function fakeQuantCopy(dir: string, schemeName: string): Promise<string> {
  const scheme = SCHEMES[schemeName];
  if (!scheme) throw new TypeError(`unknown scheme "${schemeName}"; known: ${Object.keys(SCHEMES)}`);
  const ckpt = await Checkpoint.open(dir);
  const out = await Deno.makeTempDir({ prefix: "swactor-quant-" });
  const tensors = [];
  for (const [name, shape] of tensorShapes(ckpt.config)) {
    if (!ckpt.tensors.has(name)) continue; // lm_head when tied
    let w = await ckpt.readF32(name);
    if (shape.length === 2 && shape[1] % QUANT_GROUP === 0) w = scheme(w, shape[0], shape[1]);
    tensors.push({ name, dtype: "F32" as const, shape, data: new Uint8Array(w.buffer) });
  }
  await writeSafetensors(join(out, "model.safetensors"), tensors, { format: "pt" });
  for (const f of ["config.json", "reference.json", "reference.safetensors"]) {
    await Deno.copyFile(join(dir, f), join(out, f));
  }
  return out;
}

if (import.meta.main) {
  const { values, positionals } = scriptArgs(import.meta.url, (args) =>
    parseArgs({
      args,
      options: { schemes: { type: "string", default: Object.keys(SCHEMES).join(",") } },
      allowPositionals: true,
    }));
  for (const dir of positionals) {
    for (const name of values.schemes!.split(",")) {
      const copy = await fakeQuantCopy(dir, name);
      try {
        const r = await checkFixture(copy, { weights: "f32" });
        console.log(
          `${dir} scheme=${name} logits_rel_err=${r.logitsError.toExponential(2)} tokens=${
            r.tokensMatch ? "match" : "DIFFER"
          } (${r.generated.filter((t, i) => t === r.expected[i]).length}/${r.expected.length} equal)`,
        );
      } finally {
        await Deno.remove(copy, { recursive: true });
      }
    }
  }
}
