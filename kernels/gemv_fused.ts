// The decode-path GEMV, fused: y[t, n] (+)= sum_k f(x)[t, k] * W[n, k] for T <= 4 rows, where the input
// transform f is one of
//   "none"      x as is
//   "rmsnorm"   x / sqrt(mean(x^2) + eps) * normWeight   (RMSNorm folded into the next projection)
//   "silu_mul"  silu(x[k]) * x[I + k] on a fused gate/up row of width 2K   (the MLP's middle, folded into down)
// so a Llama layer decodes in 6 dispatches instead of 9. Each thread moves 16 bytes per load: f16 weights
// are read as vec4<u32> (8 halves, unpacked with unpack2x16float, so no shader-f16 is needed), f32 weights
// as two vec4<f32>. A workgroup of 256 threads is split into teams of `team` threads, each team owning
// `rows` rows, reduced in workgroup memory. Needs K % 8 == 0; matmul.ts's kernels stay the reference
// and serve every other shape. q8 / q4 weights (K % 32 == 0) use matmul_quant.ts's variant of this kernel.
import {
  ceilDiv,
  type Gpu,
  type KernelCall,
  kernelCall,
  memoSource,
  pipeline,
  storageBuffer,
  uniformBuffer,
  type WeightType,
} from "./gpu.ts";
import {
  checkSgTuning,
  DIRECT_MAX_N,
  gemvSgSource,
  sgDefaultTuning,
  sgDirectTuning,
  sgFits,
  sgGroups,
  type SgTuning,
} from "./gemv_sg.ts";
import {
  checkMultiTuning,
  gemvInt8InputCall,
  gemvMultiSource,
  multiDefaultTuning,
  multiDirectTuning,
  multiFits,
  multiGroups,
  multiTileK,
  type MultiTuning,
} from "./gemv_multi.ts";
import { gemvQuantSource, quantUnit } from "./matmul_quant.ts";
import { RMS_PROLOGUE, siluMulVec4, TEAM_REDUCE_STORE } from "./wgsl.ts";

export { TEAM_REDUCE_STORE };
import { isQuant, QUANT_GROUP, quantFits, quantScaleWord, type QuantType } from "./quant.ts";

export type InputTransform = "none" | "rmsnorm" | "silu_mul";

const THREADS = 256;

export interface GemvTuning {
  /** Threads per team (a power of two, 4..256). */
  team: number;
  /** Rows per team. */
  rows: number;
  /** Most workgroups launched; each loops over row blocks. 0: one block per workgroup. */
  groups?: number;
}

// The GEMV sources, kept by shape (kernels/gpu.ts memoSource).
const multiSources = memoSource(gemvMultiSource);
const sgSources = memoSource(gemvSgSource);
const quantTeamSources = memoSource(gemvQuantSource);
const teamSources = memoSource(source);

/**
 * Team shape by matrix shape, from scripts/bench/gemv.ts on the H200 (docs/BENCHMARKS.md): long rows
 * want one wide team, many rows want small teams with several rows each; small K (tiny models) scales
 * the team with K so each thread still makes ~8 loads.
 */
export function defaultTuning(K: number, N: number): GemvTuning {
  if (K >= 8192) return { team: 128, rows: 1 };
  if (K >= 2048) {
    if (N >= 65536) return { team: 16, rows: 4 };
    if (N >= 8192) return { team: 32, rows: 2 };
    return { team: 64, rows: 1 };
  }
  let team = 4;
  while (team < 64 && team * 8 < K / 8) team *= 2;
  return { team, rows: 2 };
}

function source(wt: WeightType, f: InputTransform, tune: GemvTuning, nwt: WeightType): string {
  const { team, rows } = tune;
  const f16 = wt === "f16";
  const nf16 = nwt === "f16";
  // W8(i): the 8 weights of unit i as two vec4<f32>.
  const wDecl = f16 ? "array<vec4<u32>>" : "array<vec4<f32>>";
  const wLoad = f16
    ? `let wv = W[i];
      let wa = vec4<f32>(unpack2x16float(wv.x), unpack2x16float(wv.y));
      let wb = vec4<f32>(unpack2x16float(wv.z), unpack2x16float(wv.w));`
    : `let wa = W[2u * i];
      let wb = W[2u * i + 1u];`;
  const nwLoad = nf16
    ? `let nv = nw[j];
      let na = vec4<f32>(unpack2x16float(nv.x), unpack2x16float(nv.y));
      let nb = vec4<f32>(unpack2x16float(nv.z), unpack2x16float(nv.w));`
    : `let na = nw[2u * j];
      let nb = nw[2u * j + 1u];`;
  const xStride = f === "silu_mul" ? "2u * k4" : "k4";
  let xLoad = `var xa = x[xrow + 2u * j];
      var xb = x[xrow + 2u * j + 1u];`;
  if (f === "rmsnorm") xLoad += `\n      ${nwLoad}\n      xa = xa * inv * na;\n      xb = xb * inv * nb;`;
  if (f === "silu_mul") {
    xLoad += `
      let ua = x[xrow + k4 + 2u * j];
      let ub = x[xrow + k4 + 2u * j + 1u];
      xa = ${siluMulVec4("xa", "ua")};
      xb = ${siluMulVec4("xb", "ub")};`;
  }
  const norm = f !== "rmsnorm" ? "" : RMS_PROLOGUE;
  return `
struct P { K: u32, N: u32, T: u32, acc: u32, x_row0: u32, eps: f32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> W: ${wDecl};
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
${f === "rmsnorm" ? `@group(0) @binding(4) var<storage, read> nw: array<vec4<${nf16 ? "u32" : "f32"}>>;` : ""}
const TH = ${THREADS}u;
const TEAM = ${team}u;
const R = ${rows}u;
var<workgroup> part: array<f32, ${Math.max(THREADS * rows, THREADS)}>;
@compute @workgroup_size(${THREADS})
fn main(
  @builtin(workgroup_id) wg: vec3<u32>,
  @builtin(local_invocation_id) lid: vec3<u32>,
  @builtin(num_workgroups) ng: vec3<u32>,
) {
  let tid = lid.x;
  let team = tid / TEAM;
  let lane = tid % TEAM;
  let t = wg.y;
  let k4 = p.K / 4u;
  let k8 = p.K / 8u;
  let xrow = (p.x_row0 + t) * ${xStride};
  ${norm}
  let nblk = (p.N + TH / TEAM * R - 1u) / (TH / TEAM * R);
  for (var blk = wg.x; blk < nblk; blk += ng.x) {
  let n0 = (blk * (TH / TEAM) + team) * R;
  var acc: array<f32, ${rows}>;
  for (var j = lane; j < k8; j += TEAM) {
      ${xLoad}
    for (var r = 0u; r < R; r++) {
      let i = min(n0 + r, p.N - 1u) * k8 + j;
      ${wLoad}
      acc[r] += dot(wa, xa) + dot(wb, xb);
    }
  }
${TEAM_REDUCE_STORE}
  }
}`;
}

