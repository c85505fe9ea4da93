// The decode GEMV on adapters with subgroups (the fast path; gemv_fused.ts's team kernel is the fallback):
// y[t, n] (+)= sum_k f(x)[t, k] * W[n, k], f one of gemv_fused.ts's input transforms.
//
// Shape of the work, chosen so nothing waits on a barrier while weights stream (docs/KERNELS.md):
//   - each workgroup first writes f(x) for its token row into workgroup memory (RMSNorm's sum of squares,
//     or SiLU(gate) * up, is computed once per workgroup, not once per row);
//   - then each subgroup (a warp of S lanes) owns R rows at a time: lane l reads the 16-byte units
//     l, l + S, l + 2S ... of each row (coalesced), U units of each of the R rows issued before any is
//     used, so U * R loads are in flight per lane; K and N are compile-time constants, so the loop over
//     the row has a fixed trip count;
//   - subgroupAdd reduces a row across the warp: no workgroup barrier inside the row loop, and warps run
//     independently; a persistent grid (`groups`) makes each warp walk many row blocks.
// Weights: f16 (8 halves per unit, unpacked with unpack2x16float), f32 (4 per unit), q8 (16 per unit,
// bf16 scale per 32), q4 (32 per unit = one group; codes are q + 8, so sum (c - 8) x = dot(c, x) - 8
// sum(x), the unit's sum of x computed once per workgroup).
// Paired (`pairs`, the MLP's gate/up): W is [gate; up], 2N rows of K, and a warp's R row pairs are gate rows
// n and up rows N + n, loaded side by side (2R rows of loads in flight); the warp writes
// y[t, n] = silu(gate_n . f(x)) * (up_n . f(x)) (N wide), so the down GEMV stages that I-wide row as it is
// instead of reading the 2I-wide gate/up row and computing I sigmoids in every workgroup.
import type { InputTransform } from "./gemv_fused.ts";
import type { Gpu, WeightType } from "./gpu.ts";
import {
  dp4Dot,
  floatUnitDot,
  gemvBindingsWgsl,
  int8BlocksWgsl,
  normWeightOf,
  normWeightVec4,
  QUANT_DECODE_WGSL,
  siluMul,
  siluMulVec4,
} from "./wgsl.ts";
import { isQuant, QUANT_GROUP, type QuantType } from "./quant.ts";

export interface SgTuning {
  /** Rows per warp at a time. */
  rows: number;
  /** Units of each row loaded before use (per lane), a divisor of the units per lane. */
  unroll: number;
  /** Workgroup size (a multiple of the subgroup size). */
  wg: number;
  /** Most workgroups launched (each loops over row blocks); 0: enough for one block per warp. */
  groups: number;
  /**
   * q8 / q4: quantise x to int8 per block of 32 (scale amax / 127) once per workgroup and multiply with
   * packed integer dot products (dot4I8Packed: 4 multiply-adds an instruction), as llama.cpp does with
   * its Q8_1 activations. Needs WGSL's packed_4x8_integer_dot_product. Adds ~0.4% relative noise per
   * activation, far below q4's own.
   */
  dp4?: boolean;
  /**
   * Issue the first row block's first weight loads before staging x, so their memory latency overlaps the
   * prologue (RMSNorm, int8 quantisation, barriers) instead of following it. False in a tuning that omits
   * it; gemvFusedCall's default tunings turn it on (gpu.tuning.prefetch false: off).
   */
  prefetch?: boolean;
  /**
   * RMSNorm: stage x * normWeight in the same pass that sums x^2 (one read of x and one barrier fewer
   * before the first product) and scale the finished sums by 1 / rms, as gemv_multi.ts does. With dp4 the
   * int8 copy is made from x * normWeight (a row's common factor leaves the codes unchanged). False in a
   * tuning that omits it; gemvFusedCall's default tunings turn it on (gpu.tuning.deferNorm false: off).
   */
  deferNorm?: boolean;
  /**
   * Issue the loads of this workgroup's x (and RMSNorm's weights) before anything else, the first weight
   * loads (prefetch) included, and stage them after those are issued: x was just written (L2) and the norm
   * weights are a small cold read, so they arrive while the weights stream instead of queued behind them.
   * f32 / f16 staging (not dp4), transforms none and RMSNorm with deferNorm, where a thread holds at most 8
   * vec4s of x; ignored elsewhere. H200, Llama-1B f16 step: 0.947-0.953 -> 0.919-0.929 ms. With dp4 a
   * thread's block of 32 (16 vec4 registers with its norm weights) made q4 steps slower (0.687 -> 0.716 ms;
   * Qwen3-30B-A3B q4 2.55 -> 2.66), so the int8 staging keeps its order.
   */
  earlyX?: boolean;
  /**
   * Direct mode (f32 / f16 weights, transforms none and rmsnorm, paired or not): x is read straight from its
   * storage buffer (it stays in L1 / L2) instead of staged in workgroup memory, so there is no barrier
   * before the first weight load, and each row block's K is split over `splitK` warps; the warps' partial
   * sums (and RMSNorm's sum of x^2, always deferred) meet in workgroup memory behind one barrier at the end.
   * `groups` must be 0 (one row block per warp group); prefetch and deferNorm do not apply.
   */
  direct?: boolean;
  /** Direct mode: warps per row block (a divisor of wg / S), warp s summing chunks s, s + splitK, ... */
  splitK?: number;
}

