// The WebGPU device, and the few buffer and pipeline utilities every kernel uses.
// Effects live here: requesting the adapter, creating buffers, reading back.
import { setImmediate } from "node:timers";
import { checkEarlyRead, readStaging, takeStaging } from "./readback.ts";
import { EnvError } from "./env.ts";
import type { GemmTile } from "./gemm.ts";
import type { SgTuning } from "./gemv_sg.ts";
import type { MultiTuning } from "./gemv_multi.ts";
import type { MoeTuning } from "./moe_ffn.ts";
import type { MlaAttentionTuning } from "./mla_attention.ts";
import type { Int8Tile } from "./matmul_int8.ts";
import type { KvType } from "./kv.ts";

/** What weights are stored as on the GPU. Activations are always f32. */
export type WeightType = "f32" | "f16";

/**
 * Kernel choices a caller may force (benchmarks, A/B runs), read when kernel calls are built: set them on
 * `gpu.tuning` before building a model's programs (a sequence caches its programs). Each field left out
 * means the default for this adapter. The one way to force a kernel choice: a process starts from
 * SWACTOR_TUNING (tuningFromEnv); the environment switches that did this before (SWACTOR_GEMV, SWACTOR_DP4,
 * SWACTOR_MOE_*, SWACTOR_ATTN_*, SWACTOR_HEAD_NORM, SWACTOR_MLA_TUNING, SWACTOR_GEMM_MATH; their names in
 * docs/BENCHMARKS.md's older commands) are fields here now.
 */