export interface GemvFusedDims {
  /** Input features (for silu_mul: the width of the gate half; the input row is 2K wide). */
  K: number;
  /** Output features. */
  N: number;
  /** Rows (tokens), at most 4 in practice. */
  T: number;
  accumulate?: boolean;
  xRow0?: number;
  /** Matrix storage; q8 / q4 need K % 32 == 0. */
  weights: WeightType | QuantType;
  /** Norm weight storage (transform "rmsnorm"). Default: `weights` when that is a float type, else f32. */
  normWeights?: WeightType;
  transform?: InputTransform;
  /** RMSNorm epsilon (transform "rmsnorm"). */
  eps?: number;
  /** A team tuning forces this file's kernel; a subgroup tuning gemv_sg.ts's. Default: the best that fits. */
  tuning?: GemvTuning | SgTuning;
  /**
   * Steps of 2..GEMV_MULTI_MAX_T rows use gemv_multi.ts's kernel (each weight read once for all rows) where
   * it fits; this tunes it. `false` forces the one-row kernels (a grid row per token; benchmarks).
   */
  multi?: MultiTuning | false;
  /**
   * The MLP's paired gate/up: `w` is [gate; up] (2N rows of K) and y[t, n] = silu(gate_n . f(x)) *
   * (up_n . f(x)), N wide, written (not accumulated). Only the subgroup kernels (gemv_sg.ts, gemv_multi.ts)
   * pair: check gemvPairFits first.
   */
  pairs?: boolean;
  /**
   * A one-token step (T = 1) of q4 weights may take the int8 direct multi-token GEMV (multiInt8Serves),
   * whose inputs the kernels before write as int8 copies: set by blocks whose GEMVs hand each other those
   * copies all the way round a layer (BlockContext.int8One: models without MoE layers), by gemvFusedCalls
   * for a GEMV given such a copy, and on the dims a producer asks int8CopyFor with.
   */
  int8One?: boolean;
}

type GemvPath = "multi" | "sg" | "team";

/** Which kernel gemvFusedCall runs for a shape without an explicit tuning (gpu.tuning's switches applied). */
function gemvPath(
  gpu: Gpu,
  K: number,
  T: number,
  wt: WeightType | QuantType,
  multi?: MultiTuning | false,
): GemvPath {
  // Not by default for q4: on the H200 (2026-12-01) a k = 8 step with one grid row per token cost 3.24-3.31x
  // a one-token step, against 4.01x with the staged multi-token kernel's int8 activations, 4.86x in direct
  // mode and 5.3x staged with f32 activations (docs/BENCHMARKS.md). When forced (`multi` or gpu.tuning.multi), q4 stages int8 activations where
  // WGSL has dp4 (multiDp4). q8 keeps f32 activations: they keep the fixtures' greedy tokens where int8 ones
  // flip near-ties in short prompts' steps.
  const multiOn = multi !== undefined ? multi !== false : gpu.tuning.multi ?? wt !== "q4";
  if (multiOn && (T >= 2 || multi) && multiFits(gpu, K, T, wt)) return "multi";
  if (gpu.tuning.gemv !== "team" && sgFits(gpu, K, wt)) return "sg";
  return "team";
}

/**
 * Whether the decode MLP pairs gate and up in one GEMV for T rows of K (gpu.tuning.pairGateUp, default on,
 * and a subgroup kernel serves the shape; else the gate/up GEMV writes [T, 2N] and down reads silu_mul).
 */
export function gemvPairFits(gpu: Gpu, K: number, T: number, wt: WeightType | QuantType): boolean {
  return gpu.tuning.pairGateUp !== false && gemvFusedFits(K) && gemvPath(gpu, K, T, wt) !== "team";
}

/**
 * Whether a multi-token GEMV runs in direct mode (x read in place, K split over warps): f32, f16 and q8
 * weights with no transform or RMSNorm, unless gpu.tuning.multiDirect is false; q4 only when it is true
 * (H200, Llama-1B k = 8 step over the one-token step, 2026-12-01: q8 2.34x direct against 4.94x staged,
 * q4 4.86x direct against 4.01x staged with int8 activations); silu_mul always stages x.
 */
function multiDirectServes(gpu: Gpu, f: InputTransform, wt: WeightType | QuantType): boolean {
  if (f === "silu_mul") return false;
  return wt === "q4" ? gpu.tuning.multiDirect === true : gpu.tuning.multiDirect !== false;
}

/** Whether the multi-token GEMV stages int8 activations by default (q4 where WGSL has dp4). */
function multiDp4(gpu: Gpu, wt: WeightType | QuantType): boolean {
  return gpu.hasDp4 && gpu.tuning.dp4 !== false && wt === "q4";
}