/** Weights per 16-byte unit. */
function unitWeights(wt: WeightType | QuantType): number {
  return wt === "f16" ? 8 : wt === "f32" ? 4 : wt === "q8" ? 16 : 32;
}

/** Whether the subgroup kernel serves this shape on this GPU (else the team kernel does). */
export function sgFits(gpu: Gpu, K: number, wt: WeightType | QuantType): boolean {
  const S = gpu.subgroupSize;
  if (!S) return false;
  const units = K / unitWeights(wt);
  if (!Number.isInteger(units) || units % S !== 0) return false;
  if (isQuant(wt) && K % QUANT_GROUP !== 0) return false;
  return sgSharedBytes(K, wt, 256, S) <= gpu.maxWorkgroupStorage;
}

function sgSharedBytes(K: number, wt: WeightType | QuantType, wg: number, S: number): number {
  // xs (f32); a per-unit sum of x or the int8 copy with its per-block (scale, sum); RMSNorm partials.
  return K * 4 + (isQuant(wt) ? Math.max((K / unitWeights(wt)) * 4, K + (K / 32) * 8) : 0) + (wg / S) * 4;
}

/**
 * Tuning by shape and weight type, from scripts/bench/gemv.ts --sweep on the H200 (docs/BENCHMARKS.md):
 * short matrices want one row per warp and deep unrolling, tall ones several rows per warp (the x loads
 * shared), quantised rows more rows (their unpacking is the cost); very tall ones (the LM head) a capped,
 * persistent grid so fewer workgroups stage x.
 */
