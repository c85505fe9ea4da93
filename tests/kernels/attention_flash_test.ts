// Flash prefill attention (kernels/flash_attention.ts), both variants, against attentionRef (f64) for the
// head sizes of both tiles (32, 64 | 80, 96, 128), GQA groups of 1..8, step sizes that are not a multiple of
// the query block (1, 5, 37, 70), later chunks (pos0 > 0, keys not a multiple of the key tile) and finite
// garbage in the cache past the last position, which must be ignored; then long prompts (600+ keys, hd 64
// and 128, a 512-token chunk after 100 cached positions) as the prefill runs them. The workgroup-memory
// reductions run on every adapter; the subgroup ones where the subgroups fit (the blocked variant: 8-lane
// key groups, so lavapipe's 8-lane subgroups too; the lanes variant: 32-lane subgroups, the H200).
// Tolerance: f32 sums over <= 700 keys and <= 128 dims of values in [-1, 1]: atol 2e-5 + rtol 1e-4 (a wrong
// mask or index misses it).
import {
  attentionRef,
  createStepBuffer,
  flashAttentionCall,
  flashBlockedSource,
  type FlashBlockTile,
  flashBlockTile,
  flashSource,
  flashTile,
  type FlashVariant,
  kvQ8Decode,
  kvQ8Encode,
  type KvType,
  runCalls,
  storageBuffer,
  writeStep,
} from "../../kernels/mod.ts";
import { f16ToF32, f32ToF16 } from "../../models/dtype.ts";
import { assertClose, gpuOrSkip, randoms, readF32, upload } from "./harness.ts";

const gpu = await gpuOrSkip();
const ignore = gpu === null;

// [heads, kvHeads, headDim, pos0, T]
const CASES = [
  [4, 1, 64, 0, 37],
  [8, 2, 32, 0, 1],
  [2, 2, 64, 70, 70],
  [4, 1, 128, 0, 5],
  [3, 3, 80, 41, 37],
  [8, 1, 96, 100, 33],
  [2, 1, 128, 64, 70],
];

const LONG = [
  [4, 1, 64, 0, 640],
  [2, 1, 128, 0, 610],
  [4, 2, 64, 100, 512],
];

/** Runs every case through one variant and compares it with the reference. */
async function checkCases(
  cases: number[][],
  opts: {
    variant: FlashVariant;
    subgroups: boolean;
    tile?: Partial<FlashBlockTile>;
    kv?: KvType;
    /** The output as f16: compared with the reference rounded to f16, within half an f16 ulp more. */
    half?: boolean;
  },
): Promise<void> {
  const g = gpu!;
  let seed = 1;
  for (const [heads, kvHeads, hd, pos0, T] of cases) {
    const maxSeq = pos0 + T + 23;
    const width = (heads + 2 * kvHeads) * hd;
    const qkv = randoms(T * width, seed++);
    // The cache holds positions 0..pos0+T-1 and garbage after them.
    // An f16 or q8 cache: the reference reads the same values, widened (the kernel does only that to them).
    const h16 = opts.kv === "f16", q8 = opts.kv === "q8";
    const asKv = (a: Float32Array) =>
      h16 ? f16ToF32(f32ToF16(a)) : q8 ? kvQ8Decode(kvQ8Encode(a, hd), hd) : a;
    const toGpu = (a: Float32Array) => upload(g, h16 ? f32ToF16(a) : q8 ? kvQ8Encode(a, hd) : a);
    const kc = asKv(randoms(kvHeads * maxSeq * hd, seed++));
    const vc = asKv(randoms(kvHeads * maxSeq * hd, seed++));
    const step = createStepBuffer(g);
    writeStep(g, step, { pos0, T, tokOut: 0 });
    const out = storageBuffer(g, T * heads * hd * 4);
    const d = { heads, kvHeads, headDim: hd, maxSeq, T, kv: opts.kv };
    const bufs = { step, qkv: upload(g, qkv), kcache: toGpu(kc), vcache: toGpu(vc), out };
    await runCalls(g, [flashAttentionCall(g, bufs, d, opts)]);
    const q = new Float32Array(T * heads * hd);
    for (let t = 0; t < T; t++) q.set(qkv.subarray(t * width, t * width + heads * hd), t * heads * hd);
    const want = attentionRef(q, kc, vc, { ...d, pos0 });
    const n = T * heads * hd;
    const got = opts.half
      ? f16ToF32(new Uint16Array((await readF32(g, out, Math.ceil(n / 2))).buffer).slice(0, n))
      : await readF32(g, out, n);
    assertClose(
      got,
      opts.half ? f16ToF32(f32ToF16(want)) : want,
      2e-5,
      opts.half ? 1e-3 : 1e-4,
      `${opts.kv ?? "f32"}${opts.half ? " f16 out" : ""} ${opts.variant}${
        opts.tile ? JSON.stringify(opts.tile) : ""
      } sg ${opts.subgroups} h${heads}/${kvHeads} ` +
        `hd${hd} pos${pos0} T${T}`,
    );
  }
}