/**
 * The key of a GEMV's shape in gpu.tuning.gemvTunings: weights, transform, "pairs" for the paired gate/up,
 * N x K (N: rows, pairs for the paired one), and for the multi-token kernel " T" and its tokens, e.g.
 * "f16 rmsnorm pairs 8192x2048" (the one-row subgroup kernel, any T) or "f16 none 2048x8192 T8".
 */
export function gemvTuningKey(
  wt: string,
  f: InputTransform,
  N: number,
  K: number,
  pairs = false,
  multiT?: number,
): string {
  return `${wt} ${f}${pairs ? " pairs" : ""} ${N}x${K}${multiT === undefined ? "" : ` T${multiT}`}`;
}

/** A default tuning `t` with gpu.tuning.gemvTunings' fields for `key` (gemvTuningKey) applied, if any. */
function withShapeTuning<T extends SgTuning | MultiTuning>(gpu: Gpu, t: T, key: string): T {
  const over = gpu.tuning.gemvTunings?.[key];
  return over ? { ...t, ...over } as T : t;
}

/** A default tuning with gpu.tuning's prefetch choice applied (undefined: the default's own). */
function withPrefetch<T extends { prefetch?: boolean }>(t: T, prefetch: boolean | undefined): T {
  return prefetch === undefined ? t : { ...t, prefetch };
}

/** A default subgroup tuning with gpu.tuning's deferNorm and earlyX choices applied (undefined: the default's own). */
function withPrologue(t: SgTuning, deferNorm: boolean | undefined, earlyX: boolean | undefined): SgTuning {
  return {
    ...t,
    ...(deferNorm === undefined ? {} : { deferNorm }),
    ...(earlyX === undefined ? {} : { earlyX }),
  };
}

function isSgTuning(t: GemvTuning | SgTuning | undefined): t is SgTuning {
  return t !== undefined && "unroll" in t;
}

/** Whether this kernel handles the shape (else use matmulCall, with separate rmsnorm / silu_mul). */
export function gemvFusedFits(K: number): boolean {
  return K % 8 === 0;
}

/** A GEMV's buffers: input rows, matrix, output rows and (transform "rmsnorm") the norm weights. */
export interface GemvBuffers {
  x: GPUBuffer;
  w: GPUBuffer;
  y: GPUBuffer;
  normWeight?: GPUBuffer;
}

/** The int8 copy of a GEMV's T input rows (int8BlocksWgsl's layout): the words and the blocks' scales. */
export interface Int8Copy {
  q: GPUBuffer;
  s: GPUBuffer;
  /**
   * For a consumer with RMSNorm: each block of 32's sum of squares of the unnormalised rows ([T, K / 32]
   * f32). The copy then holds x * norm weight, and the consumer scales its sums by 1 / rms from these (the
   * row's common factor leaves the codes unchanged; the block scales carry it).
   */
  ssq?: GPUBuffer;
}

/**
 * The f32 copy of an RMSNorm GEMV's input that the GEMV before it wrote (floatCopyFor; the f32 direct
 * multi-token GEMV's counterpart of Int8Copy with `ssq`): x times the consumer's norm weights ([T, K] f32),
 * and `parts` partial sums of squares of x a row ([T, parts] f32, one per producer workgroup), from which
 * the consumer takes 1 / rms. The consumer reads it as its x with no transform: no norm weight and no x^2
 * in its inner loop, which every row block otherwise repeats.
 */
export interface FloatCopy {
  x: GPUBuffer;
  ssq: GPUBuffer;
  parts: number;
}

/** A FloatCopy with the norm weights its producer multiplies by. */
export type FloatCopyOut = FloatCopy & { norm: { w: GPUBuffer; type: WeightType } };

/** The copy of a GEMV's input made by the kernel before it: int8 (the int8 direct mode) or f32. */
export type InputCopy = Int8Copy | FloatCopy;
export type InputCopyOut = Int8CopyOut | FloatCopyOut;

export function isFloatCopy(c: InputCopy): c is FloatCopy {
  return "x" in c;
}

/**
 * The GEMV of a block (the decode and k-step programs' linear layers): gemvFusedCall's one dispatch, or,
 * where the int8 direct multi-token GEMV serves (multiInt8Serves), the pass making the int8 copy of f(x)'s
 * T rows and then that GEMV. `copyIn`: that copy was made by the kernel before (int8CopyFor; then no pass).
 * `copyOut`: this GEMV also writes the int8 copy of its output for the GEMV after it (int8CopyOutFits).
 * Either may be an f32 copy instead (FloatCopy, normCopyFor), for the f32 direct multi-token GEMV. A GEMV given
 * an int8 copy takes the int8 direct mode at one token too (GemvFusedDims.int8One), as its producer asked
 * int8CopyFor for it.
 */