export interface KernelTuning {
  /**
   * The one-row GEMV: "subgroup" (gemv_sg.ts, the default where the adapter has subgroups and the shape
   * fits) or "team" (gemv_fused.ts's portable kernel, everywhere). Only the GEMVs: the decode attention
   * still uses subgroups where it can.
   */
  gemv?: "subgroup" | "team";
  /** Quantised subgroup GEMVs quantise x to int8 and use dot4I8Packed (default: where WGSL has it). */
  dp4?: boolean;
  /** Steps of 2..16 rows read each weight once for all rows (gemv_multi.ts; default: all but q4, where it fits). */
  multi?: boolean;
  /**
   * How the multi-token GEMV stages x (gemv_multi.ts MultiTuning dp4 / xh): "int8" (quantised weights with
   * dot4I8Packed, where WGSL has it), "f16" or "f32". Default: int8 for q4 where dp4 is on, else f32.
   */
  multiStage?: "f32" | "f16" | "int8";
  /** The multi-token GEMV loads tile i + 1's weights before tile i's products (MultiTuning `pipeline`). */
  multiPipeline?: boolean;
  /**
   * The multi-token GEMV's matrices with no transform or RMSNorm (paired or not) read x straight from its
   * buffer and split each row block's K over warps (MultiTuning `direct`, multiDirectTuning) instead of
   * staging x in tiles. Default on for f32 / f16 / q8 (false: staged); q4 only when true (with `multi`, as
   * q4 takes one grid row per token by default); silu_mul stages x.
   */
  multiDirect?: boolean;
  /**
   * q8 / q4 k-steps (gemv_fused.ts gemvFusedCalls): one pass makes the int8 copy of the k input rows, then
   * the direct multi-token GEMV multiplies it with dot4I8Packed (MultiTuning direct + dp4). Default: q4 at
   * every k, q8 from k = 4, unless multi / multiDirect / multiStage force another kernel (gemv_fused.ts
   * multiInt8Serves says why).
   */
  multiInt8?: boolean;
  /**
   * One-token steps take that int8 direct mode too (with the copies below) instead of gemv_sg.ts's one-row
   * kernel quantising x in every workgroup: by default q4 weights in models without MoE layers
   * (gemv_fused.ts oneTokenInt8); true: every quantised one-token GEMV where it fits; false: none.
   */
  multiInt8One?: boolean;
  /**
   * In that mode the kernel before o_proj (the decode attention) and before down (the paired gate/up GEMV)
   * write the int8 copy of its input themselves, so those two GEMVs need no input pass (gemv_fused.ts
   * int8CopyFor). Default on; false: every int8 GEMV makes its own copy (A/B runs).
   */
  multiInt8Copies?: boolean;
  /**
   * With the copies, also the RMSNorm GEMVs' inputs from the kernel before (o_proj writes gate/up's int8
   * input times the norm weight and each block's sum of squares; the consumer applies 1 / rms). Default on;
   * false: those keep their input pass (A/B runs).
   */
  multiInt8NormCopies?: boolean;
  /**
   * The widest producer workgroup (threads) that writes an RMSNorm GEMV's int8 input (gemv_fused.ts
   * int8NormCopyMaxThreads: by default 1,024 in one-token steps, 512 in k-steps; A/B runs).
   */
  multiInt8NormCopyThreads?: number;
  /**
   * Int8 copies of a GEMV's output made by the last workgroup of each block of 32 rows (MultiTuning
   * `arrive`) instead of workgroups widened to whole blocks: by default where those would be wider than the
   * copy's thread limit (multiInt8NormCopyThreads'); true: wherever it serves; false: never (A/B runs).
   * A MoE block's input copy (moeCopyIn) takes them only when this is true (kernels/moe_ffn.ts moeInputCopy).
   */
  multiInt8CopyArrive?: boolean;
  /**
   * f32 / f16 k-steps in the f32 direct multi-token mode: the GEMV before each RMSNorm GEMV (o_proj before
   * gate/up, down before the next layer's qkv or the LM head) writes its input times the norm weights and
   * the sums of squares (gemv_fused.ts floatCopyFor), so the RMSNorm GEMV's inner loop reads x as it is.
   * Default on; false: each normalises x itself (A/B runs).
   */
  multiFloatNormCopies?: boolean;
  /**
   * The direct multi-token GEMV's units of a row in flight and its row cap (multiDirectTuning's `unroll`,
   * `rows`), forced for every shape: for A/B runs (scripts/bench/decode.ts --multi-unroll / --multi-rows).
   */
  multiUnroll?: number;
  multiRows?: number;
  /** The direct multi-token GEMV's splitK grows while row blocks x splitK stay under this (default 2048). */
  multiWarps?: number;
  /**
   * One-token MLA steps over at most mlaFusedKeys(heads) keys in one dispatch a layer (kernels/mla_decode.ts)
   * instead of rope + absorb, the attention and its combine + value. Default on where it fits; false: the
   * three dispatches (A/B runs).
   */
  mlaFused?: boolean;
  /** Its threads a workgroup (MlaDecodeOptions.threads; A/B runs). */
  mlaFusedThreads?: number;
  /**
   * A fused MoE block's input (the int8 copy and the router's partial logits) written by the o_proj GEMV
   * before it, so no router GEMV runs (kernels/moe_ffn.ts moeInputFor). Default on where it fits; false: the
   * router GEMV (A/B runs).
   */
  moeCopyIn?: boolean;
  /** Flash-decoding splits per head for the decode attention (1: off; default: attentionDecodeSplits). */
  attentionSplits?: number;
  /**
   * o_proj folded into the decode attention (kernels/attention_oproj.ts; models/blocks/gqa.ts): default
   * attentionOProjDefault. `attentionORowSplits` forces its workgroups per head.
   */
  attentionOProj?: boolean;
  attentionORowSplits?: number;
  /**
   * The o_proj fold's own loads issued at its kernel's start (attention_oproj.ts OProjDims.earlyTail).
   * Default: where the fold writes an int8 copy (its norm weights were the tail's one DRAM round trip).
   */
  attentionOEarlyTail?: boolean;
  /**
   * The flash-decoding combine loads a thread's slot of every split's output with the splits' (max, sum),
   * not after it has weighed them (attention_decode.ts attentionCombineSource). Default on; false for A/B runs.
   */
  attentionCombineEarly?: boolean;
  /** Subgroups per workgroup of the decode attention (default: attentionDecodeDefaultTuning's, 4 when split). */
  attentionWarps?: number;
  /** Loads a lane of the decode attention issues before using any (AttentionDecodeTuning.unroll; for A/B runs). */
  attentionUnroll?: number;
  /**
   * The decode attention runs one workgroup per KV head serving all its q heads, each K / V row read once
   * for the group (attention_decode.ts, attentionDecodeGroupedSource; its default splits are
   * attentionDecodeGroupedSplits) instead of one per q head. Default: attentionGroupedDefault (head_dim >= 128,
   * groups >= 4, > 4096 positions: where the H200 measured it faster). Read when the call is built.
   */
  attentionGrouped?: boolean;
  /** GEMVs issue their first weight loads before staging x (SgTuning / MultiTuning `prefetch`; default on). */
  prefetch?: boolean;
  /**
   * The decode MLP's gate/up GEMV pairs gate row n with up row n in one warp and writes silu(gate) * up
   * (I wide), so down stages it as it is (default true where a subgroup GEMV serves the shape; false: it
   * writes [gate | up] and down computes silu_mul as it stages; gemv_sg.ts, models/blocks/mlp.ts).
   */
  pairGateUp?: boolean;
  /**
   * One-row GEMVs with RMSNorm scale their sums by 1 / rms instead of staging normalised x (SgTuning
   * `deferNorm`; default on).
   */
  deferNorm?: boolean;
  /**
   * One-row subgroup GEMVs load x and their norm weights before their first weight loads (SgTuning
   * `earlyX`; default on).
   */
  earlyX?: boolean;
  /**
   * GEMV tunings replaced for one shape, by gemv_fused.ts gemvTuningKey (the one-row subgroup kernel's
   * SgTuning fields, e.g. {"f16 rmsnorm pairs 8192x2048": {"rows": 1, "unroll": 4}}, or the multi-token
   * kernel's MultiTuning fields at T tokens, "f16 none 2048x8192 T8"), for tuning in the model
   * (scripts/bench/decode.ts --tunings).
   */
  gemvTunings?: Record<string, Partial<SgTuning> | Partial<MultiTuning>>;
  /**
   * One-row f32 / f16 GEMVs with no transform or RMSNorm read x straight from its buffer and split each
   * row's K over several warps (SgTuning `direct`, sgDirectTuning). Default: rows of K >= 8192 with no
   * transform (down_proj after the paired gate/up); true / false forces it for every eligible GEMV. Paired
   * gate/up and silu_mul GEMVs keep the staged kernel.
   */
  direct?: boolean;
  /**
   * The f32 / f16 paired gate/up GEMV (pairGateUp) in direct mode too (default false: on the H200 it was
   * slower than the staged pairs, 0.415 against 0.388 ms a Llama-1B f16 token).
   */
  directPairs?: boolean;
  /** Logits per workgroup of the argmax / sampler's first pass (argmax_rows.ts; default 1024). */
  argmaxChunk?: number;
  /** The prefill flash attention: "blocked" (the default) or "lanes" (the first version; flash_attention.ts). */
  flash?: "blocked" | "lanes";
  /**
   * The prefill's flash attention writes f16 for the o_proj GEMM to read as f16 where that GEMM multiplies
   * in f16 (flash_attention.ts flashHalfOut). Default on; false: f32 (A/B runs).
   */
  flashHalf?: boolean;
  /**
   * The engine's prefill encodes the next chunk while one runs and submits it as the wait returns (default
   * true; false: encodes it after the wait and the yield, the first way; models/engine.ts). Read per prefill.
   */
  prefillOverlap?: boolean;
  /**
   * The engine's prefill submits a new request's first chunk a few layers at a time as its program is built,
   * so the GPU starts while the host builds the rest (default true; false: one submit after the whole
   * build). Read per prefill.
   */
  prefillEarlySubmit?: boolean;
  /**
   * After how many built layers those early submits happen (default 1, 2, 4, 8, ...: models/engine.ts). Read
   * per prefill.
   */
  prefillEarlyLayers?: number[];
  /**
   * With prefillEarlySubmit, a first chunk whose program was built before (a reused sequence's) is submitted
   * in growing pieces of its calls too (default true). Read per prefill.
   */
  prefillEarlyCached?: boolean;
  /**
   * The decode loop hands out the prefill's token as soon as it is read (default true); false: after the
   * next batches are read too (MAX_IN_FLIGHT, as every later token). Read per decode step.
   */
  firstTokenAtOnce?: boolean;
  /**
   * After a stage's one-token `run` step (Engine.run) returns, the next one-token step's commands are encoded
   * (in the gap before it), and that step submits them at once where its program is the same (default
   * true); false: each step encodes its own before submitting.
   */
  encodeAhead?: boolean;
  /**
   * The prefill GEMM's tiles (kernels/gemm.ts gemmDefaultTile): `gemmLarge` where its tiles times its split K
   * make a wave (`gemmWave` workgroups, default 256), else `gemmSmall` (defaults 128x128k32r22cv and
   * 64x64k16r11c); the wave also bounds the default split K. Their f16 / wh flags apply only to weights they
   * suit. Read when a GEMM call is built (each request's programs).
   */
  gemmLarge?: GemmTile;
  gemmSmall?: GemmTile;
  gemmWave?: number;
  /**
   * The default split K (kernels/gemm.ts gemmDefaultSplit): splits double while the tiles are under a wave,
   * each split keeps at least `minK` of K and there are at most `max` (defaults 1024 and 8, or 256 and 16 for
   * the int8 tiles and outputs of at most 4 tiles). Read when a GEMM call is built.
   */
  gemmSplit?: { minK?: number; max?: number };
  /**
   * The GQA KV cache's element type, read when a model is loaded (Model.load; default: f16 where the adapter
   * has shader-f16 and the weights are not f32, else f32; env SWACTOR_KV sets it too).
   */
  kv?: KvType;
  /**
   * The MoE expert kernels' settings (kernels/moe_ffn.ts MoeTuning, each field's default there). Read when a
   * program is built; `fused` and `fusedShared` also when a model is loaded (they decide the down stack's
   * layout), so compare those in processes of their own (SWACTOR_TUNING).
   */
  moe?: MoeTuning;
  /**
   * Where Qwen3's q_norm / k_norm run in decode steps: "fused" (default) in the decode attention kernel's
   * prologue, or "own" (head_norm.ts's dispatch, as prefill does). Read when a program is built.
   */
  headNorm?: "fused" | "own";
  /**
   * The MLA attention kernel's cut (kernels/mla_attention.ts's defaults otherwise): heads a workgroup (or
   * the subgroup kernel, one head a workgroup), key splits, unroll. Read when a program is built.
   */
  mlaAttention?: Partial<MlaAttentionTuning>;
  /**
   * How the prefill GEMM multiplies (kernels/gemm.ts): "f32" in f32 for every weight type; "f16" in f16 where
   * gemmF16Math allows; "int8" q8 and q4 layers on int8 inputs (matmul_int8.ts). Default: int8 for q4 layers
   * (gemmInt8Math), f16 where gemmF16Math allows. Read when a GEMM call is built.
   */
  gemmMath?: "f16" | "f32" | "int8";
  /** The int8 GEMM's tile (matmul_int8.ts GEMM_INT8_TILE otherwise). Read when a GEMM call is built. */
  gemmInt8?: Partial<Int8Tile>;
}

