// Multi-head latent attention (DeepSeek-V2/V3, Kimi K2) over the COMPRESSED cache, with the key
// up-projection absorbed into the query (kernels/mla.ts makes qLatent) and the value up-projection left for
// after (mla.ts's value GEMV). For token t at position pos = pos0 + t and head h:
//   score(s) = scale * (qLatent[t, h] . c_s + qRope[t, h] . kRope_s)        s = 0..pos
//   ctx[t, h] = sum_s softmax(score)_s c_s                                  [kv_lora_rank]
// where cache row s = [c_s (kv_lora_rank), kRope_s (qk_rope_head_dim)]. Every head reads the same rows, so a
// workgroup serves G heads of one token: each row read once is used G times.
//
// Workgroup (head group, token, split) of 128 threads, keys in chunks of KPC = 128 / LPK:
//   - scores: LPK lanes (1..8, so each issues about 32 row loads or fewer) read a key row together, lane l
//     taking vectors l, l + LPK, ... (adjacent lanes, adjacent 16 bytes), each load dotted with the G
//     queries held in workgroup memory; the LPK partial sums meet in a tree in workgroup memory;
//   - online softmax: one thread per head runs over the chunk's scores, leaving the weights in place;
//   - values: thread j accumulates latent slot j (and j + 128, ...) of all G heads over the chunk's rows.
//   Loads are issued in blocks (`unroll`) before any is used, so a block costs about one memory latency.
// Decode (T = 1) has few workgroups (heads / G), so the keys are split: split z takes chunks z, z + S, ...
// and writes its unnormalised (acc, m, l) to scratch; a second dispatch combines the partials of the
// splits that had keys (flash-decoding). splits = 1 writes ctx directly.
import {
  ceilDiv,
  type Gpu,
  type KernelCall,
  kernelCall,
  pipeline,
  storageBuffer,
  uniformBuffer,
} from "./gpu.ts";
import { kvWgsl } from "./kv.ts";
import type { MlaDims } from "./mla.ts";
import { STEP_WGSL } from "./step.ts";
import { range } from "./wgsl.ts";

const WG = 128;

/** How the work is cut (defaults: mlaAttentionDefaultTuning). */
export interface MlaAttentionTuning {
  /** Heads per workgroup (each cache row read is used this many times). */
  headsPerGroup: number;
  /** Key splits per (head group, token), combined by a second dispatch when > 1. */
  splits: number;
  /** Loads a lane issues before using any (per block of the score and value loops), 1..32. */
  unroll: number;
  /**
   * The subgroup kernel (sgAttentionSource): one head a workgroup, q held in registers, a warp's keys scored
   * with subgroupAdd. Default where it applies (subgroups, rows of whole vec4s); headsPerGroup is then 1.
   */
  subgroup?: boolean;
}

/** Workgroup memory of the attention kernel for G heads. */
function sharedBytes(d: MlaDims, G: number): number {
  return (G * (d.kvLoraRank + d.qkRopeHeadDim) + G * WG + G * WG + 3 * G + 4) * 4;
}

/**
 * Heads per group: up to HEADS_PER_GROUP (fewer where workgroup memory is short); splits: about
 * WORKGROUPS workgroups at decode sizes, at most 64; prefill (T > 1) has T times the workgroups already.
 * Decode (T = 1) takes the subgroup kernel where it applies, one head a workgroup, unless the model has
 * MANY_HEADS heads or more and the steps may attend to more than MLA_SHORT_KEYS keys (mlaLengthBucket): then
 * every head re-reading every cache row costs more in L2 traffic than one head a workgroup buys in
 * parallelism, and 4 heads a workgroup over 32 splits serve (H200, f16 cache, us a
 * layer at 128 / 2,048 / 8,192 keys: 64 heads 21.4 / 80.5 / 257 one head a workgroup, 24.7 / 63.1 / 154
 * four; 128 heads 24.4 / 136 / 497 against 26.6 / 101 / 285; 16 heads 18.3 / 57.9 / 102 against 24.2 /
 * 48.7 / 100: docs/BENCHMARKS.md, the twenty-seventh session).
 */
export function mlaAttentionDefaultTuning(gpu: Gpu, d: MlaDims): MlaAttentionTuning {
  let G = Math.min(HEADS_PER_GROUP, d.heads);
  while (G > 1 && sharedBytes(d, G) > gpu.maxWorkgroupStorage) G--;
  if (
    d.T === 1 && d.heads >= MANY_HEADS && !(d.keys !== undefined && d.keys <= MLA_SHORT_KEYS) &&
    sharedBytes(d, MANY_HEADS_PER_GROUP) <= gpu.maxWorkgroupStorage
  ) {
    return { headsPerGroup: MANY_HEADS_PER_GROUP, splits: MANY_HEADS_SPLITS, unroll: 8 };
  }
  if (d.T === 1 && mlaSubgroupFits(gpu, d)) {
    // One head a workgroup: enough splits for about 1024 workgroups at long contexts (idle ones exit).
    const splits = d.T === 1 ? Math.max(1, Math.min(64, Math.floor(1024 / d.heads))) : 1;
    return { headsPerGroup: 1, splits, unroll: 8, subgroup: true };
  }
  const groups = ceilDiv(d.heads, G) * d.T;
  const splits = d.T === 1 ? Math.max(1, Math.min(64, Math.floor(WORKGROUPS / groups))) : 1;
  return { headsPerGroup: G, splits, unroll: 8 };
}

