// The fused decode attention (kernels/attention_decode.ts: RoPE + KV write + attention for one token)
// against the CPU references (ropeRef, attentionRef), for several head shapes and positions around the
// chunk edges, with finite garbage in the cache past the current position that must be ignored. Skips,
// saying so, without a GPU or without subgroups.
import assert from "node:assert/strict";
import {
  attendedKeys,
  ATTENTION_LONG_KEYS,
  ATTENTION_SPLIT_KEYS,
  attentionDecodeCall,
  attentionDecodeCalls,
  attentionDecodeFits,
  attentionDecodeSplits,
  type AttentionDecodeTuning,
  attentionGroupedDefault,
  attentionLengthBucket,
  attentionRef,
  createStepBuffer,
  encodeCalls,
  gemvInt8InputCall,
  type Gpu,
  headNormRef,
  type KernelCall,
  kvQ8Decode,
  kvQ8Encode,
  type KvType,
  ropeInvFreq,
  ropeRef,
  ropeTable,
  writeStep,
} from "../../kernels/mod.ts";
import { f16ToF32, f32ToF16 } from "../../models/dtype.ts";
import { assertClose, assertQ8Rows, assertSameInt8Copy, gpuOrSkip, randoms, upload } from "./harness.ts";

const gpu = await gpuOrSkip();
if (gpu && !gpu.subgroupSize) {
  console.log(`skipped: decode attention tests (${gpu.adapterName} has no fixed subgroup size)`);
}
const ignore = gpu === null || !gpu.subgroupSize;

// head_dim 40, 6 and 12 leave lanes idle in the value loop (vector slots not a divisor of the subgroup).
const SHAPES = [[32, 8, 64], [3, 1, 40], [4, 4, 128], [1, 1, 2], [2, 1, 6], [2, 2, 12], [2, 1, 256]];
const POSITIONS = [0, 1, 63, 64, 65, 300];
const MAX_SEQ = 320;

interface Case {
  heads: number;
  kv: number;
  hd: number;
  pos: number;
  T: number;
  tuning?: Partial<AttentionDecodeTuning>;
  /** Qwen3's q_norm / k_norm folded in (random weights; head_norm.ts's headNormRef is the reference). */
  norm?: boolean;
  /** The caches' element type (default f32). */
  kvType?: KvType;
  /** The caches' capacity (default MAX_SEQ). */
  maxSeq?: number;
}

/**
 * The values a `kv` cache holds for `a` (rows of `hd`): rounded to f16 and back (round to nearest even), or
 * quantised to int8 a row (q8); identity for f32.
 */
function asKv(kv: KvType | undefined, a: Float32Array, hd: number): Float32Array {
  return kv === "f16" ? f16ToF32(f32ToF16(a)) : kv === "q8" ? kvQ8Decode(kvQ8Encode(a, hd), hd) : a;
}

/** A cache buffer holding `a` (rows of `hd`) as `kv` elements. */
function uploadKv(g: Gpu, kv: KvType | undefined, a: Float32Array, hd: number): GPUBuffer {
  return upload(g, kv === "f16" ? f32ToF16(a) : kv === "q8" ? kvQ8Encode(a, hd) : a);
}

/**
 * Runs the call and reads the buffers back in one submit (one wait: each costs ~11 ms on lavapipe); a read
 * marked "f16" holds n f16 values (an f16 cache), widened here; one marked "q8" n int8 values in rows of `hd`
 * and their scales (kernels/kv.ts), decoded here.
 */
async function runAndRead(
  g: Gpu,
  calls: KernelCall[],
  reads: [GPUBuffer, number, KvType?, number?][],
): Promise<Float32Array[]> {
  const size = (n: number, t?: KvType, hd = 1) => t === "f16" ? n * 2 : t === "q8" ? n + (n / hd) * 4 : n * 4;
  const bytes = reads.reduce((a, [, n, t, hd]) => a + size(n, t, hd), 0);
  const staging = g.device.createBuffer({
    size: bytes,
    usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST,
  });
  const enc = g.device.createCommandEncoder();
  const pass = enc.beginComputePass();
  encodeCalls(pass, calls);
  pass.end();
  let at = 0;
  for (const [buf, n, t, hd] of reads) {
    enc.copyBufferToBuffer(buf, 0, staging, at, size(n, t, hd));
    at += size(n, t, hd);
  }
  g.device.queue.submit([enc.finish()]);
  await staging.mapAsync(GPUMapMode.READ);
  const all = staging.getMappedRange().slice(0);
  staging.unmap();
  staging.destroy();
  at = 0;
  return reads.map(([, n, t, hd]) => {
    const b = all.slice(at, at += size(n, t, hd));
    return t === "f16"
      ? f16ToF32(new Uint16Array(b))
      : t === "q8"
      ? kvQ8Decode(new Uint32Array(b), hd!)
      : new Float32Array(b);
  });
}

