// GPU time of one MLA layer's attention kernels for a decode step (T = 1), on random data: RoPE + latent
// cache write, absorption of q_nope, attention over the latent cache (+ the split combine), value
// up-projection; each call timed inside the sequence (kernels/timer.ts; `attention` includes the split
// combine, also given alone as `combine`). Shapes: DeepSeek-V2-Lite's MLA
// (16 heads), Kimi K2's (64) and DeepSeek-V3's (128), kv_lora_rank 512, nope 128, rope 64, v 128, f16
// weights, at several cache lengths, with the default tuning and each of its knobs moved, for a latent cache
// of f32 and of f16 values (--cache; the engine's is f16 beside f16 / q8 / q4 weights). One JSON line per row.
//   deno run -A scripts/bench/mla.ts [--heads 16,64,128] [--keys 128,1024,4096] [--cache f32,f16]
//     [--repeat 50] [--default-only] [--tunings '[{"headsPerGroup": 8, "splits": 16, "subgroup": false}]']
// --tunings: rows of MlaAttentionTuning fields over the default, after the default's row (null: left out).
import { parseArgs } from "node:util";
import { scriptArgs } from "../args.ts";
import {
  createStepBuffer,
  getGpu,
  type KernelCall,
  kvRowBytes,
  type KvType,
  mlaAbsorbCall,
  mlaAttentionCalls,
  mlaAttentionDefaultTuning,
  type MlaAttentionTuning,
  type MlaDims,
  mlaRopeCacheCall,
  mlaValueCall,
  releaseCalls,
  storageBuffer,
  writeStep,
} from "../../kernels/mod.ts";
import { gpuMsPerCall } from "../../kernels/timer.ts";

const { values: args } = scriptArgs(import.meta.url, (args) =>
  parseArgs({
    args,
    options: {
      heads: { type: "string" },
      keys: { type: "string" },
      cache: { type: "string", default: "f32,f16" },
      repeat: { type: "string" },
      "default-only": { type: "boolean", default: false },
      tunings: { type: "string" },
    },
  }));
const list = (s: string | undefined, d: number[]) => (s ? s.split(",").map(Number) : d);
const HEADS = list(args.heads, [16, 64, 128]);
const KEYS = list(args.keys, [128, 1024, 4096]);
const REPEAT = Number(args.repeat ?? 50);
const CACHES = args.cache!.split(",").map((c) => {
  if (c !== "f32" && c !== "f16") throw new TypeError(`--cache takes f32 and / or f16, got "${c}"`);
  return c as KvType;
});

const gpu = await getGpu();
console.error(
  `# ${gpu.adapterName}, subgroup ${gpu.subgroupSize}, workgroup memory ${gpu.maxWorkgroupStorage}`,
);
for (const heads of HEADS) {
  for (const kv of CACHES) {
    if (kv === "f16" && !gpu.hasF16) {
      console.error(`# ${gpu.adapterName} has no shader-f16: no f16 cache`);
      continue;
    }
    const d: MlaDims = {
      heads,
      kvLoraRank: 512,
      qkNopeHeadDim: 128,
      qkRopeHeadDim: 64,
      vHeadDim: 128,
      maxSeq: Math.max(...KEYS),
      T: 1,
      kv,
    };
    const { kvLoraRank: R, qkNopeHeadDim: DN, qkRopeHeadDim: DR, vHeadDim: DV } = d;
    // Random-ish contents do not change the timing; zeros would (exp of equal scores is still work).
    const fill = (n: number, bytes = 4) => {
      const b = storageBuffer(gpu, n * bytes);
      const v = new Float32Array(Math.ceil((n * bytes) / 4)).map((_, i) => Math.sin(i) * 0.1);
      gpu.device.queue.writeBuffer(b, 0, v);
      return b;
    };
    const step = createStepBuffer(gpu);
    const b = {
      step,
      table: fill(d.maxSeq * DR),
      q: fill(heads * (DN + DR)),
      kv: fill(R + DR),
      kvNorm: fill(R),
      cache: fill(d.maxSeq, kvRowBytes(kv, R + DR)),
      wUK: fill(heads * R * DN, 2),
      wUV: fill(heads * DV * R, 2),
      qLatent: storageBuffer(gpu, heads * R * 4),
      ctx: storageBuffer(gpu, heads * R * 4),
      out: storageBuffer(gpu, heads * DV * 4),
    };
    const def = mlaAttentionDefaultTuning(gpu, d);
    // The default, then each knob moved: more loads in flight, half the heads per group (twice the
    // workgroups), half the splits.
    // A null field is the field left out.
    const extra = (JSON.parse(args.tunings ?? "[]") as Partial<MlaAttentionTuning>[]).map((t) => ({
      ...def,
      ...Object.fromEntries(Object.entries(t).map(([k, v]) => [k, v ?? undefined])),
    }));
    const tunings: MlaAttentionTuning[] = args["default-only"] || extra.length ? [def, ...extra] : [
      def,
      { ...def, unroll: 16 },
      { ...def, headsPerGroup: Math.max(1, def.headsPerGroup / 2), splits: Math.min(256, def.splits * 2) },
      { ...def, splits: Math.max(1, def.splits / 2) },
    ];
    for (const keys of KEYS) {
      writeStep(gpu, step, { pos0: keys - 1, T: 1, tokOut: 0 });
      for (const tuning of tunings) {
        const calls: KernelCall[] = [
          mlaRopeCacheCall(gpu, b, { ...d, eps: 1e-6, interleaved: true }),
          mlaAbsorbCall(gpu, b, { ...d, weights: "f16" }),
          ...mlaAttentionCalls(gpu, b, { ...d, scale: 0.1, tuning }),
          mlaValueCall(gpu, b, { ...d, weights: "f16" }),
        ];
        await gpuMsPerCall(gpu, calls, 5); // warm up: pipelines, clocks
        const ms = await gpuMsPerCall(gpu, calls, REPEAT);
        releaseCalls(calls, step);
        const us = (x: number) => Math.round(x * 1e4) / 10;
        const total = ms.reduce((a, x) => a + x, 0);
        // Bytes a step must read: the latent cache rows, the absorbed weights (f16), the queries.
        const bytes = keys * kvRowBytes(kv, R + DR) + heads * R * (DN + DV) * 2;
        console.log(JSON.stringify({
          heads,
          keys,
          cache: kv,
          tuning,
          us: {
            rope_cache: us(ms[0]),
            absorb: us(ms[1]),
            attention: us(ms.slice(2, -1).reduce((a, x) => a + x, 0)),
            // Of which the split partials' combine (0 with one split).
            combine: ms.length > 4 ? us(ms.at(-2)!) : 0,
            value: us(ms.at(-1)!),
            total: us(total),
          },
          gbps: Math.round(bytes / (total * 1e6)),
        }));
      }
    }
    for (const buf of Object.values(b)) buf.destroy();
  }
}
