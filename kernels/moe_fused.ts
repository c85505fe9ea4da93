// A MoE block's routed experts in one decode dispatch (q8 / q4 expert stacks, int8 dp4 activations): gate/up,
// SiLU, down and the weighted combine, with nothing handed between workgroups but integer atomics.
//   Workgroup (s C-chunk, token t), s = wg.x / CH picking slot j and chunk c of the I rows (CH = I / C):
//     routes token t itself from the router's logits (moe_router.ts's routing, as moe_sg's gate_up does);
//     h[n] = w_j silu(gate_e . xn) (up_e . xn)      for its C rows n of expert e = ids[j] (xn: the router
//                                                   GEMV's int8 copy of the normalised x, staged as it is)
//     keeps h in workgroup memory (int8 blocks) and multiplies it by the C columns of down_e it meets:
//     part[h'] = down_e[h', cC .. cC + C) . h      a partial sum for every output h' < H
//   and adds `part` into a per-token accumulator in fixed point, as two integer atomicAdds an output (whole
//   units, and the remainder in units of 2^-24 or coarser, so that every workgroup's sum fits): integer sums
//   are exact and the same in any order, so the result is deterministic, and the range is i32's. The last
//   workgroup of the token (a device-scope barrier and a count, as gemv_multi.ts's arrive copies) adds the
//   accumulator into the residual y and zeroes it for the next layer.
// Against moe_sg.ts's gate_up + down (two dispatches), the activations never leave the workgroup, down needs
// no staging pass and no coefficient table, and one dependent dispatch goes. The down stack is read
// row-major ([E, H, I]: C / 32 quant blocks of each row a workgroup) or, `packed`, in column blocks of C
// (the loader's packColumnBlocksCall: a workgroup's columns of every row one contiguous run). A shared
// expert (deepseek_v3, kimi_k2) rides along as more slots of weight 1 (`sharedSlots`: its intermediate cut
// into slots of I rows, read from its own row-major stacks), as moe_sg.ts folds it. With `copyOut` the last
// workgroup also writes the int8 input copy of the RMSNorm GEMV after the block.
import { type Gpu, type KernelCall, kernelCall, memoSource, pipeline, type WeightType } from "./gpu.ts";
import { QUANT_GROUP, quantScaleWord, type QuantType } from "./quant.ts";
import { checkRouting, type MoeRouting, routerWgsl } from "./moe_router.ts";
import type { Int8CopyOut } from "./gemv_fused.ts";
import {
  dp4Dot,
  int8BlocksWgsl,
  int8CopyBindingsWgsl,
  int8CopyTailWgsl,
  normWeightVec4,
  range,
  siluMul,
} from "./wgsl.ts";

export interface MoeFusedDims {
  /** Hidden size H (gate/up's K, down's N). */
  hidden: number;
  /** Each expert's intermediate size I. */
  intermediate: number;
  T: number;
  routing: MoeRouting;
  /** Storage of both stacks. */
  weights: QuantType;
  /** Experts in the stacks, and the id of the first (expert parallelism); default all from 0. */
  experts?: number;
  firstExpert?: number;
  /** e_score_correction_bias bound. */
  bias: boolean;
  /**
   * The down stack is stored in column blocks of `rows` (convert.ts packColumnBlocksCall: each workgroup's
   * columns of every row contiguous) instead of row-major. Default false.
   */
  packed?: boolean;
  /** Rows of h a workgroup (a multiple of 32 dividing I). Default: 64 where it divides I, else 32. */
  rows?: number;
  /**
   * Threads a workgroup (a power of 2, 64..1024). Default: 1024 where the device allows it, else its limit
   * (H200, Qwen3-30B-A3B q4: 1024 threads 2.257-2.273 ms a step, 512 2.431-2.432, against 2.349-2.360 for
   * the two dispatches; docs/BENCHMARKS.md, the twentieth session).
   */
  threads?: number;
  /**
   * The last workgroup of a token also writes the int8 copy of the new residual row for the RMSNorm GEMV
   * that reads it next (the next layer's qkv or the LM head; gemv_fused.ts int8CopyFor with its norm
   * weights): that GEMV's int8 layout and its norm weights' storage. The copy holds y times the norm weights
   * with each block's sum of squares of y, as a GEMV's own copies do (gemv_multi.ts), so the consumer needs
   * no input pass and no staging of its own.
   */
  copyOut?: { weights: QuantType; norm: WeightType };
  /**
   * The shared expert (deepseek_v3, kimi_k2) as this many more slots of weight 1: its intermediate is
   * sharedSlots x the routed one, cut into slots of I rows, its stacks bound as sharedGateUp [2 Is, H] and
   * sharedDown [H, Is] (row-major, in the routed stacks' storage). Default 0.
   */
  sharedSlots?: number;
  /**
   * "copy": the block's input is the int8 copy that the GEMV before it wrote (o_proj: gemv_fused.ts
   * Int8CopyOut with the block's norm weights and `router`): x times the norm weights in blocks of 32 with
   * each block's sum of squares (`xssq`), and the router's partial logits before 1 / rms block by block
   * ([T, H / 32, E], bound as `logits`). Each workgroup sums the partials and the squares itself (1 / rms
   * with `eps`), so no router GEMV runs before it. Default "router": the router GEMV's normalised int8 copy
   * and logits.
   */
  input?: "router" | "copy";
  /** The block's RMSNorm epsilon (input "copy"). */
  eps?: number;
}

