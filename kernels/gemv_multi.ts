// The multi-token GEMV: y[t, n] (+)= sum_k f(x)[t, k] * W[n, k] for t < T, 2 <= T <= GEMV_MULTI_MAX_T,
// reading each weight ONCE for all T rows (k accumulators per output row), so a step of a few tokens
// (speculative verification, small batches) costs about what one token costs while the GEMV is
// bandwidth-bound. f one of gemv_fused.ts's input transforms; weights f32, f16, q8 or q4.
//
// Shape of the work (needs subgroups; without them gemv_fused.ts's team kernel runs one grid row per token):
//   - a workgroup of WARPS subgroups owns WARPS * R consecutive output rows, R per warp;
//   - K is walked in tiles of KT values: the workgroup stages f(x)[0..T, tile] in workgroup memory (component-
//     major within a unit, so a warp's reads are conflict-free)
//     (warp w stages tokens w, w + WARPS, ..), one barrier, then each warp streams its R rows' 16-byte
//     units of the tile (lane l: units l, l + S, ..), decodes each unit once (f16 unpack, q8 / q4 codes
//     times the group scale) and multiplies it with all T staged rows; one barrier before the next tile;
//   - RMSNorm needs 1 / rms of each token row before any product, which would be a second pass over x.
//     Instead the tile holds x * normWeight and each staging warp sums x^2 of its tokens as it goes:
//     sum_k W (x inv nw) = inv * sum_k W (x nw), so inv scales the finished sums;
//   - the R * T sums of a warp are reduced with subgroupAdd and written by lanes spread over the warp.
// x is staged as f32, f16 pairs (`xh`: half the workgroup bytes a weight) or, q8 / q4, int8 blocks of 32 with
// their scales (`dp4`: a q4 unit costs a token 40 workgroup bytes and 8 dot4I8Packed instead of 128 bytes and
// 32 FMAs); `pipeline` loads tile i + 1's weights before tile i's products. docs/KERNELS.md says why.
// Paired (`pairs`, the MLP's gate/up; gemv_sg.ts's comment): W is [gate; up] of 2N rows, a warp's R rows are
// R (gate n, up N + n) pairs, and it writes y[t, n] = silu(gate) * (up) for each of its T tokens.
// K, N, T are compiled in. Tile: the largest multiple of S units a lane whose staging fits the budget.
import type { InputTransform } from "./gemv_fused.ts";
import type { Gpu, KernelCall, WeightType } from "./gpu.ts";
import { kernelCall, pipeline, storageBuffer, uniformBuffer } from "./gpu.ts";
import {
  dp4Dot,
  floatUnitWgsl,
  gemvBindingsWgsl,
  int8BlocksWgsl,
  int8CopyBindingsWgsl,
  int8CopyTailWgsl,
  normWeightAt,
  normWeightVec4,
  QUANT_DECODE_WGSL,
  range,
  siluMul,
  siluMulVec4,
} from "./wgsl.ts";
import { isQuant, QUANT_GROUP, type QuantType } from "./quant.ts";

/** The most rows (tokens) the multi-token GEMV takes; more is a prefill chunk (the tiled GEMM's). */
export const GEMV_MULTI_MAX_T = 16;

export interface MultiTuning {
  /** Rows per warp. */
  rows: number;
  /** Workgroup size (a multiple of the subgroup size). */
  wg: number;
  /**
   * Issue a tile's weight loads before staging its x (their latency overlaps the staging and its barrier;
   * tiles then hold at most 8 / rows units a lane). Default true.
   */
  prefetch?: boolean;
  /**
   * q8 / q4: stage x as int8 per block of 32 (scale amax / 127, gemv_sg.ts's dp4 activations) and multiply
   * with dot4I8Packed: a q4 unit's 32 weights cost a token 40 bytes of workgroup reads (not 128) and 8
   * packed dot products (not 32 FMAs plus the decode). Needs gpu.hasDp4. Default: q4 where the adapter has
   * it and gpu.tuning.dp4 is not false (q8: off, its f32 activations keep the fixtures' greedy tokens).
   */
  dp4?: boolean;
  /**
   * Stage x as f16 (pairs packed in u32; products and sums stay f32): half the workgroup bytes read per
   * weight and half the tile's footprint. Rounds x to 11 bits, so off by default (benchmarks sweep it).
   * Not with dp4.
   */
  xh?: boolean;
  /**
   * Software-pipelined weights (with prefetch): tile i + 1's loads are issued before tile i's products, so
   * loads stay in flight through the arithmetic, not only through the staging (twice the weight registers).
   * Default false.
   */
  pipeline?: boolean;
  /**
   * Direct mode (any weight type, transforms none and rmsnorm, paired or not; gemv_sg.ts's direct mode for
   * T rows): no staging and no barrier before the last load. Each lane loads its 16-byte units of the warp's
   * rows (`unroll` units a row in flight, issued before use), reads x[t]'s matching vec4s for every token
   * straight from the storage buffer (L1 / L2; with RMSNorm times the norm weight, summing x^2 per token for
   * the deferred 1 / rms) and keeps rows x T sums; a row block's K is split over `splitK` warps whose partial
   * sums meet in workgroup memory behind one barrier at the end. prefetch / pipeline / xh / dp4 do not apply:
   * q8 / q4 units are decoded to f32 (as the staged f32 path) and multiplied with f32 x.
   */
  direct?: boolean;
  /** Direct mode: warps per row block (a divisor of wg / S); warp s sums chunks s, s + splitK, ... */
  splitK?: number;
  /** Direct mode: units a lane loads per row per chunk (a chunk is unroll x S units). Default 1. */
  unroll?: number;
  /**
   * Direct int8 mode with an int8 copy of the output whose blocks of 32 rows span several workgroups (their
   * rows a divisor of 32): each workgroup also stores its outputs in a scratch buffer with atomic stores and
   * counts itself in its block's counter; the last to arrive quantises the block (gemvMultiDirectSource).
   * Without it a copy needs workgroups widened to whole blocks.
   */
  arrive?: boolean;
}

/** How the tile of x is staged. */
type Stage = "f32" | "f16" | "i8";

function stageOf(wt: WeightType | QuantType, t?: MultiTuning): Stage {
  return t?.dp4 && isQuant(wt) ? "i8" : t?.xh ? "f16" : "f32";
}

/** Workgroup bytes a staged K value costs one token. */
const STAGE_BYTES: Record<Stage, number> = { f32: 4, f16: 2, i8: 1.25 };

/** Weights per 16-byte unit. */
function unitWeights(wt: WeightType | QuantType): number {
  return wt === "f16" ? 8 : wt === "f32" ? 4 : wt === "q8" ? 16 : 32;
}

/** Workgroup bytes the staged tiles may use (most adapters give 32 KiB or more). */
const STAGE_BUDGET = 32768;

/** Values of K per tile for T rows: a multiple of one unit per lane where it fits, else fewer units. */
export function multiTileK(
  gpu: Gpu,
  K: number,
  T: number,
  wt: WeightType | QuantType,
  t?: MultiTuning,
): number {
  const S = gpu.subgroupSize ?? 32;
  const UW = unitWeights(wt);
  const budget = Math.min(STAGE_BUDGET, gpu.maxWorkgroupStorage - 1024);
  const st = stageOf(wt, t);
  let maxK = Math.floor(budget / (STAGE_BYTES[st] * T));
  // Prefetched tiles: the loads of a tile live in registers (units a lane x rows <= 8).
  if (t && t.prefetch !== false) maxK = Math.min(maxK, UW * S * Math.max(1, Math.floor(8 / t.rows)));
  // int8 tiles hold whole blocks of 32 (a q8 unit is half a block).
  const minK = st === "i8" ? QUANT_GROUP : UW;
  let kt = UW * S;
  if (kt > maxK) {
    // Fewer units than lanes per tile: some lanes idle, but any T fits.
    while (kt > minK && kt > maxK) kt /= 2;
  } else {
    while (kt * 2 <= maxK && kt * 2 <= K) kt *= 2;
  }
  // A tile need not exceed the row (rounded up to whole units).
  return Math.min(kt, Math.ceil(K / UW) * UW);
}

/**
 * Whether the multi-token GEMV serves this shape on this GPU (else the team kernel, a grid row per token).
 * It serves one token too; gemv_fused.ts decides when a one-token step takes it.
 */