export function gemvFusedCalls(
  gpu: Gpu,
  bufs: GemvBuffers & { copyIn?: InputCopy; copyOut?: InputCopyOut },
  dims: GemvFusedDims,
): KernelCall[] {
  const { copyIn, copyOut } = bufs;
  const d = copyIn && !isFloatCopy(copyIn) ? { ...dims, int8One: true } : dims;
  if (!multiInt8Serves(gpu, d)) {
    if ((copyIn && !isFloatCopy(copyIn)) || (copyOut && !isFloatCopy(copyOut))) {
      throw new RangeError("an int8 copy of x needs the int8 direct multi-token GEMV");
    }
    const fIn = copyIn as FloatCopy | undefined;
    const call = gemvFusedCall(gpu, { ...bufs, copyIn: fIn }, d);
    // A copy made for this GEMV by the kernel before it is released with this GEMV's call.
    if (fIn) call.owned = [fIn.x, fIn.ssq];
    return [call];
  }
  if ((copyIn && isFloatCopy(copyIn)) || (copyOut && isFloatCopy(copyOut))) {
    throw new RangeError("an f32 copy of x needs the f32 direct multi-token GEMV");
  }
  const i8In = copyIn as Int8Copy | undefined, i8Out = copyOut as Int8CopyOut | undefined;
  const wt = d.weights as QuantType;
  const f = d.transform ?? "none";
  const input = copyIn ? undefined : gemvInt8InputCall(gpu, bufs, {
    K: d.K,
    T: d.T,
    wt,
    transform: f,
    normWeights: d.normWeights ?? "f32",
    xRow0: d.xRow0,
    eps: d.eps,
  });
  const multi = int8Tuning(
    gpu,
    d,
    i8Out !== undefined,
    i8Out?.norm ? int8NormCopyMaxThreads(gpu, d.T) : Infinity,
  );
  if (!multi) throw new RangeError("no int8 copy of the output for this shape: check int8CopyOutFits");
  const xq = i8In ?? { q: input!.xq, s: input!.xqs };
  const gemv = gemvFusedCall(gpu, { ...bufs, copyIn: undefined, copyOut: i8Out, xq }, {
    ...d,
    multi,
    copyOut: i8Out?.weights,
  });
  // A copy made for this GEMV by the kernel before it is released with this GEMV's call.
  if (i8In) gemv.owned = [...(gemv.owned ?? []), i8In.q, i8In.s, ...(i8In.ssq ? [i8In.ssq] : [])];
  return input ? [input.call, gemv] : [gemv];
}

/**
 * The int8 direct mode's tuning; with `copyOut` a workgroup's rows made whole blocks of 32 (more warps:
 * the copy's blocks are quantised by the workgroup that wrote them) where that stays within `maxThreads`,
 * else the copy made by the last workgroup of each block (`arrive`, where that serves), else undefined.
 */
function int8Tuning(
  gpu: Gpu,
  d: GemvFusedDims,
  copyOut: boolean,
  maxThreads = Infinity,
): MultiTuning | undefined {
  const S = gpu.subgroupSize!;
  const f = d.transform ?? "none";
  const base = multiDirectTuning(d.K, d.N, d.T, d.weights, S, d.pairs, gpu.tuning);
  // RMSNorm GEMVs (qkv, the LM head) from 8 tokens: 2 rows a warp, not 4 (H200, Llama-1B q4 k = 8 step,
  // 2026-12-02, each timed in the step alone: qkv 1.005-1.008 -> 0.991 ms, the LM head -> 0.997; o_proj
  // and down were no faster with 2, the paired gate/up slower with 1 pair).
  const rows = f === "rmsnorm" && !d.pairs && d.T >= 8 && gpu.tuning.multiRows === undefined ? 2 : base.rows;
  const key = gemvTuningKey(d.weights, f, d.N, d.K, d.pairs, d.T);
  const { arrive: asked, ...t } = { ...withShapeTuning(gpu, { ...base, rows }, key), dp4: true };
  if (!copyOut) return t;
  if (d.N % 32 !== 0 || 32 % t.rows !== 0) return undefined;
  // The last workgroup of each block of 32 rows quantising it (MultiTuning `arrive`), where a workgroup's
  // rows divide 32: by default up to INT8_COPY_ARRIVE_MAX_T rows, where whole-block workgroups would be
  // wider than maxThreads; gpu.tuning.multiInt8CopyArrive true / false (or the shape's gemvTunings
  // `arrive`): wherever it serves / never.
  const rowsWg = (t.wg / S / (t.splitK ?? 1)) * t.rows;
  const force = asked ?? gpu.tuning.multiInt8CopyArrive;
  const arrive = force !== false && 32 % rowsWg === 0 && (force === true || d.T <= INT8_COPY_ARRIVE_MAX_T)
    ? { ...t, arrive: true }
    : undefined;
  if (force === true && arrive) return arrive;
  const per = 32 / t.rows; // row blocks (warp groups of splitK) a workgroup needs, or a multiple
  const max = gpu.device.limits.maxComputeInvocationsPerWorkgroup;
  // splitK halved where the wider workgroup would not fit.
  for (let sk = t.splitK ?? 1; sk >= 1; sk /= 2) {
    const wg = Math.ceil(t.wg / S / (t.splitK ?? 1) / per) * per * sk * S;
    if (wg <= max) return wg <= maxThreads ? { ...t, splitK: sk, wg } : arrive;
  }
  return arrive;
}

/**
 * The most rows for which copies made by the last workgroup of a block (MultiTuning `arrive`) are taken by
 * default. H200, Llama-1B k-steps, GPU ms (2026-12-02, fifteenth session; down then writing qkv's input, and
 * at k = 16 o_proj gate/up's): q4 k = 2 / 4 / 8 / 16 0.654 / 0.788 / 0.967-0.974 / 1.758-1.761 against
 * 0.666-0.667 / 0.790-0.791 / 0.984-0.985 / 1.648-1.649 without; q8 k = 4 / 8 0.921 / 1.084-1.091 against
 * 0.926-0.928 / 1.108-1.109, k = 16 the same.
 */
export const INT8_COPY_ARRIVE_MAX_T = 8;

/**
 * The int8 copy of x a GEMV (the consumer, dims `d`) reads, for the kernel before it to write (the
 * attention, a paired gate/up GEMV: int8CopyOutFits): buffers of T rows of K, or undefined where the
 * consumer does not take the int8 direct mode (it then makes its own copy or none) or
 * gpu.tuning.multiInt8Copies is false. The consumer's call (gemvFusedCalls with `copyIn`) owns them.
 */
