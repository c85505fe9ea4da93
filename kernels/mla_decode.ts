// A one-token MLA step over a short latent cache in ONE dispatch, a workgroup a head (kernels/mla.ts names the
// math): what mla.ts's rope + cache + absorb, mla_attention.ts's attention and the combine + value
// up-projection do in three dependent dispatches. At a few hundred keys those three cost ~27 us a layer on
// the H200 (DeepSeek-V2-Lite's shape, `moe.ts --marginal`), most of it the dispatches' fixed costs, not their
// bytes. Workgroup h, WG threads (up to 1,024) in warps of SG lanes, at pos = step.pos0:
//   1. the current latent row: c = rmsnorm(kv[:R]) * kv_a_layernorm and kr = rope(kv[R:], pos), kept in
//      workgroup memory rounded as the cache holds them (workgroup 0 also writes them into the cache at pos;
//      no workgroup reads that row from the cache, so nothing depends on another workgroup), and q's head h:
//      q_nope and rope(q_rope, pos);
//   2. the absorption qLat = W_UK_h^T q_nope: TPR lanes a row of W_UK_h [R, dn] (adjacent 16-byte units),
//      every unit's load issued before any is used, a shuffle-xor tree summing the TPR partial dots;
//   3. attention over the cached keys 0..pos-1 in chunks of KPC: each warp scores KPW keys (lanes hold
//      [qLat, q_rope] in registers and read a key row coalesced, subgroupAdd), then every thread runs the
//      chunk's online softmax from the shared scores and thread (slot, part) accumulates latent vec4 `slot`
//      over the keys of its `part` (PARTS parts, so that every thread works); the current key last, from
//      workgroup memory; the parts summed into ctx = sum_s p_s c_s / l;
//   4. out_h = W_UV_h ctx: TPR lanes a row of W_UV_h [dv, R], as step 2.
// Long caches keep the split path (a head's keys over many workgroups): one workgroup a head walks its keys
// alone, so past mlaFusedKeys(heads) keys the split path is faster (docs/KERNELS.md).
import { type Gpu, type KernelCall, kernelCall, pipeline, uniformBuffer, type WeightType } from "./gpu.ts";
import { kvWgsl } from "./kv.ts";
import type { MlaDims, MlaRopeBuffers } from "./mla.ts";
import { warpScoresWgsl } from "./mla_attention.ts";
import { STEP_WGSL } from "./step.ts";
import { range } from "./wgsl.ts";

/** The options mlaDecodeCall takes beside the dims (as mlaRopeCacheCall and mlaAttentionCalls name them). */
export interface MlaDecodeOptions {
  eps: number;
  interleaved: boolean;
  scale: number;
  /** W_UK / W_UV storage. */
  weights: WeightType;
  /** Where the kv row starts in `kv` (one token: its stride does not matter). Default 0. */
  kvOffset?: number;
  normWeights?: WeightType;
  /** Threads a workgroup (a multiple of the subgroup size); default the device's most, up to 1,024. */
  threads?: number;
}

/** Threads a workgroup by default, where the device allows (H200: 1,024 3-11% faster than 512). */
const DEFAULT_THREADS = 1024;
/** Most value rows a thread loads at once. */
const MAX_VALUE_LOADS = 8;
/** Most warps a workgroup by default. */
const MAX_WARPS = 32;
/** Keys a warp scores per chunk. */
const KPW = 2;
/** Most 16-byte units a thread loads at once in the absorption and the value projection. */
const UNITS_IN_FLIGHT = 8;
/** Most key parts the value accumulation is cut into. */
const MAX_PARTS = 8;

const pow2Floor = (x: number) => 2 ** Math.floor(Math.log2(Math.max(1, x)));
const pow2Ceil = (x: number) => 2 ** Math.ceil(Math.log2(Math.max(1, x)));

interface Shape {
  WG: number;
  SG: number;
  PARTS: number;
}