export function multiFits(gpu: Gpu, K: number, T: number, wt: WeightType | QuantType): boolean {
  if (!gpu.subgroupSize || T < 1 || T > GEMV_MULTI_MAX_T) return false;
  if (K % unitWeights(wt) !== 0 || K % 8 !== 0) return false;
  if (isQuant(wt) && K % QUANT_GROUP !== 0) return false;
  return multiTileK(gpu, K, T, wt) * 4 * T + 256 <= gpu.maxWorkgroupStorage;
}

/** Tuning by shape, to be refined by scripts/bench/gemv.ts --k on the H200. */
export function multiDefaultTuning(
  K: number,
  N: number,
  T: number,
  wt: WeightType | QuantType,
  dp4 = false,
  pairs = false,
): MultiTuning {
  // Paired: the [gate; up] matrix's 2N rows decide, and a pair is two rows.
  if (pairs) {
    const t = multiDefaultTuning(K, 2 * N, T, wt, dp4);
    return { ...t, rows: Math.max(1, t.rows >> 1) };
  }
  // q4 / q8 with int8 activations: a row's unit is 8 words and its products packed, so registers allow
  // 4 rows a warp up to T = 16 (4 x 16 accumulators). Untuned: scripts/bench/gemv.ts --k 8 --sweep.
  if (dp4 && isQuant(wt)) return { rows: T <= 8 ? 4 : 2, wg: 256, dp4: true };
  // Accumulators are R * T registers a lane: fewer rows as T grows; more rows per workgroup for tall
  // matrices so fewer workgroups stage the same x.
  // H200, f16, T = 8: 4 rows a warp with 256 threads beat 2 on qkv, gate_up and the head (536 / 1157 /
  // 1297 GB/s against 445 / 591 / 1055), not on down (454 against 611).
  const rows = T <= 8 && K < 8192 ? 4 : 2;
  return { rows, wg: T <= 8 || N < 65536 ? 256 : 1024 };
}

export function checkMultiTuning(
  t: MultiTuning,
  S: number,
  wt?: WeightType | QuantType,
  pairs = false,
): void {
  const ok = Number.isInteger(t.rows) && t.rows >= 1 && t.rows <= (pairs ? 4 : 8) && Number.isInteger(t.wg) &&
    t.wg >= S && t.wg % S === 0 && t.wg <= 1024 && !(t.dp4 && t.xh) &&
    !(t.dp4 && wt !== undefined && !isQuant(wt));
  if (!ok) throw new RangeError(`bad multi-token GEMV tuning ${JSON.stringify(t)} (S = ${S}, ${wt})`);
  if (t.direct) {
    const sk = t.splitK ?? 1, u = t.unroll ?? 1;
    const why = !Number.isInteger(sk) || sk < 1 || (t.wg / S) % sk !== 0
      ? `splitK ${sk} (a divisor of the ${t.wg / S} warps of a workgroup)`
      : !Number.isInteger(u) || u < 1 || u > 8
      ? `unroll ${u} (1..8)`
      : t.xh || t.pipeline
      ? "xh / pipeline (staged x only)"
      : "";
    if (why) throw new RangeError(`direct multi-token GEMV ${JSON.stringify(t)} cannot serve ${why}`);
  }
}

/**
 * Direct mode's tuning by shape (MultiTuning `direct`): R x T <= 32 sums a lane (4 rows up to T = 8, else 2;
 * paired, half as many pairs), so L1 reads 2T / R bytes of x per byte of f16 weight; one unit a row in
 * flight; splitK, a power of two <= 8, until ~2K-4K warps or a warp would have no chunk. Chosen by the whole
 * k-step on the H200 (scripts/bench/decode.ts --k --tunings; numbers below), not by the GEMV sweep alone.
 * gpu.tuning's multiUnroll / multiRows / multiWarps force each (A/B runs).
 */
export function multiDirectTuning(
  K: number,
  N: number,
  T: number,
  wt: WeightType | QuantType,
  S: number,
  pairs = false,
  force: { multiUnroll?: number; multiRows?: number; multiWarps?: number } = {},
): MultiTuning {
  // H200, f16, Llama-1B k = 8 step over a token's (2026-12-01, the faster of two rounds): one unit in flight
  // 1.65x, two (four at K >= 8192, the GEMV sweep's best alone) 1.67x; ~2K warps 1.65x against 1.77x at ~8K;
  // 2 rows 2.2x, 8 rows 4.5x. (Single first-pass timings of 2.75-4.55x were the benchmark's, not the tuning's.)
  const rows = Math.max(1, (force.multiRows ?? (T <= 8 ? 4 : 2)) >> (pairs ? 1 : 0));
  const unroll = force.multiUnroll ?? 1;
  const chunks = Math.ceil(K / unitWeights(wt) / (unroll * S));
  const blocks = Math.ceil(N / rows);
  let splitK = 1;
  const warps = force.multiWarps ?? 2048;
  while (splitK < 8 && 2 * splitK <= chunks && blocks * splitK < warps) splitK *= 2;
  return { rows, wg: Math.max(8, splitK) * S, direct: true, splitK, unroll };
}