/**
 * Whether the subgroup kernel serves these dims here: vec4 rows, and every warp scores a whole number of a
 * chunk's keys (a chunk holds WG / lanesPerKey keys, >= 16; subgroups of 4 make 32 warps, too many).
 */
export function mlaSubgroupFits(gpu: Gpu, d: MlaDims): boolean {
  const SG = gpu.subgroupSize;
  if (SG === null || d.kvLoraRank % 4 !== 0 || d.qkRopeHeadDim % 4 !== 0 || SG > WG) return false;
  const keysPerChunk = WG / lanesPerKey((d.kvLoraRank + d.qkRopeHeadDim) / 4);
  return keysPerChunk % (WG / SG) === 0;
}

/**
 * Decode attention for subgroup adapters, one head per workgroup of 128 threads (WG), keys in chunks of KPC
 * (the same chunks and partials as attentionSource, so the combine is shared):
 *   - each lane holds its slice of the head's query [qLatent, qRope] in registers (vec4s l, l + S, ...);
 *   - each warp scores KPC / warps keys: all their row loads issued at once, partial dots with the query
 *     registers, subgroupAdd per key (no tree in workgroup memory);
 *   - every thread runs the chunk's online softmax itself from the shared scores (no per-head serial pass);
 *   - thread j accumulates latent vec4 j (and j + WG ...) over the chunk's rows.
 */
function sgAttentionSource(d: MlaDims, S: number, SG: number): string {
  const R = d.kvLoraRank, DR = d.qkRopeHeadDim, DN = d.qkNopeHeadDim, NH = d.heads;
  const CWV = (R + DR) / 4, RV = R / 4;
  const KPC = WG / lanesPerKey(CWV);
  const WARPS = WG / SG;
  const KPW = KPC / WARPS; // keys per warp per chunk
  const QV = Math.ceil(CWV / SG); // query vec4s per lane
  const ND = Math.ceil(RV / WG);
  const PS = RV + 1;
  const QS = d.qStride ?? NH * (DN + DR);
  const qs = range(QV), nd = range(ND);
  const w = kvWgsl(d.kv);
  const kc = (i: string) => w.loadUnscaled(4, "kc", i);
  const out = S === 1
    ? nd.map((i) => `if (j + ${i * WG}u < RV) { ctx[(t * NH + h) * RV + j + ${i * WG}u] = acc${i} / l; }`)
      .join("\n  ")
    : nd.map((i) =>
      `if (j + ${i * WG}u < RV) { part[((t * ${S}u + z) * NH + h) * ${PS}u + j + ${i * WG}u] = acc${i}; }`
    ).join("\n  ") + `
  if (j == 0u) { part[((t * ${S}u + z) * NH + h) * ${PS}u + RV] = vec4<f32>(m, l, 0.0, 0.0); }`;
  return `${w.enable}${STEP_WGSL}
struct P { scale: f32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> step: Step;
@group(0) @binding(2) var<storage, read> q: array<f32>;
@group(0) @binding(3) var<storage, read> qlat: array<f32>;
@group(0) @binding(4) var<storage, read> kc: array<${w.vec(4)}>;
@group(0) @binding(5) var<storage, read_write> ${S === 1 ? "ctx" : "part"}: array<vec4<f32>>;
const NH = ${NH}u;
const R = ${R}u;
const CWV = ${CWV}u;
const RV = ${RV}u;
const KPC = ${KPC}u;
var<workgroup> ss: array<f32, ${KPC}>;
var<workgroup> keys: u32;
fn qv(t: u32, h: u32, v: u32) -> vec4<f32> {
  if (v >= CWV) { return vec4<f32>(0.0); }
  if (v < RV) { let b = (t * NH + h) * R + 4u * v; return vec4<f32>(qlat[b], qlat[b + 1u], qlat[b + 2u], qlat[b + 3u]); }
  let b = t * ${QS}u + h * ${DN + DR}u + ${DN}u + 4u * (v - RV);
  return vec4<f32>(q[b], q[b + 1u], q[b + 2u], q[b + 3u]);
}
@compute @workgroup_size(${WG})
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) j: u32) {
  let h = wg.x;
  let t = wg.y;
  let z = wg.z;
  if (j == 0u) { keys = select(0u, step.pos0 + t + 1u, t < step.T); }
  let n = workgroupUniformLoad(&keys);
  let nch = (n + KPC - 1u) / KPC;
  if (z >= nch) { return; }
  let warp = j / ${SG}u;
  let lane = j % ${SG}u;
  ${qs.map((i) => `let q${i} = qv(t, h, lane + ${i * SG}u);`).join("\n  ")}
  var m = -3.0e38;
  var l = 0.0;
  ${nd.map((i) => `var acc${i} = vec4<f32>(0.0);`).join("\n  ")}
  for (var c = z; c < nch; c += ${S}u) {
    let base = c * KPC;
    // Scores of this warp's keys.
    ${warpScoresWgsl({ KPW, SG, QV, kc })}
    workgroupBarrier();
    // Online softmax over the chunk, by every thread.
    var m1 = m;
    for (var k = 0u; k < KPC; k++) { m1 = max(m1, ss[k]); }
    let corr = exp(m - m1);
    var sum = 0.0;
    ${nd.map((i) => `acc${i} *= corr;`).join("\n    ")}
    for (var k = 0u; k < KPC; k++) {
      let w = exp(ss[k] - m1);
      sum += w;
      let row = min(base + k, n - 1u) * CWV;
      ${nd.map((i) => `acc${i} += w * ${kc(`row + min(j + ${i * WG}u, RV - 1u)`)};`).join("\n      ")}
    }
    l = l * corr + sum;
    m = m1;
    workgroupBarrier();
  }
  ${out}
}`;
}

