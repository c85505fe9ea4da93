// The blocks a layer is made of, dispatched on their kind: each kind's file says how it loads, what
// scratch and KV cache it needs, and the kernels it runs. models/model.ts composes layers from these.
import {
  type GemvFusedDims,
  type KernelCall,
  kvRowBytes,
  type KvType,
  kvTypeOf,
  type MoeScratch,
} from "../../kernels/mod.ts";
import type { AttentionSpec, FfnSpec } from "../config.ts";
import type { BlockContext, LayerLink, StepBuffers, TensorReader } from "./context.ts";
import { gqaBuffers, gqaCache, gqaProgram, gqaQkvDims, type GqaWeights, gqaWidths, loadGqa } from "./gqa.ts";
import {
  loadMla,
  mlaBuffers,
  mlaCache,
  mlaPartBytes,
  mlaProgram,
  mlaScratch,
  type MlaWeights,
} from "./mla.ts";
import { loadMlp, mlpBuffers, mlpGateUpDims, mlpProgram, type MlpWeights, mlpWidths } from "./mlp.ts";
import { loadMoe, moeBuffers, moeLinkInput, moeProgram, type MoeWeights } from "./moe.ts";

export type AttentionWeights = { kind: "gqa"; w: GqaWeights } | { kind: "mla"; w: MlaWeights };
export type FfnWeights = { kind: "mlp"; w: MlpWeights } | { kind: "moe"; w: MoeWeights };

export interface Loaders {
  read: TensorReader;
  readF32(name: string): Promise<Float32Array>;
}

export async function loadAttention(
  ctx: BlockContext,
  l: Loaders,
  a: AttentionSpec,
  hidden: number,
  p: string,
): Promise<AttentionWeights> {
  return a.kind === "gqa"
    ? { kind: "gqa", w: await loadGqa(l.read, a, hidden, p) }
    : { kind: "mla", w: await loadMla(ctx, l.read, l.readF32, a, hidden, p) };
}

/** `routed` false: a MoE layer's routed experts are held elsewhere (expert parallelism). */
export async function loadFfn(
  ctx: BlockContext,
  l: Loaders,
  f: FfnSpec,
  hidden: number,
  p: string,
  routed = true,
): Promise<FfnWeights> {
  return f.kind === "mlp"
    ? { kind: "mlp", w: await loadMlp(l.read, f, hidden, p) }
    : { kind: "moe", w: await loadMoe(ctx, l.read, f, hidden, p, routed) };
}

/** Floats per token of each scratch buffer a block needs (a sequence allocates the max over its layers). */
export function scratchWidths(a: AttentionSpec, f: FfnSpec): Record<string, number> {
  return { ...(a.kind === "gqa" ? gqaWidths(a) : mlaScratch(a)), ...(f.kind === "mlp" ? mlpWidths(f) : {}) };
}

/** One request's KV cache for one layer, and its bytes. */
export function attentionCache(
  ctx: BlockContext,
  a: AttentionSpec,
  maxSeq: number,
): { buffers: GPUBuffer[]; bytes: number } {
  return a.kind === "gqa" ? gqaCache(ctx, a, maxSeq) : mlaCache(ctx, a, maxSeq);
}

/** KV-cache bytes per token per layer: GQA's K and V rows, or MLA's latent row, of the model's `kv`. */
export function kvBytesPerToken(a: AttentionSpec, kv: KvType): number {
  if (a.kind === "gqa") {
    return 2 * a.kvHeads * kvRowBytes(kvTypeOf(kv, { gqa: true, width: a.headDim }), a.headDim);
  }
  const width = a.kvLoraRank + a.qkRopeHeadDim;
  return kvRowBytes(kvTypeOf(kv, { gqa: false, width }), width);
}

/** The width RoPE rotates (its table's head dimension). */
export function ropeDim(a: AttentionSpec): number {
  return a.kind === "gqa" ? a.headDim : a.qkRopeHeadDim;
}

/**
 * Bytes of scratch the attention's steps of up to maxT tokens share (MLA's split partials; none for GQA):
 * a sequence holds one buffer of the most any layer asks for (ProgramBuffers.mlaPart).
 */