export function int8CopyFor(gpu: Gpu, d: GemvFusedDims, normWeight?: GPUBuffer): Int8CopyOut | undefined {
  const f = d.transform ?? "none";
  if (
    gpu.tuning.multiInt8Copies === false || !multiInt8Serves(gpu, d) || (d.xRow0 ?? 0) !== 0 ||
    !(f === "none" || (f === "rmsnorm" && normWeight && gpu.tuning.multiInt8NormCopies !== false))
  ) return undefined;
  return {
    ...int8CopyBuffers(gpu, d.T, d.K, f === "rmsnorm"),
    weights: d.weights as QuantType,
    ...(f === "rmsnorm" ? { norm: { w: normWeight!, type: d.normWeights ?? "f32" } } : {}),
  };
}

/** The buffers of an int8 copy of T rows of K (Int8Copy), with the blocks' sums of squares where `ssq`. */
export function int8CopyBuffers(gpu: Gpu, T: number, K: number, ssq: boolean): Int8Copy {
  return {
    q: storageBuffer(gpu, T * K, "int8 copy of x"),
    s: storageBuffer(gpu, (T * K) / QUANT_GROUP * 8, "int8 copy of x, scales"),
    ...(ssq ? { ssq: storageBuffer(gpu, (T * K) / QUANT_GROUP * 4, "int8 copy of x, sums of squares") } : {}),
  };
}

/**
 * The f32 direct multi-token GEMV's tuning where gemvFusedCall takes that kernel for `d` (f32 / f16 weights,
 * q8 below T = 4, q4 when forced: gemvPath, multiDirectServes) with none forced by the call, else undefined
 * (also where the shape's gemvTunings turn direct mode off).
 */
function floatDirectTuning(gpu: Gpu, d: GemvFusedDims): MultiTuning | undefined {
  const f = d.transform ?? "none";
  if (
    d.multi !== undefined || d.tuning !== undefined || !gemvFusedFits(d.K) || multiInt8Serves(gpu, d) ||
    gemvPath(gpu, d.K, d.T, d.weights) !== "multi" || !multiDirectServes(gpu, f, d.weights)
  ) return undefined;
  // The tuning gemvFusedCall takes (a copy's partials are its workgroups).
  const t = shapedDirectTuning(gpu, d);
  return t.direct ? t : undefined;
}

/** The direct multi-token GEMV's tuning for `d` with its shape's gemvTunings applied, as gemvFusedCall runs it. */
function shapedDirectTuning(gpu: Gpu, d: GemvFusedDims): MultiTuning {
  const pairs = d.pairs === true;
  return withShapeTuning(
    gpu,
    multiDirectTuning(d.K, d.N, d.T, d.weights, gpu.subgroupSize!, pairs, gpu.tuning),
    gemvTuningKey(d.weights, d.transform ?? "none", d.N, d.K, pairs, d.T),
  );
}

/**
 * The fewest rows for which f32 copies pay. H200, Llama-1B f16 k-steps over a one-token step (2026-12-02):
 * k = 2 / 4 / 8 / 16 1.08 / 1.14 / 1.53 / 4.07-4.25x with them against 1.05 / 1.24-1.25 / 1.63-1.65 /
 * 4.21-4.27x without.
 */
export const FLOAT_NORM_COPY_MIN_T = 4;

/**
 * The f32 copy of an RMSNorm GEMV's input (`consumer`) for the GEMV before it (`producer`, whose output
 * rows are that input) to write, where both take the f32 direct multi-token GEMV and
 * gpu.tuning.multiFloatNormCopies is not false; else undefined. The consumer's call (gemvFusedCalls with
 * `copyIn`) owns the buffers.
 */
export function floatCopyFor(
  gpu: Gpu,
  producer: GemvFusedDims,
  consumer: GemvFusedDims,
  normWeight: GPUBuffer,
): FloatCopyOut | undefined {
  if (
    gpu.tuning.multiFloatNormCopies === false || consumer.T < FLOAT_NORM_COPY_MIN_T ||
    (consumer.transform ?? "none") !== "rmsnorm" ||
    (consumer.xRow0 ?? 0) !== 0 || (producer.xRow0 ?? 0) !== 0 || producer.pairs === true ||
    (producer.transform ?? "none") === "silu_mul" || producer.T !== consumer.T || producer.N !== consumer.K
  ) return undefined;
  const t = floatDirectTuning(gpu, producer);
  if (!t || !floatDirectTuning(gpu, consumer)) return undefined;
  const parts = multiGroups(producer.N, t, gpu.subgroupSize!);
  const { T, K } = consumer;
  return {
    x: storageBuffer(gpu, T * K * 4, "f32 copy of x"),
    ssq: storageBuffer(gpu, T * parts * 4, "f32 copy of x, sums of squares"),
    parts,
    norm: {
      w: normWeight,
      type: consumer.normWeights ?? (isQuant(consumer.weights) ? "f32" : consumer.weights),
    },
  };
}

/**
 * The copy of an RMSNorm GEMV's input (`consumer`, norm weights `normWeight`) for the GEMV before it
 * (`producer`) to write: int8 where both take the int8 direct mode and the producer's widened workgroups
 * stay within int8NormCopyMaxThreads (int8CopyFor), else f32 where both take the f32 direct mode
 * (floatCopyFor), else undefined (the consumer normalises x itself).
 */
export function normCopyFor(
  gpu: Gpu,
  producer: GemvFusedDims,
  consumer: GemvFusedDims,
  normWeight: GPUBuffer,
): InputCopyOut | undefined {
  if (int8CopyOutFits(gpu, producer, int8NormCopyMaxThreads(gpu, producer.T))) {
    const c = int8CopyFor(gpu, consumer, normWeight);
    if (c) return c;
  }
  return floatCopyFor(gpu, producer, consumer, normWeight);
}

/**
 * The int8 copy a producer writes for its consumer (int8CopyFor): in the consumer's weight layout, and for
 * an RMSNorm consumer with its norm weights (the producer multiplies by them and writes `ssq`).
 */
