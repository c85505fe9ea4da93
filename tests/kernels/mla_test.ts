// Multi-head latent attention (kernels/mla.ts, kernels/mla_attention.ts):
//   - the un-absorbed CPU reference (mlaReference) against DeepseekV3Attention as transformers 5.17 runs it
//     (tests/fixtures/mla/mla_reference.json: interleaved and rotate-half rope, q_proj and q low-rank, yarn with
//     mscale != mscale_all_dim, no scaling), and the absorbed formulation on the CPU against the same;
//   - the GPU kernels (rope + cache write, absorption, latent attention, value projection) against
//     mlaReference on random weights: heads 1..8, odd and even ranks, positions 0..300, decode (T = 1) and
//     prefill chunks, f32 and f16 weights, several head groupings and key splits; a decode sequence that
//     reads only what the kernels wrote; the cache rows themselves; nothing done when step.T = 0.
// GPU tests skip, saying so, without an adapter.
import {
  createStepBuffer,
  encodeCalls,
  type Gpu,
  type KernelCall,
  type KvType,
  MLA_SHORT_KEYS,
  mlaAbsorbCall,
  mlaAbsorbRef,
  mlaAttentionCalls,
  mlaAttentionDefaultTuning,
  mlaAttentionSplits,
  type MlaAttentionTuning,
  mlaCombineValueCall,
  mlaDecodeCall,
  mlaDecodeFits,
  type MlaDims,
  mlaFusedKeys,
  mlaKvBytesPerToken,
  mlaLatentAttentionRef,
  mlaLengthBucket,
  mlaReference,
  mlaRopeAbsorbCall,
  mlaRopeCacheCall,
  mlaRopeRef,
  mlaSoftmaxScale,
  mlaSplitKvB,
  mlaSubgroupFits,
  mlaValueCall,
  mlaValueRef,
  releaseCalls,
  ropeAttentionFactor,
  ropeInvFreq,
  ropeTable,
  storageBuffer,
  writeStep,
  type YarnRopeScaling,
} from "../../kernels/mod.ts";
import assert from "node:assert/strict";
import { f16ToF32, f32ToF16 } from "../../models/dtype.ts";
import { assertClose, gpuOrSkip, randoms, upload } from "./harness.ts";

const gpu = await gpuOrSkip();
const ignore = gpu === null;

interface AttentionCase {
  config: {
    heads: number;
    kv_lora_rank: number;
    qk_nope_head_dim: number;
    qk_rope_head_dim: number;
    v_head_dim: number;
    rope_theta: number;
    rope_scaling: Record<string, number | string> | null;
    rope_interleave: boolean;
    eps: number;
  };
  T: number;
  scaling: number;
  q: number[];
  kv: number[];
  kv_a_layernorm: number[];
  kv_b_proj: number[];
  out: number[];
}

const ref = JSON.parse(
  await Deno.readTextFile(new URL("../fixtures/mla/mla_reference.json", import.meta.url)),
);

function yarnOf(rs: Record<string, number | string> | null): YarnRopeScaling | null {
  if (!rs) return null;
  return {
    type: "yarn",
    factor: rs.factor as number,
    originalMaxPositionEmbeddings: rs.original_max_position_embeddings as number,
    betaFast: rs.beta_fast as number | undefined,
    betaSlow: rs.beta_slow as number | undefined,
    mscale: rs.mscale as number | undefined,
    mscaleAllDim: rs.mscale_all_dim as number | undefined,
  };
}

/** The latent cache rows [rmsnorm(c) * w, rope(k)] (the kernels' layout) for positions 0..n-1. */
function latentRows(
  kv: Float32Array,
  norm: Float32Array,
  table: Float32Array,
  d: { R: number; DR: number; n: number; eps: number; interleaved: boolean },
): Float32Array {
  const CW = d.R + d.DR;
  const out = new Float32Array(d.n * CW);
  for (let s = 0; s < d.n; s++) {
    let ss = 0;
    for (let i = 0; i < d.R; i++) ss += kv[s * CW + i] ** 2;
    const inv = 1 / Math.sqrt(ss / d.R + d.eps);
    for (let i = 0; i < d.R; i++) out[s * CW + i] = kv[s * CW + i] * inv * norm[i];
    const k = kv.slice(s * CW + d.R, (s + 1) * CW);
    mlaRopeRef(k, table, { pos: s, interleaved: d.interleaved });
    out.set(k, s * CW + d.R);
  }
  return out;
}

/** Values as an f16 cache holds them (rounded to f16, widened back). */
const asF16 = (a: Float32Array) => f16ToF32(f32ToF16(a));

/**
 * The absorbed formulation on the CPU for tokens pos0..pos0+T-1 (p.q their rows), over latent rows read back
 * as a cache of `kv` elements holds them: the reference for a latent cache of f16 values. `held`: the rows
 * as the kernels wrote them (the GPU rounds its f32 row to f16, the CPU its f64 one, so a value on a
 * rounding tie may land one f16 step apart: the written rows are checked on their own, within that step).
 */
