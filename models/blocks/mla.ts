// Multi-head latent attention (DeepSeek-V3, Kimi K2), pre-normed, adding into the residual; the latent KV
// cache holds [c (R), k_rope (dr)] per position, and kv_b_proj is absorbed (kernels/mla.ts):
//   xn      = rmsnorm(x) * input_layernorm                                  [H]
//   q       = q_b(rmsnorm(q_a(xn)) * q_a_layernorm)  or  q_proj(xn)         [nH (dn + dr)]
//   kv      = kv_a_proj_with_mqa(xn)                                         [R + dr]
//             (without q_lora_rank, q_proj and kv_a_proj_with_mqa are one matrix and one GEMV: rows [q | kv])
//   q_rope, cache[pos] = rope(q[:, dn:]), [rmsnorm(kv[:R]) * kv_a_layernorm, rope(kv[R:])]
//   qLat_h  = W_UK_h^T q_nope_h                                              [nH, R]
//   ctx_h   = softmax_s(scale (qLat_h . c_s + q_rope_h . kRope_s)) c_s       [nH, R]
//   out_h   = W_UV_h ctx_h                                                   [nH dv]
//   x      += out @ o_proj^T                                                 [H]
// transformers' q_a_layernorm and kv_a_layernorm keep RMSNorm's default eps (1e-6), not rms_norm_eps.
import {
  type Gpu,
  type KernelCall,
  kvRowBytes,
  type KvType,
  kvTypeOf,
  MLA_SHORT_KEYS,
  mlaAttentionCalls,
  mlaAttentionPartBytes,
  mlaAttentionSplits,
  type MlaAttentionTuning,
  mlaCombineValueCall,
  mlaDecodeCall,
  type MlaDims,
  mlaFusedKeys,
  mlaRopeAbsorbCall,
  mlaSplitKvB,
  mlaValueCall,
  storageBuffer,
  type WeightType,
} from "../../kernels/mod.ts";
import type { MlaAttention } from "../config.ts";
import type { BlockContext, StepBuffers, TensorReader } from "./context.ts";
import { linear } from "./linear.ts";

/** The attention kernel's cut from gpu.tuning.mlaAttention (kernels/mla_attention.ts's defaults otherwise). */
function attentionTuning(gpu: Gpu): Partial<MlaAttentionTuning> | undefined {
  const t = gpu.tuning.mlaAttention;
  return t && (t.subgroup ? { ...t, headsPerGroup: 1 } : t);
}

/** RMSNorm epsilon of q_a_layernorm and kv_a_layernorm (DeepseekV3RMSNorm's default). */
const LORA_NORM_EPS = 1e-6;

export interface MlaWeights {
  norm: GPUBuffer;
  /** q_lora_rank set: q_a_proj, q_a_layernorm, q_b_proj; else q_proj. */
  qA?: GPUBuffer;
  qANorm?: GPUBuffer;
  qB?: GPUBuffer;
  /** q_lora_rank null: [q_proj; kv_a_proj_with_mqa] stacked, one GEMV. Else kv_a_proj_with_mqa alone. */
  qkvA?: GPUBuffer;
  kvA?: GPUBuffer;
  kvANorm: GPUBuffer;
  /** kv_b_proj cut per head: W_UK [nH, R, dn] and W_UV [nH, dv, R] (floats). */
  wUK: GPUBuffer;
  wUV: GPUBuffer;
  kvType: WeightType;
  o: GPUBuffer;
}

export function mlaTensors(a: MlaAttention, hidden: number, p: string): [string, number[]][] {
  const qDim = a.heads * (a.qkNopeHeadDim + a.qkRopeHeadDim);
  const q: [string, number[]][] = a.qLoraRank === null ? [[p + "self_attn.q_proj.weight", [qDim, hidden]]] : [
    [p + "self_attn.q_a_proj.weight", [a.qLoraRank, hidden]],
    [p + "self_attn.q_a_layernorm.weight", [a.qLoraRank]],
    [p + "self_attn.q_b_proj.weight", [qDim, a.qLoraRank]],
  ];
  return [
    ...q,
    [p + "self_attn.kv_a_proj_with_mqa.weight", [a.kvLoraRank + a.qkRopeHeadDim, hidden]],
    [p + "self_attn.kv_a_layernorm.weight", [a.kvLoraRank]],
    [p + "self_attn.kv_b_proj.weight", [a.heads * (a.qkNopeHeadDim + a.vHeadDim), a.kvLoraRank]],
    [p + "self_attn.o_proj.weight", [hidden, a.heads * a.vHeadDim]],
  ];
}