/** Runs the kernel once on random data; returns what it wrote and what the references say. */
async function runCase(c: Case) {
  const g = gpu!;
  const { heads, kv, hd, pos } = c;
  const inv = ropeInvFreq(hd, 500000, {
    type: "llama3",
    factor: 32,
    lowFreqFactor: 1,
    highFreqFactor: 4,
    originalMaxPositionEmbeddings: 8192,
  });
  const M = c.maxSeq ?? MAX_SEQ;
  const table = ropeTable(inv, M);
  const row = (heads + 2 * kv) * hd;
  const seed = heads * 1000 + hd * 10 + pos;
  // Larger q spreads the scores, so the running max changes from chunk to chunk.
  const qkv0 = randoms(row, seed, 2);
  const cacheLen = kv * M * hd;
  const kc0 = asKv(c.kvType, randoms(cacheLen, seed + 1), hd);
  const vc0 = asKv(c.kvType, randoms(cacheLen, seed + 2), hd);
  const poison = new Float32Array(heads * hd).fill(-12345);
  const kcache = uploadKv(g, c.kvType, kc0, hd), vcache = uploadKv(g, c.kvType, vc0, hd);
  const out = upload(g, poison);
  const step = createStepBuffer(g);
  writeStep(g, step, { pos0: pos, T: c.T, tokOut: 0 });
  const wq = randoms(hd, seed + 3, 1), wk = randoms(hd, seed + 4, 1);
  const calls = attentionDecodeCalls(g, {
    step,
    table: upload(g, table),
    qkv: upload(g, qkv0),
    kcache,
    vcache,
    out,
    ...(c.norm ? { qNorm: upload(g, wq), kNorm: upload(g, wk) } : {}),
  }, {
    heads,
    kvHeads: kv,
    headDim: hd,
    maxSeq: M,
    kv: c.kvType,
    ...(c.norm ? { normEps: 1e-6 } : {}),
  }, c.tuning);
  const [gotOut, gotK, gotV] = await runAndRead(g, calls, [[out, heads * hd], [
    kcache,
    cacheLen,
    c.kvType,
    hd,
  ], [
    vcache,
    cacheLen,
    c.kvType,
    hd,
  ]]);
  const got = { out: gotOut, kc: gotK, vc: gotV };
  for (const c of calls) for (const b of [...c.buffers, ...c.owned ?? []]) b.destroy();
  // References: (normalised heads,) rotated q, caches with rope(k) and v at pos, attention over 0..pos.
  const qkv = c.norm ? headNormRef(qkv0, wq, wk, { heads, kvHeads: kv, headDim: hd, eps: 1e-6 }) : qkv0;
  const q = qkv.slice(0, heads * hd);
  for (let h = 0; h < heads; h++) ropeRef(q.subarray(h * hd, (h + 1) * hd), table, pos);
  const kc = kc0.slice(), vc = vc0.slice();
  const kRaw = kc0.slice(), vRaw = vc0.slice(); // the new rows unrounded (q8's quantisation step is per row)
  for (let h = 0; h < kv; h++) {
    const k = qkv.slice((heads + h) * hd, (heads + h + 1) * hd);
    const v = qkv.slice((heads + kv + h) * hd, (heads + kv + h + 1) * hd);
    ropeRef(k, table, pos);
    kc.set(asKv(c.kvType, k, hd), (h * M + pos) * hd);
    vc.set(asKv(c.kvType, v, hd), (h * M + pos) * hd);
    kRaw.set(k, (h * M + pos) * hd);
    vRaw.set(v, (h * M + pos) * hd);
  }
  // A q8 row may round a value one step away from the CPU's (the GPU's 1 / s may differ in the last bit): the
  // attention is checked against the cache the kernel wrote, the cache against the CPU's within a step.
  const [rk, rv] = c.kvType === "q8" ? [got.kc, got.vc] : [kc, vc];
  const want = attentionRef(q, rk, rv, { heads, kvHeads: kv, headDim: hd, maxSeq: M, T: 1, pos0: pos });
  return { got, want: { out: want, kc, vc }, kc0, vc0, poison, kRaw, vRaw };
}