function latentReference(
  p: {
    q: Float32Array;
    kv: Float32Array;
    kvNorm: Float32Array;
    table: Float32Array;
    eps: number;
    scale: number;
  },
  kvB: Float32Array,
  d: MlaDims,
  o: { pos0: number; interleaved: boolean; kv: KvType; held?: Float32Array },
): Float32Array {
  const { heads: NH, kvLoraRank: R, qkNopeHeadDim: DN, qkRopeHeadDim: DR, T } = d;
  const { wUK, wUV } = mlaSplitKvB(kvB, d);
  const q = p.q.slice(0, T * NH * (DN + DR));
  for (let t = 0; t < T; t++) {
    for (let h = 0; h < NH; h++) {
      const b = (t * NH + h) * (DN + DR) + DN;
      mlaRopeRef(q.subarray(b, b + DR), p.table, { pos: o.pos0 + t, interleaved: o.interleaved });
    }
  }
  const n = o.pos0 + T;
  const rows = o.held?.slice(0, n * (R + DR)) ??
    latentRows(p.kv, p.kvNorm, p.table, { R, DR, n, eps: p.eps, interleaved: o.interleaved });
  const cache = o.kv === "f16" ? asF16(rows) : rows;
  const ctx = mlaLatentAttentionRef({ q, qLatent: mlaAbsorbRef(q, wUK, d), cache }, {
    ...d,
    scale: p.scale,
    pos0: o.pos0,
  });
  return mlaValueRef(ctx, wUV, d);
}

Deno.test("MLA reference matches transformers' DeepseekV3Attention (un-absorbed and absorbed)", () => {
  for (const [name, c] of Object.entries(ref.attention as Record<string, AttentionCase>)) {
    const k = c.config;
    const scaling = yarnOf(k.rope_scaling);
    const R = k.kv_lora_rank, DN = k.qk_nope_head_dim, DR = k.qk_rope_head_dim, DV = k.v_head_dim;
    const scale = mlaSoftmaxScale(DN + DR, scaling);
    if (Math.abs(scale - c.scaling) > 1e-12) {
      throw new Error(`${name}: scale ${scale}, transformers ${c.scaling}`);
    }
    const inv = ropeInvFreq(DR, k.rope_theta, scaling);
    const table = ropeTable(inv, c.T, { attentionFactor: ropeAttentionFactor(scaling) });
    const d = {
      heads: k.heads,
      kvLoraRank: R,
      qkNopeHeadDim: DN,
      qkRopeHeadDim: DR,
      vHeadDim: DV,
      T: c.T,
      maxSeq: c.T,
      pos0: 0,
      eps: k.eps,
      interleaved: k.rope_interleave,
      scale,
    };
    const x = {
      q: Float32Array.from(c.q),
      kv: Float32Array.from(c.kv),
      kvNorm: Float32Array.from(c.kv_a_layernorm),
      kvB: Float32Array.from(c.kv_b_proj),
      table,
    };
    const want = Float32Array.from(c.out);
    // Inputs were rounded to f32 from transformers' f64: 1e-6 relative is that rounding, carried through.
    assertClose(mlaReference(x, d), want, 1e-6, 1e-5, `un-absorbed ${name}`);
    // The absorbed formulation on the CPU, in the kernels' layouts.
    const { wUK, wUV } = mlaSplitKvB(x.kvB, d);
    const q = x.q.slice();
    for (let t = 0; t < c.T; t++) {
      for (let h = 0; h < k.heads; h++) {
        const b = (t * k.heads + h) * (DN + DR) + DN;
        mlaRopeRef(q.subarray(b, b + DR), table, { pos: t, interleaved: k.rope_interleave });
      }
    }
    const cache = latentRows(x.kv, x.kvNorm, table, {
      R,
      DR,
      n: c.T,
      eps: k.eps,
      interleaved: k.rope_interleave,
    });
    const ctx = mlaLatentAttentionRef({ q, qLatent: mlaAbsorbRef(q, wUK, d), cache }, d);
    assertClose(mlaValueRef(ctx, wUV, d), want, 1e-6, 1e-5, `absorbed ${name}`);
  }
});

Deno.test("mlaSoftmaxScale is DeepseekV3Attention.scaling for every yarn setting", () => {
  const yarn = ref.yarn as Record<
    string,
    { rope_scaling: Record<string, number | string>; head_dim: number; scaling: number }
  >;
  for (const [name, c] of Object.entries(yarn)) {
    const rs = c.rope_scaling;
    // Those attention modules have qk_nope_head_dim 4.
    const scale = mlaSoftmaxScale(4 + c.head_dim, {
      ...yarnOf(rs)!,
      attentionFactor: rs.attention_factor as number,
    });
    if (Math.abs(scale - c.scaling) > 1e-12) {
      throw new Error(`${name}: scale ${scale}, transformers ${c.scaling}`);
    }
  }
  if (mlaSoftmaxScale(24, null) !== 24 ** -0.5) throw new Error("no scaling: qk_head_dim^-0.5");
});

Deno.test("MLA bytes per token: the latent row against expanded K and V", () => {
  // kimi-k2-tiny: 4 heads, R 32, nope 16, rope 8, v 16.
  const tiny = mlaKvBytesPerToken({
    heads: 4,
    kvLoraRank: 32,
    qkNopeHeadDim: 16,
    qkRopeHeadDim: 8,
    vHeadDim: 16,
  });
  if (tiny.latent !== 160 || tiny.expanded !== 640) throw new Error(`kimi-k2-tiny: ${JSON.stringify(tiny)}`);
  // DeepSeek-V3: 128 heads, R 512, nope 128, rope 64, v 128, f16 values.
  const v3 = mlaKvBytesPerToken({
    heads: 128,
    kvLoraRank: 512,
    qkNopeHeadDim: 128,
    qkRopeHeadDim: 64,
    vHeadDim: 128,
  }, 2);
  if (v3.latent !== 1152 || v3.expanded !== 81920) throw new Error(`DeepSeek-V3: ${JSON.stringify(v3)}`);
});