/** Every KernelTuning key, so that SWACTOR_TUNING can name one that does not exist (checked by the compiler). */
const TUNING_KEYS: Record<keyof KernelTuning, true> = {
  gemv: true,
  dp4: true,
  multi: true,
  multiStage: true,
  multiPipeline: true,
  multiDirect: true,
  multiInt8: true,
  multiInt8One: true,
  multiInt8Copies: true,
  multiInt8NormCopies: true,
  multiInt8NormCopyThreads: true,
  multiInt8CopyArrive: true,
  multiFloatNormCopies: true,
  multiUnroll: true,
  multiRows: true,
  multiWarps: true,
  mlaFused: true,
  mlaFusedThreads: true,
  moeCopyIn: true,
  attentionSplits: true,
  attentionOProj: true,
  attentionORowSplits: true,
  attentionOEarlyTail: true,
  attentionCombineEarly: true,
  attentionWarps: true,
  attentionUnroll: true,
  attentionGrouped: true,
  prefetch: true,
  pairGateUp: true,
  deferNorm: true,
  earlyX: true,
  gemvTunings: true,
  direct: true,
  directPairs: true,
  argmaxChunk: true,
  flash: true,
  flashHalf: true,
  prefillOverlap: true,
  prefillEarlySubmit: true,
  prefillEarlyLayers: true,
  prefillEarlyCached: true,
  firstTokenAtOnce: true,
  encodeAhead: true,
  gemmLarge: true,
  gemmSmall: true,
  gemmWave: true,
  gemmSplit: true,
  kv: true,
  moe: true,
  headNorm: true,
  mlaAttention: true,
  gemmMath: true,
  gemmInt8: true,
};