/** WGSL of the multi-token GEMV for one shape. */
export function gemvMultiSource(
  wt: WeightType | QuantType,
  f: InputTransform,
  t: MultiTuning,
  nwt: WeightType,
  d: {
    K: number;
    N: number;
    T: number;
    S: number;
    KT: number;
    pairs?: boolean;
    copyOut?: QuantType | "f32";
    copyNorm?: WeightType;
    rmsIn?: boolean;
    rmsParts?: number;
    router?: number;
  },
): string {
  if (t.direct) return gemvMultiDirectSource(wt, f, t, nwt, d);
  if (d.router) throw new RangeError("only the int8 direct multi-token GEMV writes router partials");
  if (d.copyOut) throw new RangeError("only the direct multi-token GEMV writes a copy of its output");
  const { K, N, T, S, KT } = d;
  const { rows: R, wg: WG } = t;
  // Rows of weights a warp reads: R, or paired R gate rows then their R up rows.
  const RR = d.pairs ? 2 * R : R;
  const WARPS = WG / S;
  const UW = unitWeights(wt);
  const XV = UW / 4; // x vec4s per unit
  const UNITS = K / UW;
  const K4 = K / 4;
  const KT4 = KT / 4;
  const TILES = Math.ceil(K / KT);
  const TPW = Math.ceil(T / WARPS); // tokens a warp stages
  // Units per tile. A token's tile is staged component-major, [XV][NU] vec4s: lane j then reads x vec4 i of
  // its unit at i * NU + j, consecutive across the warp (no bank conflicts; unit-major would stride XV vec4s,
  // 8-way for q4).
  const NU = KT / UW;
  const xStride = f === "silu_mul" ? "2u * K4" : "K4";
  const st = stageOf(wt, t);
  const q4 = wt === "q4";
  // int8 staging: NB blocks of 32 a token's tile; xq holds a token's words at tok * 2NB (q8: the words of
  // unit j at 2NB tok + j) or, q4, its even vec4s at tok * NB and odd ones at (T + tok) * NB (unit j = block
  // j reads both at + j: consecutive across the warp); xqs its blocks' (scale, scale * sum q) at tok * NB.
  const NB = KT / QUANT_GROUP;
  if (st === "i8" && KT % QUANT_GROUP !== 0) throw new RangeError(`int8 tiles need KT % 32 == 0, got ${KT}`);
  // Staging: warp w stages token rows w + i * WARPS of the tile; xin() reads and transforms a vec4 of x
  // (zero past the row) and, with RMSNorm, adds its x^2 to ssp, which the warp adds to ss<i>.
  const stageOne = (i: number): string => {
    const tok = `(warp + ${i * WARPS}u)`;
    const put = st === "f16"
      ? `xh[${tok} * KT4 + (c % ${XV}u) * ${NU}u + c / ${XV}u] = vec2<u32>(pack2x16float(o.xy), pack2x16float(o.zw));`
      : `xs[${tok} * KT4 + (c % ${XV}u) * ${NU}u + c / ${XV}u] = o;`;
    const loop = st === "i8"
      ? int8BlocksWgsl(
        wt as QuantType,
        (k) => `xin(xr, k40 + ${k})`,
        `${NB}u`,
        "S",
        q4 ? `${T * NB}u` : undefined,
        {
          first: "lane",
          q: (i) => `xq[${tok} * ${q4 ? NB : 2 * NB}u + ${i}]`,
          s: (b) => `xqs[${tok} * ${NB}u + ${b}]`,
        },
      )
      : `for (var c = lane; c < KT4; c += S) {
        let o = xin(xr, k40 + c);
        ${put}
      }`;
    return `if (${tok} < T) {
      let xr = (p.x_row0 + ${tok}) * ${xStride};
      ${f === "rmsnorm" ? "ssp = 0.0;" : ""}
      ${loop}
      ${f === "rmsnorm" ? `ss${i} += ssp;` : ""}
    }`;
  };
  const nwv = normWeightVec4(nwt, "g");
  const xinBody = f === "silu_mul"
    ? `let gt = x[xr + g];
  return ${siluMulVec4("gt", "x[xr + K4 + g]")};`
    : f === "rmsnorm"
    ? `let xv = x[xr + g];
  ssp += dot(xv, xv);
  return xv * ${nwv};`
    : `return x[xr + g];`;
  const xinFn = `${f === "rmsnorm" ? "var<private> ssp: f32;\n" : ""}fn xin(xr: u32, g: u32) -> vec4<f32> {
  if (g >= K4) { return vec4<f32>(0.0); }
  ${xinBody}
}`;
  // Decoding unit j of row r into XV vec4s (scaled for the quantised types), once for all T rows.
  const decode = (r: number, w: string, unit: string): string[] => {
    switch (wt) {
      case "f32":
      case "f16":
        return floatUnitWgsl(wt, `d${r}`, w);
      case "q8":
        return [
          `let s${r} = group_scale(row${r} * GPR + (${unit}) / 2u);`,
          ...range(4).map((i) => `let d${r}_${i} = q8v(${w}[${i}]) * s${r};`),
        ];
      case "q4":
        return [
          `let s${r} = group_scale(row${r} * GPR + ${unit});`,
          ...range(8).map((i) => `let d${r}_${i} = q4s(${w}[${i >> 1}], ${16 * (i & 1)}u) * s${r};`),
        ];
    }
  };
  const dp = (a: string, b: string) =>
    ["x", "y", "z", "w"].map((c) => `dot4I8Packed(${a}.${c}, ${b}.${c})`).join(" + ");
  // Unit j (tile-local) of the R rows, its weights in w(r): decoded once, multiplied with all T rows.
  const useUnit = (j: string, w: (r: number) => string): string[] => {
    const out: string[] = [];
    if (st === "i8") {
      // Codes c = q + 8 (q4): sum q x = xsc (sum c xq - 8 sum xq); the nibbles split into two packed
      // words once per row, matching the even / odd vec4s of the staged block.
      for (let r = 0; r < RR; r++) {
        if (q4) {
          out.push(
            `let s${r} = group_scale(row${r} * GPR + u0 + ${j});`,
            `let we${r} = ${w(r)} & vec4<u32>(0x0F0F0F0Fu);`,
            `let wo${r} = (${w(r)} >> vec4<u32>(4u)) & vec4<u32>(0x0F0F0F0Fu);`,
          );
        } else out.push(`let s${r} = group_scale(row${r} * GPR + (u0 + ${j}) / 2u);`);
      }
      for (let tk = 0; tk < T; tk++) {
        if (q4) {
          out.push(
            `let xe${tk} = xq[${tk * NB}u + ${j}];`,
            `let xo${tk} = xq[${(T + tk) * NB}u + ${j}];`,
            `let xc${tk} = xqs[${tk * NB}u + ${j}];`,
          );
        } else {out.push(
            `let xw${tk} = xq[${2 * tk * NB}u + ${j}];`,
            `let xc${tk} = xqs[${tk * NB}u + ${j} / 2u];`,
          );}
        for (let r = 0; r < RR; r++) {
          out.push(
            q4
              ? `a${r}_${tk} += s${r} * (xc${tk}.x * f32(${dp(`we${r}`, `xe${tk}`)} + ${
                dp(`wo${r}`, `xo${tk}`)
              }) - 8.0 * xc${tk}.y);`
              : `a${r}_${tk} += s${r} * xc${tk}.x * f32(${dp(w(r), `xw${tk}`)});`,
          );
        }
      }
      return out;
    }
    for (let r = 0; r < RR; r++) out.push(...decode(r, w(r), `u0 + ${j}`));
    for (let tk = 0; tk < T; tk++) {
      for (let i = 0; i < XV; i++) {
        const at = `${tk * KT4 + i * NU}u + ${j}`;
        out.push(`let x${tk}_${i} = ${st === "f16" ? `h4(xh[${at}])` : `xs[${at}]`};`);
      }
      for (let r = 0; r < RR; r++) {
        out.push(`a${r}_${tk} += ${range(XV).map((i) => `dot(d${r}_${i}, x${tk}_${i})`).join(" + ")};`);
      }
    }
    return out;
  };
  const body: string[] = [
    ...range(RR).map((r) => `let w${r} = W[rb${r} + u0 + j];`),
    ...useUnit("j", (r) => `w${r}`),
  ];
  // Prefetched: UPL unit slots a lane, loads (clamped to the tile) before the stage, use after it.
  const UPL = Math.ceil(KT / UW / S);
  const pf = t.prefetch !== false;
  const pl = pf && t.pipeline === true;
  const preLoads: string[] = [];
  const preUse: string[] = [];
  // Pipelined: the tile's weights are vars loaded by the previous tile (tile 0's before the loop); after the
  // stage the next tile's (the last tile reloads itself) go to n<u>_<r>, copied over once the products are done.
  const wType = wt === "f32" ? "vec4<f32>" : "vec4<u32>";
  const plFirst: string[] = [];
  const plNext: string[] = [];
  const plSwap: string[] = [];
  for (let u = 0; u < UPL; u++) {
    if (pl) {
      preLoads.push(`let j${u} = ${u}u * S + lane;`);
      plFirst.push(`let f${u} = min(${u}u * S + lane, min(${KT / UW}u, UNITS) - 1u);`);
      plNext.push(`let c${u} = min(j${u}, nun - 1u);`);
      for (let r = 0; r < RR; r++) {
        plFirst.push(`var w${u}_${r}: ${wType} = W[rb${r} + f${u}];`);
        plNext.push(`let n${u}_${r} = W[rb${r} + u0n + c${u}];`);
        plSwap.push(`w${u}_${r} = n${u}_${r};`);
      }
    } else {
      preLoads.push(`let j${u} = ${u}u * S + lane;`, `let c${u} = min(j${u}, nu - 1u);`);
      for (let r = 0; r < RR; r++) preLoads.push(`let w${u}_${r} = W[rb${r} + u0 + c${u}];`);
    }
    preUse.push(`if (j${u} < nu) {
        ${useUnit(`j${u}`, (r) => `w${u}_${r}`).join("\n        ")}
      }`);
  }
  const rowsDecl = range(RR).map((r) =>
    `let row${r} = ${r < R ? "" : "N + "}min(n0 + ${r % R}u, N - 1u);\n  let rb${r} = row${r} * UNITS;`
  );
  const accDecl = range(RR).flatMap((r) => range(T).map((tk) => `var a${r}_${tk} = 0.0;`));
  const ssDecl = f === "rmsnorm" ? range(TPW).map((i) => `var ss${i} = 0.0;`) : [];
  const invStore = f !== "rmsnorm" ? "" : range(TPW).map((i) => {
    const tok = `warp + ${i * WARPS}u`;
    return `let sq${i} = subgroupAdd(ss${i});
  if (lane == 0u && ${tok} < T) { inv[${tok}] = inverseSqrt(sq${i} / f32(K) + p.eps); }`;
  }).join("\n  ");
  const stores: string[] = [];
  for (let r = 0; r < RR; r++) {
    for (let tk = 0; tk < T; tk++) {
      const sc = f === "rmsnorm" ? ` * inv[${tk}]` : "";
      stores.push(`let s${r}_${tk} = subgroupAdd(a${r}_${tk})${sc};`);
    }
  }
  for (let r = 0; r < R; r++) {
    for (let tk = 0; tk < T; tk++) {
      stores.push(`if (lane == ${(r * T + tk) % S}u && n0 + ${r}u < N) {
    let o = ${tk}u * N + n0 + ${r}u;
    ${
        d.pairs
          ? `y[o] = ${siluMul(`s${r}_${tk}`, `s${r + R}_${tk}`)};`
          : `y[o] = select(0.0, y[o], p.acc != 0u) + s${r}_${tk};`
      }
  }`);
    }
  }
  const quantFns = !isQuant(wt) ? "" : `const GPR = ${K / QUANT_GROUP}u;\n${QUANT_DECODE_WGSL}`;
  return `
${gemvBindingsWgsl(wt, f === "rmsnorm", nwt)}
const K = ${K}u;
const N = ${N}u;
const T = ${T}u;
const K4 = ${K4}u;
const KT4 = ${KT4}u;
const UNITS = ${UNITS}u;
const S = ${S}u;
const WARPS = ${WARPS}u;
const R = ${R}u;
${
    st === "i8"
      ? `var<workgroup> xq: array<vec4<u32>, ${(T * KT) / 16}>;\nvar<workgroup> xqs: array<vec2<f32>, ${
        T * NB
      }>;`
      : st === "f16"
      ? `var<workgroup> xh: array<vec2<u32>, ${T * KT4}>;
fn h4(v: vec2<u32>) -> vec4<f32> { return vec4<f32>(unpack2x16float(v.x), unpack2x16float(v.y)); }`
      : `var<workgroup> xs: array<vec4<f32>, ${T * KT4}>;`
  }
${f === "rmsnorm" ? `var<workgroup> inv: array<f32, ${T}>;` : ""}
${quantFns}
${xinFn}
@compute @workgroup_size(${WG})
fn main(
  @builtin(workgroup_id) wg: vec3<u32>,
  @builtin(local_invocation_index) tid: u32,
) {
  let warp = tid / S;
  let lane = tid % S;
  let n0 = (wg.x * WARPS + warp) * R;
  ${rowsDecl.join("\n  ")}
  ${accDecl.join("\n  ")}
  ${ssDecl.join("\n  ")}
  ${plFirst.join("\n  ")}
  for (var tile = 0u; tile < ${TILES}u; tile++) {
    let k40 = tile * KT4;
    let u0 = tile * ${KT / UW}u;
    let nu = min(${KT / UW}u, UNITS - u0);
    ${pf ? preLoads.join("\n    ") : ""}
    ${range(TPW).map(stageOne).join("\n    ")}
    workgroupBarrier();
    ${
    pl
      ? `let u0n = min(tile + 1u, ${TILES - 1}u) * ${KT / UW}u;
    let nun = min(${KT / UW}u, UNITS - u0n);
    ${plNext.join("\n    ")}`
      : ""
  }
    ${
    pf ? preUse.join("\n    ") : `for (var j = lane; j < nu; j += S) {
      ${body.join("\n      ")}
    }`
  }
    ${plSwap.join("\n    ")}
    workgroupBarrier();
  }
  ${invStore}
  ${f === "rmsnorm" ? "workgroupBarrier();" : ""}
  ${stores.join("\n  ")}
}`;
}