Deno.test("mlaSplitKvB lays out W_UK transposed and W_UV as stored, and refuses a wrong size", () => {
  const d = { heads: 2, kvLoraRank: 3, qkNopeHeadDim: 2, vHeadDim: 1 };
  // Row-major [heads * (dn + dv), R] with value 100 * row + col.
  const kvB = Float32Array.from({ length: 6 * 3 }, (_, i) => 100 * Math.floor(i / 3) + (i % 3));
  const { wUK, wUV } = mlaSplitKvB(kvB, d);
  // wUK[h, r, j] = kvB[h * 3 + j, r]; wUV[h, 0, r] = kvB[h * 3 + 2, r].
  assertClose(wUK, Float32Array.from([0, 100, 1, 101, 2, 102, 300, 400, 301, 401, 302, 402]), 0, 0, "wUK");
  assertClose(wUV, Float32Array.from([200, 201, 202, 500, 501, 502]), 0, 0, "wUV");
  let threw = false;
  try {
    mlaSplitKvB(new Float32Array(5), d);
  } catch (e) {
    threw = e instanceof RangeError && e.message.includes("kv_b_proj");
  }
  if (!threw) throw new Error("expected a RangeError naming kv_b_proj");
});

// ---- GPU ----

interface Shape {
  heads: number;
  R: number;
  DN: number;
  DR: number;
  DV: number;
}

const SCALING: YarnRopeScaling = {
  type: "yarn",
  factor: 32,
  originalMaxPositionEmbeddings: 64,
  betaFast: 4,
  betaSlow: 1,
  mscale: 0.9,
  mscaleAllDim: 1,
};

/** The kernels' dims of a shape for steps of T tokens. */
const dimsOf = (s: Shape, T: number): MlaDims => ({
  heads: s.heads,
  kvLoraRank: s.R,
  qkNopeHeadDim: s.DN,
  qkRopeHeadDim: s.DR,
  vHeadDim: s.DV,
  maxSeq: 1024,
  T,
});

/** Random inputs for positions 0..pos0+T-1 and the reference output for tokens pos0..pos0+T-1. */
function problem(s: Shape, pos0: number, T: number, maxSeq: number, interleaved: boolean, seed: number) {
  const { heads, R, DN, DR, DV } = s;
  const n = pos0 + T;
  const kvB = randoms(heads * (DN + DV) * R, seed, 2 / Math.sqrt(R));
  const d: MlaDims = { heads, kvLoraRank: R, qkNopeHeadDim: DN, qkRopeHeadDim: DR, vHeadDim: DV, maxSeq, T };
  const table = ropeTable(ropeInvFreq(DR, 10000, SCALING), maxSeq, {
    attentionFactor: ropeAttentionFactor(SCALING),
  });
  return {
    d,
    q: randoms(T * heads * (DN + DR), seed + 1, 1.5),
    kv: randoms(n * (R + DR), seed + 2, 1.5),
    kvNorm: randoms(R, seed + 3, 0.4).map((v) => 1 + v),
    kvB,
    table,
    eps: 1e-6,
    interleaved,
    scale: mlaSoftmaxScale(DN + DR, SCALING),
  };
}

/** Encodes the calls, copies `reads` out, one submit and one wait. */
async function runAndRead(
  g: Gpu,
  calls: KernelCall[],
  reads: [GPUBuffer, number][],
): Promise<Float32Array[]> {
  const bytes = reads.reduce((a, [, n]) => a + n * 4, 0);
  const staging = g.device.createBuffer({
    size: bytes,
    usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST,
  });
  const enc = g.device.createCommandEncoder();
  const pass = enc.beginComputePass();
  encodeCalls(pass, calls);
  pass.end();
  let at = 0;
  for (const [buf, n] of reads) {
    enc.copyBufferToBuffer(buf, 0, staging, at, n * 4);
    at += n * 4;
  }
  g.device.queue.submit([enc.finish()]);
  await staging.mapAsync(GPUMapMode.READ);
  const all = new Float32Array(staging.getMappedRange().slice(0));
  staging.unmap();
  staging.destroy();
  at = 0;
  return reads.map(([, n]) => all.slice(at, at += n));
}

/** The layer's attention kernels in order, on the given buffers. */
function program(
  g: Gpu,
  b: Record<
    "step" | "table" | "q" | "kv" | "kvNorm" | "cache" | "wUK" | "wUV" | "qLatent" | "ctx" | "out",
    GPUBuffer
  >,
  d: MlaDims,
  o: {
    eps: number;
    interleaved: boolean;
    scale: number;
    weights: "f32" | "f16";
    tuning?: Partial<MlaAttentionTuning>;
    kvStride?: number;
    kvOffset?: number;
    ropeAbsorb?: boolean;
    combineValue?: boolean;
    decode?: boolean;
  },
): KernelCall[] {
  if (o.decode) {
    const call = mlaDecodeCall(g, b, { ...d, ...o });
    if (!call) throw new Error("the one-dispatch decode does not apply here");
    return [call];
  }
  if (o.combineValue) {
    const attention = mlaAttentionCalls(g, b, { ...d, scale: o.scale, tuning: o.tuning });
    if (attention.length !== 2) throw new Error("combineValue needs split keys");
    const splits = mlaAttentionSplits(g, { ...d, tuning: o.tuning });
    const fused = mlaCombineValueCall(g, { ...b, part: attention[1].buffers[1] }, {
      ...d,
      splits,
      weights: o.weights,
    });
    if (!fused) throw new Error("combineValue does not apply here");
    return [
      mlaRopeCacheCall(g, b, {
        ...d,
        eps: o.eps,
        interleaved: o.interleaved,
        kvStride: o.kvStride,
        kvOffset: o.kvOffset,
      }),
      mlaAbsorbCall(g, b, { ...d, weights: o.weights }),
      attention[0],
      fused,
    ];
  }
  if (o.ropeAbsorb) {
    return [
      mlaRopeAbsorbCall(g, b, {
        ...d,
        eps: o.eps,
        interleaved: o.interleaved,
        kvStride: o.kvStride,
        kvOffset: o.kvOffset,
        weights: o.weights,
      }),
      ...mlaAttentionCalls(g, b, { ...d, scale: o.scale, tuning: o.tuning }),
      mlaValueCall(g, b, { ...d, weights: o.weights }),
    ];
  }
  return [
    mlaRopeCacheCall(g, b, {
      ...d,
      eps: o.eps,
      interleaved: o.interleaved,
      kvStride: o.kvStride,
      kvOffset: o.kvOffset,
    }),
    mlaAbsorbCall(g, b, { ...d, weights: o.weights }),
    ...mlaAttentionCalls(g, b, { ...d, scale: o.scale, tuning: o.tuning }),
    mlaValueCall(g, b, { ...d, weights: o.weights }),
  ];
}