export function sgDefaultTuning(
  K: number,
  N: number,
  wt: WeightType | QuantType,
  S: number,
  dp4 = false,
  pairs = false,
): SgTuning {
  // Paired: the rows of the [gate; up] matrix (2N) decide, and a pair is two rows. f16: a quarter of the
  // rows and twice the loads of each in flight (H200, Llama-1B's gate/up timed in the step, 2026-12-02:
  // 0.916-0.922 -> 0.912-0.915 ms a token against half the rows at the same unroll).
  if (pairs) {
    const t = sgDefaultTuning(K, 2 * N, wt, S, dp4);
    if (wt === "f16") {
      const perLane = K / unitWeights(wt) / S;
      return { ...t, rows: Math.max(1, t.rows >> 2), unroll: largestDivisorAtMost(perLane, 2 * t.unroll) };
    }
    return { ...t, rows: Math.max(1, t.rows >> 1) };
  }
  const perLane = K / unitWeights(wt) / S;
  const groups = N >= 65536 ? 512 : 0;
  let rows: number, unroll: number;
  // q4 (H200 sweep, scripts/bench/gemv.ts --sweep, dp4 on): 4 rows a warp for the wide matrices (gate_up),
  // else 2 rows with 2-4 loads in flight (down 1019 GB/s against 788 with [4, 1]; qkv, o, head +4-6%).
  if (wt === "q4") [rows, unroll] = N >= 16384 && N < 65536 ? [4, 1] : [2, K >= 8192 ? 4 : 2];
  else if (wt === "q8") [rows, unroll] = N >= 16384 ? [4, 1] : [2, 4];
  else {[rows, unroll] = K >= 8192
      ? [2, 8]
      : N >= 65536
      ? [1, 4]
      : N >= 16384
      ? [4, 2]
      : N >= 4096
      ? [2, 2]
      : [1, 4];}
  // q4 with int8 activations at K <= 2048 (gate/up, o, qkv): workgroups of 512, half as many quantising x
  // (H200, Llama-1B step, 2026-12-02: gate/up 0.687-0.691 -> 0.677 ms, o -2 us more, qkv within noise;
  // down at K = 8192 was slower, the LM head keeps its capped grid).
  const wg = wt === "q4" && dp4 && K <= 2048 && N < 65536 ? 512 : 256;
  return { rows, unroll: largestDivisorAtMost(perLane, unroll), wg, groups, dp4: dp4 && isQuant(wt) };
}

/**
 * gpu.tuning.direct serves matrices of fewer rows than this (o, qkv, down: their staged grids are a
 * workgroup or so an SM); the tall ones (gate/up, the LM head) already stream at ~3.3 TB/s staged, and
 * scripts/bench/gemv.ts times their direct_default to say whether to lift it.
 */
export const DIRECT_MAX_N = 16384;

/**
 * Direct mode's tuning (SgTuning `direct`): enough warps for the H200's ~8K resident ones on the small-N
 * decode matrices (o, qkv: 1 row, 4-way split; down: 2 rows, U = 4, 8-way split), one row block a warp
 * group. Untuned: scripts/bench/gemv.ts --direct ranks the grid on the H200.
 */
export function sgDirectTuning(
  K: number,
  N: number,
  wt: WeightType | QuantType,
  S: number,
  pairs = false,
): SgTuning {
  const perLane = K / unitWeights(wt) / S;
  // Paired gate/up: N pairs of rows; a pair is two rows' loads, so as many loads a lane as 2 rows.
  if (pairs) {
    const unroll = largestDivisorAtMost(perLane, 2);
    const splitK = perLane / unroll >= 2 ? 2 : 1;
    return { rows: 2, unroll, wg: 8 * S, groups: 0, direct: true, splitK };
  }
  const rows = K >= 8192 || N >= 16384 ? 2 : 1;
  const unroll = largestDivisorAtMost(perLane, K >= 8192 ? 4 : 2);
  const chunks = perLane / unroll;
  // Warps wanted: ~8192 (N / rows row blocks, splitK warps each), a power of two <= 8 and <= chunks.
  let splitK = 1;
  while (splitK < 8 && 2 * splitK <= chunks && (N / rows) * splitK < 8192) splitK *= 2;
  return { rows, unroll, wg: Math.max(8, splitK) * S, groups: 0, direct: true, splitK };
}

function largestDivisorAtMost(n: number, m: number): number {
  for (let d = Math.min(n, m); d > 1; d--) if (n % d === 0) return d;
  return 1;
}