export type Int8CopyOut = Int8Copy & {
  weights: QuantType;
  norm?: { w: GPUBuffer; type: WeightType };
  /**
   * With `norm`, for a MoE block's fused expert kernel (moe_fused.ts `input: "copy"`): the producer also
   * writes its router's partial logits, block by block of 32 rows (gemv_multi.ts routerPartsWgsl): `w` the
   * router (f32 [experts, K]), `parts` [T, K / 32, experts] f32.
   */
  router?: RouterParts;
};

/** A MoE router's partial logits that the GEMV before the block writes (Int8CopyOut.router). */
export interface RouterParts {
  w: GPUBuffer;
  experts: number;
  parts: GPUBuffer;
}

/**
 * Whether a GEMV (the producer, dims `d`) can write the int8 copy of its output (gemvFusedCalls' copyOut).
 * `maxThreads`: only where its workgroups, widened to whole blocks of 32 rows, have at most this many threads.
 */
export function int8CopyOutFits(gpu: Gpu, d: GemvFusedDims, maxThreads = Infinity): boolean {
  return multiInt8Serves(gpu, d) && int8Tuning(gpu, d, true, maxThreads) !== undefined;
}

/**
 * Whether a GEMV (the producer, dims `d`) can write the int8 copy of its output for an RMSNorm consumer
 * (with the norm weights and the blocks' sums of squares), within the widths where that pays; with `arrive`
 * false, only by workgroups of whole blocks (not the last workgroup of each block, MultiTuning `arrive`).
 */
export function int8NormCopyOutFits(gpu: Gpu, d: GemvFusedDims, o: { arrive?: boolean } = {}): boolean {
  if (!multiInt8Serves(gpu, d)) return false;
  const t = int8Tuning(gpu, d, true, int8NormCopyMaxThreads(gpu, d.T));
  return t !== undefined && (o.arrive !== false || !t.arrive);
}

/**
 * The widest producer workgroup for which an RMSNorm consumer's input copy pays (int8CopyOutFits' maxThreads;
 * models/blocks/gqa.ts, o_proj for gate/up). H200, Llama-1B k-steps over a one-token step
 * (2026-12-01, eighth session), copies against gate/up's input pass: q4 (o_proj's workgroups widened
 * to 512 threads) 0.98 / 1.16 / 1.47x against 1.02 / 1.22 / 1.53x at k = 2 / 4 / 8; with 1,024 threads slower:
 * q4 k = 16 2.57 against 2.44x, q8 k = 8 1.37 against 1.30x.
 */
export const INT8_NORM_COPY_MAX_THREADS = 512;

/**
 * The widest producer workgroup for an RMSNorm consumer's int8 copy at T rows: INT8_NORM_COPY_MAX_THREADS,
 * or 1,024 for one-token steps, where down (widened to 1,024 threads) writing the next layer's qkv input is
 * what lets the one-token int8 chain pay (oneTokenInt8); at k = 8 the same copy lost (H200, Llama-1B q4 k = 8
 * step 0.983-0.986 -> 1.156-1.158 ms). gpu.tuning.multiInt8NormCopyThreads overrides both.
 */
function int8NormCopyMaxThreads(gpu: Gpu, T: number): number {
  return gpu.tuning.multiInt8NormCopyThreads ?? (T === 1 ? 1024 : INT8_NORM_COPY_MAX_THREADS);
}

/**
 * Whether gemvFusedCalls takes the int8 direct multi-token GEMV: q8 / q4 weights, 2..16 rows (or one row,
 * oneTokenInt8) where the multi-token GEMV fits, WGSL's dp4, and no kernel forced by the call.
 * gpu.tuning.multiInt8 true / false forces it on / off; by default it serves q4 at every k and q8 from k = 4 (H200, Llama-1B k-step over the
 * one-token step, 2026-12-01 seventh session: q4 k = 2 / 4 / 8 / 16 1.20 / 1.38 / 1.68 / 2.46x against one
 * grid row per token's 1.31 / 2.04 / 3.24 / 5.76x; q8 1.20 / 1.24 / 1.43 / 2.02x against the f32 direct
 * mode's 1.12 / 1.59 / 2.34 / 6.92x), where the one-token step's GEMV also multiplies int8 activations
 * (gemv_sg.ts with dp4: the k-step then rounds x as the one-token step does, and the fixtures' short rows
 * keep f32 activations, whose greedy tokens int8 ones can flip at near-ties), unless another multi-token
 * kernel is forced (gpu.tuning.multi, multiDirect or multiStage set: the A/B runs' and tests' ways of
 * asking for the older paths).
 */
function multiInt8Serves(gpu: Gpu, d: GemvFusedDims): boolean {
  const t = gpu.tuning;
  const on = t.multiInt8 ??
    (t.multi === undefined && t.multiDirect === undefined && t.multiStage === undefined &&
      t.dp4 !== false && sgFits(gpu, d.K, d.weights) && (d.weights === "q4" || d.T >= 4));
  return on && isQuant(d.weights) && gpu.hasDp4 && gpu.subgroupSize !== undefined &&
    t.gemv !== "team" && (d.T >= 2 || oneTokenInt8(gpu, d)) && d.multi === undefined &&
    d.tuning === undefined &&
    gemvFusedFits(d.K) && multiFits(gpu, d.K, d.T, d.weights);
}

/**
 * Whether a one-token GEMV takes the int8 direct mode: q4 weights in blocks that chain int8 copies
 * (GemvFusedDims.int8One), unless gpu.tuning.multiInt8One says otherwise (true: every quantised one-token
 * GEMV where the mode fits; false: none). With the copies, every such GEMV of a layer reads an input the
 * kernel before quantised (the attention for o_proj, o_proj for gate/up, gate/up for down, down for the
 * next layer's qkv or the LM head), so no workgroup quantises x itself: H200, Llama-1B q4 step 0.675-0.679
 * -> 0.644-0.646 ms, decode 1,468-1,478 -> 1,537-1,563 tok/s (2026-12-02, thirteenth session). Without
 * down's copy (each qkv making its own input) it was 0.680 against 0.676-0.678: no gain.
 */