/**
 * Runs the four kernels for T tokens at pos0, the cache holding the reference rows for 0..pos0-1 and
 * garbage elsewhere; returns what came out, the cache, and the references.
 */
async function runCase(
  s: Shape,
  pos0: number,
  T: number,
  o: {
    weights: "f32" | "f16";
    interleaved: boolean;
    tuning?: Partial<MlaAttentionTuning>;
    fused?: boolean;
    ropeAbsorb?: boolean;
    combineValue?: boolean;
    /** The one-dispatch decode (mla_decode.ts). */
    decode?: boolean;
    /** The latent cache's element type (default f32): f16 checks against latentReference on rounded rows. */
    kv?: KvType;
  },
) {
  const g = gpu!;
  const maxSeq = pos0 + T + 3;
  const p = problem(s, pos0, T, maxSeq, o.interleaved, s.heads * 7919 + s.R * 31 + pos0 * 3 + T);
  const kv = o.kv ?? "f32";
  const d = { ...p.d, kv };
  const CW = s.R + s.DR;
  const kvB = o.weights === "f16" ? f16ToF32(f32ToF16(p.kvB)) : p.kvB;
  const { wUK, wUV } = mlaSplitKvB(kvB, d);
  const rows = latentRows(p.kv, p.kvNorm, p.table, {
    R: s.R,
    DR: s.DR,
    n: pos0 + T,
    eps: p.eps,
    interleaved: o.interleaved,
  });
  const cache0 = randoms(maxSeq * CW, 99, 50); // garbage past pos0 that must be overwritten or ignored
  cache0.set(rows.subarray(0, pos0 * CW));
  const w = (a: Float32Array) => upload(g, o.weights === "f16" ? f32ToF16(a) : a);
  const step = createStepBuffer(g);
  writeStep(g, step, { pos0, T, tokOut: 0 });
  // fused: q and kv rows side by side in one buffer, as one GEMV over [q_proj; kv_a_proj] writes them,
  // with 3 floats of padding to show the stride is honoured.
  const qRow = s.heads * (s.DN + s.DR), QS = qRow + CW + 3;
  const qkv = new Float32Array(T * QS);
  for (let t = 0; t < T; t++) {
    qkv.set(p.q.subarray(t * qRow, (t + 1) * qRow), t * QS);
    qkv.set(p.kv.subarray((pos0 + t) * CW, (pos0 + t + 1) * CW), t * QS + qRow);
  }
  const qBuf = upload(g, o.fused ? qkv : p.q);
  const b = {
    step,
    table: upload(g, p.table),
    q: qBuf,
    kv: o.fused ? qBuf : upload(g, p.kv.slice(pos0 * CW)),
    kvNorm: upload(g, p.kvNorm),
    cache: upload(g, kv === "f16" ? f32ToF16(cache0) : cache0),
    wUK: w(wUK),
    wUV: w(wUV),
    qLatent: storageBuffer(g, T * s.heads * s.R * 4),
    ctx: storageBuffer(g, T * s.heads * s.R * 4),
    out: upload(g, new Float32Array(T * s.heads * s.DV).fill(-12345)),
  };
  const calls = o.fused
    ? program(g, b, { ...d, qStride: QS }, { ...p, ...o, kvStride: QS, kvOffset: qRow })
    : program(g, b, d, { ...p, ...o });
  const words = kv === "f16" ? Math.ceil(maxSeq * CW / 2) : maxSeq * CW;
  const [out, cacheWords] = await runAndRead(g, calls, [[b.out, T * s.heads * s.DV], [b.cache, words]]);
  releaseCalls(calls, step);
  for (const buf of new Set(Object.values(b))) buf.destroy();
  // The cache as values, and what it held before and should hold now, as its elements hold them.
  const cache = kv === "f16" ? f16ToF32(new Uint16Array(cacheWords.buffer, 0, maxSeq * CW)) : cacheWords;
  const want = kv === "f16"
    ? latentReference(p, kvB, d, { pos0, interleaved: o.interleaved, kv, held: cache })
    : mlaReference({ ...p, kvB }, { ...d, pos0, eps: p.eps, interleaved: o.interleaved, scale: p.scale });
  const held = kv === "f16" ? asF16 : (a: Float32Array) => a;
  return { out, want, cache, rows: held(rows), cache0: held(cache0), maxSeq, CW };
}