/**
 * `let s<r> = ` the group scale of unit `j` of row r in direct mode (rb<r> = row * UNITS): a q4 unit is one
 * group of 32, a q8 unit half of one (UNITS is even for q8, so (rb + j) / 2 is the row's group j / 2).
 */
function unitScale(wt: QuantType, r: number, j: string): string {
  return `let s${r} = group_scale(${wt === "q4" ? `rb${r} + ${j}` : `(rb${r} + ${j}) / 2u`});`;
}

/**
 * The int8 direct mode's products for unit u (index `j`, clamped) of the RR rows: each row's words split
 * into the nibbles dp4Dot pairs with the even / odd int8 vec4s (q4) once, then for each token its block's
 * int8 words and (scale, scale * sum q) read from the copy (token t's at t * 2NB: q4 even vec4s then odd
 * ones, q8 a unit's vec4 at its index; scales at t * NB) and dot4I8Packed: a q4 unit is scale * (xs.x * dot
 * - 8 xs.y), a q8 unit scale * xs.x * dot (int8BlocksWgsl's convention). Units past the row (`ok` false)
 * take a zero block scale, so they add nothing.
 */
function int8UnitBody(
  wt: QuantType,
  u: number,
  j: string,
  d: { RR: number; T: number; NB: number; ragged: boolean },
): string {
  const { RR, T, NB, ragged } = d;
  const out: string[] = [];
  const q4 = wt === "q4";
  for (let r = 0; r < RR; r++) {
    out.push(unitScale(wt, r, j));
    if (q4) {
      out.push(
        `let we${r} = w${u}_${r} & vec4<u32>(0x0F0F0F0Fu);`,
        `let wo${r} = (w${u}_${r} >> vec4<u32>(4u)) & vec4<u32>(0x0F0F0F0Fu);`,
      );
    }
  }
  // The nibbles split once a row above, so each token's products are dp4Dot's plain (q8) form.
  const dp = (a: string, b: string) => dp4Dot("q8", a, b);
  for (let tk = 0; tk < T; tk++) {
    const sc = `xqs[${tk * NB}u + ${q4 ? j : `${j} / 2u`}]`;
    out.push(`let xc${tk} = ${ragged ? `select(vec2<f32>(0.0), ${sc}, ok${u})` : sc};`);
    if (q4) {
      out.push(
        `let xe${tk} = xq[${2 * tk * NB}u + ${j}];`,
        `let xo${tk} = xq[${(2 * tk + 1) * NB}u + ${j}];`,
      );
    } else out.push(`let xw${tk} = xq[${2 * tk * NB}u + ${j}];`);
    for (let r = 0; r < RR; r++) {
      out.push(
        q4
          ? `a${r}_${tk} += s${r} * (xc${tk}.x * f32(${dp(`we${r}`, `xe${tk}`)} + ${
            dp(`wo${r}`, `xo${tk}`)
          }) - 8.0 * xc${tk}.y);`
          : `a${r}_${tk} += s${r} * xc${tk}.x * f32(${dp(`w${u}_${r}`, `xw${tk}`)});`,
      );
    }
  }
  return out.join("\n        ");
}

/**
 * Direct mode's products for quantised unit u (index `j`, clamped) of the RR rows, vec4 by vec4: the
 * rows' vec4 i decoded (codes times the group scale, as the staged path), then each token's x vec4 i read
 * (with RMSNorm: its x^2 summed, times the norm weight) and dotted with them. A q4 unit is 8 vec4s of x a
 * token, so decoding it whole for every row first (as the float units are) would hold RR x 32 weights in
 * registers; this order holds RR x 4.
 */
function quantUnitBody(
  wt: QuantType,
  u: number,
  j: string,
  d: { RR: number; T: number; XV: number; norm: boolean; ragged: boolean; nwt: WeightType },
): string {
  const { RR, T, XV, norm, ragged, nwt } = d;
  const out: string[] = [];
  for (let r = 0; r < RR; r++) out.push(unitScale(wt, r, j));
  for (let i = 0; i < XV; i++) {
    for (let r = 0; r < RR; r++) {
      out.push(
        wt === "q4"
          ? `let d${r}_${i} = q4s(w${u}_${r}[${i >> 1}], ${16 * (i & 1)}u) * s${r};`
          : `let d${r}_${i} = q8v(w${u}_${r}[${i}]) * s${r};`,
      );
    }
    if (norm) out.push(`let g${i} = ${normWeightVec4(nwt, `${j} * ${XV}u + ${i}u`)};`);
    for (let tk = 0; tk < T; tk++) {
      const at = `x[(p.x_row0 + ${tk}u) * K4 + ${j} * ${XV}u + ${i}u]`;
      const xv = ragged ? `select(vec4<f32>(0.0), ${at}, ok${u})` : at;
      if (norm) {
        out.push(
          `let xr${tk}_${i} = ${xv};`,
          `q${tk} += dot(xr${tk}_${i}, xr${tk}_${i});`,
          `let x${tk}_${i} = xr${tk}_${i} * g${i};`,
        );
      } else out.push(`let x${tk}_${i} = ${xv};`);
      for (let r = 0; r < RR; r++) out.push(`a${r}_${tk} += dot(d${r}_${i}, x${tk}_${i});`);
    }
  }
  return out.join("\n        ");
}