Deno.test(
  { name: "decode attention: rope, KV write and attention match the references", ignore },
  async () => {
    for (const [heads, kv, hd] of SHAPES) {
      if (!attentionDecodeFits(gpu!, { heads, kvHeads: kv, headDim: hd, maxSeq: MAX_SEQ })) {
        throw new Error(`decode attention should fit heads ${heads} kv ${kv} hd ${hd}`);
      }
      for (const pos of POSITIONS) {
        const what = `h${heads} kv${kv} hd${hd} @${pos}`;
        const { got, want } = await runCase({ heads, kv, hd, pos, T: 1 });
        assertClose(got.out, want.out, 1e-5, 1e-4, `out ${what}`);
        for (let h = 0; h < kv; h++) {
          const at = (h * MAX_SEQ + pos) * hd;
          assertClose(
            got.kc.slice(at, at + hd),
            want.kc.slice(at, at + hd),
            1e-6,
            1e-5,
            `k cache ${what} kv${h}`,
          );
          assertClose(got.vc.slice(at, at + hd), want.vc.slice(at, at + hd), 0, 0, `v cache ${what} kv${h}`);
          // Everything else in the caches is untouched.
          for (const [name, a, b] of [["k", got.kc, want.kc], ["v", got.vc, want.vc]] as const) {
            assertClose(
              a.slice(h * MAX_SEQ * hd, at),
              b.slice(h * MAX_SEQ * hd, at),
              0,
              0,
              `${name} before ${what}`,
            );
            const end = (h + 1) * MAX_SEQ * hd;
            assertClose(a.slice(at + hd, end), b.slice(at + hd, end), 0, 0, `${name} after ${what}`);
          }
        }
      }
    }
  },
);

Deno.test(
  { name: "decode attention: other workgroup shapes, unrolls and scoring match the reference", ignore },
  async () => {
    const tunings = [
      { warps: 1 },
      { warps: 3, unroll: 3, butterfly: false },
      { unroll: 5 },
    ];
    for (const [heads, kv, hd] of [[3, 1, 40], [4, 4, 128], [2, 1, 16]]) {
      for (const tuning of tunings) {
        for (const pos of [65, 300]) {
          const what = `h${heads} kv${kv} hd${hd} @${pos} ${JSON.stringify(tuning)}`;
          const { got, want } = await runCase({ heads, kv, hd, pos, T: 1, tuning });
          assertClose(got.out, want.out, 1e-5, 1e-4, `out ${what}`);
          assertClose(got.kc, want.kc, 1e-6, 1e-5, `k cache ${what}`);
          assertClose(got.vc, want.vc, 0, 0, `v cache ${what}`);
        }
      }
    }
  },
);

Deno.test(
  { name: "flash-decoding: attention split over the keys and combined matches the reference", ignore },
  async () => {
    // Splits that divide the chunks, that do not, that leave later splits without keys (short positions),
    // and more splits than chunks; position 0 has only the current key.
    const tunings = [
      { splits: 2, minChunks: 1 },
      { splits: 5, minChunks: 1 },
      { splits: 3 },
      { splits: 16, minChunks: 1, warps: 2 },
    ];
    for (const [heads, kv, hd] of [[32, 8, 64], [3, 1, 40], [2, 1, 6], [4, 4, 128]]) {
      for (const tuning of tunings) {
        for (const pos of [0, 1, 31, 65, 300, 319]) {
          const what = `h${heads} kv${kv} hd${hd} @${pos} ${JSON.stringify(tuning)}`;
          const { got, want } = await runCase({ heads, kv, hd, pos, T: 1, tuning });
          assertClose(got.out, want.out, 1e-5, 1e-4, `out ${what}`);
          assertClose(got.kc, want.kc, 1e-6, 1e-5, `k cache ${what}`);
          assertClose(got.vc, want.vc, 0, 0, `v cache ${what}`);
        }
      }
    }
    // The combine loading each slot after the splits' weights (the default loads them beside the weights').
    gpu!.tuning.attentionCombineEarly = false;
    try {
      for (const [heads, kv, hd] of [[32, 8, 64], [3, 1, 40]]) {
        const what = `h${heads} kv${kv} hd${hd} @300, the combine's slots loaded late`;
        const { got, want } = await runCase({
          heads,
          kv,
          hd,
          pos: 300,
          T: 1,
          tuning: { splits: 5, minChunks: 1 },
        });
        assertClose(got.out, want.out, 1e-5, 1e-4, `out ${what}`);
      }
    } finally {
      delete gpu!.tuning.attentionCombineEarly;
    }
  },
);