// [heads, R, DN, DR, DV]: kimi-k2-tiny; the smallest; odd ranks and widths (scalar paths); R not a
// multiple of 4 with DR one, and 130 latent slots (more than one per thread); 8 heads in one group; rows
// of 66 vectors (4 lanes a key, the last load block partly past the row); the real models' 512 + 64.
const SHAPES: Shape[] = [
  [4, 32, 16, 8, 16],
  [1, 1, 1, 2, 1],
  [3, 7, 4, 6, 5],
  [5, 33, 9, 4, 7],
  [2, 130, 12, 2, 10],
  [8, 64, 16, 16, 16],
  [6, 260, 8, 4, 3],
  [3, 512, 32, 64, 16],
].map(([heads, R, DN, DR, DV]) => ({ heads, R, DN, DR, DV }));
// Decode positions around chunk edges (chunks of 16 to 128 keys) and up to 300; prefill chunks from 0 and
// mid-way.
const POSITIONS: [number, number][] = [
  [0, 1],
  [1, 1],
  [63, 1],
  [64, 1],
  [65, 1],
  [128, 1],
  [299, 1],
  [0, 7],
  [60, 9],
];

for (const weights of ["f32", "f16"] as const) {
  Deno.test(
    { name: `MLA kernels match the un-absorbed reference (${weights} weights)`, ignore },
    async () => {
      let k = 0;
      for (const s of SHAPES) {
        for (const [pos0, T] of POSITIONS) {
          // f16 on every other position to keep the run short; interleaved and rotate-half alternate.
          if (weights === "f16" && k++ % 2 === 1) continue;
          const interleaved = (pos0 + T) % 2 === 0;
          const what =
            `h${s.heads} R${s.R} dn${s.DN} dr${s.DR} dv${s.DV} @${pos0}+${T} ${weights} il=${interleaved}`;
          const r = await runCase(s, pos0, T, { weights, interleaved });
          assertClose(r.out, r.want, 2e-5, 2e-4, `out ${what}`);
        }
      }
    },
  );
}

Deno.test(
  {
    name: "MLA kernels with an f16 latent cache: rows written rounded, read widened",
    ignore: ignore || !gpu?.hasF16,
  },
  async () => {
    const tunings: Partial<MlaAttentionTuning>[] = [
      {},
      { headsPerGroup: 2, splits: 3 },
      { subgroup: true, splits: 5 },
      { subgroup: false, splits: 1 },
    ];
    let k = 0, ran = 0;
    for (const s of SHAPES) {
      for (const [pos0, T] of POSITIONS) {
        const tuning = tunings[k++ % tunings.length];
        if (tuning.headsPerGroup! > s.heads) continue;
        if (tuning.subgroup && !mlaSubgroupFits(gpu!, dimsOf(s, 1))) continue;
        const weights = k % 3 === 0 ? "f32" : "f16";
        const interleaved = (pos0 + T) % 2 === 1;
        const what = `h${s.heads} R${s.R} dr${s.DR} @${pos0}+${T} ${weights} ${JSON.stringify(tuning)}`;
        const r = await runCase(s, pos0, T, {
          weights,
          interleaved,
          tuning,
          kv: "f16",
          ropeAbsorb: k % 2 === 0,
          combineValue: k % 2 === 1 && T === 1 && (tuning.splits ?? 2) > 1 && s.R % 4 === 0 &&
            s.DR % 4 === 0 &&
            gpu!.subgroupSize !== null && pos0 > 0,
        });
        assertClose(r.out, r.want, 2e-5, 2e-4, `out ${what}`);
        const rows = [pos0 * r.CW, (pos0 + T) * r.CW];
        assertClose(r.cache.slice(...rows), r.rows.slice(...rows), 1e-6, 1e-3, `written rows ${what}`);
        ran++;
      }
    }
    if (ran < 40) throw new Error(`only ${ran} cases ran`);
  },
);

Deno.test(
  {
    name: "MLA split attention's combine fused with the value projection: the same answer",
    ignore: ignore || gpu?.subgroupSize === null,
  },
  async () => {
    let ran = 0;
    for (const s of SHAPES.filter((s) => s.R % 4 === 0 && s.DR % 4 === 0)) {
      for (const pos0 of [0, 15, 16, 64, 299]) {
        for (const weights of ["f32", "f16"] as const) {
          if (weights === "f16" && !gpu!.hasF16) continue;
          for (const tuning of [{}, { headsPerGroup: 1, splits: 5 }]) {
            const what = `h${s.heads} R${s.R} dv${s.DV} @${pos0} ${weights} ${JSON.stringify(tuning)}`;
            const r = await runCase(s, pos0, 1, { weights, interleaved: true, tuning, combineValue: true });
            assertClose(r.out, r.want, 2e-5, 2e-4, `combine+value ${what}`);
            ran++;
          }
        }
      }
    }
    if (ran < 20) throw new Error(`only ${ran} cases ran`);
  },
);