function oneTokenInt8(gpu: Gpu, d: GemvFusedDims): boolean {
  return gpu.tuning.multiInt8One ?? (d.int8One === true && d.weights === "q4");
}

export function gemvFusedCall(
  gpu: Gpu,
  bufs: GemvBuffers & {
    /** The int8 copy of f(x) (gemvInt8InputCall), for a `multi` tuning with direct and dp4. */
    xq?: Int8Copy;
    /**
     * With d.copyOut: the int8 copy of y to write (int8CopyFor); with `norm`, of y times those weights, and
     * each block's sum of squares of y. Or, in the f32 direct multi-token mode, the f32 copy (floatCopyFor).
     */
    copyOut?: InputCopyOut;
    /** The f32 direct multi-token mode: x's copy made by the GEMV before (x and normWeight then unused). */
    copyIn?: FloatCopy;
  },
  d: GemvFusedDims & { copyOut?: QuantType },
): KernelCall {
  if (!gemvFusedFits(d.K)) throw new RangeError(`fused GEMV needs K % 8 == 0, got K = ${d.K}`);
  const wt = d.weights;
  if (isQuant(wt) && !quantFits(d.K)) throw new RangeError(`${wt} weights need K % 32 == 0, got K = ${d.K}`);
  const nwt = d.normWeights ?? (isQuant(wt) ? "f32" : wt);
  const f = d.transform ?? "none";
  if (f === "rmsnorm" && !bufs.normWeight) throw new TypeError("rmsnorm transform needs normWeight");
  const pairs = d.pairs === true;
  if (pairs && d.accumulate) {
    throw new RangeError("a paired gate/up GEMV writes its output; it cannot accumulate");
  }
  // The matrix's rows: paired, the gate and the up halves.
  const soff = isQuant(wt) ? quantScaleWord(pairs ? 2 * d.N : d.N, d.K, wt) : 0;
  const params = uniformBuffer(gpu, [d.K, d.N, d.T, d.accumulate ? 1 : 0, d.xRow0 ?? 0, d.eps ?? 0, soff], [
    5,
  ]);
  const buffers = [params, bufs.x, bufs.w, bufs.y];
  if (f === "rmsnorm") buffers.push(bufs.normWeight!);
  const S = gpu.subgroupSize;
  const label = pairs ? `gemv_${f}_pairs` : `gemv_${f}`;
  const teamTuning = d.tuning !== undefined && !isSgTuning(d.tuning) ? d.tuning : undefined;
  const path = isSgTuning(d.tuning) ? "sg" : teamTuning ? "team" : gemvPath(gpu, d.K, d.T, wt, d.multi);
  if (path === "multi") {
    const stage = gpu.tuning.multiStage ?? (multiDp4(gpu, wt) ? "int8" : "f32");
    const i8 = stage === "int8" && isQuant(wt) && gpu.hasDp4;
    // Direct mode (x read in place, K split over warps) where it serves the GEMV, unless
    // gpu.tuning.multiDirect is false.
    const direct = multiDirectServes(gpu, f, wt);
    const t = d.multi || (direct ? shapedDirectTuning(gpu, d) : withShapeTuning(
      gpu,
      withPrefetch(
        {
          ...multiDefaultTuning(d.K, d.N, d.T, wt, i8, pairs),
          ...(stage === "f16" ? { xh: true } : {}),
          ...(gpu.tuning.multiPipeline ? { pipeline: true } : {}),
        },
        gpu.tuning.prefetch,
      ),
      gemvTuningKey(wt, f, d.N, d.K, pairs, d.T),
    ));
    checkMultiTuning(t, S!, wt, pairs);
    if (t.dp4 && !gpu.hasDp4) {
      throw new RangeError(`dp4 multi-token GEMV needs WGSL's packed_4x8_integer_dot_product`);
    }
    if (t.direct && t.dp4) {
      // The int8 direct mode reads the copy of f(x) that gemvFusedCalls' first pass made.
      if (!bufs.xq) {
        throw new TypeError("the int8 direct multi-token GEMV needs the int8 copy of x (gemvFusedCalls)");
      }
      const out8 = bufs.copyOut as Int8CopyOut | undefined;
      if (d.copyOut && (!out8 || isFloatCopy(out8))) {
        throw new TypeError("copyOut needs the int8 copy's buffers (int8CopyFor)");
      }
      const copyNorm = d.copyOut ? out8?.norm : undefined;
      if (copyNorm && !out8?.ssq) {
        throw new TypeError("a copy with norm weights needs its sums of squares");
      }
      // A copy of x * nw with its block sums of squares: this GEMV applies 1 / rms (its RMSNorm) itself.
      const rmsIn = bufs.xq.ssq !== undefined;
      if (rmsIn && f !== "rmsnorm") {
        throw new RangeError("a copy with sums of squares is for an RMSNorm GEMV");
      }
      const router = d.copyOut ? out8?.router : undefined;
      if (router && !copyNorm) throw new TypeError("router partials need the copy's norm weights");
      const code = multiSources(wt, "none", t, nwt, {
        K: d.K,
        N: d.N,
        T: d.T,
        S: S!,
        KT: 0,
        pairs,
        copyOut: d.copyOut,
        copyNorm: copyNorm?.type,
        rmsIn,
        router: router?.experts,
      });
      const out = d.copyOut ? [out8!.q, out8!.s, ...(copyNorm ? [copyNorm.w, out8!.ssq!] : [])] : [];
      // arrive: the outputs' scratch and the blocks' counters (zeroed at creation; each dispatch's last
      // workgroup of a block zeroes its counter again).
      const scratch = t.arrive
        ? [
          storageBuffer(gpu, d.T * d.N * 4, "int8 copy of y, scratch"),
          storageBuffer(gpu, (d.N / 32) * 4, "int8 copy of y, block counters"),
        ]
        : [];
      const call = kernelCall(
        gpu,
        pipeline(gpu, code),
        [
          params,
          bufs.xq.q,
          bufs.w,
          bufs.y,
          bufs.xq.s,
          ...out,
          ...(rmsIn ? [bufs.xq.ssq!] : []),
          ...scratch,
          ...(router ? [router.w, router.parts] : []),
        ],
        [multiGroups(d.N, t, S!)],
        `${label}_direct_i8`,
      );
      if (scratch.length) call.owned = scratch;
      return call;
    }
    // Paired, a warp holds loads of twice its rows (the tile's register budget).
    const KT = t.direct ? 0 : multiTileK(gpu, d.K, d.T, wt, pairs ? { ...t, rows: 2 * t.rows } : t);
    // Direct mode's own label, so a k-step profile times it apart from the staged GEMVs.
    const mLabel = t.direct ? `${label}_direct` : label;
    // f32 copies (floatCopyFor): this GEMV reads its input's copy (its RMSNorm then only 1 / rms) and / or
    // writes the next GEMV's.
    const fIn = bufs.copyIn, fOut = bufs.copyOut && isFloatCopy(bufs.copyOut) ? bufs.copyOut : undefined;
    if (
      (fIn || bufs.copyOut) && (!t.direct || t.dp4 || (bufs.copyOut && !fOut) || (fIn && f !== "rmsnorm"))
    ) {
      throw new RangeError("f32 copies are the f32 direct multi-token GEMV's, their consumer's an RMSNorm");
    }
    const code = multiSources(wt, fIn ? "none" : f, t, nwt, {
      K: d.K,
      N: d.N,
      T: d.T,
      S: S!,
      KT,
      pairs,
      copyOut: fOut ? "f32" : undefined,
      copyNorm: fOut?.norm.type,
      rmsIn: fIn !== undefined,
      rmsParts: fIn?.parts,
    });
    const bound = fIn || fOut
      ? [
        params,
        fIn ? fIn.x : bufs.x,
        bufs.w,
        bufs.y,
        ...(f === "rmsnorm" && !fIn ? [bufs.normWeight!] : []),
        ...(fOut ? [fOut.x, fOut.norm.w, fOut.ssq] : []),
        ...(fIn ? [fIn.ssq] : []),
      ]
      : buffers;
    return kernelCall(gpu, pipeline(gpu, code), bound, [multiGroups(d.N, t, S!)], mLabel);
  }
  if (path === "sg") {
    if (!S || !sgFits(gpu, d.K, wt)) {
      throw new RangeError(`the subgroup GEMV does not fit K = ${d.K} (${wt}) on ${gpu.adapterName}`);
    }
    // Direct mode (SgTuning `direct`: x read in place, each row's K split over warps) for f32 / f16 matrices
    // of fewer than DIRECT_MAX_N rows with no transform or RMSNorm, and the paired gate/up; silu_mul and the
    // tall ones keep the staged kernel. gpu.tuning.direct forces it on or off; by default it serves rows of
    // K >= 8192 with no transform (the paired MLP's down_proj): 2.97-3.04 TB/s against 2.42 staged on the
    // H200 at Llama-1B's 2048 x 8192, while at K = 2048 (o, qkv) it only matched the staged kernel
    // (2026-12-01). The paired gate/up only with gpu.tuning.directPairs: in the step it took 0.415 ms a
    // token against 0.388 staged (Llama-1B f16, 2026-12-01), so it stays off by default.
    const direct = (wt === "f32" || wt === "f16") && f !== "silu_mul" &&
      (pairs
        ? gpu.tuning.directPairs === true
        : (gpu.tuning.direct ?? (d.K >= 8192 && f === "none")) && d.N < DIRECT_MAX_N);
    const t = isSgTuning(d.tuning) ? d.tuning : withShapeTuning(
      gpu,
      direct ? sgDirectTuning(d.K, d.N, wt, S, pairs) : withPrologue(
        withPrefetch(
          sgDefaultTuning(d.K, d.N, wt, S, gpu.hasDp4 && gpu.tuning.dp4 !== false, pairs),
          gpu.tuning.prefetch ?? true,
        ),
        gpu.tuning.deferNorm ?? true,
        gpu.tuning.earlyX ?? true,
      ),
      gemvTuningKey(wt, f, d.N, d.K, pairs),
    );
    checkSgTuning(t, d.K, wt, S, pairs);
    if (t.dp4 && !gpu.hasDp4) throw new RangeError(`dp4 GEMV needs WGSL's packed_4x8_integer_dot_product`);
    const code = sgSources(wt, f, t, nwt, d.K, d.N, S, pairs);
    // Direct mode's own label, so a decode profile times it apart from the staged GEMVs (the LM head).
    const sgLabel = t.direct ? `${label}_direct` : label;
    return kernelCall(gpu, pipeline(gpu, code), buffers, [sgGroups(d.N, t, S), d.T], sgLabel);
  }
  if (pairs) {
    throw new RangeError(
      `no paired gate/up GEMV for K = ${d.K} (${wt}) on ${gpu.adapterName}: check gemvPairFits`,
    );
  }
  // A quantised row is fewer 16-byte loads: tune it as the f16 row of as many loads (untuned on the H200).
  const tune = teamTuning ?? defaultTuning(isQuant(wt) ? (d.K * 8) / quantUnit(wt) : d.K, d.N);
  const rowsPerGroup = (THREADS / tune.team) * tune.rows;
  const code = isQuant(wt) ? quantTeamSources(wt, f, tune, nwt) : teamSources(wt, f, tune, nwt);
  return kernelCall(gpu, pipeline(gpu, code), buffers, [
    ceilDiv(d.N, rowsPerGroup),
    d.T,
  ], `gemv_${f}`);
}