const HEADS_PER_GROUP = 8;
const WORKGROUPS = 256;
/** From this many heads, decode groups MANY_HEADS_PER_GROUP heads a workgroup over MANY_HEADS_SPLITS splits. */
const MANY_HEADS = 64;
const MANY_HEADS_PER_GROUP = 4;
const MANY_HEADS_SPLITS = 32;
/**
 * Up to this many keys, many heads keep one head a workgroup where the program's builder says its steps
 * stay that short (MlaDims.keys; H200, f16 cache, 64 heads: 36 against 41.7 us at 512 keys, 51.1 against
 * 49.3 at 1,024; 128 heads 47.4 against 56.9, 77.2 against 72.2).
 */
export const MLA_SHORT_KEYS = 1024;

/** The most keys any one-token step takes the fused decode (kernels/mla_decode.ts) for. */
export const MLA_FUSED_MAX_KEYS = 2048;

/**
 * One-token steps of `heads` heads attending to at most this many keys take the fused decode: 12 keys a head
 * up to 32 heads, 16 past that, at most MLA_FUSED_MAX_KEYS (16 heads 192, 32 heads 384, 64 heads 1,024, 128
 * heads 2,048). H200, DeepSeek-V2-Lite's shape q4 (docs/BENCHMARKS.md, the twenty-ninth session): the split
 * path catches up at ~290 keys with 16 heads, ~380 with 32, ~1,150 with 64 and ~2,500 with 128. A workgroup a
 * head walks its keys alone, but more heads fill more SMs, while the split path's absorption and combine grow
 * with them.
 */
export function mlaFusedKeys(heads: number): number {
  return Math.min(MLA_FUSED_MAX_KEYS, heads * (heads <= 32 ? 12 : 16));
}

/**
 * The length bucket of a one-token step of an MLA layer of `heads` heads attending to `keys` keys: the most
 * keys of the bucket it falls in, or undefined for the unbounded one (and where the length is unknown). A
 * decode program is built per bucket and serves every step in it, given the bound as MlaDims.keys: up to
 * mlaFusedKeys(heads) the whole attention runs in one dispatch where it fits (kernels/mla_decode.ts); with
 * MANY_HEADS heads or more the split path cuts one head a workgroup up to MLA_SHORT_KEYS and
 * MANY_HEADS_PER_GROUP heads past it. The bounds nest, so each bucket's program is right for all its steps.
 * (Called for every decode step: no allocation.)
 */
export function mlaLengthBucket(heads: number, keys: number | undefined): number | undefined {
  if (keys === undefined) return undefined;
  const fused = mlaFusedKeys(heads);
  const short = heads >= MANY_HEADS ? MLA_SHORT_KEYS : fused;
  const lo = Math.min(fused, short), hi = Math.max(fused, short);
  return keys <= lo ? lo : keys <= hi ? hi : undefined;
}

/**
 * WGSL scoring a warp's KPW keys of the chunk at `base` (keys base + warp * KPW + k, clamped to n - 1, and
 * set to -3e38 past n): each lane holds query vec4s q0.. (lane, lane + SG, ...) and reads the same slots of
 * each key row of the `kc` cache (CWV vec4s a row), issuing every load before any is used; subgroupAdd
 * makes the score, times p.scale, which lane 0 writes to ss[warp * KPW + k]. Shared by the subgroup
 * attention and the fused decode.
 */
export function warpScoresWgsl(
  o: { KPW: number; SG: number; QV: number; kc: (i: string) => string },
): string {
  const qs = range(o.QV), ks = range(o.KPW);
  const loads = ks.map((k) =>
    `let r${k} = min(base + warp * ${o.KPW}u + ${k}u, n - 1u) * CWV;
    ${
      qs.map((i) => `let k${k}_${i} = ${o.kc(`r${k} + min(lane + ${i * o.SG}u, CWV - 1u)`)};`).join("\n    ")
    }`
  );
  const scores = ks.map((k) =>
    `let d${k} = subgroupAdd(${qs.map((i) => `dot(q${i}, k${k}_${i})`).join(" + ")});
    if (lane == 0u) {
      let key = base + warp * ${o.KPW}u + ${k}u;
      ss[warp * ${o.KPW}u + ${k}u] = select(-3.0e38, d${k} * p.scale, key < n);
    }`
  );
  return [...loads, ...scores].join("\n    ");
}