Deno.test(
  { name: "decode attention with q_norm / k_norm folded in matches head_norm then attention", ignore },
  async () => {
    const tunings: Partial<AttentionDecodeTuning>[] = [{}, { warps: 3, unroll: 3 }, {
      splits: 3,
      minChunks: 1,
    }];
    for (const [heads, kv, hd] of [[4, 2, 128], [3, 1, 40], [2, 1, 6], [2, 1, 256]]) {
      for (const tuning of tunings) {
        for (const pos of [0, 65]) {
          const what = `norm h${heads} kv${kv} hd${hd} @${pos} ${JSON.stringify(tuning)}`;
          const { got, want } = await runCase({ heads, kv, hd, pos, T: 1, tuning, norm: true });
          assertClose(got.out, want.out, 1e-5, 1e-4, `out ${what}`);
          assertClose(got.kc, want.kc, 1e-5, 1e-4, `k cache ${what}`);
          assertClose(got.vc, want.vc, 0, 0, `v cache ${what}`);
        }
      }
    }
  },
);

Deno.test(
  {
    name: "f16 KV cache: decode attention (unsplit, split, q/k norm, > 1024 positions) matches",
    ignore: ignore || !gpu?.hasF16,
  },
  async () => {
    // The references read the same f16-rounded cache and round the new k / v as the kernel stores them;
    // tolerances allow a rounding step either way (WGSL does not pin f32 -> f16 rounding).
    const cases: Case[] = [];
    for (const [heads, kv, hd] of [[32, 8, 64], [3, 1, 40], [2, 1, 6], [4, 4, 128]]) {
      for (const tuning of [{ splits: 1 }, { splits: 3, minChunks: 1 }]) {
        for (const pos of [0, 65, 300]) cases.push({ heads, kv, hd, pos, T: 1, tuning });
      }
      cases.push({ heads, kv, hd, pos: 65, T: 1, norm: true, tuning: { splits: 2, minChunks: 1 } });
    }
    // A cache of > 1024 positions takes the default flash-decoding splits.
    for (const [heads, kv, hd] of [[32, 8, 64], [4, 2, 128]]) {
      cases.push({ heads, kv, hd, pos: 1400, T: 1, maxSeq: 1536 }, {
        heads,
        kv,
        hd,
        pos: 1535,
        T: 1,
        maxSeq: 1536,
      });
    }
    for (const c of cases) {
      const what = `f16 h${c.heads} kv${c.kv} hd${c.hd} @${c.pos} ${JSON.stringify(c.tuning ?? {})} norm ${!!c
        .norm}`;
      const { got, want, kc0 } = await runCase({ ...c, kvType: "f16" });
      assertClose(got.out, want.out, 2e-3, 2e-3, `out ${what}`);
      assertClose(got.kc, want.kc, 1e-4, 2e-3, `k cache ${what}`);
      assertClose(got.vc, want.vc, 1e-4, 2e-3, `v cache ${what}`);
      // Only position pos was written.
      const M = c.maxSeq ?? MAX_SEQ;
      for (let h = 0; h < c.kv; h++) {
        const at = (h * M + c.pos) * c.hd;
        assertClose(got.kc.slice(h * M * c.hd, at), kc0.slice(h * M * c.hd, at), 0, 0, `k before ${what}`);
      }
    }
  },
);