Deno.test(
  {
    name: "MLA decode in one dispatch (mla_decode.ts): the reference's output and cache row, f32 / f16 cache",
    ignore: ignore || gpu?.subgroupSize === null,
  },
  async () => {
    // The shapes it serves (R, dr and dn multiples of 4), a shape with more latent vec4s than threads would
    // leave idle parts for, and DeepSeek-V2-Lite's head at a short cache.
    // (At 4 lanes, subgroup_sizes_test.ts's run, the 512-wide shapes' kernels take llvmpipe minutes to compile;
    // the small ones exercise the same lane arithmetic.)
    const shapes = [
      ...SHAPES.filter((s) => s.R % 4 === 0 && s.DR % 4 === 0 && s.DN % 4 === 0),
      { heads: 3, R: 24, DN: 16, DR: 8, DV: 12 },
      { heads: 2, R: 512, DN: 128, DR: 64, DV: 128 },
    ].filter((s) => s.R < 512 || gpu!.subgroupSize! >= 8);
    // Two (weights, cache) pairs a shape, so that every pair comes up over the shapes while each shape
    // compiles two kernels (a compile is most of a case's time on the software adapter).
    const pairs = [["f32", "f32"], ["f16", "f16"], ["f16", "f32"], ["f32", "f16"]] as const;
    let k = 0, ran = 0;
    for (const [i, s] of shapes.entries()) {
      const positions = s.R >= 512 ? [0, 3, 70] : [0, 1, 63, 64, 65, 128, 299];
      for (const pos0 of positions) {
        const [weights, kv] = pairs[(2 * i + (k % 2)) % pairs.length];
        const fused = k % 4 < 2;
        k++;
        if ((weights === "f16" || kv === "f16") && !gpu!.hasF16) continue;
        const interleaved = pos0 % 2 === 0;
        const what =
          `h${s.heads} R${s.R} dn${s.DN} dr${s.DR} dv${s.DV} @${pos0} ${weights} kv ${kv} fused=${fused}`;
        const r = await runCase(s, pos0, 1, { weights, interleaved, kv, fused, decode: true });
        assertClose(r.out, r.want, 2e-5, 2e-4, `out ${what}`);
        const { CW } = r;
        assertClose(r.cache.slice(0, pos0 * CW), r.cache0.slice(0, pos0 * CW), 0, 0, `rows before ${what}`);
        const row = [pos0 * CW, (pos0 + 1) * CW];
        assertClose(
          r.cache.slice(...row),
          r.rows.slice(...row),
          1e-6,
          kv === "f16" ? 1e-3 : 1e-5,
          `row ${what}`,
        );
        assertClose(
          r.cache.slice((pos0 + 1) * CW),
          r.cache0.slice((pos0 + 1) * CW),
          0,
          0,
          `rows after ${what}`,
        );
        ran++;
      }
    }
    if (ran < 15) throw new Error(`only ${ran} cases ran`);
    // It serves one-token steps only, and says so by returning null.
    assert.equal(mlaDecodeFits(gpu!, { ...dimsOf(shapes[0], 2) }), false);
    assert.equal(mlaDecodeFits(gpu!, { ...dimsOf(SHAPES[2], 1) }), false); // dn 4, R 7: not whole vec4s
  },
);

Deno.test("MLA length buckets: the fused kernel's bound per head count, nested with MLA_SHORT_KEYS", () => {
  assert.deepEqual([4, 16, 32, 64, 128, 256].map(mlaFusedKeys), [48, 192, 384, 1024, 2048, 2048]);
  const cases: [number, number | undefined, number | undefined][] = [
    [16, 1, 192],
    [16, 192, 192],
    [16, 193, undefined],
    [16, undefined, undefined],
    [64, 1024, 1024],
    [64, 1025, undefined],
    [128, 1000, 1024],
    [128, 1500, 2048],
    [128, 2049, undefined],
  ];
  for (const [heads, keys, want] of cases) {
    assert.equal(mlaLengthBucket(heads, keys), want, `${heads} heads, ${keys}`);
  }
});

Deno.test(
  { name: "MLA rope + cache and absorption in one dispatch: the same answer", ignore },
  async () => {
    for (const s of SHAPES) {
      for (const [pos0, T] of [[0, 1], [64, 1], [60, 9]] as [number, number][]) {
        for (const [weights, fused] of [["f32", false], ["f16", true]] as const) {
          if (weights === "f16" && !gpu!.hasF16) continue;
          const what = `h${s.heads} R${s.R} dn${s.DN} dr${s.DR} @${pos0}+${T} ${weights} fused=${fused}`;
          const r = await runCase(s, pos0, T, {
            weights,
            interleaved: pos0 % 2 === 0,
            fused,
            ropeAbsorb: true,
          });
          assertClose(r.out, r.want, 2e-5, 2e-4, `rope+absorb ${what}`);
        }
      }
    }
  },
);

Deno.test(
  { name: "MLA kernels with q and kv in one buffer (a fused projection's rows, strided)", ignore },
  async () => {
    for (const s of [SHAPES[0], SHAPES[2], SHAPES[7]]) {
      for (const [pos0, T] of [[0, 1], [65, 1], [60, 9]] as [number, number][]) {
        const r = await runCase(s, pos0, T, { weights: "f32", interleaved: T % 2 === 1, fused: true });
        assertClose(r.out, r.want, 2e-5, 2e-4, `fused h${s.heads} R${s.R} @${pos0}+${T}`);
      }
    }
  },
);

Deno.test(
  { name: "MLA attention: head groups, key splits and unrolls give the same answer", ignore },
  async () => {
    const tunings: Partial<MlaAttentionTuning>[] = [
      { headsPerGroup: 1, splits: 1 },
      { headsPerGroup: 3, splits: 1 },
      { headsPerGroup: 2, splits: 3, unroll: 3 },
      { headsPerGroup: 5, splits: 7, unroll: 16 },
      { splits: 64, unroll: 1 },
      { subgroup: true, splits: 1 },
      { subgroup: true, splits: 3 },
      { subgroup: false, splits: 5 },
    ];
    for (const s of [SHAPES[0], SHAPES[3], SHAPES[5]]) {
      for (const tuning of tunings) {
        if (tuning.headsPerGroup! > s.heads) continue;
        if (tuning.subgroup && !mlaSubgroupFits(gpu!, dimsOf(s, 1))) continue;
        for (const [pos0, T] of [[0, 1], [200, 1], [130, 6]] as [number, number][]) {
          const what = `h${s.heads} R${s.R} @${pos0}+${T} ${JSON.stringify(tuning)}`;
          const r = await runCase(s, pos0, T, { weights: "f32", interleaved: true, tuning });
          assertClose(r.out, r.want, 2e-5, 2e-4, `out ${what}`);
        }
      }
    }
  },
);