/** Lanes per key row in the score phase: about 32 loads or fewer each, at most 8 lanes. */
function lanesPerKey(cwv: number): number {
  let lpk = 1;
  while (lpk < 8 && cwv / lpk > 32) lpk *= 2;
  return lpk;
}

function attentionSource(d: MlaDims, G: number, S: number, unroll: number): string {
  const R = d.kvLoraRank, DR = d.qkRopeHeadDim, DN = d.qkNopeHeadDim, NH = d.heads;
  const CW = R + DR;
  // vec4 rows and slots when the row and both of its parts are whole vec4s.
  const V = R % 4 === 0 && DR % 4 === 0 ? 4 : 1;
  const vt = V === 4 ? "vec4<f32>" : "f32";
  const CWV = CW / V, RV = R / V;
  const LPK = lanesPerKey(CWV);
  const KPC = WG / LPK; // keys per chunk
  const NL = ceilDiv(CWV, LPK); // row loads per lane
  const ND = ceilDiv(RV, WG); // output slots per thread
  const gs = range(G);
  const PS = V === 4 ? RV + 1 : RV + 2; // a partial: RV slots, then (m, l) (one vec4, or two floats)
  const dot = (a: string, b: string) => (V === 4 ? `dot(${a}, ${b})` : `${a} * ${b}`);
  const w = kvWgsl(d.kv);
  const kc = (i: string) => w.loadUnscaled(V, "kc", i);
  // Loops over blocks of loads, each block's loads issued before any is used (bounded code size): UB row
  // slots in the score loop, UV rows (a power of two, so it divides KPC) in the value loop.
  const UB = Math.min(unroll, NL);
  let UV = 1;
  while (UV * 2 <= Math.min(unroll, KPC)) UV *= 2;
  // Score: lane l of key kk reads row slots l, l + LPK, ... (LPK lanes read LPK adjacent vectors); slots
  // past the row (the last block's) read the last one and count zero.
  const score = `for (var i0 = 0u; i0 < ${ceilDiv(NL, UB) * UB}u; i0 += ${UB}u) {
      ${range(UB).map((b) => `let e${b} = l + (i0 + ${b}u) * LPK;`).join("\n      ")}
      ${
    range(UB).map((b) => `let k${b} = select(${vt}(0.0), ${kc(`krow + min(e${b}, CWV - 1u)`)}, e${b} < CWV);`)
      .join(
        "\n      ",
      )
  }
      ${
    range(UB).flatMap((b) =>
      gs.map((g) => `x${g} += ${dot(`qs[${g * CWV}u + min(e${b}, CWV - 1u)]`, `k${b}`)};`)
    )
      .join("\n      ")
  }
    }`;
  // Values: the chunk's KPC rows, slot u of each; rows past the last key read the last one and weigh 0.
  const values = (u: string, i: number) =>
    `for (var k0 = 0u; k0 < KPC; k0 += ${UV}u) {
        ${
      range(UV).map((k) => `let v${k} = ${kc(`min(base + k0 + ${k}u, n - 1u) * CWV + ${u}`)};`).join(
        "\n        ",
      )
    }
        ${
      range(UV).flatMap((k) => gs.map((g) => `acc${g}_${i} += ss[${g} * KPC + k0 + ${k}u] * v${k};`))
        .join("\n        ")
    }
      }`;
  const store = (g: number, i: number) =>
    S === 1
      ? `if (h0 + ${g}u < NH && u < RV) { ctx[(t * NH + h0 + ${g}u) * RV + u] = acc${g}_${i} / ls[${g}]; }`
      : `if (h0 + ${g}u < NH && u < RV) { part[((t * ${S}u + z) * NH + h0 + ${g}u) * ${PS}u + u] = acc${g}_${i}; }`;
  const ml = S === 1 ? "" : `if (j < ${G}u && h0 + j < NH) {
    let pb = ((t * ${S}u + z) * NH + h0 + j) * ${PS}u + RV;
    ${
    V === 4
      ? "part[pb] = vec4<f32>(ms[j], ls[j], 0.0, 0.0);"
      : "part[pb] = ms[j];\n    part[pb + 1u] = ls[j];"
  }
  }`;
  return `${w.enable}${STEP_WGSL}
struct P { scale: f32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> step: Step;
@group(0) @binding(2) var<storage, read> q: array<f32>;
@group(0) @binding(3) var<storage, read> qlat: array<f32>;
@group(0) @binding(4) var<storage, read> kc: array<${w.vec(V)}>;
@group(0) @binding(5) var<storage, read_write> ${S === 1 ? "ctx" : "part"}: array<${vt}>;
const NH = ${NH}u;
const R = ${R}u;
const DR = ${DR}u;
const DN = ${DN}u;
const CW = ${CW}u;
const CWV = ${CWV}u;
const RV = ${RV}u;
const LPK = ${LPK}u;
const KPC = ${KPC}u;
var<workgroup> qs: array<${vt}, ${G * CWV}>;
var<workgroup> red: array<f32, ${G * WG}>;
var<workgroup> ss: array<f32, ${G * KPC}>;
var<workgroup> ms: array<f32, ${G}>;
var<workgroup> ls: array<f32, ${G}>;
var<workgroup> cf: array<f32, ${G}>;
var<workgroup> keys: u32;
@compute @workgroup_size(${WG})
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  let h0 = wg.x * ${G}u;
  let t = wg.y;
  let z = wg.z;
  let j = lid.x;
  if (j == 0u) { keys = select(0u, step.pos0 + t + 1u, t < step.T); }
  let n = workgroupUniformLoad(&keys);
  let nch = (n + KPC - 1u) / KPC;
  // No token, or no chunk for this split (the combine reads splits z < nch only).
  if (z >= nch) { return; }
  if (j < ${G}u) {
    ms[j] = -3.0e38;
    ls[j] = 0.0;
  }
  // The G queries [qLatent, qRope] (zero for heads past the last).
  for (var e = j; e < CW; e += ${WG}u) {
    ${
    gs.map((g) =>
      `var v${g} = 0.0;
    if (h0 + ${g}u < NH) {
      if (e < R) { v${g} = qlat[(t * NH + h0 + ${g}u) * R + e]; }
      else { v${g} = q[t * ${d.qStride ?? NH * (DN + DR)}u + (h0 + ${g}u) * (DN + DR) + DN + e - R]; }
    }
    ${V === 4 ? `qs[${g * CWV}u + e / 4u][e % 4u] = v${g};` : `qs[${g * CWV}u + e] = v${g};`}`
    ).join("\n    ")
  }
  }
  workgroupBarrier();
  let kk = j / LPK;
  let l = j % LPK;
  ${range(ND).map((i) => gs.map((g) => `var acc${g}_${i} = ${vt}(0.0);`).join(" ")).join("\n  ")}
  for (var c = z; c < nch; c += ${S}u) {
    let base = c * KPC;
    // Scores of the chunk's keys: partial dot products per lane, summed over the key's LPK lanes.
    let krow = min(base + kk, n - 1u) * CWV;
    ${gs.map((g) => `var x${g} = 0.0;`).join(" ")}
    ${score}
    ${gs.map((g) => `red[${g * WG}u + j] = x${g};`).join("\n    ")}
    workgroupBarrier();
    ${
    LPK > 1
      ? `for (var s = LPK / 2u; s > 0u; s >>= 1u) {
      if (l < s) {
        ${gs.map((g) => `red[${g * WG}u + j] += red[${g * WG}u + j + s];`).join("\n        ")}
      }
      workgroupBarrier();
    }`
      : ""
  }
    if (l == 0u) {
      ${
    gs.map((g) => `ss[${g * KPC}u + kk] = select(-3.0e38, red[${g * WG}u + j] * p.scale, base + kk < n);`)
      .join("\n      ")
  }
    }
    workgroupBarrier();
    // Online softmax, one thread per head: the chunk's weights replace its scores.
    if (j < ${G}u) {
      let m0 = ms[j];
      var m1 = m0;
      for (var k = 0u; k < KPC; k++) { m1 = max(m1, ss[j * KPC + k]); }
      var sum = 0.0;
      for (var k = 0u; k < KPC; k++) {
        let e = exp(ss[j * KPC + k] - m1);
        ss[j * KPC + k] = e;
        sum += e;
      }
      let corr = exp(m0 - m1);
      cf[j] = corr;
      ls[j] = ls[j] * corr + sum;
      ms[j] = m1;
    }
    workgroupBarrier();
    ${gs.map((g) => `let corr${g} = cf[${g}];`).join(" ")}
    ${
    range(ND).map((i) => {
      const u = `j + ${i * WG}u`;
      const body = [...gs.map((g) => `acc${g}_${i} *= corr${g};`), values(`min(${u}, ${RV - 1}u)`, i)];
      return `${(i + 1) * WG <= RV ? "" : `if (${u} < RV) `}{\n      ${body.join("\n      ")}\n    }`;
    }).join("\n    ")
  }
    workgroupBarrier();
  }
  ${
    range(ND).map((i) =>
      `{\n    let u = j + ${i * WG}u;\n    ${gs.map((g) => store(g, i)).join("\n    ")}\n  }`
    )
      .join("\n  ")
  }
  ${ml}
}`;
}