/**
 * A process's starting gpu.tuning from SWACTOR_TUNING, a JSON object of KernelTuning fields (empty: every
 * default). The one way to A/B a kernel choice across processes (settings read at load, a CLI run); in one
 * process, benchmarks set gpu.tuning itself (`--tunings`, tuningList). Values are the fields' own types; a key
 * that is not a field, or text that is not a JSON object, is an error naming it.
 */
export function tuningFromEnv(text = Deno.env.get("SWACTOR_TUNING") ?? ""): KernelTuning {
  if (text.trim() === "") return {};
  const v = parseTuningJson(text, "SWACTOR_TUNING must be a JSON object of kernel settings", EnvError);
  return asTuning(v, "SWACTOR_TUNING", EnvError);
}

/**
 * A benchmark's `--tunings`: a JSON list of KernelTuning objects, each checked as SWACTOR_TUNING is, so that
 * a misspelt setting fails the run instead of timing the default twice. Errors are `error`s naming the
 * entry (`--tunings[1]`).
 */
export function tuningList(text: string, what = "--tunings", error: ErrorClass = TypeError): KernelTuning[] {
  const must = `${what} must be a JSON list of kernel settings objects`;
  const v = parseTuningJson(text, must, error);
  if (!Array.isArray(v)) throw new error(must);
  return v.map((t, i) => asTuning(t, `${what}[${i}]`, error));
}

type ErrorClass = new (message: string) => Error;

/** JSON.parse, its error an `error` saying what the text `must` be. */
function parseTuningJson(text: string, must: string, error: ErrorClass): unknown {
  try {
    return JSON.parse(text);
  } catch (e) {
    throw new error(`${must}: ${(e as Error).message}`);
  }
}