Deno.test(
  {
    name: "q8 KV cache: decode attention (per head and grouped, split, q/k norm, > 1024 positions) matches",
    ignore: ignore || !gpu?.hasDp4,
  },
  async () => {
    // The cache the kernel wrote against the CPU's quantisation (a step either way), the output against
    // attention over that cache; positions before pos left as they were (their words and scales).
    const cases: Case[] = [];
    for (const [heads, kv, hd] of [[32, 8, 64], [3, 1, 40], [4, 4, 128], [6, 2, 12]]) {
      for (const grouped of [false, true]) {
        for (const tuning of [{ splits: 1 }, { splits: 3, minChunks: 1 }]) {
          for (const pos of [0, 65, 300]) {
            cases.push({ heads, kv, hd, pos, T: 1, tuning: { ...tuning, grouped } });
          }
        }
        cases.push({
          heads,
          kv,
          hd,
          pos: 65,
          T: 1,
          norm: true,
          tuning: { splits: 2, minChunks: 1, grouped },
        });
      }
    }
    for (const [heads, kv, hd] of [[32, 8, 64], [4, 2, 128]]) {
      cases.push({ heads, kv, hd, pos: 1400, T: 1, maxSeq: 1536 });
      // Lane per key (no butterfly): the lane that scores a key holds its scales.
      for (const grouped of [false, true]) {
        cases.push({ heads, kv, hd, pos: 300, T: 1, tuning: { butterfly: false, grouped } });
      }
    }
    for (const c of cases) {
      const what = `q8 h${c.heads} kv${c.kv} hd${c.hd} @${c.pos} ${JSON.stringify(c.tuning ?? {})} norm ${!!c
        .norm}`;
      const { got, want, kc0, vc0, kRaw, vRaw } = await runCase({ ...c, kvType: "q8" });
      assertClose(got.out, want.out, 1e-4, 1e-3, `out ${what}`);
      assertQ8Rows(got.kc, want.kc, kRaw, c.hd, `k cache ${what}`);
      assertQ8Rows(got.vc, want.vc, vRaw, c.hd, `v cache ${what}`);
      const M = c.maxSeq ?? MAX_SEQ;
      for (let h = 0; h < c.kv; h++) {
        const at = (h * M + c.pos) * c.hd;
        assertClose(got.kc.slice(h * M * c.hd, at), kc0.slice(h * M * c.hd, at), 0, 0, `k before ${what}`);
        assertClose(got.vc.slice(h * M * c.hd, at), vc0.slice(h * M * c.hd, at), 0, 0, `v before ${what}`);
      }
    }
  },
);

Deno.test(
  { name: "grouped decode attention (one workgroup per kv head) matches the references", ignore },
  async () => {
    // Groups 1, 2, 3, 4, 8 and 16; head_dim 64, 128, 256, 40, 16, 32 (rows of 4 and 8 lanes: the coalesced
    // scores' packed rows, as head_dim 64 / 128 at 32 lanes) and the vec2 2, 6 and 12; split or not, warps
    // from 1 up, f16 cache, q/k norm. Each case's k / v caches and output against the references. Few
    // shaders a shape: lavapipe compiles each for seconds on a cold shader cache.
    const cases: Case[] = [];
    const shapes = [
      [32, 8, 64],
      [3, 1, 40],
      [4, 4, 128],
      [1, 1, 2],
      [2, 1, 6],
      [6, 2, 12],
      [2, 1, 256],
      [
        8,
        1,
        128,
      ],
      [16, 1, 64],
      [8, 2, 16],
      [4, 1, 32],
    ];
    for (const [heads, kv, hd] of shapes) {
      for (const pos of [0, 1, 65, 300]) cases.push({ heads, kv, hd, pos, T: 1, tuning: { grouped: true } });
      const split = { grouped: true, splits: 5, minChunks: 1 };
      cases.push({ heads, kv, hd, pos: 319, T: 1, norm: true, tuning: split });
      cases.push({ heads, kv, hd, pos: 300, T: 1, norm: true, tuning: split });
      if (gpu?.hasF16) {
        cases.push({ heads, kv, hd, pos: 300, T: 1, kvType: "f16", tuning: { grouped: true } });
      }
    }
    // Heads per pass over the keys: the whole group in one, or 3 passes of 2 (group 6).
    for (const [heads, kv, hd, groupBatch] of [[32, 8, 64, 4], [8, 2, 16, 4], [6, 1, 32, 2]]) {
      cases.push({ heads, kv, hd, pos: 300, T: 1, tuning: { grouped: true, groupBatch } });
    }
    for (const [heads, kv, hd] of [[32, 8, 64], [4, 1, 128]]) {
      cases.push({ heads, kv, hd, pos: 1400, T: 1, maxSeq: 1536, tuning: { grouped: true } });
      cases.push({
        heads,
        kv,
        hd,
        pos: 300,
        T: 1,
        norm: true,
        tuning: { grouped: true, warps: 1, unroll: 3 },
      });
    }
    for (const c of cases) {
      const what = `grouped h${c.heads} kv${c.kv} hd${c.hd} @${c.pos} ${JSON.stringify(c.tuning)} norm ${!!c
        .norm} ${c.kvType ?? "f32"}`;
      const { got, want } = await runCase(c);
      const f16 = c.kvType === "f16";
      assertClose(got.out, want.out, f16 ? 2e-3 : 1e-5, f16 ? 2e-3 : 1e-4, `out ${what}`);
      assertClose(got.kc, want.kc, f16 ? 1e-4 : 1e-5, f16 ? 2e-3 : 1e-4, `k cache ${what}`);
      assertClose(got.vc, want.vc, f16 ? 1e-4 : 0, f16 ? 2e-3 : 0, `v cache ${what}`);
    }
  },
);