export function checkSgTuning(
  t: SgTuning,
  K: number,
  wt: WeightType | QuantType,
  S: number,
  pairs = false,
): void {
  const perLane = K / unitWeights(wt) / S;
  const ok = Number.isInteger(t.rows) && t.rows >= 1 && t.rows <= (pairs ? 4 : 8) &&
    Number.isInteger(t.unroll) && t.unroll >= 1 && perLane % t.unroll === 0 &&
    Number.isInteger(t.wg) && t.wg >= S && t.wg % S === 0 && t.wg <= 1024 &&
    Number.isInteger(t.groups) && t.groups >= 0;
  if (!ok) {
    throw new RangeError(`bad subgroup GEMV tuning ${JSON.stringify(t)} for K = ${K} (${wt}, S = ${S})`);
  }
  if (t.direct) {
    const sk = t.splitK ?? 1;
    const why = wt !== "f32" && wt !== "f16"
      ? `${wt} weights (f32 and f16 only; quantised rows keep the staged int8 path)`
      : !Number.isInteger(sk) || sk < 1 || (t.wg / S) % sk !== 0
      ? `splitK ${sk} (a divisor of the ${t.wg / S} warps of a workgroup)`
      : t.groups !== 0
      ? `groups ${t.groups} (direct mode launches one row block per warp group: groups 0)`
      : t.dp4
      ? "dp4 (quantised weights only)"
      : "";
    if (why) throw new RangeError(`direct subgroup GEMV ${JSON.stringify(t)} cannot serve ${why}`);
  }
}