function shapeOf(gpu: Gpu, d: MlaDims, o: Pick<MlaDecodeOptions, "threads">): Shape | null {
  const SG = gpu.subgroupSize;
  const R = d.kvLoraRank, DR = d.qkRopeHeadDim, DN = d.qkNopeHeadDim;
  if (SG === null || d.T !== 1 || R % 4 !== 0 || DR % 4 !== 0 || DN % 4 !== 0 || DN === 0) return null;
  // At most MAX_WARPS warps: a chunk is 2 keys a warp, and narrow subgroups (4-8 lanes) would otherwise make
  // chunks of hundreds of keys, unrolled.
  let WG = o.threads ?? Math.min(DEFAULT_THREADS, MAX_WARPS * SG);
  const lim = gpu.device.limits;
  while (WG > SG && (WG > lim.maxComputeInvocationsPerWorkgroup || WG > lim.maxComputeWorkgroupSizeX)) {
    WG /= 2;
  }
  if (WG % SG !== 0 || WG < SG) return null;
  const RV = R / 4;
  if (RV > WG) return null;
  // Parts: a power of two dividing the chunk's keys.
  let PARTS = Math.min(MAX_PARTS, pow2Floor(Math.floor(WG / RV)), (WG / SG) * KPW);
  const bytes = (parts: number) =>
    4 * (2 * (R + DR) + DN + 2 * DR + WG / SG + (WG / SG) * KPW + 4) + 16 * parts * RV;
  while (PARTS > 1 && bytes(PARTS) > gpu.maxWorkgroupStorage) PARTS /= 2;
  if (bytes(PARTS) > gpu.maxWorkgroupStorage) return null;
  return { WG, SG, PARTS };
}

/** Whether mlaDecodeCall serves these dims here (subgroups, T = 1, R, dr and dn multiples of 4). */
export function mlaDecodeFits(gpu: Gpu, d: MlaDims, o: Pick<MlaDecodeOptions, "threads"> = {}): boolean {
  return shapeOf(gpu, d, o) !== null;
}

/**
 * WGSL summing, per thread, `tpr` lanes' share of a row's NU vec4 units (units li, li + tpr, ...), every load
 * issued first, into `out` (the full dot on every lane of the row after the shuffle-xor tree).
 */
function rowDotWgsl(o: {
  out: string;
  /** The thread's lane within its row (a WGSL u32 expression). */
  li: string;
  NU: number;
  tpr: number;
  /** The unit u's weights as vec4<f32> (u a WGSL u32 expression). */
  load: (u: string) => string;
  /** The matching vec4 of the vector. */
  vec: (u: string) => string;
}): string {
  const per = Math.ceil(o.NU / o.tpr);
  const us = range(per);
  const u = (i: number) => `min(${o.li} + ${i * o.tpr}u, ${o.NU - 1}u)`;
  const ok = (i: number) =>
    (i + 1) * o.tpr <= o.NU ? "" : `select(0.0, 1.0, ${o.li} + ${i * o.tpr}u < ${o.NU}u) * `;
  const tree = range(Math.log2(o.tpr)).map((k) => `${o.out} += subgroupShuffleXor(${o.out}, ${1 << k}u);`);
  return [
    ...us.map((i) => `let w${i} = ${o.load(u(i))};`),
    `var ${o.out} = ${us.map((i) => `${ok(i)}dot(w${i}, ${o.vec(u(i))})`).join(" + ")};`,
    ...tree,
  ].join("\n    ");
}