/**
 * Splits whose partials a thread of mergeSplitsWgsl loads at once (H200, the combine at 64 splits: 4 16.4,
 * 8 14.0, 16 13.4 us).
 */
const MERGE_UNROLL = 8;

/** Workgroup memory of mergeSplitsWgsl for S splits. */
const MERGE_DECLS = (S: number) =>
  `var<workgroup> wz: array<f32, ${S}>;\nvar<workgroup> lz: array<f32, ${S}>;\nvar<workgroup> lsum: f32;`;

/**
 * WGSL merging the first nz split partials of one (token, head) (`base`: its split 0's partial; NH, RV, nz
 * in scope): the threads load the splits' (m, l) side by side into workgroup memory, one thread turns them
 * into weights exp(m - max), then thread j sums latent slots j, j + WG, ... over the splits, MERGE_UNROLL
 * splits' loads in flight at once, and `write`s each merged, normalised slot. One thread reading every (m, l) and a
 * slot's splits one after another took 21-36 us at 32-64 splits on the H200 (a memory latency each; the
 * whole attention at 2,048 keys was 58 us: docs/BENCHMARKS.md, the twenty-eighth session).
 */
function mergeSplitsWgsl(o: {
  tid: string;
  WG: number;
  V: number;
  PS: number;
  write: (u: string, v: string) => string;
}): string {
  const vt = o.V === 4 ? "vec4<f32>" : "f32";
  const at = (z: string) => `base + ${z} * NH * ${o.PS}u`;
  const ZU = MERGE_UNROLL;
  const zs = Array.from({ length: ZU }, (_, i) => i);
  return `for (var z = ${o.tid}; z < nz; z += ${o.WG}u) {
    let at = ${at("z")} + RV;
    wz[z] = ${o.V === 4 ? "part[at].x" : "part[at]"};
    lz[z] = ${o.V === 4 ? "part[at].y" : "part[at + 1u]"};
  }
  workgroupBarrier();
  if (${o.tid} == 0u) {
    var mx = -3.0e38;
    for (var z = 0u; z < nz; z++) { mx = max(mx, wz[z]); }
    var ls = 0.0;
    for (var z = 0u; z < nz; z++) {
      let w = exp(wz[z] - mx);
      wz[z] = w;
      ls += w * lz[z];
    }
    lsum = ls;
  }
  workgroupBarrier();
  let inv = 1.0 / lsum;
  for (var u = ${o.tid}; u < RV; u += ${o.WG}u) {
    ${zs.map((i) => `var a${i} = ${vt}(0.0);`).join("\n    ")}
    var z = 0u;
    for (; z + ${ZU}u <= nz; z += ${ZU}u) {
      let p = ${at("z")} + u;
      ${
    zs.map((i) => `a${i} += part[p${i ? ` + ${i}u * NH * ${o.PS}u` : ""}] * wz[z${i ? ` + ${i}u` : ""}];`)
      .join("\n      ")
  }
    }
    for (; z < nz; z++) { a0 += part[${at("z")} + u] * wz[z]; }
    ${o.write("u", `(${zs.map((i) => `a${i}`).join(" + ")}) * inv`)}
  }`;
}