/** `v` as a KernelTuning: an object whose keys are all KernelTuning fields, or an `error` naming `what`. */
function asTuning(v: unknown, what: string, error: ErrorClass): KernelTuning {
  if (typeof v !== "object" || v === null || Array.isArray(v)) {
    throw new error(
      `${what} must be a JSON object of kernel settings, got ${JSON.stringify(v).slice(0, 40)}`,
    );
  }
  const unknown = Object.keys(v).filter((k) => !(k in TUNING_KEYS));
  if (unknown.length) {
    throw new error(
      `${what}: no kernel setting named ${unknown.map((k) => `"${k.slice(0, 40)}"`).join(", ")} ` +
        `(kernels/gpu.ts KernelTuning lists them)`,
    );
  }
  return v as KernelTuning;
}

export interface Gpu {
  device: GPUDevice;
  /** The adapter's description, e.g. "NVIDIA H200" or "llvmpipe (LLVM 15.0.6, 256 bits)". */
  adapterName: string;
  /** True for a software adapter (llvmpipe/lavapipe): correct but slow. */
  isSoftware: boolean;
  /** Whether `shader-f16` is enabled, so f16 weights can be used. */
  hasF16: boolean;
  /** Whether `timestamp-query` is enabled. */
  hasTimestamps: boolean;
  /**
   * The subgroup (warp) size when `subgroups` is enabled and the adapter has one fixed size (NVIDIA 32,
   * lavapipe 8), else null. The fast GEMVs (gemv_sg.ts, gemv_multi.ts) and the decode attention need it.
   */
  subgroupSize: number | null;
  /** Bytes of workgroup memory a kernel may use. */
  maxWorkgroupStorage: number;
  /** Whether WGSL has packed 4x8-bit integer dot products (dot4I8Packed), for int8-activation GEMVs. */
  hasDp4: boolean;
  /** Pipelines by WGSL source + entry point, built once per device. */
  pipelines: Map<string, GPUComputePipeline>;
  /**
   * Pipelines built (`pipeline`'s cache misses) and the host ms they took. A build blocks the host: a fresh
   * process's first Llama-1B request waited 0.13-0.36 s for its first token on an H100 with the driver's shader
   * cache warm and 1.5-2.2 s with it cold, of which the GPU's part was ~25-31 ms (docs/BENCHMARKS.md, the
   * sixty-third session).
   */
  builds: { count: number; ms: number };
  /** Forced kernel choices (empty: every default). */
  tuning: KernelTuning;
  /** While a sequence's program is built, its uniform buffers by contents (withSharedUniforms). */
  sharedUniforms?: Map<string, GPUBuffer>;
}

/** Thrown when no WebGPU adapter is available; callers (tests) may skip on it. */
export class NoGpuError extends Error {
  override name = "NoGpuError";
}

/** The GPU could not hold what was asked of it: an allocation failed, or its device was lost (Model.load). */
export class GpuMemoryError extends Error {
  override name = "GpuMemoryError";
}

/**
 * Out-of-memory errors that no error scope caught, by device. WebGPU does not throw when the GPU cannot
 * allocate a buffer: the buffer is invalid, every use of it fails, and Deno prints nothing (2026-12-07), so
 * work on it would go on with garbage. requestGpu's devices count them here (watchDevice).
 */
const outOfMemory = new WeakMap<GPUDevice, { count: number; last: string }>();
/** Why a device was lost (its `lost` promise), by device. An H100 short of memory lost it (2026-12-07). */
const lostDevices = new WeakMap<GPUDevice, string>();

function watchDevice(device: GPUDevice): void {
  const seen = { count: 0, last: "" };
  outOfMemory.set(device, seen);
  device.addEventListener("uncapturederror", (e) => {
    const error = (e as GPUUncapturedErrorEvent).error;
    if (error instanceof GPUOutOfMemoryError) {
      seen.count++;
      seen.last = error.message;
    }
  });
  device.lost.then((info) => lostDevices.set(device, info.message || info.reason || "lost"), () => {});
}

/** Why `gpu`'s device was lost, once it has been; undefined while it works. */
export function deviceLost(gpu: Gpu): string | undefined {
  return lostDevices.get(gpu.device);
}

/**
 * How many out-of-memory errors `gpu`'s device has had so far (0 for a device getGpu did not make). Take it
 * before allocating, then pass it to outOfMemorySince: errors arrive as the device is polled, at the latest
 * once the queue's work is done.
 */
export function outOfMemoryErrors(gpu: Gpu): number {
  return outOfMemory.get(gpu.device)?.count ?? 0;
}

/** The last out-of-memory message when `gpu` has had any since `count` (outOfMemoryErrors), else undefined. */
export function outOfMemorySince(gpu: Gpu, count: number): string | undefined {
  const seen = outOfMemory.get(gpu.device);
  return seen && seen.count > count ? seen.last || "out of memory" : undefined;
}

let shared: Promise<Gpu> | undefined;

/** The process's GPU, requested once. Requests the adapter's full buffer and workgroup limits. */
export function getGpu(): Promise<Gpu> {
  shared ??= requestGpu();
  return shared;
}