/** WGSL of the subgroup GEMV for one shape (K, N are baked in; paired: N pairs, the matrix 2N rows). */
export function gemvSgSource(
  wt: WeightType | QuantType,
  f: InputTransform,
  t: SgTuning,
  nwt: WeightType,
  K: number,
  N: number,
  S: number,
  pairs = false,
): string {
  if (t.direct) {
    if (f === "silu_mul") {
      throw new RangeError("the direct subgroup GEMV has no silu_mul transform (pair gate/up instead)");
    }
    return gemvSgDirectSource(wt, f, t, nwt, K, N, S, pairs);
  }
  const UW = unitWeights(wt);
  const XV = UW / 4; // x vec4s per unit
  const UNITS = K / UW;
  const ITER = UNITS / S;
  const { rows: R, unroll: U, wg: WG } = t;
  // Rows of loads a warp has at a time: R, or paired R gate rows then their R up rows.
  const RR = pairs ? 2 * R : R;
  const K4 = K / 4;
  const dp4 = isQuant(wt) && t.dp4 === true;
  const defer = f === "rmsnorm" && t.deferNorm === true;
  // 1 / rms from the warps' partial sums of squares in red (after a barrier).
  const invOf = `
  var tot = 0.0;
  for (var w = 0u; w < WARPS; w++) { tot += red[w]; }
  let inv = inverseSqrt(tot / f32(K) + p.eps);`;
  // The transformed input row, staged in workgroup memory (f32 in xs; with dp4 only its int8 copy, made
  // straight from x: one pass and one barrier fewer, and no xs).
  let stage: string;
  // earlyX: x (and its norm weights) loaded into registers ahead of the weights' first loads (`early`,
  // placed before the prefetch), the stage then made from those registers.
  const NI = Math.ceil(K4 / WG);
  const earlyX = t.earlyX === true && !dp4 && (f === "none" || defer) && NI <= 8;
  const early: string[] = [];
  const xin = (k: string): string =>
    f === "rmsnorm"
      ? `x[xrow + ${k}]${defer ? "" : " * inv"} * ${normWeightVec4(nwt, k)}`
      : f === "silu_mul"
      ? siluMulVec4(`x[xrow + ${k}]`, `x[xrow + K4 + ${k}]`)
      : `x[xrow + ${k}]`;
  if (earlyX) {
    const rms = f === "rmsnorm";
    const parts: string[] = rms ? ["var ss = 0.0;"] : [];
    for (let i = 0; i < NI; i++) {
      early.push(`let ek${i} = tid + ${i * WG}u;`, `let ex${i} = x[xrow + min(ek${i}, K4 - 1u)];`);
      if (rms) early.push(`let en${i} = nw[min(ek${i}, K4 - 1u)];`);
      const put = rms
        ? `ss += dot(ex${i}, ex${i}); xs[xi(ek${i})] = ex${i} * ${normWeightOf(nwt, `en${i}`)};`
        : `xs[xi(ek${i})] = ex${i};`;
      parts.push((i + 1) * WG <= K4 ? `{ ${put} }` : `if (ek${i} < K4) { ${put} }`);
    }
    if (rms) parts.push("ss = subgroupAdd(ss);", "if (lane == 0u) { red[warp] = ss; }");
    stage = "\n  " + parts.join("\n  ");
  } else if (defer) {
    // The sum of squares alone (dp4: the int8 copy's loop reads x again, with no barrier between), or with
    // the staging of x * normWeight.
    stage = `
  var ss = 0.0;
  for (var k = tid; k < K4; k += WG) {
    let v = x[xrow + k];
    ss += dot(v, v);${
      dp4 ? "" : `
    xs[xi(k)] = v * ${normWeightVec4(nwt, "k")};`
    }
  }
  ss = subgroupAdd(ss);
  if (lane == 0u) { red[warp] = ss; }`;
  } else if (dp4) {
    stage = f !== "rmsnorm" ? "" : `
  var ss = 0.0;
  for (var k = tid; k < K4; k += WG) { let v = x[xrow + k]; ss += dot(v, v); }
  ss = subgroupAdd(ss);
  if (lane == 0u) { red[warp] = ss; }
  workgroupBarrier();
  var tot = 0.0;
  for (var w = 0u; w < WARPS; w++) { tot += red[w]; }
  let inv = inverseSqrt(tot / f32(K) + p.eps);`;
  } else if (f === "rmsnorm") {
    const nwv = normWeightVec4(nwt, "k");
    stage = `
  var ss = 0.0;
  for (var k = tid; k < K4; k += WG) { let v = x[xrow + k]; ss += dot(v, v); }
  ss = subgroupAdd(ss);
  if (lane == 0u) { red[warp] = ss; }
  workgroupBarrier();
  var tot = 0.0;
  for (var w = 0u; w < WARPS; w++) { tot += red[w]; }
  let inv = inverseSqrt(tot / f32(K) + p.eps);
  for (var k = tid; k < K4; k += WG) { xs[xi(k)] = x[xrow + k] * inv * ${nwv}; }`;
  } else if (f === "silu_mul") {
    stage = `
  for (var k = tid; k < K4; k += WG) {
    let g = x[xrow + k];
    xs[xi(k)] = ${siluMulVec4("g", "x[xrow + K4 + k]")};
  }`;
  } else {
    stage = `
  for (var k = tid; k < K4; k += WG) { xs[xi(k)] = x[xrow + k]; }`;
  }
  if (!dp4) stage += "\n  workgroupBarrier();";
  if (dp4) {
    stage += int8BlocksWgsl(wt as QuantType, xin, "K / 32u", "WG", "UNITS") + "\n  workgroupBarrier();";
  }
  if (defer) stage += invOf;
  const needXsum = !dp4 && wt === "q4";
  if (needXsum) {
    stage += `
  for (var j = tid; j < UNITS; j += WG) {
    var s4 = vec4<f32>(0.0);
    for (var i = 0u; i < ${XV}u; i++) { s4 += xs[i * UNITS + j]; }
    xsum[j] = dot(s4, vec4<f32>(1.0));
  }
  workgroupBarrier();`;
  }
  // One unit's contribution: weights w (the loaded unit), x vec4s xv(i) of unit u, row index row. The x
  // values of a unit are loaded from workgroup memory once and shared by the R rows.
  const xv = (u: number, i: number) => `x${u}_${i}`;
  const unitDot = (w: string, u: number, row: string): string => {
    const j = `j${u}`;
    switch (wt) {
      case "f32":
      case "f16":
        return floatUnitDot(wt, w, xv(u, 0), xv(u, 1));
      case "q8": {
        if (dp4) {
          // Unit j is half j % 2 of block j / 2; its 16 values' words are xq[j] in natural order.
          const d = dp4Dot("q8", w, `xq${u}`);
          return `group_scale(${row} * GPR + ${j} / 2u) * xs${u}.x * f32(${d})`;
        }
        const d = [0, 1, 2, 3].map((i) => `dot(q8v(${w}[${i}]), ${xv(u, i)})`).join(" + ");
        return `group_scale(${row} * GPR + ${j} / 2u) * (${d})`;
      }
      case "q4": {
        if (dp4) {
          const d = dp4Dot("q4", w, [`xq${u}e`, `xq${u}o`]);
          // Codes are q + 8: sum q x = s (sum c xq - 8 sum xq).
          return `group_scale(${row} * GPR + ${j}) * (xs${u}.x * f32(${d}) - 8.0 * xs${u}.y)`;
        }
        const d = [0, 1, 2, 3, 4, 5, 6, 7].map((i) =>
          `dot(q4v(${w}[${i >> 1}], ${16 * (i & 1)}u), ${xv(u, i)})`
        )
          .join(" + ");
        return `group_scale(${row} * GPR + ${j}) * (${d} - 8.0 * xsum${u})`;
      }
    }
  };
  const body: string[] = [];
  for (let u = 0; u < U; u++) body.push(`let j${u} = (it + ${u}u) * S + lane;`);
  for (let u = 0; u < U; u++) {
    for (let r = 0; r < RR; r++) body.push(`let w${u}_${r} = W[rb${r} + j${u}];`);
  }
  for (let u = 0; u < U; u++) {
    if (dp4 && wt === "q4") {
      body.push(
        `let xq${u}e = xq[j${u}];`,
        `let xq${u}o = xq[UNITS + j${u}];`,
        `let xs${u} = xqs[j${u}];`,
      );
    } else if (dp4) body.push(`let xq${u} = xq[j${u}];`, `let xs${u} = xqs[j${u} / 2u];`);
    else {
      for (let i = 0; i < XV; i++) body.push(`let ${xv(u, i)} = xs[${i}u * UNITS + j${u}];`);
    }
    if (needXsum) body.push(`let xsum${u} = xsum[j${u}];`);
  }
  for (let u = 0; u < U; u++) {
    for (let r = 0; r < RR; r++) body.push(`a${r} += ${unitDot(`w${u}_${r}`, u, `row${r}`)};`);
  }
  // Row r of the block (clamped; up rows N further), from its first row `n0`.
  const rowOf = (r: number, n0: string) =>
    r < R ? `min(${n0} + ${r}u, N - 1u)` : `N + min(${n0} + ${r - R}u, N - 1u)`;
  const rowsDecl: string[] = [];
  for (let r = 0; r < RR; r++) {
    rowsDecl.push(
      `let row${r} = ${rowOf(r, "n0")};`,
      `let rb${r} = row${r} * UNITS;`,
      `var a${r} = 0.0;`,
    );
  }
  // The first iteration of the first block with its weights loaded before the stage (prefetch).
  const pre: string[] = [];
  const firstBody = body.map((line) => {
    const m = /^let w(\d+)_(\d+) = W\[rb(\d+) \+ j(\d+)\];$/.exec(line);
    return m ? `let w${m[1]}_${m[2]} = pw${m[1]}_${m[2]};` : line;
  });
  if (t.prefetch) {
    pre.push("let pn0 = min(blk0, nblk - 1u) * R;");
    for (let r = 0; r < RR; r++) pre.push(`let prb${r} = (${rowOf(r, "pn0")}) * UNITS;`);
    for (let u = 0; u < U; u++) {
      for (let r = 0; r < RR; r++) pre.push(`let pw${u}_${r} = W[prb${r} + ${u}u * S + lane];`);
    }
  }
  const stores: string[] = [];
  for (let r = 0; r < RR; r++) {
    stores.push(`let s${r} = subgroupAdd(a${r})${defer ? " * inv" : ""};`);
  }
  for (let r = 0; r < R; r++) {
    stores.push(`if (lane == ${r}u && n0 + ${r}u < N) {
      let o = t * N + n0 + ${r}u;
      ${pairs ? `y[o] = ${siluMul(`s${r}`, `s${r + R}`)};` : `y[o] = select(0.0, y[o], p.acc != 0u) + s${r};`}
    }`);
  }
  const quantFns = !isQuant(wt) ? "" : `const GPR = ${K / QUANT_GROUP}u;\n${QUANT_DECODE_WGSL}`;
  return `
${gemvBindingsWgsl(wt, f === "rmsnorm", nwt)}
const K = ${K}u;
const N = ${N}u;
const K4 = ${K4}u;
const UNITS = ${UNITS}u;
const ITER = ${ITER}u;
const S = ${S}u;
const WG = ${WG}u;
const WARPS = ${WG / S}u;
const R = ${R}u;
${dp4 ? "" : `var<workgroup> xs: array<vec4<f32>, ${K4}>;`}
// x vec4 k of the row is component k % XV of unit k / XV; staged component-major ([XV][UNITS]) so a warp's
// lanes, one unit each, read consecutive vec4s (unit-major would stride XV vec4s: XV-way bank conflicts).
fn xi(k: u32) -> u32 { return (k % ${XV}u) * UNITS + k / ${XV}u; }
var<workgroup> red: array<f32, ${WG / S}>;
${needXsum ? `var<workgroup> xsum: array<f32, ${UNITS}>;` : ""}
${
    dp4
      ? `var<workgroup> xq: array<vec4<u32>, ${K / 16}>;\nvar<workgroup> xqs: array<vec2<f32>, ${K / 32}>;`
      : ""
  }
${quantFns}
@compute @workgroup_size(${WG})
fn main(
  @builtin(workgroup_id) wg: vec3<u32>,
  @builtin(local_invocation_index) tid: u32,
  @builtin(num_workgroups) ng: vec3<u32>,
) {
  let warp = tid / S;
  let lane = tid % S;
  let t = wg.y;
  let xrow = (p.x_row0 + t) * ${f === "silu_mul" ? "2u * K4" : "K4"};
  let nblk = (N + R - 1u) / R;
  let blk0 = wg.x * WARPS + warp;
  ${early.join("\n  ")}
  ${pre.join("\n  ")}
  ${stage}
  ${
    t.prefetch
      ? `if (blk0 < nblk) {
    let blk = blk0;
    let n0 = blk * R;
    ${rowsDecl.join("\n    ")}
    {
      let it = 0u;
      ${firstBody.join("\n      ")}
    }
    for (var it = ${U}u; it < ITER; it += ${U}u) {
      ${body.join("\n      ")}
    }
    ${stores.join("\n    ")}
  }`
      : ""
  }
  for (var blk = blk0${t.prefetch ? " + ng.x * WARPS" : ""}; blk < nblk; blk += ng.x * WARPS) {
    let n0 = blk * R;
    ${rowsDecl.join("\n    ")}
    for (var it = 0u; it < ITER; it += ${U}u) {
      ${body.join("\n      ")}
    }
    ${stores.join("\n    ")}
  }
}`;
}