/** Combines the S partials of each (token, head): one workgroup each. */
function combineSource(d: MlaDims, S: number): string {
  const R = d.kvLoraRank;
  const V = R % 4 === 0 && d.qkRopeHeadDim % 4 === 0 ? 4 : 1;
  const vt = V === 4 ? "vec4<f32>" : "f32";
  const RV = R / V;
  const KPC = WG / lanesPerKey((R + d.qkRopeHeadDim) / V);
  const PS = V === 4 ? RV + 1 : RV + 2;
  return `${STEP_WGSL}
@group(0) @binding(0) var<storage, read> step: Step;
@group(0) @binding(1) var<storage, read> part: array<${vt}>;
@group(0) @binding(2) var<storage, read_write> ctx: array<${vt}>;
const NH = ${d.heads}u;
const RV = ${RV}u;
const S = ${S}u;
${MERGE_DECLS(S)}
var<workgroup> live: u32;
@compute @workgroup_size(${WG})
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  let h = wg.x;
  let t = wg.y;
  let j = lid.x;
  if (j == 0u) { live = select(0u, 1u, t < step.T); }
  if (workgroupUniformLoad(&live) == 0u) { return; }
  let base = (t * S * NH + h) * ${PS}u;
  // Splits z >= the chunk count had no keys and wrote nothing.
  let nz = min(S, (step.pos0 + t + ${KPC}u) / ${KPC}u);
  ${mergeSplitsWgsl({ tid: "j", WG, V, PS, write: (u, v) => `ctx[(t * NH + h) * RV + ${u}] = ${v};` })}
}`;
}

/**
 * Attention over the latent cache for T tokens at positions step.pos0 + t (causal: token t sees positions
 * 0..pos0 + t, which must all be in the cache, mlaRopeCacheCall having written this step's rows).
 *   q       [T, heads * (qkNope + qkRope)]  the query projection's output, its rope parts already rotated
 *                                          (only the rope parts are read)
 *   qLatent [T, heads, kvLoraRank]          W_UK_h^T q_nope (mlaAbsorbCall)
 *   cache   [maxSeq, kvLoraRank + qkRope]   rows [c, rotated k_rope] (mlaRopeCacheCall) of d.kv (f32 / f16)
 *   ctx     [T, heads, kvLoraRank]          output: sum_s p_s c_s per head (f32)
 * `scale` is the softmax scale (mlaSoftmaxScale). One dispatch, or two when the keys are split (then the
 * first call owns a scratch buffer; releaseCalls frees it).
 */