Deno.test({ name: "decode attention does nothing when the step has no tokens", ignore }, async () => {
  for (const [heads, kv, hd] of [[32, 8, 64], [3, 1, 40]]) {
    const { got: one } = await runCase({ heads, kv, hd, pos: 5, T: 0, tuning: { splits: 3, minChunks: 1 } });
    const { got: gr } = await runCase({ heads, kv, hd, pos: 5, T: 0, tuning: { grouped: true } });
    const { got, kc0, vc0, poison } = await runCase({ heads, kv, hd, pos: 5, T: 0 });
    assertClose(one.out, poison, 0, 0, `split out h${heads} hd${hd}`);
    assertClose(gr.out, poison, 0, 0, `grouped out h${heads} hd${hd}`);
    assertClose(gr.kc, kc0, 0, 0, `grouped k cache h${heads} hd${hd}`);
    assertClose(gr.vc, vc0, 0, 0, `grouped v cache h${heads} hd${hd}`);
    assertClose(got.out, poison, 0, 0, `out h${heads} hd${hd}`);
    assertClose(got.kc, kc0, 0, 0, `k cache h${heads} hd${hd}`);
    assertClose(got.vc, vc0, 0, 0, `v cache h${heads} hd${hd}`);
  }
});

Deno.test({ name: "decode attention refuses a device without subgroups", ignore: gpu === null }, () => {
  const g = { ...gpu!, subgroupSize: null };
  const d = { heads: 4, kvHeads: 2, headDim: 64, maxSeq: 8 };
  if (attentionDecodeFits(g, d)) throw new Error("fits without subgroups");
  let threw = false;
  try {
    attentionDecodeCall(g, {
      step: createStepBuffer(g),
      table: upload(g, new Float32Array(4)),
      qkv: upload(g, new Float32Array(4)),
      kcache: upload(g, new Float32Array(4)),
      vcache: upload(g, new Float32Array(4)),
      out: upload(g, new Float32Array(4)),
    }, d);
  } catch (e) {
    threw = e instanceof RangeError;
  }
  if (!threw) throw new Error("expected a RangeError");
});