/**
 * Direct mode (MultiTuning `direct`): a workgroup of WARPS warps is WARPS / SK row blocks of R rows (paired:
 * R gate rows n.. and their up rows N + n..); warp w sums chunks s, s + SK, .. (s = w % SK) of its block's
 * rows, a chunk being U x S units (lane l: units c U S + u S + l), every load of the chunk issued before the
 * products. A unit's weights are decoded once and multiplied with the T tokens' x vec4s, read from the
 * storage buffer (units past the row, where a chunk overhangs it, read x as zero). After the loop the warp's
 * RR x T sums (and T sums of x^2) are reduced over its lanes (a halving butterfly) into workgroup memory;
 * one barrier; then one thread an output adds its block's SK partials, scales by 1 / rms and writes (paired:
 * silu(gate) * up).
 * The int8 mode (dp4) reads x's int8 copy instead. `copyOut`: the workgroup (whole blocks of 32 rows) also
 * quantises what it wrote into the next GEMV's copy, from workgroup memory; with `copyNorm` of y times that
 * GEMV's norm weights (binding `onw`), writing each block's sum of squares of y too (`ossq`). `rmsIn`: x's
 * copy is such a copy, and the sums are scaled by 1 / rms from its block sums (`issq`).
 * `copyOut` "f32" (f32 / f16 / q8 weights in the f32 direct mode, for an RMSNorm consumer: `copyNorm` is
 * required): each output thread also writes y times the consumer's norm weight to `xc` ([T, N] f32, the
 * consumer's x), and the workgroup its rows' sum of squares of y for each token (`ossq` [T, groups]: one
 * partial a workgroup, from workgroup memory after one barrier). A consumer with `rmsIn` and `rmsParts`
 * (that many partials a token; the int8 copies' default is K / 32) reads such a copy as its x with no
 * transform, and scales its sums by 1 / rms from the partials.
 */