export function mlaAttentionCalls(
  gpu: Gpu,
  bufs: {
    step: GPUBuffer;
    q: GPUBuffer;
    qLatent: GPUBuffer;
    cache: GPUBuffer;
    ctx: GPUBuffer;
    /** Scratch for the split partials, shared with other calls that never run at once; else owned. */
    part?: GPUBuffer;
  },
  d: MlaDims & { scale: number; tuning?: Partial<MlaAttentionTuning> },
): KernelCall[] {
  checkDims(d);
  if (d.kv === "f16" && !gpu.hasF16) throw new RangeError("MLA attention: an f16 cache needs shader-f16");
  const t = mlaAttentionTuning(gpu, d);
  const G = t.headsPerGroup, S = t.splits;
  if (!Number.isInteger(G) || G < 1 || G > d.heads || sharedBytes(d, G) > gpu.maxWorkgroupStorage) {
    throw new RangeError(
      `MLA attention: headsPerGroup ${G} must be 1..${d.heads} and fit workgroup memory ` +
        `(${sharedBytes(d, G)} bytes of ${gpu.maxWorkgroupStorage})`,
    );
  }
  if (!Number.isInteger(S) || S < 1 || S > 256) {
    throw new RangeError(`MLA attention: splits ${S} must be 1..256`);
  }
  if (!(d.scale > 0)) throw new RangeError(`MLA attention: scale must be positive, got ${d.scale}`);
  if (t.subgroup && !mlaSubgroupFits(gpu, d)) {
    throw new RangeError(`MLA attention: the subgroup kernel needs subgroups and vec4 rows (R, dr % 4 == 0)`);
  }
  const params = uniformBuffer(gpu, [d.scale], [0]);
  const sg = t.subgroup === true;
  const grid: [number, number, number] = [sg ? d.heads : ceilDiv(d.heads, G), d.T, S];
  const source = (splits: number) =>
    sg ? sgAttentionSource(d, splits, gpu.subgroupSize!) : attentionSource(d, G, splits, t.unroll);
  if (S === 1) {
    const call = kernelCall(
      gpu,
      pipeline(gpu, source(1)),
      [
        params,
        bufs.step,
        bufs.q,
        bufs.qLatent,
        bufs.cache,
        bufs.ctx,
      ],
      grid,
      "mla_attention",
    );
    return [call];
  }
  // The partials: the caller's scratch where it is large enough, else a buffer of the call's own.
  const bytes = mlaAttentionPartBytes(gpu, d);
  const shared = bufs.part && bufs.part.size >= bytes ? bufs.part : undefined;
  const part = shared ?? storageBuffer(gpu, bytes, "mla_part");
  const call = kernelCall(
    gpu,
    pipeline(gpu, source(S)),
    [
      params,
      bufs.step,
      bufs.q,
      bufs.qLatent,
      bufs.cache,
      part,
    ],
    grid,
    "mla_attention",
  );
  if (!shared) call.owned = [part];
  const combine = kernelCall(gpu, pipeline(gpu, combineSource(d, S)), [bufs.step, part, bufs.ctx], [
    d.heads,
    d.T,
  ], "mla_combine");
  return [call, combine];
}

function checkDims(d: MlaDims): void {
  for (const k of ["heads", "kvLoraRank", "qkRopeHeadDim", "maxSeq", "T"] as const) {
    if (!Number.isInteger(d[k]) || d[k] < 1) {
      throw new RangeError(`MLA attention: ${k} must be a positive integer, got ${d[k]}`);
    }
  }
  if (!Number.isInteger(d.qkNopeHeadDim) || d.qkNopeHeadDim < 0) {
    throw new RangeError(
      `MLA attention: qkNopeHeadDim must be a non-negative integer, got ${d.qkNopeHeadDim}`,
    );
  }
}

/**
 * Reference of mlaAttentionCalls (f64): the same absorbed formulation, for the kernel's tests. Returns ctx
 * [T, heads, kvLoraRank]. (mla.ts's mlaReference is the un-absorbed transformers math.)
 */
export function mlaLatentAttentionRef(
  x: { q: Float32Array; qLatent: Float32Array; cache: Float32Array },
  d: MlaDims & { scale: number; pos0: number },
): Float32Array {
  const { heads: NH, kvLoraRank: R, qkNopeHeadDim: DN, qkRopeHeadDim: DR, T } = d;
  const CW = R + DR;
  const out = new Float32Array(T * NH * R);
  for (let t = 0; t < T; t++) {
    const n = d.pos0 + t + 1;
    for (let h = 0; h < NH; h++) {
      const qb = t * NH * (DN + DR) + h * (DN + DR) + DN;
      const lb = (t * NH + h) * R;
      const sc = new Float64Array(n);
      for (let s = 0; s < n; s++) {
        let a = 0;
        for (let e = 0; e < R; e++) a += x.qLatent[lb + e] * x.cache[s * CW + e];
        for (let e = 0; e < DR; e++) a += x.q[qb + e] * x.cache[s * CW + R + e];
        sc[s] = a * d.scale;
      }
      const m = Math.max(...sc);
      let z = 0;
      for (let s = 0; s < n; s++) z += sc[s] = Math.exp(sc[s] - m);
      for (let e = 0; e < R; e++) {
        let a = 0;
        for (let s = 0; s < n; s++) a += sc[s] * x.cache[s * CW + e];
        out[lb + e] = a / z;
      }
    }
  }
  return out;
}