/** Floats per token of the block's scratch buffers. */
export function mlaScratch(a: MlaAttention): Record<string, number> {
  const R = a.kvLoraRank;
  return {
    q: a.heads * (a.qkNopeHeadDim + a.qkRopeHeadDim),
    qa: a.qLoraRank ?? 1,
    qan: a.qLoraRank ?? 1,
    kv: R + a.qkRopeHeadDim,
    qkv: a.qLoraRank === null ? a.heads * (a.qkNopeHeadDim + a.qkRopeHeadDim) + R + a.qkRopeHeadDim : 1,
    qLatent: a.heads * R,
    ctx: a.heads * R,
    att: a.heads * a.vHeadDim,
  };
}

export async function loadMla(
  ctx: BlockContext,
  read: TensorReader,
  readF32: (name: string) => Promise<Float32Array>,
  a: MlaAttention,
  hidden: number,
  p: string,
): Promise<MlaWeights> {
  const norm = await read([`${p}input_layernorm.weight`]);
  const kvName = `${p}self_attn.kv_a_proj_with_mqa.weight`;
  const q = a.qLoraRank === null ? { qkvA: await read([`${p}self_attn.q_proj.weight`, kvName], hidden) } : {
    qA: await read([`${p}self_attn.q_a_proj.weight`], hidden),
    qANorm: await read([`${p}self_attn.q_a_layernorm.weight`]),
    qB: await read([`${p}self_attn.q_b_proj.weight`], a.qLoraRank),
    kvA: await read([kvName], hidden),
  };
  const kvANorm = await read([`${p}self_attn.kv_a_layernorm.weight`], undefined, "f32");
  const { wUK, wUV } = mlaSplitKvB(await readF32(`${p}self_attn.kv_b_proj.weight`), a);
  const kvType: WeightType = ctx.gpu.hasF16 && ctx.normType === "f16" ? "f16" : "f32";
  const o = await read([`${p}self_attn.o_proj.weight`], a.heads * a.vHeadDim);
  return {
    norm,
    ...q,
    kvANorm,
    wUK: ctx.upload(wUK, kvType, "W_UK"),
    wUV: ctx.upload(wUV, kvType, "W_UV"),
    kvType,
    o,
  };
}

/** The latent cache's element type: the model's, f16 for a q8 model (kvTypeOf: no q8 MLA kernels). */
function mlaKv(ctx: BlockContext, a: MlaAttention): KvType {
  return kvTypeOf(ctx.kv, { gqa: false, width: a.kvLoraRank + a.qkRopeHeadDim });
}

/** The latent cache [maxSeq, R + dr] of the layer's KV type (mlaKv). */
export function mlaCache(
  ctx: BlockContext,
  a: MlaAttention,
  maxSeq: number,
): { buffers: GPUBuffer[]; bytes: number } {
  const width = a.kvLoraRank + a.qkRopeHeadDim;
  const bytes = maxSeq * kvRowBytes(mlaKv(ctx, a), width);
  return { buffers: [storageBuffer(ctx.gpu, bytes, "mla cache")], bytes };
}