function gemvMultiDirectSource(
  wt: WeightType | QuantType,
  f: InputTransform,
  t: MultiTuning,
  nwt: WeightType,
  d: {
    K: number;
    N: number;
    T: number;
    S: number;
    pairs?: boolean;
    copyOut?: QuantType | "f32";
    copyNorm?: WeightType;
    rmsIn?: boolean;
    rmsParts?: number;
    router?: number;
  },
): string {
  const i8 = t.dp4 === true;
  const fcopy = d.copyOut === "f32";
  if ((d.copyNorm && !d.copyOut) || (fcopy && (i8 || !d.copyNorm)) || (d.copyOut && !fcopy && !i8)) {
    throw new RangeError(
      "copyNorm needs copyOut; an f32 copy is the f32 direct mode's, with copyNorm; an int8 copy the int8 mode's",
    );
  }
  if (d.rmsIn && f !== "none") {
    throw new RangeError("rmsIn reads a copy already multiplied by the norm weights");
  }
  if (i8 && (!isQuant(wt) || f !== "none")) {
    throw new RangeError(
      `the int8 direct multi-token GEMV takes q8 / q4 weights and x already transformed (${wt}, ${f})`,
    );
  }
  if (f === "silu_mul") {
    throw new RangeError("the direct multi-token GEMV has no silu_mul transform (pair gate/up instead)");
  }
  const { K, N, T, S } = d;
  const { rows: R, wg: WG } = t;
  const SK = t.splitK ?? 1;
  const U = t.unroll ?? 1;
  const RR = d.pairs ? 2 * R : R;
  const WARPS = WG / S;
  const BLOCKS = WARPS / SK;
  const UW = unitWeights(wt);
  const XV = UW / 4;
  const UNITS = K / UW;
  const K4 = K / 4;
  const CH = Math.ceil(UNITS / (U * S));
  const CMAX = Math.ceil(CH / SK);
  const ragged = UNITS % (U * S) !== 0;
  const norm = f === "rmsnorm";
  // Partials a warp leaves: RR x T sums, then T sums of x^2.
  const RS = RR * T + (norm ? T : 0);
  const OUT = BLOCKS * R * T;
  const body: string[] = [];
  for (let u = 0; u < U; u++) {
    body.push(`let j${u} = (c * ${U}u + ${u}u) * S + lane;`);
    if (ragged) body.push(`let ok${u} = j${u} < UNITS;`, `let jc${u} = min(j${u}, UNITS - 1u);`);
  }
  const jc = (u: number) => ragged ? `jc${u}` : `j${u}`;
  for (let u = 0; u < U; u++) {
    for (let r = 0; r < RR; r++) body.push(`let w${u}_${r} = W[rb${r} + ${jc(u)}];`);
  }
  for (let u = 0; u < U; u++) {
    if (i8) {
      body.push(
        `{\n        ${
          int8UnitBody(wt as QuantType, u, jc(u), { RR, T, NB: K / QUANT_GROUP, ragged })
        }\n      }`,
      );
      continue;
    }
    if (isQuant(wt)) {
      body.push(`{\n        ${quantUnitBody(wt, u, jc(u), { RR, T, XV, norm, ragged, nwt })}\n      }`);
      continue;
    }
    // Unit u's block: its rows decoded once, then each token's x.
    const inner: string[] = [];
    for (let r = 0; r < RR; r++) {
      inner.push(...floatUnitWgsl(wt, `d${r}`, `w${u}_${r}`));
    }
    if (norm) {
      for (let i = 0; i < XV; i++) {
        inner.push(`let g${i} = ${normWeightVec4(nwt, `${jc(u)} * ${XV}u + ${i}u`)};`);
      }
    }
    for (let tk = 0; tk < T; tk++) {
      for (let i = 0; i < XV; i++) {
        const at = `x[(p.x_row0 + ${tk}u) * K4 + ${jc(u)} * ${XV}u + ${i}u]`;
        const xv = ragged ? `select(vec4<f32>(0.0), ${at}, ok${u})` : at;
        if (norm) {
          inner.push(`let xr${tk}_${i} = ${xv};`, `q${tk} += dot(xr${tk}_${i}, xr${tk}_${i});`);
          inner.push(`let x${tk}_${i} = xr${tk}_${i} * g${i};`);
        } else inner.push(`let x${tk}_${i} = ${xv};`);
      }
      for (let r = 0; r < RR; r++) {
        inner.push(`a${r}_${tk} += ${range(XV).map((i) => `dot(d${r}_${i}, x${tk}_${i})`).join(" + ")};`);
      }
    }
    body.push(`{\n        ${inner.join("\n        ")}\n      }`);
  }
  // Rows past N (the last block) read row N - 1 (their sums are not written).
  const decl = range(RR).map((r) =>
    `let rb${r} = (${r < R ? "" : "N + "}min(n0 + ${r % R}u, N - 1u)) * UNITS;`
  );
  const acc = range(RR).flatMap((r) => range(T).map((tk) => `var a${r}_${tk} = 0.0;`));
  if (norm) acc.push(...range(T).map((tk) => `var q${tk} = 0.0;`));
  // The warp's RS partials, reduced over its lanes by a butterfly that halves them each step (lanes with
  // bit h keep the upper half and send the lower to lane ^ h): V - 1 + log2(S / V) shuffles for V values
  // (RS padded to a power of two) instead of RS subgroupAdds of log2(S) each. After it lane l holds partial
  // l VPL + j (j < VPL) where V >= S, else (every lane the whole sum) partial l / (S / V).
  let V = 1;
  while (V < RS) V *= 2;
  let vals = range(V).map((i) => {
    if (i < RR * T) return `a${Math.floor(i / T)}_${i % T}`;
    return i < RS ? `q${i - RR * T}` : "0.0";
  });
  const sums: string[] = [];
  let step = 0;
  for (let h = S / 2; h >= 1; h /= 2, step++) {
    if (vals.length === 1) {
      sums.push(`let y${step}_0 = ${vals[0]} + subgroupShuffleXor(${vals[0]}, ${h}u);`);
      vals = [`y${step}_0`];
      continue;
    }
    sums.push(`let b${step} = (lane & ${h}u) != 0u;`);
    const half = vals.length / 2;
    const next: string[] = [];
    for (let k = 0; k < half; k++) {
      const lo = vals[k], hi = vals[k + half], y = `y${step}_${k}`;
      sums.push(
        `let ${y} = select(${lo}, ${hi}, b${step}) + subgroupShuffleXor(select(${hi}, ${lo}, b${step}), ${h}u);`,
      );
      next.push(y);
    }
    vals = next;
  }
  if (V >= S) {
    vals.forEach((v, j) => {
      sums.push(`if (lane * ${V / S}u + ${j}u < RS) { red[warp * RS + lane * ${V / S}u + ${j}u] = ${v}; }`);
    });
  } else {
    sums.push(
      `if (lane % ${S / V}u == 0u && lane / ${S / V}u < RS) { red[warp * RS + lane / ${S / V}u] = ${
        vals[0]
      }; }`,
    );
  }
  const part = (at: string) => `red[(g * SK + k) * RS + ${at}]`;
  // copyOut: the workgroup's BLOCKS x R rows (whole blocks of 32) of each token, quantised for the next GEMV;
  // or (t.arrive) its rows a divisor of 32, and the block quantised by the last of its workgroups to finish.
  const CB = (BLOCKS * R) / 32;
  const arrive = t.arrive === true;
  if (arrive && (!d.copyOut || fcopy || 32 % (BLOCKS * R) !== 0 || N % 32 !== 0)) {
    throw new RangeError(
      `arrive is for an int8 copy of the output from workgroups of a divisor of 32 rows (${BLOCKS} x ${R}, N ${N})`,
    );
  }
  if (d.copyOut && !fcopy && !arrive && (!Number.isInteger(CB) || N % 32 !== 0)) {
    throw new RangeError(
      `an int8 copy of the output needs whole blocks of 32 rows a workgroup (${BLOCKS} x ${R} rows, N ${N})`,
    );
  }
  // The values are also kept in workgroup memory (ys: [T][BLOCKS R]), so the copy needs a workgroup barrier,
  // not a device-scope storageBarrier and a second read of y from L2.
  const WR = BLOCKS * R;
  // f32 copy: the workgroup's rows' sums of squares, a token a thread (rows past N were not written).
  const fcopyTail = `
  workgroupBarrier();
  let nr = min(${WR}u, N - min(wg.x * ${WR}u, N));
  for (var tk = tid; tk < T; tk += ${WG}u) {
    var ss = 0.0;
    for (var i = 0u; i < nr; i++) { let v = ys[tk * ${WR}u + i]; ss += v * v; }
    ossq[tk * ${Math.ceil(N / WR)}u + wg.x] = ss;
  }`;
  // arrive: PER workgroups make a block of 32 rows. Each stores its outputs in ya (atomics: the last one
  // reads them from L2, never from a stale L1 line), then one device-scope barrier (release) before thread 0
  // counts the workgroup in; the last of the block (it resets the counter for the next dispatch) takes an
  // acquire barrier and quantises the block's T rows, a token a thread (with copyNorm each block's sum of
  // squares too, as below).
  const PER = 32 / (BLOCKS * R);
  // router: the MoE router's partial logits of the copy's blocks (routerPartsWgsl), for the fused expert
  // kernel after this GEMV (moe_fused.ts `input: "copy"`).
  if (d.router && (fcopy || !d.copyOut || !d.copyNorm || N % 32 !== 0)) {
    throw new RangeError("router partials come with an int8 copy of the output with its norm weights");
  }
  const router = d.router
    ? routerPartsWgsl({
      E: d.router,
      T,
      CB: arrive ? 1 : CB,
      S,
      WG,
      N,
      n0: arrive ? `wg.x / ${PER}u * 32u` : `wg.x * ${WR}u`,
      norm: d.copyNorm!,
    })
    : undefined;
  const arriveTail = !arrive ? "" : `
  storageBarrier();
  if (tid == 0u) {
    let blk = wg.x / ${PER}u;
    let last = atomicAdd(&cnt[blk], 1u) == ${PER - 1}u;
    if (last) { atomicStore(&cnt[blk], 0u); }
    arrived = select(0u, 1u, last);
  }
  if (workgroupUniformLoad(&arrived) != 0u) {
    storageBarrier();
    let nw0 = wg.x / ${PER}u * 32u;${
    int8CopyTailWgsl(d.copyOut as QuantType, {
      K: N,
      row0: "0u",
      rows: "T",
      blocks: "1u",
      gb0: "nw0 / 32u",
      vec4At: (i) =>
        d.copyNorm ? `xa${i} * ${normWeightVec4(d.copyNorm, `nw0 / 4u + ${i}u`, "onw")}` : `xa${i}`,
      WG: `${WG}u`,
      prelude: `${range(8).map((i) => `let xa${i} = yav(cr * N + nw0 + ${4 * i}u);`).join("\n    ")}${
        d.copyNorm
          ? `
    ossq[cr * ${N / 32}u + nw0 / 32u] = ${range(8).map((i) => `dot(xa${i}, xa${i})`).join(" + ")};`
          : ""
      }`,
    })
  }${
    router
      ? router.tail({
        blocks: "1u",
        val4: (cr, _cb, k) => `yav(${cr} * N + nw0 + 4u * ${k})`,
      })
      : ""
  }
  }`;
  const copyTail = fcopy ? fcopyTail : arrive ? arriveTail : d.copyOut
    ? `
  workgroupBarrier();
  let nw0 = wg.x * ${WR}u;
  let cbw = min(${CB}u, (N - min(nw0, N)) / 32u);${
      int8CopyTailWgsl(d.copyOut as QuantType, {
        K: N,
        row0: "0u",
        rows: "T",
        blocks: "cbw",
        gb0: "nw0 / 32u",
        vec4At: (i) =>
          d.copyNorm
            ? `ysv(cr * ${WR}u + 32u * cb + ${4 * i}u) * ${
              normWeightVec4(d.copyNorm, `(nw0 + 32u * cb) / 4u + ${i}u`, "onw")
            }`
            : `ysv(cr * ${WR}u + 32u * cb + ${4 * i}u)`,
        WG: `${WG}u`,
        // copyNorm: the block's sum of squares of y (before the norm weight), for the consumer's 1 / rms.
        prelude: d.copyNorm
          ? `var ss = 0.0;
    for (var i = 0u; i < 8u; i++) { let v = ysv(cr * ${WR}u + 32u * cb + 4u * i); ss += dot(v, v); }
    ossq[cr * ${N / 32}u + nw0 / 32u + cb] = ss;`
          : undefined,
      })
    }${
      router
        ? router.tail({
          blocks: "cbw",
          val4: (cr, cb, k) => `ysv(${cr} * ${WR}u + 32u * ${cb} + 4u * ${k})`,
        })
        : ""
    }`
    : "";
  // rmsIn: x's copy is of x * nw, unscaled; each warp loads the block sums of squares of its tokens (warp,
  // warp + WARPS, ..) as it starts, and after its weights, adds them into 1 / rms in inv_s for the outputs.
  // An f32 copy's sums of squares: loaded as the warps start up to T = 8, above it after the main loop,
  // before the butterfly whose shuffles hide their latency (at the start they would live in registers
  // through the loop). H200, Llama-1B f16 k-steps (2026-12-02): k = 4 1.079 ms early against 1.13 late,
  // k = 8 1.446-1.453 against 1.446-1.449, k = 16 4.03 against 3.87.
  const lateLoads = d.rmsIn && !i8 && T > 8;
  // Bindings after gemvBindingsWgsl's (binding 4 is the norm weights' or the int8 scales', where bound):
  // the copy's, then x's sums of squares (rmsIn), then arrive's scratch and counters.
  const b0 = norm || i8 ? 5 : 4;
  const rmsBinding = d.copyOut ? (fcopy ? b0 + 3 : d.copyNorm ? 9 : 7) : b0;
  const arriveBinding = d.rmsIn ? rmsBinding + 1 : d.copyNorm ? 9 : 7;
  const routerBinding = arrive ? arriveBinding + 2 : d.rmsIn ? rmsBinding + 1 : 9;
  const TPW = Math.ceil(T / WARPS);
  const P = d.rmsParts ?? K / 32; // partials a token
  // An f32 copy's partials are loaded as vec4s (H200, Llama-1B f16 k = 8 step: 1.429-1.432 ms against
  // 1.448-1.450 with scalar loads, 2026-12-02); the int8 copies' (K / 32 a token) as they were measured.
  const v4 = d.rmsIn === true && !i8 && P % 4 === 0;
  const PV = v4 ? P / 4 : P;
  const PL = Math.ceil(PV / S); // partials a lane adds, per token
  const rmsLoads = d.rmsIn
    ? range(TPW).flatMap((j) =>
      range(PL).map((i) => {
        const at = `min(warp + ${j * WARPS}u, T - 1u) * ${PV}u + lane + ${i * S}u`;
        return `let pq${j}_${i} = select(${v4 ? "vec4<f32>(0.0)" : "0.0"}, issq[min(${at}, ${
          T * PV - 1
        }u)], lane + ${i * S}u < ${PV}u);`;
      })
    )
    : [];
  const rmsSums = d.rmsIn
    ? range(TPW).map((j) =>
      `{
    let ssum = subgroupAdd(${v4 ? "dot(" : ""}${range(PL).map((i) => `pq${j}_${i}`).join(" + ")}${
        v4 ? ", vec4<f32>(1.0))" : ""
      });
    if (lane == 0u && warp + ${j * WARPS}u < T) { inv_s[warp + ${
        j * WARPS
      }u] = inverseSqrt(ssum / f32(K) + p.eps); }
  }`
    )
    : [];
  return `
${gemvBindingsWgsl(wt, norm, nwt, i8)}${
    fcopy
      ? `
@group(0) @binding(${b0}) var<storage, read_write> xc: array<f32>;
@group(0) @binding(${b0 + 1}) var<storage, read> onw: array<${
        d.copyNorm === "f16" ? "vec2<u32>" : "vec4<f32>"
      }>;
@group(0) @binding(${b0 + 2}) var<storage, read_write> ossq: array<f32>;
var<workgroup> ys: array<f32, ${T * WR}>;`
      : d.copyOut
      ? `
${int8CopyBindingsWgsl(5)}${
        arrive
          ? `
@group(0) @binding(${arriveBinding}) var<storage, read_write> ya: array<atomic<u32>>;
@group(0) @binding(${arriveBinding + 1}) var<storage, read_write> cnt: array<atomic<u32>>;
var<workgroup> arrived: u32;
fn yav(o: u32) -> vec4<f32> {
  return bitcast<vec4<f32>>(
    vec4<u32>(atomicLoad(&ya[o]), atomicLoad(&ya[o + 1u]), atomicLoad(&ya[o + 2u]), atomicLoad(&ya[o + 3u])),
  );
}`
          : `
var<workgroup> ys: array<f32, ${T * WR}>;
fn ysv(o: u32) -> vec4<f32> { return vec4<f32>(ys[o], ys[o + 1u], ys[o + 2u], ys[o + 3u]); }`
      }${
        d.copyNorm
          ? `
@group(0) @binding(7) var<storage, read> onw: array<${d.copyNorm === "f16" ? "vec2<u32>" : "vec4<f32>"}>;
@group(0) @binding(8) var<storage, read_write> ossq: array<f32>;`
          : ""
      }`
      : ""
  }${
    d.rmsIn
      ? `
@group(0) @binding(${rmsBinding}) var<storage, read> issq: array<${v4 ? "vec4<f32>" : "f32"}>;
var<workgroup> inv_s: array<f32, ${T}>;`
      : ""
  }${
    router
      ? `
@group(0) @binding(${routerBinding}) var<storage, read> rw: array<vec4<f32>>;
@group(0) @binding(${routerBinding + 1}) var<storage, read_write> rparts: array<f32>;`
      : ""
  }
${isQuant(wt) ? `const GPR = ${K / QUANT_GROUP}u;\n${QUANT_DECODE_WGSL}` : ""}
const K = ${K}u;
const N = ${N}u;
const T = ${T}u;
const K4 = ${K4}u;
const UNITS = ${UNITS}u;
const S = ${S}u;
const R = ${R}u;
const SK = ${SK}u;
const RS = ${RS}u;
const BLOCKS = ${BLOCKS}u;
var<workgroup> red: array<f32, ${WARPS * RS}>;
@compute @workgroup_size(${WG})
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
  let warp = tid / S;
  let lane = tid % S;
  let ks = warp % SK;
  let n0 = (wg.x * BLOCKS + warp / SK) * R;
  ${decl.join("\n  ")}
  ${acc.join("\n  ")}${router?.prefetch ?? ""}
  ${lateLoads ? "" : rmsLoads.join("\n  ")}
  for (var i = 0u; i < ${CMAX}u; i++) {
    let c = i * SK + ks;
    ${CH % SK === 0 ? "{" : `if (c < ${CH}u) {`}
      ${body.join("\n      ")}
    }
  }
  ${lateLoads ? rmsLoads.join("\n  ") : ""}${
    fcopy
      ? `
  let onw0 = ${
        normWeightAt(d.copyNorm!, `min((wg.x * BLOCKS + tid / ${R * T}u) * R + tid / T % R, N - 1u)`, "onw")
      };`
      : ""
  }
  ${sums.join("\n  ")}
  ${rmsSums.join("\n  ")}
  workgroupBarrier();
  for (var e = tid; e < ${OUT}u; e += ${WG}u) {
    let g = e / ${R * T}u;
    let r = e / T % R;
    let tk = e % T;
    let n = (wg.x * BLOCKS + g) * R + r;
    if (n < N) {
      var a = 0.0;
      ${d.pairs ? "var b = 0.0;" : ""}
      ${norm ? "var q = 0.0;" : ""}
      for (var k = 0u; k < SK; k++) {
        a += ${part("r * T + tk")};
        ${d.pairs ? `b += ${part("(R + r) * T + tk")};` : ""}
        ${norm ? `q += ${part(`${RR * T}u + tk`)};` : ""}
      }
      ${norm ? `let inv = inverseSqrt(q / f32(K) + p.eps);\n      a *= inv;` : ""}
      ${d.rmsIn ? `let inv = inv_s[tk];\n      a *= inv;` : ""}
      ${d.pairs && (norm || d.rmsIn) ? "b *= inv;" : ""}
      let o = tk * N + n;
      let v = ${d.pairs ? siluMul("a", "b") : "select(0.0, y[o], p.acc != 0u) + a"};
      y[o] = v;${
    fcopy
      ? `
      var onv = onw0;
      if (e != tid) { onv = ${normWeightAt(d.copyNorm!, "n", "onw")}; }
      xc[o] = v * onv;`
      : ""
  }${
    d.copyOut
      ? arrive
        ? `
      atomicStore(&ya[o], bitcast<u32>(v));`
        : `
      ys[tk * ${WR}u + g * R + r] = v;`
      : ""
  }
    }
  }${copyTail}
}`;
}

/**
 * WGSL of a MoE router's partial logits over the blocks of 32 rows of y a workgroup has just written (the
 * int8 copy's tail, gemv_multi.ts with `router`; the fused expert kernel sums them, moe_fused.ts):
 *   rparts[(t NB + b) E + e] = sum_{i < 32} router[e, 32 b + i] nw[32 b + i] y[t, 32 b + i]   (NB = N / 32)
 * the router's logits before 1 / rms, for each token t, block b and expert e. G = min(8, S) adjacent lanes
 * take a (token, block, expert), each VG = 8 / G vec4s of its 32 values, summed by shuffles. The router's
 * vec4s (f32 [E, N], bound as `rw`) are loaded when the kernel starts where a thread needs at most 4 (one
 * token: 1 a thread of 1,024), so their latency is not the tail's; else in the tail. `n0`: the first row of
 * the workgroup's blocks (an expression of wg.x); CB blocks of 32 a workgroup.
 */
function routerPartsWgsl(
  r: {
    E: number;
    T: number;
    CB: number;
    S: number;
    WG: number;
    N: number;
    n0: string;
    norm: WeightType;
  },
): {
  prefetch: string;
  tail: (o: { blocks: string; val4: (cr: string, cb: string, k: string) => string }) => string;
} {
  const { E, T, CB, S, WG, N } = r;
  const G = Math.min(8, S);
  const VG = 8 / G;
  const TOT = T * CB * E;
  const ITER = Math.ceil((TOT * G) / WG);
  const pre = ITER * VG <= 4;
  const at = (it: string) => `
    let rt = ${it} * ${WG}u + tid;
    let rk = min(rt / ${G}u, ${TOT - 1}u);
    let rv = (rn0 + 32u * (rk / ${E}u % ${CB}u)) / 4u + (rt % ${G}u) * ${VG}u;
    let rq = (rk % ${E}u) * ${N / 4}u + rv;`;
  const load = (v: number) => `rw[min(rq + ${v}u, ${(E * N) / 4 - 1}u)]`;
  const nload = (v: number) => normWeightVec4(r.norm, `min(rv + ${v}u, ${N / 4 - 1}u)`, "onw");
  // The router's and the norm weights' vec4s of a thread's tasks, loaded as the kernel starts.
  const prefetch = `
  let rn0 = ${r.n0};${
    pre
      ? range(ITER).map((it) => `
  var rwp${it}: array<vec4<f32>, ${VG}>;
  var rnp${it}: array<vec4<f32>, ${VG}>;
  {${at(`${it}u`)}
    ${range(VG).map((v) => `rwp${it}[${v}] = ${load(v)}; rnp${it}[${v}] = ${nload(v)};`).join(" ")}
  }`).join("")
      : ""
  }`;
  const tail = (o: { blocks: string; val4: (cr: string, cb: string, k: string) => string }) => {
    const one = (it: string, w: (v: number) => string, nw: (v: number) => string) => `
  {${at(it)}
    let re = rk % ${E}u;
    let rb = rk / ${E}u % ${CB}u;
    let rc = rk / ${E * CB}u;
    let rp = rt % ${G}u;
    var rs = 0.0;
    ${
      range(VG).map((v) => `rs += dot(${w(v)}, ${o.val4("rc", "rb", `(rp * ${VG}u + ${v}u)`)} * ${nw(v)});`)
        .join("\n    ")
    }
    ${range(Math.log2(G)).map((i) => `rs += subgroupShuffleXor(rs, ${G >> (i + 1)}u);`).join("\n    ")}
    if (rp == 0u && rt / ${G}u < ${TOT}u && rb < ${o.blocks}) {
      rparts[(rc * ${N / 32}u + rn0 / 32u + rb) * ${E}u + re] = rs;
    }
  }`;
    // Every lane runs every round (the shuffles need the whole subgroup); lanes past the tasks take the last
    // one's indices and write nothing.
    return pre
      ? range(ITER).map((it) => one(`${it}u`, (v) => `rwp${it}[${v}]`, (v) => `rnp${it}[${v}]`)).join("")
      : `
  for (var ri = 0u; ri < ${ITER}u; ri++) {${one("ri", load, nload)}
  }`;
  };
  return { prefetch, tail };
}

/** Workgroups to launch along x. */
export function multiGroups(N: number, t: MultiTuning, S: number): number {
  if (t.direct) return Math.ceil(N / ((t.wg / S / (t.splitK ?? 1)) * t.rows));
  return Math.ceil(N / ((t.wg / S) * t.rows));
}

/**
 * WGSL of the int8 input pass: workgroup t makes token row t's int8 copy (int8BlocksWgsl: blocks of 32, scale
 * amax / 127, (scale, scale * sum q); q4 even vec4s of a row's blocks then its odd ones) of f(x) for the int8
 * direct multi-token GEMV, a thread a block (WG threads: the blocks rounded up to whole subgroups, at most
 * 256). RMSNorm: each thread reads its block into registers and sums its squares, one subgroupAdd and one
 * barrier give 1 / rms, and the block is quantised from the registers times the norm weight; rows of more
 * than 256 blocks read x twice (the sum of squares first). silu_mul reads [gate | up] rows.
 */
function int8InputSource(
  wt: QuantType,
  f: InputTransform,
  nwt: WeightType,
  K: number,
  S: number,
): string {
  const K4 = K / 4;
  const NB = K / QUANT_GROUP;
  const WG = Math.min(256, Math.ceil(NB / S) * S);
  const WARPS = WG / S;
  const norm = f === "rmsnorm";
  // RMSNorm with a block a thread: the block is read once, into r0..r7.
  const held = norm && NB <= WG;
  const vin = (k: string, i: number) =>
    f === "silu_mul"
      ? `silu_mul_at(xr, ${k})`
      : norm
      ? `${held ? `r${i}` : `x[xr + ${k}]`} * ${normWeightVec4(nwt, k)} * inv`
      : `x[xr + ${k}]`;
  const blocks = int8BlocksWgsl(wt, vin, `${NB}u`, `${WG}u`, wt === "q4" ? `${NB}u` : undefined, {
    first: "tid",
    q: (i) => `xq[t * ${2 * NB}u + ${i}]`,
    s: (b) => `xqs[t * ${NB}u + ${b}]`,
  });
  const r8 = Array.from({ length: 8 }, (_, i) => i);
  const sumSquares = held
    ? `${r8.map((i) => `var r${i} = vec4<f32>(0.0);`).join(" ")}
  if (tid < ${NB}u) {
    ${r8.map((i) => `r${i} = x[xr + 8u * tid + ${i}u];`).join("\n    ")}
  }
  let ss = ${r8.map((i) => `dot(r${i}, r${i})`).join(" + ")};`
    : `var ss = 0.0;
  for (var k = tid; k < ${K4}u; k += ${WG}u) { let v = x[xr + k]; ss += dot(v, v); }`;
  const code = `struct P { K: u32, T: u32, x_row0: u32, eps: f32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> xq: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read_write> xqs: array<vec2<f32>>;
${
    norm
      ? `@group(0) @binding(4) var<storage, read> nw: array<${nwt === "f16" ? "vec2<u32>" : "vec4<f32>"}>;
var<workgroup> red: array<f32, ${WARPS}>;`
      : ""
  }
${
    f === "silu_mul"
      ? `fn silu_mul_at(xr: u32, k: u32) -> vec4<f32> { return ${
        siluMulVec4("x[xr + k]", `x[xr + ${K4}u + k]`)
      }; }`
      : ""
  }
@compute @workgroup_size(${WG})
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
  let t = wg.x;
  let xr = (p.x_row0 + t) * ${f === "silu_mul" ? 2 * K4 : K4}u;
  ${
    norm
      ? `${sumSquares}
  let sw = subgroupAdd(ss);
  if (tid % ${S}u == 0u) { red[tid / ${S}u] = sw; }
  workgroupBarrier();
  var tot = 0.0;
  for (var w = 0u; w < ${WARPS}u; w++) { tot += red[w]; }
  let inv = inverseSqrt(tot / f32(p.K) + p.eps);`
      : ""
  }
  ${blocks}
}`;
  return code;
}

/**
 * The int8 input pass of the int8 direct multi-token GEMV (MultiTuning direct + dp4): one dispatch making the
 * int8 copy of f(x)'s T rows once, instead of every workgroup staging it (the staged kernel's cost). Returns
 * the call and the buffers, to be bound by the GEMV (gemv_fused.ts) or the grouped expert matmul
 * (moe_grouped.ts). The call owns the copy's two buffers unless the caller gives them (`out`: T * K bytes of
 * words and T * K / 32 (scale, scale * sum q) pairs, at least).
 */
export function gemvInt8InputCall(
  gpu: Gpu,
  bufs: { x: GPUBuffer; normWeight?: GPUBuffer; out?: { xq: GPUBuffer; xqs: GPUBuffer } },
  d: {
    K: number;
    T: number;
    wt: QuantType;
    transform: InputTransform;
    normWeights: WeightType;
    xRow0?: number;
    eps?: number;
  },
): { call: KernelCall; xq: GPUBuffer; xqs: GPUBuffer } {
  const { K, T, wt, transform: f } = d;
  if (K % QUANT_GROUP !== 0) throw new RangeError(`int8 rows need K % ${QUANT_GROUP} == 0, got ${K}`);
  if (f === "rmsnorm" && !bufs.normWeight) throw new TypeError("rmsnorm transform needs normWeight");
  const xqBytes = T * K, xqsBytes = (T * K) / QUANT_GROUP * 8;
  const { out } = bufs;
  if (out && (out.xq.size < xqBytes || out.xqs.size < xqsBytes)) {
    throw new RangeError(`the int8 copy of ${T} rows of ${K} needs ${xqBytes} + ${xqsBytes} bytes`);
  }
  const xq = out?.xq ?? storageBuffer(gpu, xqBytes, "gemv int8 x");
  const xqs = out?.xqs ?? storageBuffer(gpu, xqsBytes, "gemv int8 x scales");
  const params = uniformBuffer(gpu, [K, T, d.xRow0 ?? 0, d.eps ?? 0], [3]);
  const buffers = [params, bufs.x, xq, xqs, ...(f === "rmsnorm" ? [bufs.normWeight!] : [])];
  if (!gpu.subgroupSize) throw new RangeError("the int8 input pass needs subgroups of a fixed size");
  const code = int8InputSource(wt, f, d.normWeights, K, gpu.subgroupSize);
  const call = kernelCall(gpu, pipeline(gpu, code), buffers, [T], "gemv_int8_x");
  if (!out) call.owned = [xq, xqs];
  return { call, xq, xqs };
}