function source(d: MlaDims, o: MlaDecodeOptions, s: Shape): string {
  const { WG, SG, PARTS } = s;
  const R = d.kvLoraRank, DR = d.qkRopeHeadDim, DN = d.qkNopeHeadDim, DV = d.vHeadDim;
  const RV = R / 4, DRV = DR / 4, DNV = DN / 4, CWV = RV + DRV, HALF = DR / 2;
  const WARPS = WG / SG, KPC = WARPS * KPW, QV = Math.ceil(CWV / SG);
  const w = kvWgsl(d.kv);
  const f16 = o.weights === "f16";
  const wType = f16 ? "vec2<u32>" : "vec4<f32>";
  const wLoad = (arr: string, i: string) =>
    f16 ? `vec4<f32>(unpack2x16float(${arr}[${i}].x), unpack2x16float(${arr}[${i}].y))` : `${arr}[${i}]`;
  const nw = (o.normWeights ?? "f32") === "f16"
    ? (i: string) => `unpack2x16float(nw[(${i}) >> 1u])[(${i}) & 1u]`
    : (i: string) => `nw[${i}]`;
  const pair = o.interleaved ? ["2u * i", "2u * i + 1u"] : ["i", `i + ${HALF}u`];
  // Lanes a row of the absorption (R rows of DNV units) and of the value projection (DV rows of RV units).
  // At most UNITS_IN_FLIGHT loads a thread a row (the registers of wider workgroups), all threads busy.
  const tprOf = (rows: number, units: number) =>
    Math.max(
      1,
      Math.min(Math.max(pow2Ceil(WG / rows), pow2Ceil(units / UNITS_IN_FLIGHT)), SG, pow2Floor(units)),
    );
  const TK = tprOf(R, DNV), TV = tprOf(DV, RV);
  const passesK = Math.ceil(R / (WG / TK)), passesV = Math.ceil(DV / (WG / TV));
  const qs = range(QV), sl = range(Math.ceil(KPC / SG));
  // A part's keys of a chunk in groups of PU loads in flight (KPC / PARTS is a power of two).
  const PU = Math.min(MAX_VALUE_LOADS, KPC / PARTS), pk = range(PU);
  const kc = (i: string) => w.loadUnscaled(4, "cache", i);
  // The current row as the cache will hold it, in workgroup memory of the cache's type: rounding through
  // f32(f16(x)) or unpack2x16float(pack2x16float(x)) in registers was folded to x by the H200's compiler,
  // leaving the current key more precise than the row the later steps read.
  const vec4At = (arr: string, b: string) =>
    `vec4<f32>(f32(${arr}[${b}]), f32(${arr}[${b} + 1u]), f32(${arr}[${b} + 2u]), f32(${arr}[${b} + 3u]))`;
  // The current row as the cache will hold it, in workgroup memory of the cache's type: rounding through
  // f32(f16(x)) or unpack2x16float(pack2x16float(x)) in registers was folded to x by the H200's compiler,
  // leaving the current key more precise than the row the later steps read.
  const curType = d.kv === "f16" ? "f16" : "f32";
  const held = (e: string) => w.store(1, e);
  return `${w.enable}${STEP_WGSL}
struct P { kv_off: u32, eps: f32, scale: f32, pad: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> step: Step;
@group(0) @binding(2) var<storage, read> cs: array<vec2<f32>>;
@group(0) @binding(3) var<storage, read> q: array<f32>;
@group(0) @binding(4) var<storage, read> kv: array<f32>;
@group(0) @binding(5) var<storage, read> nw: array<${(o.normWeights ?? "f32") === "f16" ? "u32" : "f32"}>;
@group(0) @binding(6) var<storage, read_write> cache: array<${w.vec(4)}>;
@group(0) @binding(7) var<storage, read> wk: array<${wType}>;
@group(0) @binding(8) var<storage, read> wv: array<${wType}>;
@group(0) @binding(9) var<storage, read_write> y: array<f32>;
const R = ${R}u;
const RV = ${RV}u;
const CW = ${R + DR}u;
const CWV = ${CWV}u;
const KPC = ${KPC}u;
var<workgroup> cur: array<${curType}, ${R + DR}>;
var<workgroup> qsh: array<f32, ${R + DR}>;
var<workgroup> qn: array<f32, ${DN}>;
var<workgroup> kr: array<f32, ${DR}>;
var<workgroup> red: array<f32, ${WARPS}>;
var<workgroup> ss: array<f32, ${KPC}>;
var<workgroup> accs: array<vec4<f32>, ${PARTS * RV}>;
var<workgroup> live: u32;
var<workgroup> cached: u32;
@compute @workgroup_size(${WG})
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) j: u32) {
  let h = wg.x;
  if (j == 0u) { live = step.T; cached = step.pos0; }
  if (workgroupUniformLoad(&live) == 0u) { return; }
  let n = workgroupUniformLoad(&cached); // keys in the cache before this one; this one is at pos = n
  let warp = j / ${SG}u;
  let lane = j % ${SG}u;
  // 1. The current latent row and q's head.
  var sq = 0.0;
  for (var i = j; i < R; i += ${WG}u) { let v = kv[p.kv_off + i]; sq += v * v; }
  sq = subgroupAdd(sq);
  if (lane == 0u) { red[warp] = sq; }
  let qb = h * ${DN + DR}u;
  for (var i = j; i < ${DN}u; i += ${WG}u) { qn[i] = q[qb + i]; }
  for (var i = j; i < ${HALF}u; i += ${WG}u) {
    let c = cs[n * ${HALF}u + i];
    let a0 = q[qb + ${DN}u + ${pair[0]}];
    let a1 = q[qb + ${DN}u + ${pair[1]}];
    qsh[R + ${pair[0]}] = a0 * c.x - a1 * c.y;
    qsh[R + ${pair[1]}] = a1 * c.x + a0 * c.y;
    let b0 = kv[p.kv_off + R + ${pair[0]}];
    let b1 = kv[p.kv_off + R + ${pair[1]}];
    cur[R + ${pair[0]}] = ${held("b0 * c.x - b1 * c.y")};
    cur[R + ${pair[1]}] = ${held("b1 * c.x + b0 * c.y")};
  }
  workgroupBarrier();
  var tot = 0.0;
  for (var i = 0u; i < ${WARPS}u; i++) { tot += red[i]; }
  let inv = inverseSqrt(tot / f32(R) + p.eps);
  for (var i = j; i < R; i += ${WG}u) { cur[i] = ${held(`kv[p.kv_off + i] * inv * f32(${nw("i")})`)}; }
  // 2. qLat = W_UK_h^T q_nope: ${TK} lanes a row.
  let li = j % ${TK}u;
  for (var ps = 0u; ps < ${passesK}u; ps++) {
    let r = ps * ${WG / TK}u + j / ${TK}u;
    let wb = (h * R + min(r, R - 1u)) * ${DNV}u;
    ${
    rowDotWgsl({
      out: "a",
      li: "li",
      NU: DNV,
      tpr: TK,
      load: (u) => wLoad("wk", `wb + ${u}`),
      vec: (u) => vec4At("qn", `4u * ${u}`),
    })
  }
    if (li == 0u && r < R) { qsh[r] = a; }
  }
  workgroupBarrier();
  if (h == 0u) {
    for (var i = j; i < CWV; i += ${WG}u) { cache[n * CWV + i] = ${w.store(4, vec4At("cur", "4u * i"))}; }
  }
  // 3. Attention: the cached keys in chunks, then this one.
  ${qs.map((i) => `let q${i} = qv(lane + ${i * SG}u);`).join("\n  ")}
  let slot = j % RV;
  let part = j / RV;
  var m = -3.0e38;
  var l = 0.0;
  var acc = vec4<f32>(0.0);
  let nch = (n + KPC - 1u) / KPC;
  for (var c = 0u; c < nch; c++) {
    let base = c * KPC;
    ${warpScoresWgsl({ KPW, SG, QV, kc })}
    workgroupBarrier();
    // The chunk's max and sum by every warp itself (lanes over the scores), so no thread walks them all.
    var mx = -3.0e38;
    ${sl.map((i) => `mx = max(mx, ss[min(lane + ${i * SG}u, KPC - 1u)]);`).join("\n    ")}
    let m1 = max(m, subgroupMax(mx));
    var e = 0.0;
    ${
    sl.map((i) =>
      `e += select(0.0, exp(ss[min(lane + ${i * SG}u, KPC - 1u)] - m1), lane + ${i * SG}u < KPC);`
    ).join("\n    ")
  }
    let sum = subgroupAdd(e);
    let corr = exp(m - m1);
    acc *= corr;
    if (part < ${PARTS}u) {
      // This part's keys of the chunk, ${PU} at a time: every row's load issued before any is used.
      for (var g = part; g < KPC; g += ${PU * PARTS}u) {
        ${
    pk.map((i) => `let v${i} = ${kc(`min(base + g + ${i * PARTS}u, n - 1u) * CWV + slot`)};`).join(
      "\n        ",
    )
  }
        ${pk.map((i) => `acc += exp(ss[g + ${i * PARTS}u] - m1) * v${i};`).join("\n        ")}
      }
    }
    l = l * corr + sum;
    m = m1;
    workgroupBarrier();
  }
  {
    let dc = subgroupAdd(${qs.map((i) => `dot(q${i}, cv(lane + ${i * SG}u))`).join(" + ")}) * p.scale;
    let m1 = max(m, dc);
    let corr = exp(m - m1);
    let wc = exp(dc - m1);
    acc = acc * corr + select(vec4<f32>(0.0), wc * ${vec4At("cur", "4u * slot")}, part == 0u);
    l = l * corr + wc;
  }
  if (part < ${PARTS}u) { accs[part * RV + slot] = acc; }
  workgroupBarrier();
  if (j < RV) {
    var t = accs[j];
    for (var k = 1u; k < ${PARTS}u; k++) { t += accs[k * RV + j]; }
    accs[j] = t / l;
  }
  workgroupBarrier();
  // 4. out_h = W_UV_h ctx: ${TV} lanes a row.
  let lv = j % ${TV}u;
  for (var ps = 0u; ps < ${passesV}u; ps++) {
    let v = ps * ${WG / TV}u + j / ${TV}u;
    let wb = (h * ${DV}u + min(v, ${DV - 1}u)) * RV;
    ${
    rowDotWgsl({
      out: "o",
      li: "lv",
      NU: RV,
      tpr: TV,
      load: (u) => wLoad("wv", `wb + ${u}`),
      vec: (u) => `accs[${u}]`,
    })
  }
    if (lv == 0u && v < ${DV}u) { y[h * ${DV}u + v] = o; }
  }
}
fn qv(v: u32) -> vec4<f32> {
  if (v >= CWV) { return vec4<f32>(0.0); }
  return ${vec4At("qsh", "4u * v")};
}
fn cv(v: u32) -> vec4<f32> {
  if (v >= CWV) { return vec4<f32>(0.0); }
  return ${vec4At("cur", "4u * v")};
}`;
}