export function mlaProgram(
  ctx: BlockContext,
  a: MlaAttention,
  w: MlaWeights,
  cache: GPUBuffer[],
  bufs: StepBuffers & {
    scratch: Record<string, GPUBuffer>;
    rope: GPUBuffer;
    maxSeq: number;
    /** The split attention's partials, shared by every MLA layer and program of a sequence (mlaPartBytes). */
    mlaPart?: GPUBuffer;
  },
  d: { hidden: number; T: number; keys?: number },
): KernelCall[] {
  const { gpu } = ctx;
  const { step, x, xn, scratch: s, rope: table } = bufs;
  const { hidden: H, T } = d;
  const dims: MlaDims = {
    heads: a.heads,
    kvLoraRank: a.kvLoraRank,
    qkNopeHeadDim: a.qkNopeHeadDim,
    qkRopeHeadDim: a.qkRopeHeadDim,
    vHeadDim: a.vHeadDim,
    maxSeq: bufs.maxSeq,
    T,
    kv: mlaKv(ctx, a),
    keys: d.keys,
  };
  const qDim = a.heads * (a.qkNopeHeadDim + a.qkRopeHeadDim);
  const kvDim = a.kvLoraRank + a.qkRopeHeadDim;
  const calls: KernelCall[] = [];
  // q and kv: one GEMV into rows [q | kv] without q_lora_rank, else q through the low rank and kv apart.
  let q = s.q, kv = s.kv, kvLayout = {};
  if (a.qLoraRank === null) {
    const QS = qDim + kvDim;
    calls.push(...linear(ctx, { x, w: w.qkvA!, y: s.qkv, norm: w.norm, normed: xn }, { K: H, N: QS, T }));
    q = kv = s.qkv;
    dims.qStride = QS;
    kvLayout = { kvStride: QS, kvOffset: qDim };
  } else {
    const r = a.qLoraRank;
    calls.push(
      ...linear(ctx, { x, w: w.qA!, y: s.qa, norm: w.norm, normed: xn }, { K: H, N: r, T }),
      ...linear(ctx, { x: s.qa, w: w.qB!, y: s.q, norm: w.qANorm, normed: s.qan }, {
        K: r,
        N: qDim,
        T,
        eps: LORA_NORM_EPS,
      }),
      ...linear(ctx, { x, w: w.kvA!, y: s.kv, norm: w.norm, normed: xn }, { K: H, N: kvDim, T }),
    );
  }
  const rope = { step, table, q, kv, kvNorm: w.kvANorm, cache: cache[0] };
  const ropeDims = {
    ...dims,
    ...kvLayout,
    eps: LORA_NORM_EPS,
    interleaved: a.interleaved,
    weights: w.kvType,
  };
  // One-token steps over a short cache: the whole attention in one dispatch (kernels/mla_decode.ts).
  const decode =
    T === 1 && d.keys !== undefined && d.keys <= mlaFusedKeys(a.heads) && gpu.tuning.mlaFused !== false
      ? mlaDecodeCall(gpu, { ...rope, wUK: w.wUK, wUV: w.wUV, out: s.att }, {
        ...ropeDims,
        scale: a.scale,
        threads: gpu.tuning.mlaFusedThreads,
      })
      : null;
  if (decode) calls.push(decode);
  else calls.push(...splitAttention());
  calls.push(
    ...linear(ctx, { x: s.att, w: w.o, y: x }, { K: a.heads * a.vHeadDim, N: H, T, accumulate: true }),
  );
  return calls;

  /** Rope + absorb, the attention, then (split keys) its combine and the value projection, fused where they can. */
  function splitAttention(): KernelCall[] {
    const out = [mlaRopeAbsorbCall(gpu, { ...rope, wUK: w.wUK, qLatent: s.qLatent }, ropeDims)];
    const ATTENTION_TUNING = attentionTuning(gpu);
    const attention = mlaAttentionCalls(gpu, {
      step,
      q,
      qLatent: s.qLatent,
      cache: cache[0],
      ctx: s.ctx,
      part: bufs.mlaPart,
    }, {
      ...dims,
      scale: a.scale,
      tuning: ATTENTION_TUNING,
    });
    const fused = attention.length === 2
      ? mlaCombineValueCall(gpu, { step, part: attention[1].buffers[1], wUV: w.wUV, out: s.att }, {
        ...dims,
        splits: mlaAttentionSplits(gpu, { ...dims, tuning: ATTENTION_TUNING }),
        weights: w.kvType,
      })
      : null;
    if (fused) out.push(attention[0], fused);
    else {
      out.push(
        ...attention,
        mlaValueCall(gpu, { ctx: s.ctx, wUV: w.wUV, out: s.att }, { ...dims, weights: w.kvType }),
      );
    }
    return out;
  }
}

/**
 * The most bytes of split partials any step of up to maxT tokens of this layer asks for (every length bucket):
 * one buffer of this size serves all the MLA layers and programs of a sequence, as their steps and layers run
 * one after another (a program whose tuning asks for more, gpu.tuning.mlaAttention's, takes a buffer of its own).
 */
export function mlaPartBytes(
  ctx: BlockContext,
  a: MlaAttention,
  d: { maxT: number; maxSeq: number },
): number {
  let most = 0;
  const tuning = attentionTuning(ctx.gpu);
  // Past 256 tokens a step has one split (no partials) by default.
  for (let T = 1; T <= Math.min(d.maxT, 256); T++) {
    for (const keys of [MLA_SHORT_KEYS, undefined]) {
      most = Math.max(
        most,
        mlaAttentionPartBytes(ctx.gpu, {
          heads: a.heads,
          kvLoraRank: a.kvLoraRank,
          qkNopeHeadDim: a.qkNopeHeadDim,
          qkRopeHeadDim: a.qkRopeHeadDim,
          vHeadDim: a.vHeadDim,
          maxSeq: d.maxSeq,
          T,
          kv: mlaKv(ctx, a),
          keys,
          tuning,
        }),
      );
    }
  }
  return most;
}

export function mlaBuffers(w: MlaWeights): GPUBuffer[] {
  return [w.norm, w.qA, w.qANorm, w.qB, w.qkvA, w.kvA, w.kvANorm, w.wUK, w.wUV, w.o].filter((
    b,
  ): b is GPUBuffer => !!b);
}