/** A GPU of its own (a new device on the adapter getGpu uses): for tests that break theirs. */
export async function requestGpu(): Promise<Gpu> {
  gpuSlowdown(); // a bad SWACTOR_SLOWDOWN is an error before anything runs
  const tuning = tuningFromEnv(); // and a bad SWACTOR_TUNING
  if (typeof navigator === "undefined" || !("gpu" in navigator)) {
    throw new NoGpuError("this Deno has no WebGPU (navigator.gpu is missing)");
  }
  const adapter = await navigator.gpu.requestAdapter({ powerPreference: "high-performance" });
  if (!adapter) {
    throw new NoGpuError(
      "no WebGPU adapter: install a GPU driver with Vulkan, or mesa-vulkan-drivers for the software adapter",
    );
  }
  const wanted: GPUFeatureName[] = ["shader-f16", "timestamp-query"];
  const requiredFeatures = wanted.filter((f) => adapter.features.has(f));
  const l = adapter.limits;
  const info = adapter.info as GPUAdapterInfo & { subgroupMinSize?: number; subgroupMaxSize?: number };
  // `subgroups` works on the H200 and lavapipe though neither lists it in adapter.features (FACTS.md), so
  // it is asked for whenever the adapter reports one subgroup size, and dropped if the request fails.
  const sgSize = info.subgroupMinSize && info.subgroupMinSize === info.subgroupMaxSize
    ? info.subgroupMinSize
    : 0;
  const useSubgroups = sgSize > 0;
  const request = (features: GPUFeatureName[]) =>
    adapter.requestDevice({
      requiredFeatures: features,
      requiredLimits: {
        maxStorageBufferBindingSize: l.maxStorageBufferBindingSize,
        maxBufferSize: l.maxBufferSize,
        maxComputeWorkgroupStorageSize: l.maxComputeWorkgroupStorageSize,
        maxComputeInvocationsPerWorkgroup: l.maxComputeInvocationsPerWorkgroup,
        maxComputeWorkgroupSizeX: l.maxComputeWorkgroupSizeX,
        maxStorageBuffersPerShaderStage: l.maxStorageBuffersPerShaderStage,
        maxComputeWorkgroupsPerDimension: l.maxComputeWorkgroupsPerDimension,
      },
    });
  let device: GPUDevice | undefined;
  if (useSubgroups) {
    try {
      device = await request([...requiredFeatures, "subgroups" as GPUFeatureName]);
    } catch {
      device = undefined;
    }
  }
  const hasSubgroups = device !== undefined;
  device ??= await request(requiredFeatures);
  const adapterName = info.description || info.device || info.vendor || "unknown adapter";
  watchDevice(device);
  return {
    device,
    adapterName,
    isSoftware: info.isFallbackAdapter || /llvmpipe|lavapipe|swiftshader|software/i.test(adapterName),
    hasF16: device.features.has("shader-f16"),
    hasTimestamps: device.features.has("timestamp-query"),
    subgroupSize: hasSubgroups ? sgSize : null,
    maxWorkgroupStorage: device.limits.maxComputeWorkgroupStorageSize,
    hasDp4: (navigator.gpu as GPU & { wgslLanguageFeatures?: ReadonlySet<string> }).wgslLanguageFeatures
      ?.has("packed_4x8_integer_dot_product") ?? false,
    pipelines: new Map(),
    builds: { count: 0, ms: 0 },
    tuning,
  };
}

/**
 * `gen` with its results kept by argument list (JSON): for the generated kernels, which every request's
 * programs would otherwise regenerate before `pipeline` finds them compiled (the H100 host, Qwen3-30B-A3B q4:
 * 2.5 MB of WGSL a decode program, 5.4 MB a 32-token prefill's; docs/BENCHMARKS.md, the forty-seventh
 * session), and whose same string then finds its pipeline without hashing it again. Arguments must be
 * JSON-serialisable, hold only what the source depends on (not a request's length: each value is an
 * entry), and the generator must be pure. Past MEMO_MOST entries the memo starts over.
 */
export function memoSource<A extends unknown[]>(gen: (...args: A) => string): (...args: A) => string {
  const memo = new Map<string, string>();
  return (...args: A) => {
    const key = JSON.stringify(args);
    let code = memo.get(key);
    if (code === undefined) {
      if (memo.size >= MEMO_MOST) memo.clear();
      memo.set(key, code = gen(...args));
    }
    return code;
  };
}

/** The most sources one memoSource keeps. */
const MEMO_MOST = 512;