/** Weights per 16-byte unit. */
const unitWeights = (q: QuantType) => q === "q8" ? 16 : 32;

function threadsOf(gpu: Gpu, d: MoeFusedDims): number {
  if (d.threads !== undefined) return d.threads;
  let wg = 1024;
  while (wg > 64 && wg > gpu.device.limits.maxComputeInvocationsPerWorkgroup) wg /= 2;
  return wg;
}

/** The rows of h a workgroup: `rows`, or 64 where it divides the intermediate, else 32. */
export function moeFusedRows(d: MoeFusedDims): number {
  return d.rows ?? (d.intermediate % 64 === 0 ? 64 : 32);
}

/** Workgroup bytes: the staged x, h and its int8 copy, the routing's arrays. */
function sharedBytes(d: MoeFusedDims, WG: number): number {
  const { experts: E, topK: k, groups } = checkRouting(d.routing);
  const C = moeFusedRows(d);
  return d.hidden + (d.hidden / 32) * 8 + C * 4 + C + (C / 32) * 8 + (2 * E + WG + 3 * k + 2 * groups) * 4 +
    16 + (d.copyOut ? d.hidden * 4 : 0) + (d.input === "copy" ? (copyGroups(E, WG) + 1) * E * 4 : 0);
}

/** Groups of threads summing an expert's partial logits (input "copy"): as many as fit in the workgroup. */
function copyGroups(E: number, WG: number): number {
  return Math.max(1, Math.floor(WG / E));
}

/** Whether the fused kernel serves this shape here. */
export function moeFusedFits(gpu: Gpu, d: MoeFusedDims): boolean {
  const WG = threadsOf(gpu, d);
  const C = moeFusedRows(d);
  const { groups } = checkRouting(d.routing);
  return gpu.subgroupSize !== null && gpu.hasDp4 && d.hidden % QUANT_GROUP === 0 &&
    d.intermediate % C === 0 && C % QUANT_GROUP === 0 &&
    WG <= gpu.device.limits.maxComputeInvocationsPerWorkgroup &&
    groups <= WG && sharedBytes(d, WG) <= gpu.maxWorkgroupStorage;
}

const sources = memoSource(source);