/**
 * The whole one-token MLA attention of a layer in one dispatch (a workgroup a head), for short caches; null
 * where it does not apply (mlaDecodeFits), and the caller keeps mlaRopeAbsorbCall + mlaAttentionCalls + the
 * value projection. Buffers as those take them (q and kv may be one buffer: q's rows then kv's at kvOffset);
 * out [heads * dv] f32 is o_proj's input. Leaves q unrotated and writes no qLatent.
 */
export function mlaDecodeCall(
  gpu: Gpu,
  bufs: MlaRopeBuffers & { wUK: GPUBuffer; wUV: GPUBuffer; out: GPUBuffer },
  d: MlaDims & MlaDecodeOptions,
): KernelCall | null {
  const s = shapeOf(gpu, d, d);
  if (!s) return null;
  if (d.weights !== "f32" && d.weights !== "f16") {
    throw new RangeError(`MLA decode: W_UK / W_UV must be f32 or f16, got ${d.weights}`);
  }
  if (d.kv === "f16" && !gpu.hasF16) throw new RangeError("MLA decode: an f16 cache needs shader-f16");
  const params = uniformBuffer(gpu, [d.kvOffset ?? 0, d.eps, d.scale, 0], [1, 2]);
  return kernelCall(
    gpu,
    pipeline(gpu, source(d, d, s)),
    [params, bufs.step, bufs.table, bufs.q, bufs.kv, bufs.kvNorm, bufs.cache, bufs.wUK, bufs.wUV, bufs.out],
    [d.heads, 1],
    "mla_decode",
  );
}