/**
 * The split attention's combine and the value up-projection (mla.ts's mlaValueCall) in one dispatch, for
 * subgroup adapters: each workgroup (row block, head, token) merges the head's split partials into ctx in
 * workgroup memory (as the combine does), then its warps compute RB rows of out = W_UV_h ctx, lanes over
 * 4-weight units of a row, subgroupAdd reducing. Null where it does not apply (one split: ctx is written
 * directly; no subgroups; R or dr not a multiple of 4), and the caller keeps the two dispatches.
 *   part  the attention's partials (mlaAttentionCalls' scratch)
 *   wUV   [heads, dv, R] f32 or f16, out [T, heads * dv] f32
 */
export function mlaCombineValueCall(
  gpu: Gpu,
  bufs: { step: GPUBuffer; part: GPUBuffer; wUV: GPUBuffer; out: GPUBuffer },
  d: MlaDims & { splits: number; weights: "f32" | "f16" },
): KernelCall | null {
  const SG = gpu.subgroupSize;
  const R = d.kvLoraRank, DR = d.qkRopeHeadDim, NH = d.heads, DV = d.vHeadDim, S = d.splits;
  if (!SG || S <= 1 || R % 4 !== 0 || DR % 4 !== 0) return null;
  const RV = R / 4;
  const PS = RV + 1;
  const KPC = WG / lanesPerKey((R + DR) / 4);
  const CWG = 256, WARPS = CWG / SG;
  const RPW = 2; // rows per warp
  const RB = WARPS * RPW;
  const f16 = d.weights === "f16";
  const wv = f16 ? "vec4<f32>(unpack2x16float(W[wb + u].x), unpack2x16float(W[wb + u].y))" : "W[wb + u]";
  const code = `${STEP_WGSL}
@group(0) @binding(0) var<storage, read> step: Step;
@group(0) @binding(1) var<storage, read> part: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> W: array<${f16 ? "vec2<u32>" : "vec4<f32>"}>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
const NH = ${NH}u;
const RV = ${RV}u;
const S = ${S}u;
const DV = ${DV}u;
var<workgroup> cx: array<vec4<f32>, ${RV}>;
${MERGE_DECLS(S)}
var<workgroup> live: u32;
@compute @workgroup_size(${CWG})
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
  let h = wg.y;
  let t = wg.z;
  if (tid == 0u) { live = select(0u, 1u, t < step.T); }
  if (workgroupUniformLoad(&live) == 0u) { return; }
  let base = (t * S * NH + h) * ${PS}u;
  // Splits z >= the chunk count had no keys and wrote nothing.
  let nz = min(S, (step.pos0 + t + ${KPC}u) / ${KPC}u);
  ${mergeSplitsWgsl({ tid: "tid", WG: CWG, V: 4, PS, write: (u, v) => `cx[${u}] = ${v};` })}
  workgroupBarrier();
  let warp = tid / ${SG}u;
  let lane = tid % ${SG}u;
  for (var r = 0u; r < ${RPW}u; r++) {
    let n = wg.x * ${RB}u + warp * ${RPW}u + r;
    let wb = (h * DV + min(n, DV - 1u)) * RV;
    var acc = 0.0;
    for (var u = lane; u < RV; u += ${SG}u) { acc += dot(${wv}, cx[u]); }
    let s = subgroupAdd(acc);
    if (lane == 0u && n < DV) { y[t * NH * DV + h * DV + n] = s; }
  }
}`;
  return kernelCall(
    gpu,
    pipeline(gpu, code),
    [bufs.step, bufs.part, bufs.wUV, bufs.out],
    [ceilDiv(DV, RB), NH, d.T],
    "mla_combine_value",
  );
}

/**
 * The tuning mlaAttentionCalls runs for these dims: the default with d.tuning's fields over it (a tuning
 * that picks head groups means the grouped kernel, with its splits, unless it asks for the subgroup one).
 */
export function mlaAttentionTuning(
  gpu: Gpu,
  d: MlaDims & { tuning?: Partial<MlaAttentionTuning> },
): MlaAttentionTuning {
  const def = mlaAttentionDefaultTuning(gpu, d);
  if (d.tuning?.headsPerGroup !== undefined && d.tuning.subgroup === undefined && def.subgroup) {
    Object.assign(def, {
      subgroup: false,
      splits: Math.max(1, Math.min(64, Math.floor(WORKGROUPS / ceilDiv(d.heads, d.tuning.headsPerGroup)))),
    });
  }
  return { ...def, ...d.tuning };
}

/** The splits mlaAttentionCalls will use for these dims (its second call, if any, is the combine). */
export function mlaAttentionSplits(gpu: Gpu, d: MlaDims & { tuning?: Partial<MlaAttentionTuning> }): number {
  return mlaAttentionTuning(gpu, d).splits;
}

/** Bytes of the split partials mlaAttentionCalls needs for these dims (0 with one split). */
export function mlaAttentionPartBytes(
  gpu: Gpu,
  d: MlaDims & { tuning?: Partial<MlaAttentionTuning> },
): number {
  const S = mlaAttentionSplits(gpu, d);
  const slot = d.kvLoraRank % 4 === 0 && d.qkRopeHeadDim % 4 === 0 ? 4 : 2; // (m, l) after each row
  return S > 1 ? d.T * S * d.heads * (d.kvLoraRank + slot) * 4 : 0;
}