Deno.test(
  {
    name: "MLA decode with 64 heads or more groups 4 heads a workgroup past MLA_SHORT_KEYS: the same answer",
    ignore,
  },
  async () => {
    for (const s of [{ heads: 64, R: 16, DN: 8, DR: 8, DV: 8 }, { heads: 66, R: 20, DN: 4, DR: 4, DV: 6 }]) {
      const d = { heads: s.heads, kvLoraRank: s.R, qkNopeHeadDim: s.DN, qkRopeHeadDim: s.DR, vHeadDim: s.DV };
      const def = mlaAttentionDefaultTuning(gpu!, { ...d, maxSeq: 512, T: 1 });
      assert.deepEqual([def.headsPerGroup, def.splits, def.subgroup], [4, 32, undefined]);
      // A program whose steps stay within MLA_SHORT_KEYS keys keeps one head a workgroup where it can.
      const short = mlaAttentionDefaultTuning(gpu!, { ...d, maxSeq: 512, T: 1, keys: MLA_SHORT_KEYS });
      assert.equal(short.headsPerGroup === 1, mlaSubgroupFits(gpu!, { ...d, maxSeq: 512, T: 1 }));
      const long = mlaAttentionDefaultTuning(gpu!, { ...d, maxSeq: 512, T: 1, keys: MLA_SHORT_KEYS + 1 });
      assert.deepEqual(long, def);
      for (const [pos0, T] of [[0, 1], [65, 1], [700, 1]] as [number, number][]) {
        const r = await runCase(s, pos0, T, { weights: "f16", interleaved: true });
        assertClose(r.out, r.want, 2e-5, 2e-4, `h${s.heads} R${s.R} @${pos0}+${T}`);
      }
    }
  },
);

Deno.test(
  { name: "MLA rope + cache write: rows at the step's positions, nothing else", ignore },
  async () => {
    for (const s of [SHAPES[0], SHAPES[2], SHAPES[4]]) {
      for (const [interleaved, kv] of [[true, "f32"], [false, "f32"], [true, "f16"]] as const) {
        if (kv === "f16" && !gpu!.hasF16) continue;
        const pos0 = 5, T = 3;
        const r = await runCase(s, pos0, T, { weights: "f32", interleaved, kv });
        const { CW } = r;
        const what = `h${s.heads} R${s.R} il=${interleaved} ${kv}`;
        assertClose(r.cache.slice(0, pos0 * CW), r.cache0.slice(0, pos0 * CW), 0, 0, `rows before ${what}`);
        assertClose(
          r.cache.slice(pos0 * CW, (pos0 + T) * CW),
          r.rows.slice(pos0 * CW, (pos0 + T) * CW),
          1e-6,
          kv === "f16" ? 1e-3 : 1e-5,
          `written rows ${what}`,
        );
        assertClose(
          r.cache.slice((pos0 + T) * CW),
          r.cache0.slice((pos0 + T) * CW),
          0,
          0,
          `rows after ${what}`,
        );
      }
    }
  },
);

Deno.test(
  { name: "MLA rope + cache write: kv as a slice of a wider row, f16 norm weights", ignore },
  async () => {
    const g = gpu!;
    for (const s of [SHAPES[0], SHAPES[2]]) {
      const T = 3, pos0 = 2, maxSeq = 8, CW = s.R + s.DR, stride = CW + 5, offset = 3;
      const p = problem(s, pos0, T, maxSeq, true, 31);
      const norm = f16ToF32(f32ToF16(p.kvNorm));
      const wide = randoms(T * stride, 32);
      for (let t = 0; t < T; t++) {
        wide.set(
          p.kv.subarray((pos0 + t) * CW, (pos0 + t + 1) * CW),
          t * stride + offset,
        );
      }
      const step = createStepBuffer(g);
      writeStep(g, step, { pos0, T, tokOut: 0 });
      const b = {
        step,
        table: upload(g, p.table),
        q: upload(g, p.q),
        kv: upload(g, wide),
        kvNorm: upload(g, f32ToF16(p.kvNorm)),
        cache: storageBuffer(g, maxSeq * CW * 4),
      };
      const call = mlaRopeCacheCall(g, b, {
        ...p.d,
        eps: p.eps,
        interleaved: true,
        kvStride: stride,
        kvOffset: offset,
        normWeights: "f16",
      });
      const [cache] = await runAndRead(g, [call], [[b.cache, maxSeq * CW]]);
      releaseCalls([call], step);
      const want = latentRows(p.kv, norm, p.table, {
        R: s.R,
        DR: s.DR,
        n: pos0 + T,
        eps: p.eps,
        interleaved: true,
      });
      const rows = [pos0 * CW, (pos0 + T) * CW];
      assertClose(cache.slice(...rows), want.slice(...rows), 1e-6, 1e-5, `rows h${s.heads} R${s.R}`);
    }
  },
);

