// Grouped-query attention with RoPE (Llama, Qwen2, Qwen3, Mixtral), pre-normed, adding into the residual:
//   xn   = rmsnorm(x) * input_layernorm                        [H]
//   qkv  = xn @ [q_proj; k_proj; v_proj]^T (+ q/k/v biases)     [(nH + 2 nKV) * hd]
//   q, k = rmsnorm per head (q_norm, k_norm; Qwen3)
//   q, k = rope(q, k, pos); kcache[pos], vcache[pos] = k, v
//   att  = softmax(q k^T / sqrt(hd)) v  (causal, GQA)           [nH * hd]
//   x   += att @ o_proj^T (+ o bias)                            [H]
// KV cache per layer: K and V [nKV, maxSeq, hd] of ctx.kv elements (f16 by default with f16 / q8 / q4
// weights, f32 with f32 weights: Model.kvType), written rounded to it, read back widened to f32.
import {
  attentionCall,
  attentionCopyOutFits,
  attentionDecodeCalls,
  attentionDecodeFits,
  attentionOProjDefault,
  attentionOProjFits,
  biasAddCall,
  DECODE_MAX_T,
  flashAttentionCall,
  flashAttentionFits,
  flashHalfOut,
  gemmHalfInput,
  gemvFusedCalls,
  type GemvFusedDims,
  type Gpu,
  headNormCall,
  int8CopyFor,
  type KernelCall,
  kvRowBytes,
  type KvType,
  kvTypeOf,
  moeInputCopy,
  normCopyFor,
  prefillLinearCalls,
  ropeKvCall,
  storageBuffer,
} from "../../kernels/mod.ts";
import type { GqaAttention } from "../config.ts";
import type { BlockContext, LayerLink, StepBuffers, TensorReader } from "./context.ts";
import { normedPrefillCalls } from "./linear.ts";

export interface GqaWeights {
  norm: GPUBuffer;
  qkv: GPUBuffer;
  o: GPUBuffer;
  qkvBias?: GPUBuffer;
  oBias?: GPUBuffer;
  qNorm?: GPUBuffer;
  kNorm?: GPUBuffer;
}

/** Where Qwen3's q_norm / k_norm run in decode steps (gpu.tuning.headNorm; read when a program is built). */
function headNormSwitch(gpu: Gpu): "fused" | "own" {
  const v = gpu.tuning.headNorm ?? "fused";
  if (v !== "fused" && v !== "own") {
    throw new TypeError(`gpu.tuning.headNorm must be fused or own, got ${JSON.stringify(v)}`);
  }
  return v;
}

/** Floats per token of the block's scratch buffers. */
export function gqaWidths(a: GqaAttention): { qkv: number; att: number } {
  return { qkv: (a.heads + 2 * a.kvHeads) * a.headDim, att: a.heads * a.headDim };
}

export async function loadGqa(
  read: TensorReader,
  a: GqaAttention,
  hidden: number,
  p: string,
): Promise<GqaWeights> {
  const w: GqaWeights = {
    norm: await read([`${p}input_layernorm.weight`]),
    qkv: await read([
      `${p}self_attn.q_proj.weight`,
      `${p}self_attn.k_proj.weight`,
      `${p}self_attn.v_proj.weight`,
    ], hidden),
    o: await read([`${p}self_attn.o_proj.weight`], a.heads * a.headDim),
  };
  if (a.qkvBias) {
    w.qkvBias = await read(
      [`${p}self_attn.q_proj.bias`, `${p}self_attn.k_proj.bias`, `${p}self_attn.v_proj.bias`],
      undefined,
      "f32",
    );
  }
  if (a.oBias) w.oBias = await read([`${p}self_attn.o_proj.bias`], undefined, "f32");
  if (a.qkNorm) {
    w.qNorm = await read([`${p}self_attn.q_norm.weight`], undefined, "f32");
    w.kNorm = await read([`${p}self_attn.k_norm.weight`], undefined, "f32");
  }
  return w;
}

/** The element type of the layer's K and V caches (the model's; q8 needs head_dim % 4 == 0: kvTypeOf). */
function gqaKv(ctx: BlockContext, a: GqaAttention): KvType {
  return kvTypeOf(ctx.kv, { gqa: true, width: a.headDim });
}