Deno.test(
  { name: "decode attention of several tokens: causal among them, with and without splits", ignore },
  async () => {
    const g = gpu!;
    const inv = ropeInvFreq(64, 10000, null);
    for (
      const [heads, kv, hd, kvType] of [
        [4, 2, 64, "f32"],
        [3, 1, 40, "f32"],
        [2, 1, 6, "f32"],
        [
          4,
          2,
          64,
          "f16",
        ],
        [2, 1, 6, "f16"],
        [4, 1, 128, "f32"],
        [6, 2, 12, "f32"],
        [4, 2, 64, "q8"],
        [6, 2, 12, "q8"],
      ] as [number, number, number, KvType][]
    ) {
      if (kvType === "f16" && !g.hasF16) continue;
      if (kvType === "q8" && !g.hasDp4) continue;
      const invHd = hd === 64 ? inv : ropeInvFreq(hd, 10000, null);
      const table = ropeTable(invHd, MAX_SEQ);
      const row = (heads + 2 * kv) * hd;
      for (
        const [T, steps, pos0, tuning] of [
          [2, 2, 0, {}],
          [3, 3, 64, { splits: 3, minChunks: 1 }],
          [16, 16, 300, {}],
          [5, 5, 33, { splits: 2, minChunks: 1, warps: 2 }], // 2 subgroups: each scores several own keys
          [8, 3, 100, { splits: 4, minChunks: 1 }], // 8 dispatched, the step has 3: tokens 3.. write nothing
        ] as [number, number, number, Partial<AttentionDecodeTuning>][]
      ) {
        // Each step shape per-head and grouped (one workgroup per kv head; the new shapes grouped only, to
        // keep lavapipe's cold shader compiles few).
        const modes = hd === 128 || hd === 12
          ? [true]
          : kvType !== "f32" || hd === 6
          ? [false, true]
          : [false];
        for (const grouped of modes) {
          // Some with Qwen3's q_norm / k_norm folded in (the other tokens' keys normalised on the fly).
          const norm = T % 2 === 1 || T === 16;
          const what = `${kvType} h${heads} kv${kv} hd${hd} T${T}/${steps} @${pos0} ${
            JSON.stringify(tuning)
          } norm ${norm} grouped ${grouped}`;
          const seed = heads * 7 + hd + T + pos0;
          const raw = randoms(T * row, seed, 2);
          const wq = randoms(hd, seed + 3, 1), wk = randoms(hd, seed + 4, 1);
          const qkv0 = norm ? headNormRef(raw, wq, wk, { heads, kvHeads: kv, headDim: hd, eps: 1e-6 }) : raw;
          const cacheLen = kv * MAX_SEQ * hd;
          const kc0 = asKv(kvType, randoms(cacheLen, seed + 1), hd),
            vc0 = asKv(kvType, randoms(cacheLen, seed + 2), hd);
          const poison = new Float32Array(T * heads * hd).fill(-12345);
          const kcache = uploadKv(g, kvType, kc0, hd), vcache = uploadKv(g, kvType, vc0, hd);
          const out = upload(g, poison);
          const step = createStepBuffer(g);
          writeStep(g, step, { pos0, T: steps, tokOut: 0 });
          const calls = attentionDecodeCalls(
            g,
            {
              step,
              table: upload(g, table),
              qkv: upload(g, raw),
              kcache,
              vcache,
              out,
              ...(norm ? { qNorm: upload(g, wq), kNorm: upload(g, wk) } : {}),
            },
            {
              heads,
              kvHeads: kv,
              headDim: hd,
              maxSeq: MAX_SEQ,
              T,
              kv: kvType,
              ...(norm ? { normEps: 1e-6 } : {}),
            },
            { ...tuning, grouped },
          );
          const [gotOut, gotK, gotV] = await runAndRead(g, calls, [[out, T * heads * hd], [
            kcache,
            cacheLen,
            kvType,
            hd,
          ], [
            vcache,
            cacheLen,
            kvType,
            hd,
          ]]);
          const q = new Float32Array(steps * heads * hd);
          const kc = kc0.slice(), vc = vc0.slice();
          const kRaw = kc0.slice(), vRaw = vc0.slice();
          for (let t = 0; t < steps; t++) {
            const r = qkv0.subarray(t * row, (t + 1) * row);
            for (let h = 0; h < heads; h++) {
              const qh = r.slice(h * hd, (h + 1) * hd);
              ropeRef(qh, table, pos0 + t);
              q.set(qh, (t * heads + h) * hd);
            }
            for (let h = 0; h < kv; h++) {
              const k = r.slice((heads + h) * hd, (heads + h + 1) * hd);
              const v = r.slice((heads + kv + h) * hd, (heads + kv + h + 1) * hd);
              ropeRef(k, table, pos0 + t);
              kc.set(asKv(kvType, k, hd), (h * MAX_SEQ + pos0 + t) * hd);
              vc.set(asKv(kvType, v, hd), (h * MAX_SEQ + pos0 + t) * hd);
              kRaw.set(k, (h * MAX_SEQ + pos0 + t) * hd);
              vRaw.set(v, (h * MAX_SEQ + pos0 + t) * hd);
            }
          }
          // q8: against the cache the kernel wrote (a value may round a step off the CPU's; runCase).
          const q8 = kvType === "q8";
          const want = attentionRef(q, q8 ? gotK : kc, q8 ? gotV : vc, {
            heads,
            kvHeads: kv,
            headDim: hd,
            maxSeq: MAX_SEQ,
            T: steps,
            pos0,
          });
          const f16 = kvType !== "f32";
          assertClose(
            gotOut.slice(0, steps * heads * hd),
            want,
            f16 ? 2e-3 : 1e-5,
            f16 ? 2e-3 : 1e-4,
            `out ${what}`,
          );
          assertClose(
            gotOut.slice(steps * heads * hd),
            poison.slice(steps * heads * hd),
            0,
            0,
            `unused ${what}`,
          );
          if (q8) {
            assertQ8Rows(gotK, kc, kRaw, hd, `k cache ${what}`);
            assertQ8Rows(gotV, vc, vRaw, hd, `v cache ${what}`);
          } else {
            assertClose(
              gotK,
              kc,
              f16 ? 1e-4 : norm ? 1e-5 : 1e-6,
              f16 ? 2e-3 : norm ? 1e-4 : 1e-5,
              `k cache ${what}`,
            );
            assertClose(gotV, vc, f16 ? 1e-4 : 0, f16 ? 2e-3 : 0, `v cache ${what}`);
          }
          for (const c of calls) for (const b of [...c.buffers, ...c.owned ?? []]) b.destroy();
        }
      }
    }
  },
);