Deno.test({
  name: "MLA decode sequence: a prefill chunk then tokens one by one, from the kernels' own cache (f32, f16)",
  ignore,
}, async () => {
  const g = gpu!;
  const s = SHAPES[0];
  const total = 9, prefill = 5, maxSeq = 16;
  // One problem for all positions: the prefill and decode steps take their rows of q and kv.
  const p = problem(s, 0, total, maxSeq, true, 4242);
  const { heads, R, DN, DR, DV } = s;
  const { wUK, wUV } = mlaSplitKvB(p.kvB, p.d);
  for (const kv of ["f32", "f16"] as const) {
    if (kv === "f16" && !g.hasF16) continue;
    const all = { ...p.d, T: total, kv };
    const outs: Float32Array[] = [];
    const step = createStepBuffer(g);
    const cache = storageBuffer(g, maxSeq * (R + DR) * (kv === "f16" ? 2 : 4));
    const fixed = {
      step,
      table: upload(g, p.table),
      kvNorm: upload(g, p.kvNorm),
      cache,
      wUK: upload(g, wUK),
      wUV: upload(g, wUV),
    };
    for (let pos = 0; pos < total;) {
      const T = pos === 0 ? prefill : 1;
      const d = { ...p.d, T, kv };
      writeStep(g, step, { pos0: pos, T, tokOut: 0 });
      const b = {
        ...fixed,
        q: upload(g, p.q.slice(pos * heads * (DN + DR), (pos + T) * heads * (DN + DR))),
        kv: upload(g, p.kv.slice(pos * (R + DR), (pos + T) * (R + DR))),
        qLatent: storageBuffer(g, T * heads * R * 4),
        ctx: storageBuffer(g, T * heads * R * 4),
        out: storageBuffer(g, T * heads * DV * 4),
      };
      const calls = program(g, b, d, { ...p, weights: "f32" });
      const [out] = await runAndRead(g, calls, [[b.out, T * heads * DV]]);
      releaseCalls(calls, step);
      outs.push(out);
      pos += T;
    }
    // f16: against the rows as the kernels wrote them (latentReference's `held`).
    const words = kv === "f16" ? total * (R + DR) / 2 : total * (R + DR);
    const [cacheWords] = await runAndRead(g, [], [[cache, words]]);
    const held = kv === "f16" ? f16ToF32(new Uint16Array(cacheWords.buffer)) : cacheWords;
    const want = kv === "f16"
      ? latentReference(p, p.kvB, all, { pos0: 0, interleaved: true, kv, held })
      : mlaReference(p, { ...all, pos0: 0, eps: p.eps, interleaved: true, scale: p.scale });
    for (let pos = 0, i = 0; pos < total; i++) {
      const T = pos === 0 ? prefill : 1;
      const what = `${kv} cache, tokens ${pos}..${pos + T - 1}`;
      assertClose(outs[i], want.slice(pos * heads * DV, (pos + T) * heads * DV), 2e-5, 2e-4, what);
      pos += T;
    }
  }
});

Deno.test({ name: "MLA kernels do nothing when the step has no tokens", ignore }, async () => {
  const g = gpu!;
  const s = SHAPES[0];
  const p = problem(s, 0, 2, 8, false, 77);
  const { wUK, wUV } = mlaSplitKvB(p.kvB, p.d);
  const cache0 = randoms(8 * (s.R + s.DR), 5);
  const step = createStepBuffer(g);
  writeStep(g, step, { pos0: 3, T: 0, tokOut: 0 });
  const b = {
    step,
    table: upload(g, p.table),
    q: upload(g, p.q),
    kv: upload(g, p.kv),
    kvNorm: upload(g, p.kvNorm),
    cache: upload(g, cache0),
    wUK: upload(g, wUK),
    wUV: upload(g, wUV),
    qLatent: storageBuffer(g, 2 * s.heads * s.R * 4),
    ctx: upload(g, new Float32Array(2 * s.heads * s.R).fill(7)),
    out: storageBuffer(g, 2 * s.heads * s.DV * 4),
  };
  for (const splits of [1, 4]) {
    const calls = program(g, b, p.d, { ...p, weights: "f32", tuning: { splits } });
    const [q, cache, ctx] = await runAndRead(g, calls, [[b.q, p.q.length], [b.cache, cache0.length], [
      b.ctx,
      2 * s.heads * s.R,
    ]]);
    releaseCalls(calls, step);
    assertClose(q, p.q, 0, 0, `q untouched (splits ${splits})`);
    assertClose(cache, cache0, 0, 0, `cache untouched (splits ${splits})`);
    assertClose(ctx, new Float32Array(ctx.length).fill(7), 0, 0, `ctx untouched (splits ${splits})`);
  }
});

Deno.test({ name: "MLA kernels refuse bad shapes and tunings, naming what was wrong", ignore }, () => {
  const g = gpu!;
  const buf = storageBuffer(g, 64);
  const b = {
    step: buf,
    table: buf,
    q: buf,
    kv: buf,
    kvNorm: buf,
    cache: buf,
    wUK: buf,
    wUV: buf,
    qLatent: buf,
    ctx: buf,
    out: buf,
  };
  const d: MlaDims = {
    heads: 2,
    kvLoraRank: 8,
    qkNopeHeadDim: 4,
    qkRopeHeadDim: 4,
    vHeadDim: 4,
    maxSeq: 8,
    T: 1,
  };
  const cases: [() => unknown, string][] = [
    [() => mlaRopeCacheCall(g, b, { ...d, qkRopeHeadDim: 3, eps: 1e-6, interleaved: true }), "qkRopeHeadDim"],
    [() => mlaRopeCacheCall(g, b, { ...d, eps: 1e-6, interleaved: true, kvStride: 10 }), "stride"],
    [() => mlaAbsorbCall(g, b, { ...d, heads: 0, weights: "f32" }), "heads"],
    [() => mlaValueCall(g, b, { ...d, weights: "q8" as "f32" }), "weights"],
    [() => mlaAttentionCalls(g, b, { ...d, scale: 0.1, tuning: { headsPerGroup: 3 } }), "headsPerGroup"],
    [() => mlaAttentionCalls(g, b, { ...d, scale: 0.1, tuning: { splits: 0 } }), "splits"],
    [() => mlaAttentionCalls(g, b, { ...d, scale: -1 }), "scale"],
  ];
  for (const [f, word] of cases) {
    let msg = "";
    try {
      f();
    } catch (e) {
      if (e instanceof RangeError) msg = e.message;
    }
    if (!msg.includes(word)) throw new Error(`expected a RangeError naming ${word}, got "${msg}"`);
  }
});