function source(d: MoeFusedDims, S: number, WG: number): string {
  const q = d.weights;
  const r = checkRouting(d.routing);
  const E = r.experts, k = r.topK;
  const H = d.hidden, I = d.intermediate, C = moeFusedRows(d);
  const UW = unitWeights(q);
  const VU = H / UW; // units of a gate/up row
  const DU = I / UW; // units of a down row
  const CU = C / UW; // units of a chunk of a down row
  const CH = I / C;
  const WARPS = WG / S;
  const PW = Math.ceil(C / WARPS); // gate/up pairs a warp
  const U = Math.max(1, Math.min(Math.ceil(VU / S), Math.floor(8 / PW))); // units a lane a pass
  const RB = Math.max(1, Math.min(Math.ceil(H / WG), Math.floor(8 / CU))); // down rows a thread a pass
  const rt = routerWgsl(r, d.bias, S, WG);
  const fromCopy = d.input === "copy";
  const e0 = d.eps ?? 0;
  const eps = Number.isInteger(e0) ? `${e0}.0` : `${e0}`;
  const NB = H / 32;
  const NG = copyGroups(E, WG);
  const NSH = d.sharedSlots ?? 0;
  const SL = k + NSH; // slots: the k routed ones, then the shared expert's
  // The remainders' units: NWG of them, each at most half a unit, must sum within i32.
  const NWG = SL * CH;
  const LO = Math.min(24, 31 - Math.ceil(Math.log2(NWG)));
  const sc = (buf: string, off: number, unit: string) => {
    const g = q === "q4" ? unit : `(${unit}) / 2u`;
    return `bf16at(${buf}[${off / 4}u + (${g}) / 8u][((${g}) / 2u) % 4u], ${g})`;
  };
  const unitDot = (w: string, s: string, x: string | [string, string], xs: string) => {
    const dot = dp4Dot(q, w, x);
    return q === "q4" ? `${s} * (${xs}.x * f32(${dot}) - 8.0 * ${xs}.y)` : `${s} * ${xs}.x * f32(${dot})`;
  };
  const guOff = quantScaleWord((d.experts ?? E) * 2 * I, H, q);
  const dnOff = quantScaleWord((d.experts ?? E) * H, I, q);
  // A slot's weight words and scales: from the routed stacks, or with shared slots through helpers that
  // pick the shared expert's (`sh`, the same for the whole workgroup).
  const gu = (i: string) => NSH ? `ldgu(sh, ${i})` : `Wgu[${i}]`;
  const guSc = (unit: string) => NSH ? `scgu(sh, ${unit})` : sc("Wgu", guOff, unit);
  const dn = (i: string) => NSH ? `ldd(sh, ${i})` : `Wd[${i}]`;
  const dnSc = (unit: string) => NSH ? `scd(sh, ${unit})` : sc("Wd", dnOff, unit);
  const helpers = !NSH ? "" : `
fn ldgu(sh: bool, i: u32) -> vec4<u32> { if (sh) { return Wsgu[i]; } return Wgu[i]; }
fn ldd(sh: bool, i: u32) -> vec4<u32> { if (sh) { return Wsd[i]; } return Wd[i]; }
fn scgu(sh: bool, u: u32) -> f32 {
  if (sh) { return ${sc("Wsgu", quantScaleWord(2 * NSH * I, H, q), "u")}; }
  return ${sc("Wgu", guOff, "u")};
}
fn scd(sh: bool, u: u32) -> f32 {
  if (sh) { return ${sc("Wsd", quantScaleWord(H, NSH * I, q), "u")}; }
  return ${sc("Wd", dnOff, "u")};
}`;
  // gate/up: pair p = warp + WARPS r of the chunk (gate row n = cC + p, its up row I further).
  const pairs = range(PW);
  const units = range(U);
  const xin = (u: number) =>
    q === "q4"
      ? `let xe${u} = xq[v${u}]; let xo${u} = xq[${VU}u + v${u}]; let xb${u} = xqs[v${u}];`
      : `let xe${u} = xq[v${u}]; let xb${u} = xqs[v${u} / 2u];`;
  const xarg = (u: number): string | [string, string] => q === "q4" ? [`xe${u}`, `xo${u}`] : `xe${u}`;
  const gateUp = `
  ${
    pairs.map((p) =>
      `let pr${p} = min(warp + ${WARPS * p}u, ${C - 1}u);
  let g${p} = gbase + (c * ${C}u + pr${p}) * ${VU}u;
  var ag${p} = 0.0;
  var au${p} = 0.0;`
    ).join("\n  ")
  }
  for (var p0 = lane; p0 < ${VU}u; p0 += ${S * U}u) {
    ${
    units.map((u) =>
      `let v${u} = min(p0 + ${u * S}u, ${VU - 1}u);
    let ok${u} = p0 + ${u * S}u < ${VU}u;
    ${xin(u)}`
    ).join("\n    ")
  }
    ${
    pairs.flatMap((p) =>
      units.map((u) =>
        `let wg${p}_${u} = ${gu(`g${p} + v${u}`)};
    let sg${p}_${u} = ${guSc(`g${p} + v${u}`)};
    let wu${p}_${u} = ${gu(`g${p} + upo + v${u}`)};
    let su${p}_${u} = ${guSc(`g${p} + upo + v${u}`)};`
      )
    ).join("\n    ")
  }
    ${
    pairs.flatMap((p) =>
      units.map((u) =>
        `ag${p} += select(0.0, ${unitDot(`wg${p}_${u}`, `sg${p}_${u}`, xarg(u), `xb${u}`)}, ok${u});
    au${p} += select(0.0, ${unitDot(`wu${p}_${u}`, `su${p}_${u}`, xarg(u), `xb${u}`)}, ok${u});`
      )
    ).join("\n    ")
  }
  }
  ${
    pairs.map((p) =>
      `let tg${p} = subgroupAdd(ag${p})${fromCopy ? " * xinv" : ""};
  let tu${p} = subgroupAdd(au${p})${fromCopy ? " * xinv" : ""};
  if (lane == 0u && warp + ${WARPS * p}u < ${C}u) {
    hv[pr${p} / 4u][pr${p} % 4u] = select(0.0, ${siluMul(`tg${p}`, `tu${p}`)} * wt, on);
  }`
    ).join("\n  ")
  }`;
  // down: rows h = h0 + WG i of a pass, each its CU units of the chunk.
  const rows = range(RB);
  const cus = range(CU);
  const hin = (cu: number): string | [string, string] =>
    q === "q4" ? [`hq[${cu}u]`, `hq[${CU + cu}u]`] : `hq[${cu}u]`;
  const hsc = (cu: number) => q === "q4" ? `hqs[${cu}u]` : `hqs[${cu >> 1}u]`;
  const down = `
  for (var h0 = tid; h0 < ${H}u; h0 += ${WG * RB}u) {
    ${
    rows.map((i) =>
      `let r${i} = min(h0 + ${WG * i}u, ${H - 1}u);
    let d${i} = dbase + r${i} * dstride;`
    ).join("\n    ")
  }
    ${
    rows.flatMap((i) =>
      cus.map((cu) =>
        `let w${i}_${cu} = ${dn(`d${i} + ${cu}u`)};
    let s${i}_${cu} = ${dnSc(`d${i} + ${cu}u`)};`
      )
    ).join("\n    ")
  }
    ${
    rows.map((i) =>
      `if (on && h0 + ${WG * i}u < ${H}u) {
      let v = ${cus.map((cu) => unitDot(`w${i}_${cu}`, `s${i}_${cu}`, hin(cu), hsc(cu))).join(" + ")};
      let whole = i32(round(v));
      atomicAdd(&acc[t * ${2 * H}u + r${i}], whole);
      atomicAdd(&acc[t * ${2 * H}u + ${H}u + r${i}], i32(round((v - f32(whole)) * ${2 ** LO}.0)));
    }`
    ).join("\n    ")
  }
  }`;
  // Bindings after y (9): the bias, the copy's four, the shared expert's two, each where present.
  let nb = 10;
  const bias = d.bias ? `@group(0) @binding(${nb++}) var<storage, read> bias: array<f32>;` : "";
  // The consumer's copy of the new row (copyOut): block b of 32 quantised from yf by thread b, as
  // gemv_multi.ts's copies are, with its sum of squares before the norm weights.
  const copy = d.copyOut;
  const cb0 = nb;
  if (copy) nb += 4;
  const sharedDecls = !NSH ? "" : `
@group(0) @binding(${nb}) var<storage, read> Wsgu: array<vec4<u32>>;
@group(0) @binding(${nb + 1}) var<storage, read> Wsd: array<vec4<u32>>;`;
  if (NSH) nb += 2;
  // input "copy": the router's partial logits (binding 4) summed over the H / 32 blocks, NG groups of
  // threads an expert, and 1 / rms from the blocks' sums of squares by warp 0; then the routing reads
  // them from workgroup memory.
  const copyInDecls = !fromCopy ? "" : `
@group(0) @binding(${nb}) var<storage, read> xssq: array<f32>;
var<workgroup> lgp: array<f32, ${NG * E}>;
var<workgroup> logits: array<f32, ${E}>;
var<workgroup> inv_x: f32;`;
  const copyInLogits = !fromCopy ? "" : `
  for (var i = tid; i < ${NG * E}u; i += ${WG}u) {
    let e = i % ${E}u;
    var s = 0.0;
    for (var b = i / ${E}u; b < ${NB}u; b += ${NG}u) { s += parts[(t * ${NB}u + b) * ${E}u + e]; }
    lgp[i] = s;
  }
  if (warp == 0u) {
    var q = 0.0;
    for (var b = lane; b < ${NB}u; b += ${S}u) { q += xssq[t * ${NB}u + b]; }
    q = subgroupAdd(q);
    if (lane == 0u) { inv_x = inverseSqrt(q / ${H}.0 + ${eps}); }
  }
  workgroupBarrier();
  for (var e = tid; e < ${E}u; e += ${WG}u) {
    var s = 0.0;
    for (var g = 0u; g < ${NG}u; g++) { s += lgp[g * ${E}u + e]; }
    logits[e] = s * inv_x;
  }
  workgroupBarrier();
  let xinv = inv_x;`;
  const copyDecls = !copy ? "" : `
${int8CopyBindingsWgsl(cb0)}
@group(0) @binding(${cb0 + 2}) var<storage, read> onw: array<${
    copy.norm === "f16" ? "vec2<u32>" : "vec4<f32>"
  }>;
@group(0) @binding(${cb0 + 3}) var<storage, read_write> ossq: array<f32>;
var<workgroup> yf: array<vec4<f32>, ${H / 4}>;`;
  const copyTail = !copy ? "" : `
    workgroupBarrier();${
    int8CopyTailWgsl(copy.weights, {
      K: H,
      row0: "t",
      rows: "1u",
      blocks: `${H / 32}u`,
      gb0: "0u",
      vec4At: (i) => `yf[8u * cb + ${i}u] * ${normWeightVec4(copy.norm, `8u * cb + ${i}u`, "onw")}`,
      WG: `${WG}u`,
      prelude: `ossq[t * ${H / 32}u + cb] = ${
        range(8).map((i) => `dot(yf[8u * cb + ${i}u], yf[8u * cb + ${i}u])`).join(" + ")
      };`,
    })
  }`;
  return `
@group(0) @binding(0) var<storage, read> xn: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read> xns: array<vec2<f32>>;
@group(0) @binding(2) var<storage, read> Wgu: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> Wd: array<vec4<u32>>;
@group(0) @binding(4) var<storage, read> ${fromCopy ? "parts" : "logits"}: array<f32>;
@group(0) @binding(5) var<storage, read_write> ids: array<u32>;
@group(0) @binding(6) var<storage, read_write> rw: array<f32>;
@group(0) @binding(7) var<storage, read_write> acc: array<atomic<i32>>;
@group(0) @binding(8) var<storage, read_write> cnt: array<atomic<u32>>;
@group(0) @binding(9) var<storage, read_write> y: array<f32>;
${bias}${copyDecls}${sharedDecls}${copyInDecls}
var<workgroup> xq: array<vec4<u32>, ${H / 16}>;
var<workgroup> xqs: array<vec2<f32>, ${H / 32}>;
var<workgroup> hv: array<vec4<f32>, ${C / 4}>;
var<workgroup> hq: array<vec4<u32>, ${C / 16}>;
var<workgroup> hqs: array<vec2<f32>, ${C / 32}>;
var<workgroup> arrived: u32;
${rt.decls}
fn bf16at(w: u32, g: u32) -> f32 { return bitcast<f32>(select(w << 16u, w & 0xffff0000u, (g & 1u) == 1u)); }${helpers}
@compute @workgroup_size(${WG})
fn main(
  @builtin(workgroup_id) wgid: vec3<u32>,
  @builtin(local_invocation_index) tid: u32,
  @builtin(subgroup_invocation_id) sg_lane: u32,
) {
  let t = wgid.y;
  let warp = tid / ${S}u;
  let lane = tid % ${S}u;
  for (var i = tid; i < ${H / 16}u; i += ${WG}u) { xq[i] = xn[t * ${H / 16}u + i]; }
  for (var i = tid; i < ${H / 32}u; i += ${WG}u) { xqs[i] = xns[t * ${H / 32}u + i]; }
  ${copyInLogits}
  ${rt.body(fromCopy ? "0u" : `t * ${E}u`)}
  if (wgid.x == 0u && tid < ${k}u) {
    ids[t * ${k}u + tid] = rt_ids[tid];
    rw[t * ${k}u + tid] = rt_w[tid];
  }
  let j = wgid.x / ${CH}u;
  let c = wgid.x % ${CH}u;
  // Slot j < k: the routed expert e (weight rt_w[j]; nothing where the stack does not hold it). j >= k:
  // shared slot js = j - k, rows js I .. of the shared expert, weight 1.
  let sh = j >= ${k}u;
  let js = j - ${k}u;
  let e = rt_ids[min(j, ${k - 1}u)];
  let on = sh || (e >= ${d.firstExpert ?? 0}u && e - ${d.firstExpert ?? 0}u < ${d.experts ?? E}u);
  let le = select(0u, e - ${d.firstExpert ?? 0}u, on && !sh);
  let wt = select(rt_w[min(j, ${k - 1}u)], 1.0, sh);
  ${
    NSH
      ? `let gbase = select(le * ${2 * I * VU}u, js * ${I * VU}u, sh);
  let upo = select(${I * VU}u, ${NSH * I * VU}u, sh);
  let dbase = select(le * ${H * DU}u + c * ${d.packed ? H * CU : CU}u, js * ${DU}u + c * ${CU}u, sh);
  let dstride = select(${d.packed ? CU : DU}u, ${NSH * DU}u, sh);`
      : `let gbase = le * ${2 * I * VU}u;
  let upo = ${I * VU}u;
  let dbase = le * ${H * DU}u + c * ${d.packed ? H * CU : CU}u;
  let dstride = ${d.packed ? CU : DU}u;`
  }
  ${gateUp}
  workgroupBarrier();
  ${
    int8BlocksWgsl(q, (i) => `hv[${i}]`, `${C / 32}u`, `${WG}u`, q === "q4" ? `${CU}u` : undefined, {
      q: (i) => `hq[${i}]`,
      s: (b) => `hqs[${b}]`,
    })
  }
  workgroupBarrier();
  ${down}
  storageBarrier();
  if (tid == 0u) {
    let last = atomicAdd(&cnt[t], 1u) == ${SL * CH - 1}u;
    if (last) { atomicStore(&cnt[t], 0u); }
    arrived = select(0u, 1u, last);
  }
  if (workgroupUniformLoad(&arrived) != 0u) {
    storageBarrier();
    for (var h = tid; h < ${H}u; h += ${WG}u) {
      let a = atomicLoad(&acc[t * ${2 * H}u + h]);
      let b = atomicLoad(&acc[t * ${2 * H}u + ${H}u + h]);
      atomicStore(&acc[t * ${2 * H}u + h], 0);
      atomicStore(&acc[t * ${2 * H}u + ${H}u + h], 0);
      let v = y[t * ${H}u + h] + f32(a) + f32(b) * ${2 ** -LO};
      y[t * ${H}u + h] = v;${copy ? "\n      yf[h / 4u][h % 4u] = v;" : ""}
    }${copy ? copyTail : ""}
  }
}`;
}