Deno.test(
  {
    name: "decode attention writes the int8 copy of its output (copyOut) the o_proj input pass would make",
    ignore: ignore || !gpu?.hasDp4,
  },
  async () => {
    // Per-head and grouped kernels, with and without splits (then the combine writes it), 1 or 3 tokens:
    // the copy must be the input pass's (gemvInt8InputCall on `out`), bit for bit.
    const g = gpu!;
    let k = 0;
    for (const [heads, kv, hd] of [[4, 2, 64], [8, 2, 128], [2, 1, 32]]) {
      for (
        const tuning of [{ splits: 1 }, { splits: 3 }, { grouped: true, splits: 1 }, {
          grouped: true,
          splits: 2,
        }]
      ) {
        // One case a (shape, tuning): weights and 1 / 3 tokens cycling through their four pairs.
        for (const T of [1 + 2 * (Math.floor(k / 2) % 2)]) {
          const wt = (["q8", "q4"] as const)[k++ % 2];
          const M = 96, pos = 70;
          const K = heads * hd;
          const row = (heads + 2 * kv) * hd;
          const step = createStepBuffer(g);
          writeStep(g, step, { pos0: pos, T, tokOut: 0 });
          const table = ropeTable(ropeInvFreq(hd, 10000, null), M);
          const out = upload(g, new Float32Array(T * K));
          const copy = {
            q: upload(g, new Uint32Array(T * K / 4)),
            s: upload(g, new Float32Array(T * K / 16)),
            weights: wt,
          };
          const calls = attentionDecodeCalls(
            g,
            {
              step,
              table: upload(g, table),
              qkv: upload(g, randoms(T * row, k, 2)),
              kcache: upload(g, randoms(kv * M * hd, k + 1)),
              vcache: upload(g, randoms(kv * M * hd, k + 2)),
              out,
              copyOut: copy,
            },
            { heads, kvHeads: kv, headDim: hd, maxSeq: M, T },
            tuning,
          );
          const pass = gemvInt8InputCall(g, { x: out }, { K, T, wt, transform: "none", normWeights: "f32" });
          await runAndRead(g, [...calls, pass.call], []);
          const what = `copyOut ${wt} heads ${heads}/${kv} hd ${hd} T${T} ${JSON.stringify(tuning)}`;
          const [o] = await runAndRead(g, [], [[out, T * K]]);
          if (!o.every(Number.isFinite) || o.every((v) => v === 0)) {
            throw new Error(`${what}: out is not finite and nonzero`);
          }
          await assertSameInt8Copy(g, copy, { q: pass.xq, s: pass.xqs }, T * K, what);
        }
      }
    }
  },
);

// The cache-length buckets a sequence's decode programs are built for (a pure function, no GPU): the first
// 1,024 keys without splits, up to 4,096 with per-head splits, and past it the cache's capacity (undefined);
// a bucket the cache cannot exceed is the capacity's program (undefined), so it is built once.
Deno.test("attention length bucket: nested bounds below the cache's capacity", () => {
  const cases: [maxSeq: number, keys: number | undefined, bucket: number | undefined][] = [
    [8192, undefined, undefined],
    [8192, 1, ATTENTION_SPLIT_KEYS],
    [8192, 1024, ATTENTION_SPLIT_KEYS],
    [8192, 1025, ATTENTION_LONG_KEYS],
    [8192, 4096, ATTENTION_LONG_KEYS],
    [8192, 4097, undefined],
    [1024, 10, undefined],
    [1025, 10, ATTENTION_SPLIT_KEYS],
    [1025, 1025, undefined],
    [4096, 2000, undefined],
    [4097, 2000, ATTENTION_LONG_KEYS],
  ];
  for (const [maxSeq, keys, bucket] of cases) {
    assert.deepEqual(attentionLengthBucket(maxSeq, keys), bucket, `maxSeq ${maxSeq}, keys ${keys}`);
  }
  // The kernel's choices follow the bound, capped by the capacity.
  assert.deepEqual(attendedKeys({ maxSeq: 8192 }), 8192);
  assert.deepEqual(attendedKeys({ maxSeq: 8192, keys: 1024 }), 1024);
  assert.deepEqual(attendedKeys({ maxSeq: 512, keys: 1024 }), 512);
  assert.deepEqual([attentionDecodeSplits(32, 1024), attentionDecodeSplits(32, 1025)], [1, 16]);
  const d = { heads: 32, kvHeads: 4, headDim: 128, maxSeq: 8192 };
  assert.deepEqual(
    [attentionGroupedDefault(d), attentionGroupedDefault({ ...d, keys: ATTENTION_LONG_KEYS })],
    [
      true,
      false,
    ],
  );
});