/** A compute pipeline for `code`, compiled once per device. */
export function pipeline(gpu: Gpu, code: string, entryPoint = "main"): GPUComputePipeline {
  // The source itself where it can be (a memoised source's string keeps its hash: no rehashing a copy).
  const key = entryPoint === "main" ? code : `${entryPoint}\n${code}`;
  let p = gpu.pipelines.get(key);
  if (!p) {
    const t = performance.now();
    const module = gpu.device.createShaderModule({ code });
    p = gpu.device.createComputePipeline({ layout: "auto", compute: { module, entryPoint } });
    gpu.pipelines.set(key, p);
    gpu.builds.count++;
    gpu.builds.ms += performance.now() - t;
  }
  return p;
}

const STORAGE = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST;

/** A storage buffer of `bytes` (rounded up to 16), zero-filled. */
export function storageBuffer(gpu: Gpu, bytes: number, label?: string): GPUBuffer {
  return gpu.device.createBuffer({ size: Math.max(16, Math.ceil(bytes / 16) * 16), usage: STORAGE, label });
}

/** A storage buffer holding `data` (its bytes, padded to a multiple of 16). */
export function uploadBuffer(gpu: Gpu, data: ArrayBufferView, label?: string): GPUBuffer {
  const buf = storageBuffer(gpu, data.byteLength, label);
  writeBytes(gpu, buf, 0, data);
  return buf;
}

/** queue.writeBuffer for any view, padding the write to a multiple of 4 bytes as WebGPU requires. */
export function writeBytes(gpu: Gpu, buf: GPUBuffer, offset: number, data: ArrayBufferView): void {
  let bytes = new Uint8Array(data.buffer as ArrayBuffer, data.byteOffset, data.byteLength);
  if (bytes.byteLength % 4 !== 0) {
    const padded = new Uint8Array(Math.ceil(bytes.byteLength / 4) * 4);
    padded.set(bytes);
    bytes = padded;
  }
  gpu.device.queue.writeBuffer(buf, offset, bytes);
}

/**
 * A uniform buffer holding 32-bit words (u32, or f32 given as numbers via `floats` indices); while
 * withSharedUniforms runs, the one already made with the same words.
 */
export function uniformBuffer(gpu: Gpu, words: ArrayLike<number>, floatAt: number[] = []): GPUBuffer {
  const n = Math.max(4, Math.ceil(words.length / 4) * 4);
  const data = packWords(words, floatAt, n);
  const shared = gpu.sharedUniforms;
  const key = shared ? data.join(",") : "";
  const hit = shared?.get(key);
  if (hit) return hit;
  const buf = gpu.device.createBuffer({
    size: n * 4,
    usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST,
  });
  gpu.device.queue.writeBuffer(buf, 0, data);
  shared?.set(key, buf);
  return buf;
}

/**
 * Runs `build` with the uniform parameter buffers it makes shared by contents through `shared` (uniformBuffer):
 * a buffer per distinct parameter block rather than one per kernel call, as a model's layers mostly take the
 * same parameters (a sequence's programs: 266 buffers and their writes for Llama-1B's prefill and decode
 * programs, ~31 us each of a program's build on the H100's host; docs/BENCHMARKS.md, the forty-fifth
 * session). The buffers stay the calls': releaseCalls destroys them, more than once where they are shared,
 * which WebGPU allows, so the calls built through one `shared` map must be released together, and its owner
 * destroys what the map holds then (a build that threw may have left buffers no call lists).
 */
export function withSharedUniforms<T>(gpu: Gpu, shared: Map<string, GPUBuffer>, build: () => T): T {
  const outer = gpu.sharedUniforms;
  gpu.sharedUniforms = shared;
  try {
    return build();
  } finally {
    gpu.sharedUniforms = outer;
  }
}

/** Packs numbers into a Uint32Array, bit-casting the entries at `floatAt` from f32. */
export function packWords(
  words: ArrayLike<number>,
  floatAt: number[] = [],
  length = words.length,
): Uint32Array<ArrayBuffer> {
  const out = new Uint32Array(length);
  const f = new Float32Array(out.buffer);
  for (let i = 0; i < words.length; i++) {
    if (floatAt.includes(i)) f[i] = words[i];
    else out[i] = words[i] >>> 0;
  }
  return out;
}

/**
 * Copies `bytes` from `src` (at `offset`) and maps them to the CPU. On Deno 2.9 this returns as soon as the
 * GPU is done, not ~11 ms later (kernels/readback.ts says how and when).
 */
export async function readBack(gpu: Gpu, src: GPUBuffer, bytes: number, offset = 0): Promise<ArrayBuffer> {
  const t0 = performance.now();
  const size = Math.ceil(bytes / 4) * 4;
  const staging = takeStaging(gpu, size);
  const enc = gpu.device.createCommandEncoder();
  enc.copyBufferToBuffer(src, offset, staging, 0, size);
  gpu.device.queue.submit([enc.finish()]); // now: what later writes do to `src` is not in this read
  await checkEarlyRead(gpu);
  const data = await readStaging(gpu, staging, bytes);
  const f = gpuSlowdown();
  if (f > 1) await new Promise((r) => setTimeout(r, (f - 1) * (performance.now() - t0)));
  return data;
}