/**
 * Direct mode (SgTuning `direct`): a workgroup of WARPS warps is WARPS / SK row blocks of R rows; warp w
 * sums chunks s, s + SK, s + 2SK ... (s = w % SK) of its block's rows, a chunk being U * S units (U loads
 * per lane per row, all issued before use), reading x's vec4s from the storage buffer and, with RMSNorm,
 * multiplying them by the norm weight and summing their squares. After the loop each warp's R sums (and its
 * sum of squares) go to workgroup memory; one barrier; then thread (block g, row r) adds its block's SK
 * partials and scales by 1 / rms. No barrier precedes the first weight load.
 */
function gemvSgDirectSource(
  wt: WeightType | QuantType,
  f: InputTransform,
  t: SgTuning,
  nwt: WeightType,
  K: number,
  N: number,
  S: number,
  pairs = false,
): string {
  if (wt !== "f32" && wt !== "f16") throw new RangeError(`the direct subgroup GEMV has no ${wt} weights`);
  const UW = unitWeights(wt);
  const XV = UW / 4;
  const UNITS = K / UW;
  const ITER = UNITS / S;
  const { rows: R, unroll: U, wg: WG } = t;
  const SK = t.splitK ?? 1;
  const WARPS = WG / S;
  const BLOCKS = WARPS / SK;
  const CH = ITER / U;
  const CMAX = Math.ceil(CH / SK);
  const norm = f === "rmsnorm";
  // Rows of weights a warp reads: R, or paired R gate rows (n) then their R up rows (N + n).
  const RR = pairs ? 2 * R : R;
  const RS = RR + (norm ? 1 : 0);
  const body: string[] = [];
  for (let u = 0; u < U; u++) body.push(`let j${u} = (c * ${U}u + ${u}u) * S + lane;`);
  for (let u = 0; u < U; u++) {
    for (let r = 0; r < RR; r++) body.push(`let w${u}_${r} = W[rb${r} + j${u}];`);
  }
  for (let u = 0; u < U; u++) {
    for (let i = 0; i < XV; i++) {
      const k = `j${u} * ${XV}u + ${i}u`;
      if (norm) {
        body.push(
          `let xr${u}_${i} = x[xrow + ${k}];`,
          `ss += dot(xr${u}_${i}, xr${u}_${i});`,
          `let x${u}_${i} = xr${u}_${i} * ${normWeightVec4(nwt, k)};`,
        );
      } else body.push(`let x${u}_${i} = x[xrow + ${k}];`);
    }
  }
  for (let u = 0; u < U; u++) {
    const w = `w${u}_`;
    for (let r = 0; r < RR; r++) {
      body.push(`a${r} += ${floatUnitDot(wt, `${w}${r}`, `x${u}_0`, `x${u}_1`)};`);
    }
  }
  const decl: string[] = [];
  for (let r = 0; r < RR; r++) {
    decl.push(
      `let rb${r} = (${r < R ? "" : "N + "}min(n0 + ${r % R}u, N - 1u)) * UNITS;`,
      `var a${r} = 0.0;`,
    );
  }
  const sums: string[] = [];
  for (let r = 0; r < RR; r++) {
    sums.push(`let s${r} = subgroupAdd(a${r});`, `if (lane == 0u) { red[warp * RS + ${r}u] = s${r}; }`);
  }
  if (norm) sums.push("let sst = subgroupAdd(ss);", `if (lane == 0u) { red[warp * RS + ${RR}u] = sst; }`);
  return `
${gemvBindingsWgsl(wt, norm, nwt)}
const K = ${K}u;
const N = ${N}u;
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
  let t = wg.y;
  let xrow = (p.x_row0 + t) * ${K / 4}u;
  let ks = warp % SK;
  let n0 = (wg.x * BLOCKS + warp / SK) * R;
  ${decl.join("\n  ")}
  ${norm ? "var ss = 0.0;" : ""}
  for (var i = 0u; i < ${CMAX}u; i++) {
    let c = i * SK + ks;
    ${CH % SK === 0 ? "{" : `if (c < ${CH}u) {`}
      ${body.join("\n      ")}
    }
  }
  ${sums.join("\n  ")}
  workgroupBarrier();
  if (tid < BLOCKS * R) {
    let g = tid / R;
    let n = (wg.x * BLOCKS + g) * R + tid % R;
    if (n < N) {
      var acc = 0.0;
      ${pairs ? "var up = 0.0;" : ""}
      ${norm ? "var tot = 0.0;" : ""}
      for (var k = 0u; k < SK; k++) {
        acc += red[(g * SK + k) * RS + tid % R];
        ${pairs ? "up += red[(g * SK + k) * RS + R + tid % R];" : ""}
        ${norm ? `tot += red[(g * SK + k) * RS + ${RR}u];` : ""}
      }
      ${norm ? "let inv = inverseSqrt(tot / f32(K) + p.eps);" : ""}
      ${norm ? `acc *= inv;${pairs ? " up *= inv;" : ""}` : ""}
      let o = t * N + n;
      ${pairs ? `y[o] = ${siluMul("acc", "up")};` : "y[o] = select(0.0, y[o], p.acc != 0u) + acc;"}
    }
  }
}`;
}

/** Workgroups to launch along x. */
export function sgGroups(N: number, t: SgTuning, S: number): number {
  if (t.direct) return Math.ceil(N / ((t.wg / S / (t.splitK ?? 1)) * t.rows));
  const warps = t.wg / S;
  const need = Math.ceil(Math.ceil(N / t.rows) / warps);
  return t.groups > 0 ? Math.min(need, t.groups) : need;
}