/** Bytes of the accumulator and counters a scratch needs for T tokens of hidden size H. */
export function moeFusedScratchBytes(T: number, H: number): { acc: number; count: number } {
  return { acc: T * 2 * H * 4, count: T * 4 };
}

/**
 * The fused expert MLP (the file's comment). xn / xnScales: the router GEMV's int8 copy of the normalised x
 * (moeRouterGemvCall's `xn: q`, the dp4 staged layout); logits [T, E]; ids / routeWeights [T, k] (written by
 * workgroup 0, for readers after); acc (zeroed, [T, 2, H] i32) and count (zeroed, [T] u32), left zeroed;
 * y [T, H] the residual, added into.
 */
export function moeFusedCall(
  gpu: Gpu,
  b: {
    xn: GPUBuffer;
    xnScales: GPUBuffer;
    gateUp: GPUBuffer;
    down: GPUBuffer;
    logits: GPUBuffer;
    bias?: GPUBuffer;
    ids: GPUBuffer;
    routeWeights: GPUBuffer;
    acc: GPUBuffer;
    count: GPUBuffer;
    y: GPUBuffer;
    /** The consumer's int8 copy (d.copyOut): gemv_fused.ts int8CopyFor's buffers, with its norm weights. */
    copy?: Int8CopyOut;
    /** The shared expert (d.sharedSlots): gate;up [2 Is, H] and down [H, Is], row-major. */
    sharedGateUp?: GPUBuffer;
    sharedDown?: GPUBuffer;
    /** input "copy": the copy's block sums of squares (xn / xnScales its words and scales, logits the partials). */
    xssq?: GPUBuffer;
  },
  d: MoeFusedDims,
): KernelCall {
  const S = gpu.subgroupSize;
  const WG = threadsOf(gpu, d);
  if (!(WG >= 64 && WG <= 1024 && (WG & (WG - 1)) === 0)) {
    throw new RangeError(`threads must be a power of 2 from 64 to 1024, got ${WG}`);
  }
  const C = moeFusedRows(d);
  if (!(Number.isInteger(C) && C > 0 && C % QUANT_GROUP === 0 && d.intermediate % C === 0)) {
    throw new RangeError(
      `rows must be a multiple of 32 dividing the intermediate ${d.intermediate}, got ${C}`,
    );
  }
  if (!S || !moeFusedFits(gpu, d)) {
    throw new RangeError(
      `the fused expert MLP does not fit H ${d.hidden}, I ${d.intermediate} (${d.weights}, ${WG} threads) here`,
    );
  }
  if (d.bias !== (b.bias !== undefined)) throw new TypeError("bias: the dims and the buffers disagree");
  const { topK } = checkRouting(d.routing);
  if ((d.copyOut !== undefined) !== (b.copy !== undefined)) {
    throw new TypeError("copyOut: the dims and the buffers disagree");
  }
  if (b.copy && (!b.copy.ssq || !b.copy.norm)) {
    throw new TypeError(
      "copyOut is the copy of an RMSNorm GEMV's input: it needs ssq and norm (int8CopyFor)",
    );
  }
  const buffers = [b.xn, b.xnScales, b.gateUp, b.down, b.logits, b.ids, b.routeWeights, b.acc, b.count, b.y];
  if (b.bias) buffers.push(b.bias);
  if (b.copy) buffers.push(b.copy.q, b.copy.s, b.copy.norm!.w, b.copy.ssq!);
  const NSH = d.sharedSlots ?? 0;
  if (!(Number.isInteger(NSH) && NSH >= 0)) throw new RangeError(`sharedSlots must be >= 0, got ${NSH}`);
  if ((NSH > 0) !== (b.sharedGateUp !== undefined && b.sharedDown !== undefined)) {
    throw new TypeError("sharedSlots: the dims and the shared expert's buffers disagree");
  }
  if (NSH > 0) buffers.push(b.sharedGateUp!, b.sharedDown!);
  if ((d.input === "copy") !== (b.xssq !== undefined)) {
    throw new TypeError('input "copy": the dims and the copy\'s sums of squares (xssq) disagree');
  }
  if (b.xssq) buffers.push(b.xssq);
  return kernelCall(
    gpu,
    pipeline(gpu, sources(d, S, WG)),
    buffers,
    [(topK + NSH) * (d.intermediate / C), d.T],
    "moe_fused",
  );
}