export function attentionPartBytes(
  ctx: BlockContext,
  a: AttentionSpec,
  d: { maxT: number; maxSeq: number },
): number {
  return a.kind === "mla" ? mlaPartBytes(ctx, a, d) : 0;
}

export interface ProgramBuffers extends StepBuffers {
  scratch: Record<string, GPUBuffer>;
  moe?: MoeScratch;
  rope: GPUBuffer;
  maxSeq: number;
  /** The split MLA attention's partials, shared by the sequence's MLA layers and programs (mlaPartBytes). */
  mlaPart?: GPUBuffer;
}

export function attentionProgram(
  ctx: BlockContext,
  a: AttentionSpec,
  w: AttentionWeights,
  cache: GPUBuffer[],
  bufs: ProgramBuffers,
  d: { hidden: number; T: number; fused: boolean; link?: LayerLink; keys?: number },
): KernelCall[] {
  if (a.kind === "gqa" && w.kind === "gqa") return gqaProgram(ctx, a, w.w, cache, bufs, d);
  if (a.kind === "mla" && w.kind === "mla") return mlaProgram(ctx, a, w.w, cache, bufs, d);
  throw new Error(`attention weights of kind ${w.kind} for a ${a.kind} layer`);
}

/**
 * The layer's link for one step's program (context.ts LayerLink): whether the FFN is a dense MLP, and its first
 * GEMV where the attention may write its input (the paired gate/up).
 */
export function layerLink(
  ctx: BlockContext,
  f: FfnSpec,
  w: FfnWeights,
  d: { hidden: number; T: number; fused: boolean },
): LayerLink {
  if (f.kind === "moe" && w.kind === "moe") {
    const moeInput = d.fused ? moeLinkInput(ctx, f, w.w, d) : undefined;
    return moeInput ? { moeInput } : {};
  }
  if (f.kind !== "mlp" || w.kind !== "mlp") return {};
  const dims = mlpGateUpDims(ctx, f, w.w, d);
  return dims ? { denseFfn: true, ffnInput: { dims, norm: w.w.norm } } : { denseFfn: true };
}

/**
 * The attention block's first GEMV where the layer before may write its input (LayerLink `after`: GQA's
 * fused qkv, with input_layernorm), else undefined (MLA, or a step of unfused GEMVs).
 */
export function attentionInput(
  ctx: BlockContext,
  a: AttentionSpec,
  w: AttentionWeights,
  d: { hidden: number; T: number; fused: boolean },
): { dims: GemvFusedDims; norm: GPUBuffer } | undefined {
  if (!d.fused || a.kind !== "gqa" || w.kind !== "gqa") return undefined;
  // As the qkv GEMV will run when its int8 copy arrives (gqaQkvDims).
  return { dims: { ...gqaQkvDims(ctx, a, w.w, d), int8One: true }, norm: w.w.norm };
}

export function ffnProgram(
  ctx: BlockContext,
  f: FfnSpec,
  w: FfnWeights,
  bufs: ProgramBuffers,
  d: { hidden: number; T: number; fused: boolean; link?: LayerLink },
): KernelCall[] {
  if (f.kind === "mlp" && w.kind === "mlp") return mlpProgram(ctx, f, w.w, bufs, d);
  if (f.kind === "moe" && w.kind === "moe") {
    if (!bufs.moe) throw new Error("a MoE layer needs the sequence's MoE scratch");
    return moeProgram(ctx, f, w.w, { ...bufs, moe: bufs.moe }, d);
  }
  throw new Error(`FFN weights of kind ${w.kind} for a ${f.kind} layer`);
}

export function attentionBuffers(w: AttentionWeights): GPUBuffer[] {
  return w.kind === "gqa" ? gqaBuffers(w.w) : mlaBuffers(w.w);
}

export function ffnBuffers(w: FfnWeights): GPUBuffer[] {
  return w.kind === "mlp" ? mlpBuffers(w.w) : moeBuffers(w.w);
}
