// Decode attention microbenchmark (kernels/attention_decode.ts) at Llama-3.2-1B's shape (32 q heads, 8 KV
// heads, head_dim 64), 16 layers' caches rotated so L2 holds none of them: GPU us per layer for each
// context and tuning (flash-decoding splits, fewest chunks a split takes, subgroups per workgroup), and
// the KV bytes read per us; the per-head kernel against the grouped one (one workgroup per kv head, rows
// read once for the group: grouped-one, grouped, g-b / g-w / g-s / g-u variants). One JSON line per context
// and cache type (--cache: the KV cache's element type, f32 and f16 by default, or q8; f16 where the adapter has
// shader-f16). --ab: only the per-head defaults against the grouped variants (no per-head split sweep).
// --variants '{"name": {tuning}, ...}': only "default" and these (AttentionDecodeTuning fields), for A/B runs.
//   deno run -A scripts/bench/attention_decode.ts [--context 128,2048,8192] [--heads 32] [--kv 8] [--hd 64]
//     [--cache f32,f16] [--quick] [--ab] [--variants JSON]
import { parseArgs } from "node:util";
import { scriptArgs } from "../args.ts";
import {
  attentionDecodeCalls,
  type AttentionDecodeTuning,
  createStepBuffer,
  getGpu,
  isKvType,
  type KernelCall,
  KV_TYPES,
  kvRowBytes,
  ropeInvFreq,
  ropeTable,
  storageBuffer,
  uploadBuffer,
  writeStep,
} from "../../kernels/mod.ts";
import { gpuMs } from "../../kernels/timer.ts";

const { values } = scriptArgs(import.meta.url, (args) =>
  parseArgs({
    args,
    options: {
      context: { type: "string", default: "128,2048,8192" },
      heads: { type: "string", default: "32" },
      kv: { type: "string", default: "8" },
      hd: { type: "string", default: "64" },
      cache: { type: "string", default: "f32,f16" },
      quick: { type: "boolean", default: false },
      ab: { type: "boolean", default: false },
      variants: { type: "string" },
    },
  }));
const gpu = await getGpu();
const heads = Number(values.heads), kvHeads = Number(values.kv), headDim = Number(values.hd);
const LAYERS = values.quick ? 2 : 16;
// The per-head kernel (grouped: false) against the grouped one (one workgroup per kv head; its own
// default splits, attentionDecodeGroupedSplits): g-b<n> q heads a pass over the keys (groupBatch),
// g-w<n> subgroups a workgroup, g-s<n> splits, g-m1 a split's fewest chunks 1 (default 4), g-u8 8 loads
// a block.
const variants: [string, Partial<AttentionDecodeTuning>][] = [
  ["one", { splits: 1, grouped: false }],
  ["default", { grouped: false }],
  ["grouped-one", { splits: 1, grouped: true }],
  ["grouped", { grouped: true }],
];
// Loads a lane issues before using any (default 16 where a chunk's loads are at most 16 a lane, else 8):
// u<n> unsplit (one workgroup a head) and s-u<n> with the default splits.
for (const unroll of [8, 16, 32]) {
  variants.push([`u${unroll}`, { splits: 1, unroll, grouped: false }], [`s-u${unroll}`, {
    unroll,
    grouped: false,
  }]);
}
if (!values.quick) {
  for (const groupBatch of [1, 2, 8]) variants.push([`g-b${groupBatch}`, { groupBatch, grouped: true }]);
  for (const warps of [2, 8]) variants.push([`g-w${warps}`, { warps, grouped: true }]);
  for (const splits of [16, 32]) variants.push([`g-s${splits}`, { splits, grouped: true }]);
  variants.push(["g-m1", { minChunks: 1, grouped: true }], ["g-u8", { unroll: 8, grouped: true }]);
}
if (!values.quick && !values.ab) {
  // One workgroup a head with fewer subgroups (short contexts leave most of 16 idle).
  for (const warps of [2, 4, 8]) variants.push([`s1w${warps}`, { splits: 1, warps, grouped: false }]);
  for (const splits of [4, 8, 16, 32]) {
    for (const minChunks of [1, 4]) {
      for (const warps of [4, 16]) {
        variants.push([`s${splits}m${minChunks}w${warps}`, { splits, minChunks, warps, grouped: false }]);
      }
    }
  }
}
if (values.variants) {
  const given = JSON.parse(values.variants) as Record<string, Partial<AttentionDecodeTuning>>;
  if (typeof given !== "object" || given === null || Array.isArray(given)) {
    throw new TypeError(`--variants takes a JSON object of named tunings, got ${values.variants}`);
  }
  variants.splice(0, variants.length, ["default", { grouped: false }], ...Object.entries(given));
}
const cacheTypes = values.cache!.split(",").map((c) => {
  if (!isKvType(c)) throw new TypeError(`--cache takes ${KV_TYPES.join(", ")}, got "${c}"`);
  return c;
}).filter((c) => c === "f32" || gpu.hasF16);
for (const ctx of values.context!.split(",").map(Number)) {
  for (const cache of cacheTypes) {
    const maxSeq = ctx + 8;
    const step = createStepBuffer(gpu);
    writeStep(gpu, step, { pos0: ctx, T: 1, tokOut: ctx + 1 });
    const table = uploadBuffer(gpu, ropeTable(ropeInvFreq(headDim, 500000, null), maxSeq));
    const qkv = uploadBuffer(
      gpu,
      new Float32Array((heads + 2 * kvHeads) * headDim).map((_, i) => Math.sin(i)),
    );
    const out = storageBuffer(gpu, heads * headDim * 4);
    const bytes = kvHeads * maxSeq * kvRowBytes(cache, headDim);
    const caches = Array.from(
      { length: LAYERS },
      () => [storageBuffer(gpu, bytes), storageBuffer(gpu, bytes)],
    );
    const d = { heads, kvHeads, headDim, maxSeq, kv: cache };
    // A tuning this shape's workgroup memory cannot hold (RangeError) is left out of the line.
    const sets: [string, KernelCall[]][] = variants.flatMap(([name, t]): [string, KernelCall[]][] => {
      try {
        return [[
          name,
          caches.flatMap(([kcache, vcache]) =>
            attentionDecodeCalls(gpu, { step, table, qkv, kcache, vcache, out }, d, t)
          ),
        ]];
      } catch (e) {
        if (e instanceof RangeError) return [];
        throw e;
      }
    });
    // The H200 ramps its clocks under load: ~0.5 s of this work first.
    for (let spent = 0; spent < (values.quick ? 0 : 500);) spent += await gpuMs(gpu, sets[0][1], 20) * 20;
    const us: Record<string, number> = {};
    for (let pass = 0; pass < 2; pass++) {
      for (const [name, calls] of sets) {
        const ms = await gpuMs(gpu, calls, values.quick ? 1 : 10);
        us[name] = Math.min(us[name] ?? Infinity, Number((ms * 1000 / LAYERS).toFixed(2)));
      }
    }
    const best = Object.entries(us).reduce((a, b) => (b[1] < a[1] ? b : a));
    const kvRead = 2 * kvHeads * (ctx + 1) * kvRowBytes(cache, headDim);
    console.log(JSON.stringify({
      bench: "attention-decode",
      adapter: gpu.adapterName,
      context: ctx,
      heads,
      kv_heads: kvHeads,
      head_dim: headDim,
      cache,
      kv_bytes_per_layer: kvRead,
      us_per_layer: us,
      best: best[0],
      best_gb_s: Number((kvRead / best[1] / 1000).toFixed(0)),
    }));
    for (const [k, v] of caches) (k.destroy(), v.destroy());
  }
}