/**
 * SWACTOR_SLOWDOWN=F (a number >= 1; default 1) emulates a GPU F times slower, to make a node of a local
 * cluster slower than the others (docs/NODE.md): each readBack, having waited W ms for the GPU's work, waits
 * (F - 1) x W more. A chain stage's steps (Engine.run) and the node's self-measurement, which times its
 * pieces by the wall clock when throttled (node/measure.ts), see it; the single-node decode loop does not.
 * Waits shorter than the timer's resolution (~1 ms) are stretched by more than F.
 */
export function gpuSlowdown(): number {
  return slowdown ??= slowdownFromEnv();
}
let slowdown: number | undefined;

function slowdownFromEnv(): number {
  const v = Deno.env.get("SWACTOR_SLOWDOWN");
  if (v === undefined || v === "") return 1;
  const f = Number(v);
  if (!(Number.isFinite(f) && f >= 1)) {
    throw new EnvError(`SWACTOR_SLOWDOWN must be a number >= 1 (how many times slower), got "${v}"`);
  }
  return f;
}

/** One dispatch, prepared once and encoded as often as needed (no per-use JavaScript work but the encode). */
export interface KernelCall {
  pipeline: GPUComputePipeline;
  bindGroup: GPUBindGroup;
  workgroups: [number, number, number];
  /** The buffers bound, in binding order (uniform parameter buffers are owned by the call). */
  buffers: GPUBuffer[];
  /** Other buffers the call owns (scratch space), freed with it by releaseCalls. */
  owned?: GPUBuffer[];
  label?: string;
}

/** Builds a KernelCall, binding `buffers` to bindings 0..n-1 in order. */
export function kernelCall(
  gpu: Gpu,
  pipe: GPUComputePipeline,
  buffers: GPUBuffer[],
  workgroups: [number, number?, number?],
  label?: string,
): KernelCall {
  const bindGroup = gpu.device.createBindGroup({
    layout: pipe.getBindGroupLayout(0),
    entries: buffers.map((buffer, binding) => ({ binding, resource: { buffer } })),
  });
  const [x, y = 1, z = 1] = workgroups;
  return { pipeline: pipe, bindGroup, workgroups: [x, y, z], buffers, label };
}

/** Encodes calls into one compute pass (WebGPU orders dispatches in a pass, with barriers between them). */
export function encodeCalls(pass: GPUComputePassEncoder, calls: readonly KernelCall[]): void {
  for (const c of calls) {
    pass.setPipeline(c.pipeline);
    pass.setBindGroup(0, c.bindGroup);
    pass.dispatchWorkgroups(c.workgroups[0], c.workgroups[1], c.workgroups[2]);
  }
}

/** Destroys the uniform parameter buffers the calls own (the shared step buffer is storage, not theirs). */
export function releaseCalls(calls: Iterable<KernelCall>, keep?: GPUBuffer): void {
  for (const c of calls) {
    for (const b of c.buffers) if (b !== keep && (b.usage & GPUBufferUsage.UNIFORM) !== 0) b.destroy();
    for (const b of c.owned ?? []) b.destroy();
  }
}

/** `calls` in one compute pass of a finished command buffer, to submit now or later. */
export function commandBuffer(gpu: Gpu, calls: readonly KernelCall[]): GPUCommandBuffer {
  const enc = gpu.device.createCommandEncoder();
  const pass = enc.beginComputePass();
  encodeCalls(pass, calls);
  pass.end();
  return enc.finish();
}

/**
 * Lets timers and I/O run (membership, the control API, signals) between bounded pieces of GPU work: one turn
 * of the event loop, by setImmediate (Deno runs a zero setTimeout ~2 ms late, idling the GPU while it waits).
 */
export const yieldToEventLoop = (): Promise<void> => new Promise<void>((r) => setImmediate(r));

/** Runs calls in one submit and waits for the GPU (tests and one-off work; the decode loop does not wait). */
export async function runCalls(gpu: Gpu, calls: readonly KernelCall[]): Promise<void> {
  gpu.device.queue.submit([commandBuffer(gpu, calls)]);
  await gpu.device.queue.onSubmittedWorkDone();
}

/** The WGSL preamble and scalar type name for a weight type. */
export function weightType(wt: WeightType): { enable: string; type: string } {
  return wt === "f16" ? { enable: "enable f16;", type: "f16" } : { enable: "", type: "f32" };
}

/** ceil(a / b) for positive integers. */
export function ceilDiv(a: number, b: number): number {
  return Math.floor((a + b - 1) / b);
}