export function gqaCache(
  ctx: BlockContext,
  a: GqaAttention,
  maxSeq: number,
): { buffers: GPUBuffer[]; bytes: number } {
  const bytes = a.kvHeads * maxSeq * kvRowBytes(gqaKv(ctx, a), a.headDim);
  return {
    buffers: [storageBuffer(ctx.gpu, bytes, "k"), storageBuffer(ctx.gpu, bytes, "v")],
    bytes: 2 * bytes,
  };
}

/** The fused qkv GEMV of a step of T tokens (input_layernorm folded in): also what the layer before links to. */
export function gqaQkvDims(
  ctx: BlockContext,
  a: GqaAttention,
  w: GqaWeights,
  d: { hidden: number; T: number },
): GemvFusedDims {
  return {
    K: d.hidden,
    N: gqaWidths(a).qkv,
    T: d.T,
    weights: ctx.typeOf(w.qkv),
    normWeights: ctx.normType,
    transform: "rmsnorm",
    eps: ctx.eps,
    int8One: ctx.int8One,
  };
}

/** The block's kernel calls for a step of T tokens. `fused`: decode-sized GEMVs with the norm folded in. */
export function gqaProgram(
  ctx: BlockContext,
  a: GqaAttention,
  w: GqaWeights,
  cache: GPUBuffer[],
  bufs: StepBuffers & { scratch: Record<string, GPUBuffer>; rope: GPUBuffer; maxSeq: number },
  d: { hidden: number; T: number; fused: boolean; link?: LayerLink; keys?: number },
): KernelCall[] {
  const { gpu, eps } = ctx;
  const wt = (b: GPUBuffer) => ctx.typeOf(b);
  const { step, x, xn, rope: table } = bufs;
  const { qkv, att } = bufs.scratch;
  const { qkv: qkvDim, att: attDim } = gqaWidths(a);
  const { T, hidden: H } = d;
  // keys: the most keys this program's steps attend to (its cache-length bucket), for the decode attention.
  const dims = {
    heads: a.heads,
    kvHeads: a.kvHeads,
    headDim: a.headDim,
    maxSeq: bufs.maxSeq,
    keys: d.keys,
    T,
    kv: gqaKv(ctx, a),
  };
  const calls: KernelCall[] = d.fused
    ? gemvFusedCalls(
      gpu,
      { x, w: w.qkv, y: qkv, normWeight: w.norm, copyIn: d.link?.input },
      gqaQkvDims(ctx, a, w, d),
    )
    : [
      ...normedPrefillCalls(ctx, { x, norm: w.norm, normed: xn, w: w.qkv, y: qkv }, {
        K: H,
        N: qkvDim,
        T,
        eps,
      }),
    ];
  if (w.qkvBias) calls.push(biasAddCall(gpu, { b: w.qkvBias, y: qkv }, { N: qkvDim, T }));
  // Up to 16 tokens: (q/k head norms,) RoPE, the KV write and attention in one dispatch (subgroups;
  // flash-decoding splits for long caches add a combine); else two or three.
  const decode = T <= DECODE_MAX_T && attentionDecodeFits(gpu, dims);
  const qkNorm = w.qNorm && w.kNorm ? { wq: w.qNorm, wk: w.kNorm } : undefined;
  const foldNorm = qkNorm !== undefined && decode && headNormSwitch(gpu) === "fused";
  if (qkNorm && !foldNorm) calls.push(headNormCall(gpu, { qkv, ...qkNorm }, { ...dims, eps }));
  const [kcache, vcache] = cache;
  const o = { K: attDim, N: H, T, accumulate: true, weights: wt(w.o), int8One: ctx.int8One };
  // Prefill: the flash attention writes o_proj's input as f16 where its GEMM reads f16 (flashHalfOut).
  const oHalf = !decode && !d.fused &&
    flashHalfOut(gpu, a.headDim, gemmHalfInput(gpu, o, o.weights, ctx.gemmF16));
  // The int8 direct mode (k-steps; one-token q4 steps): the attention writes o_proj's int8 input itself (no
  // input pass), in models with MoE layers too, where o_proj takes that mode only for the copy (H200,
  // Qwen3-30B-A3B q4: 2.147-2.148 ms a step against 2.160-2.161, docs/BENCHMARKS.md, twenty-first session).
  // One-token steps before a dense MLP: o_proj folded into the decode attention (kernels/attention_oproj.ts),
  // no o_proj dispatch, the fold writing the MLP's int8 input copy where its first GEMV takes one.
  // H200 (docs/BENCHMARKS.md, the twenty-fourth session): Llama-1B q4 step 0.643 -> 0.598 ms, f16 0.914 ->
  // 0.890; not for k-steps (q4 k = 8: 0.935 -> 1.167, each token's workgroups reading o_proj again) nor
  // before MoE blocks (Qwen3-30B-A3B q4 2.130 -> 2.149).
  const foldO = decode && d.fused && T === 1 && d.link?.denseFfn === true && !w.oBias &&
    attentionOProjDefault(gpu) &&
    attentionOProjFits(gpu, dims, { weights: o.weights, N: H, copy: true });
  const foldCopy = foldO && d.link?.ffnInput
    ? int8CopyFor(gpu, d.link.ffnInput.dims, d.link.ffnInput.norm)
    : undefined;
  const oProj = foldO
    ? {
      w: w.o,
      weights: o.weights,
      N: H,
      y: x,
      copy: foldCopy,
      ...(gpu.tuning.attentionORowSplits ? { rowSplits: gpu.tuning.attentionORowSplits } : {}),
    }
    : undefined;
  const copy = decode && d.fused && !foldO && attentionCopyOutFits(a)
    ? int8CopyFor(gpu, { ...o, int8One: true })
    : undefined;
  if (decode) {
    calls.push(
      ...(foldNorm
        ? attentionDecodeCalls(
          gpu,
          {
            step,
            table,
            qkv,
            kcache,
            vcache,
            out: att,
            qNorm: qkNorm.wq,
            kNorm: qkNorm.wk,
            copyOut: copy,
            oProj,
          },
          { ...dims, normEps: eps },
        )
        : attentionDecodeCalls(
          gpu,
          { step, table, qkv, kcache, vcache, out: att, copyOut: copy, oProj },
          dims,
        )),
    );
    if (foldCopy && d.link) d.link.copy = foldCopy;
    // The fold's copy buffers are owned by the FFN GEMV that reads them (gemvFusedCalls with copyIn).
    if (oProj) return calls;
  } else {
    // Flash attention (tiles of queries and keys) where the head size fits it, else one query a workgroup.
    const ab = { step, qkv, kcache, vcache, out: att };
    calls.push(
      ropeKvCall(gpu, { step, table, qkv, kcache, vcache }, dims),
      flashAttentionFits(a.headDim)
        ? flashAttentionCall(gpu, ab, dims, { half: oHalf })
        : attentionCall(gpu, ab, dims),
    );
  }
  // k-steps: o_proj also writes the FFN's input times its norm weights and the sums of squares for its
  // 1 / rms (normCopyFor: int8 where o_proj's widened workgroups stay small enough for that to pay, f32 in
  // the f32 direct mode), so the FFN's first GEMV needs no input pass or no norm in its inner loop. Not with
  // an o_proj bias (added after the GEMV).
  // Before a fused MoE block: o_proj writes the block's int8 input and its router's partial logits
  // (kernels/moe_ffn.ts moeInputCopy), so no router GEMV runs.
  const moeIn = d.link?.moeInput && d.fused && !w.oBias
    ? moeInputCopy(gpu, { ...o, int8One: o.int8One || copy !== undefined }, d.link.moeInput)
    : undefined;
  const next = moeIn ??
    (d.link?.ffnInput && d.fused && !w.oBias
      ? normCopyFor(gpu, o, d.link.ffnInput.dims, d.link.ffnInput.norm)
      : undefined);
  if (next && d.link) d.link.copy = next;
  calls.push(
    ...(d.fused
      ? gemvFusedCalls(gpu, { x: att, w: w.o, y: x, copyIn: copy, copyOut: next }, o)
      : prefillLinearCalls(gpu, { x: att, w: w.o, y: x }, { ...o, f16Math: ctx.gemmF16, xHalf: oHalf })),
  );
  if (w.oBias) calls.push(biasAddCall(gpu, { b: w.oBias, y: x }, { N: H, T }));
  return calls;
}

export function gqaBuffers(w: GqaWeights): GPUBuffer[] {
  return [w.norm, w.qkv, w.o, w.qkvBias, w.oBias, w.qNorm, w.kNorm].filter((b): b is GPUBuffer => !!b);
}