for (const variant of ["blocked", "lanes"] as const) {
  for (const sg of [false, true]) {
    const fits = variant === "blocked" ? (gpu?.subgroupSize ?? 1) % 8 === 0 : gpu?.subgroupSize === 32;
    const skip = ignore || (sg && !fits);
    Deno.test({
      name: `flash attention (${variant}) matches the reference (${
        sg ? "subgroup" : "workgroup-memory"
      } reductions)${skip && !ignore ? " [ignored: the subgroups do not fit]" : ""}`,
      ignore: skip,
    }, async () => {
      await checkCases(CASES, { variant, subgroups: sg });
      if (variant === "blocked") {
        // Both query blocks on every adapter (lavapipe's 32 KiB take bq 64 only with small heads).
        // (hd 40 at bq 64: a tile is 320 vec4s for 128 threads, so the third load is only some threads'.)
        await checkCases([[8, 2, 32, 0, 1], [4, 2, 32, 30, 99], [8, 8, 16, 5, 64], [4, 2, 40, 9, 70]], {
          variant,
          subgroups: sg,
          tile: { bq: 64 },
        });
        await checkCases(CASES.slice(0, 3), { variant, subgroups: sg, tile: { bq: 32 } });
        await checkCases(CASES.slice(0, 4), { variant, subgroups: sg, tile: { prefetch: false } });
        // 16 keys a tile: 4-lane key groups.
        await checkCases(CASES.slice(3, 7), { variant, subgroups: sg, tile: { bkv: 16 } });
        await checkCases(CASES.slice(3, 5), { variant, subgroups: sg, tile: { shareKV: true } });
      }
    });
  }
}

Deno.test({ name: "flash attention (blocked) on long prompts matches the reference", ignore }, async () => {
  await checkCases(LONG, { variant: "blocked", subgroups: (gpu?.subgroupSize ?? 1) % 8 === 0 });
});

for (const kv of ["f16", "q8"] as const) {
  const has = kv === "f16" ? gpu?.hasF16 : gpu?.hasDp4;
  Deno.test({
    name: `flash attention over the ${kv} KV cache (both variants) matches the reference`,
    ignore: ignore || !has,
  }, async () => {
    for (const sg of [false, ...((gpu?.subgroupSize ?? 1) % 8 === 0 ? [true] : [])]) {
      await checkCases([...CASES, LONG[2]], { variant: "blocked", subgroups: sg, kv });
      await checkCases(CASES.slice(0, 3), {
        variant: "blocked",
        subgroups: sg,
        kv,
        tile: { prefetch: false },
      });
      await checkCases(CASES.slice(3, 5), { variant: "blocked", subgroups: sg, kv, tile: { shareKV: true } });
    }
    await checkCases(CASES, { variant: "lanes", subgroups: gpu?.subgroupSize === 32, kv });
  });
}

// The prefill's o_proj input as f16 (flashHalfOut): the same attention, rounded once as it is stored.
Deno.test({
  name: "flash attention (blocked) with an f16 output matches the reference rounded to f16",
  ignore: ignore || !gpu?.hasF16,
}, async () => {
  const subgroups = (gpu?.subgroupSize ?? 1) % 8 === 0;
  await checkCases(CASES.slice(0, 4), { variant: "blocked", subgroups, half: true });
  await checkCases(CASES.slice(4, 6), { variant: "blocked", subgroups, kv: "f16", half: true });
});

// Regression: the subgroup variant once began with `enable subgroups;`, which naga rejects, so on the H200 the
// pipeline was invalid and every prefill attention silently wrote nothing. Compiling it needs only an adapter
// with the subgroups feature (lavapipe has it, with 8-lane subgroups it cannot run this variant on).
Deno.test({
  name: `flash attention's subgroup variant compiles${gpu?.subgroupSize ? "" : " [ignored: no subgroups]"}`,
  ignore: ignore || !gpu?.subgroupSize,
}, async () => {
  const g = gpu!;
  for (const hd of [64, 128]) {
    for (
      const code of [
        flashSource(hd, flashTile(hd), true),
        flashBlockedSource(hd, flashBlockTile(hd, 49152), true),
        ...(g.hasF16
          ? [
            flashSource(hd, flashTile(hd), true, "f16"),
            flashBlockedSource(hd, flashBlockTile(hd, 49152), true, "f16"),
          ]
          : []),
        ...(g.hasDp4
          ? [
            flashSource(hd, flashTile(hd), true, "q8"),
            flashBlockedSource(hd, flashBlockTile(hd, 49152), true, "q8"),
          ]
          : []),
      ]
    ) {
      const module = g.device.createShaderModule({ code });
      const errors = (await module.getCompilationInfo()).messages.filter((m) => m.type === "error");
      if (errors.length > 0) throw new Error(`head_dim ${hd}: ${errors.map((e) => e.message).join("; ")}`);
    }
  }
});
