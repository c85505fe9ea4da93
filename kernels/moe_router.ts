// Mixture-of-experts routing on the GPU: router logits [T, E] (from an ordinary matmul of the normalised
// hidden state with the router's [E, H] weight) -> the chosen experts ids [T, k] (u32) and their weights
// [T, k] (f32), which the expert GEMVs (moe_gemv.ts) read directly, so a layer needs no readback.
// The families, as transformers computes them (all in f32):
//   mixtral      softmax over all E, top-k, weights / their sum
//   qwen3_moe    softmax over all E, top-k, weights / their sum only if norm_topk_prob
//   deepseek_v3  s = sigmoid(logits); selection on c = s + e_score_correction_bias; with n_group > 1 the
//   (kimi_k2)    experts are cut into n_group groups, a group's score is the sum of its top-2 c, the best
//                topk_group groups are kept and the others' experts masked (-inf, as in transformers 5.17;
//                older versions filled 0.0, which let a dropped expert beat a kept one whose biased score
//                is negative), then top-k; weights = the chosen experts' unbiased s,
//                / (sum + 1e-20) if norm_topk_prob, times routed_scaling_factor
// Ties (torch.topk leaves them unspecified) go to the lowest index, for experts and for groups. Output
// slots are in descending order of the selection score. One workgroup per token: each thread ranks its
// experts by counting the experts that beat them (one barrier, no sort; reads of four choices at a time,
// several in flight, since every gate_up workgroup of a decode step routes before its first weight load).
import { type Gpu, type KernelCall, kernelCall, pipeline } from "./gpu.ts";

export interface MoeRouting {
  /** Routed experts in the layer (n_routed_experts / num_local_experts / num_experts), 1..1024. */
  experts: number;
  /** Experts chosen per token (num_experts_per_tok), 1..experts. */
  topK: number;
  /** "softmax" (mixtral, qwen3_moe) or "sigmoid" (deepseek_v3, kimi_k2: scoring_func). */
  scoring: "softmax" | "sigmoid";
  /** Divide the chosen weights by their sum (sigmoid: sum + 1e-20). mixtral: always; others: norm_topk_prob. */
  normTopK: boolean;
  /** Expert groups for group-limited selection (n_group; topk_method noaux_tc). Default 1: no groups. */
  groups?: number;
  /** Groups kept (topk_group), 1..groups. Default: groups. */
  topKGroups?: number;
  /** Factor on the final weights (routed_scaling_factor). Default 1. */
  scale?: number;
}

export const MOE_MAX_EXPERTS = 1024;

/** The routing with its defaults filled in, or a RangeError naming the bad field. */
export function checkRouting(r: MoeRouting): Required<MoeRouting> {
  const E = r.experts;
  const groups = r.groups ?? 1;
  const topKGroups = r.topKGroups ?? groups;
  const scale = r.scale ?? 1;
  const int = (v: number, lo: number, hi: number) => Number.isInteger(v) && v >= lo && v <= hi;
  if (!int(E, 1, MOE_MAX_EXPERTS)) throw new RangeError(`experts must be 1..${MOE_MAX_EXPERTS}, got ${E}`);
  if (!int(r.topK, 1, E)) throw new RangeError(`topK must be 1..experts (${E}), got ${r.topK}`);
  if (r.scoring !== "softmax" && r.scoring !== "sigmoid") {
    throw new RangeError(`scoring must be "softmax" or "sigmoid", got ${JSON.stringify(r.scoring)}`);
  }
  if (!int(groups, 1, E) || E % groups !== 0) {
    throw new RangeError(`groups must divide experts (${E}), got ${groups}`);
  }
  if (groups > 1 && E / groups < 2) {
    throw new RangeError(
      `group scores sum each group's top 2, so groups need >= 2 experts: ${E} / ${groups}`,
    );
  }
  if (!int(topKGroups, 1, groups)) {
    throw new RangeError(`topKGroups must be 1..groups (${groups}), got ${topKGroups}`);
  }
  if (topKGroups * (E / groups) < r.topK) {
    // transformers would then choose among masked (-inf) experts, an unspecified tie.
    throw new RangeError(
      `topK (${r.topK}) is more than the experts of the kept groups (${topKGroups} x ${E / groups})`,
    );
  }
  if (!Number.isFinite(scale)) throw new RangeError(`scale must be finite, got ${scale}`);
  return { ...r, groups, topKGroups, scale };
}

/**
 * The routing as WGSL a kernel of WG threads (default 256, a power of 2) can embed: `decls` (workgroup
 * arrays and a reduction helper, names prefixed `rt_`) and `body(row)`, statements run by every thread (tid = its local index) that
 * read `logits[row + e]` (and `bias[e]` with `bias`) and leave the choice in workgroup memory: rt_ids[j]
 * (u32) and rt_w[j] (f32, final weights), slot 0 the best, after a barrier. With `warp` (the subgroup
 * size S) the scores are taken by the first subgroup with subgroupMax / subgroupAdd (no barrier tree) and
 * the ranking is shared by P threads an expert (their counts summed with subgroupShuffleXor, so like the
 * kernels around it this takes subgroup s to be threads s S .. s S + S - 1 in lane order): one barrier and a
 * pass over the E choices in workgroup memory where routerWgslFast does k dependent rounds of two subgroup
 * reductions.
 */
export function routerWgsl(
  r: Required<MoeRouting>,
  bias: boolean,
  warp?: number,
  WG = 256,
): { decls: string; body: (row: string) => string } {
  if (!(WG >= 32 && (WG & (WG - 1)) === 0)) {
    throw new RangeError(`the routing's workgroup must be a power of 2 >= 32, got ${WG}`);
  }
  const E = r.experts;
  const G = r.groups;
  const GS = E / G;
  const KG = r.topKGroups;
  const K = r.topK;
  const scale = Math.fround(r.scale);
  const f = (v: number) => (Number.isInteger(v) ? `${v}.0` : `${v}`);
  // The choices (selection scores) in workgroup memory: a vec4 view where E % 4 == 0; `ch(i)` is choice i.
  const V = E % 4 === 0;
  const ch = (i: string) => V ? `rt_choice[(${i}) / 4u][(${i}) % 4u]` : `rt_choice[${i}]`;
  // Softmax by the first subgroup (sigmoid needs no reduction: every thread scores its experts); its lanes
  // hold experts lane, lane + S, ... and also write the choices.
  const byWarp = warp !== undefined && r.scoring === "softmax";
  const score = (row: string) => byWarp ? warpScore(row, warp!) : treeScore(row);
  const warpScore = (row: string, S: number) => `
  if (tid < ${S}u) {
    var m = -3.4e38;
    for (var e = tid; e < ${E}u; e += ${S}u) { m = max(m, logits[${row} + e]); }
    m = subgroupMax(m);
    var s = 0.0;
    for (var e = tid; e < ${E}u; e += ${S}u) { let v = exp(logits[${row} + e] - m); rt_score[e] = v; s += v; }
    s = subgroupAdd(s);
    for (var e = tid; e < ${E}u; e += ${S}u) {
      let v = rt_score[e] / s;
      rt_score[e] = v;
      ${ch("e")} = v${bias ? " + bias[e]" : ""};
    }
  }`;
  const treeScore = (row: string) =>
    r.scoring === "softmax"
      ? `
  var rt_m = -3.4e38;
  for (var e = tid; e < ${E}u; e += ${WG}u) { rt_m = max(rt_m, logits[${row} + e]); }
  let rt_mx = rt_reduce(tid, rt_m, true);
  var rt_s = 0.0;
  for (var e = tid; e < ${E}u; e += ${WG}u) { let v = exp(logits[${row} + e] - rt_mx); rt_score[e] = v; rt_s += v; }
  let rt_tot = rt_reduce(tid, rt_s, false);
  for (var e = tid; e < ${E}u; e += ${WG}u) { rt_score[e] = rt_score[e] / rt_tot; }`
      : `
  for (var e = tid; e < ${E}u; e += ${WG}u) { rt_score[e] = 1.0 / (1.0 + exp(-logits[${row} + e])); }`;
  // Group-limited selection: group g's score is the sum of its two largest c; the KG best groups stay.
  const groups = G === 1 ? "" : `
  if (tid < ${G}u) {
    var a = -3.4e38;
    var b = -3.4e38;
    for (var e = tid * ${GS}u; e < tid * ${GS}u + ${GS}u; e++) {
      let v = ${ch("e")};
      if (v > a) { b = a; a = v; } else if (v > b) { b = v; }
    }
    rt_gscore[tid] = a + b;
  }
  workgroupBarrier();
  if (tid < ${G}u) {
    let v = rt_gscore[tid];
    var rank = 0u;
    for (var g = 0u; g < ${G}u; g++) { let o = rt_gscore[g]; rank += u32(o > v || (o == v && g < tid)); }
    rt_keep[tid] = u32(rank < ${KG}u);
  }
  workgroupBarrier();
  // -inf in transformers; the lowest finite f32 orders the same (kept scores are finite) and WGSL has no
  // infinite constants.
  for (var e = tid; e < ${E}u; e += ${WG}u) { if (rt_keep[e / ${GS}u] == 0u) { ${
    ch("e")
  } = -3.40282347e38; } }
  workgroupBarrier();`;
  const norm = !r.normTopK ? "" : `
    var sum = 0.0;
    for (var j = 0u; j < ${K}u; j++) { sum += rt_pick[j]; }
    w = w / (sum + ${r.scoring === "sigmoid" ? "1e-20" : "0.0"});`;
  const decls = `
var<workgroup> rt_score: array<f32, ${E}>;
var<workgroup> rt_choice: array<${V ? `vec4<f32>, ${E / 4}` : `f32, ${E}`}>;
var<workgroup> rt_red: array<f32, ${WG}>;
var<workgroup> rt_gscore: array<f32, ${G}>;
var<workgroup> rt_keep: array<u32, ${G}>;
var<workgroup> rt_pick: array<f32, ${K}>;
var<workgroup> rt_ids: array<u32, ${K}>;
var<workgroup> rt_w: array<f32, ${K}>;
fn rt_reduce(tid: u32, v: f32, is_max: bool) -> f32 {
  rt_red[tid] = v;
  workgroupBarrier();
  for (var s = ${WG / 2}u; s > 0u; s >>= 1u) {
    if (tid < s) { rt_red[tid] = select(rt_red[tid] + rt_red[tid + s], max(rt_red[tid], rt_red[tid + s]), is_max); }
    workgroupBarrier();
  }
  let r = rt_red[0];
  workgroupBarrier();
  return r;
}`;
  // The ranking. An expert's rank is the count of experts beating it, read from workgroup memory: four a
  // load (a vec4 view where E % 4 == 0), several loads issued before any is used, and with subgroups P
  // threads an expert, each counting 1 / P of the experts, their counts summed by subgroupShuffleXor (P a
  // power of 2 dividing the subgroup, E * P filling whole subgroups of the WG threads).
  let P = 1;
  while (
    V && warp !== undefined && 2 * P <= Math.min(8, warp) && E * 2 * P <= WG && (E / (2 * P)) % 4 === 0 &&
    (E * 2 * P) % warp === 0
  ) P *= 2;
  const W = V ? E / 4 / P : E; // loads (vec4 or scalar) a thread
  const UN = [8, 4, 2, 1].find((u) => W % u === 0)!;
  const beat = (u: number) =>
    V
      ? `
      let m${u} = mb + ${u}u;
      let o${u} = rt_choice[m${u}];
      let b${u} = (o${u} > vec4<f32>(v)) | ((o${u} == vec4<f32>(v)) & (vec4<u32>(4u * m${u}) + vec4<u32>(0u, 1u, 2u, 3u) < vec4<u32>(e)));
      rank += dot(select(vec4<u32>(0u), vec4<u32>(1u), b${u}), vec4<u32>(1u));`
      : `
      let o${u} = rt_choice[mb + ${u}u];
      rank += u32(o${u} > v || (o${u} == v && mb + ${u}u < e));`;
  const count = (first: string) => `
    let v = ${ch("e")};
    var rank = 0u;
    for (var i = 0u; i < ${W}u; i += ${UN}u) {
      let mb = ${first} + i;${Array.from({ length: UN }, (_, u) => beat(u)).join("")}
    }`;
  const take = `
    if (rank < ${K}u) {
      rt_ids[rank] = e;
      rt_pick[rank] = rt_score[e];
    }`;
  const ranking = P > 1
    ? `
  if (tid < ${E * P}u) {
    let e = tid / ${P}u;${count(`(tid % ${P}u) * ${W}u`)}${
      Array.from({ length: Math.log2(P) }, (_, i) => `
    rank += subgroupShuffleXor(rank, ${1 << i}u);`).join("")
    }
    if (tid % ${P}u == 0u) {${take}
    }
  }`
    : `
  for (var e = tid; e < ${E}u; e += ${WG}u) {${count("0u")}${take}
  }`;
  const body = (row: string) => `
  ${score(row)}${
    byWarp ? "" : `
  for (var e = tid; e < ${E}u; e += ${WG}u) { ${ch("e")} = rt_score[e]${bias ? " + bias[e]" : ""}; }`
  }
  workgroupBarrier();
  ${groups}
  // Rank = how many experts beat this one (larger c, or equal c and a lower index): a total order, so
  // ranks 0..K-1 are each written once.${ranking}
  workgroupBarrier();
  if (tid < ${K}u) {
    var w = rt_pick[tid];${norm}
    rt_w[tid] = w * ${f(scale)};
  }
  workgroupBarrier();`;
  return { decls, body };
}

/**
 * WGSL for `a[min(i, n - 1)]` of a per-lane array `a` of n elements, by constant indices (selects) for
 * n <= 16: an array indexed by a runtime value may be placed in local memory, constant indices keep it in
 * registers (routerWgslFast's rt_wid / rt_wt).
 */
export function registerAt(a: string, i: string, n: number): string {
  if (n > 16) return `${a}[min(${i}, ${n - 1}u)]`;
  let r = `${a}[${n - 1}]`;
  for (let j = n - 2; j >= 0; j--) r = `select(${r}, ${a}[${j}], ${i} == ${j}u)`;
  return r;
}

/**
 * routerWgsl for the common case without expert groups, built for latency: one subgroup (S lanes) does
 * the whole routing in registers, each lane holding experts lane, lane + S, ...: softmax (or sigmoid) with
 * subgroupMax / subgroupAdd, then k rounds of argmax (highest choice, lowest index on ties: the rank
 * order) with subgroupMax / subgroupMin, each round's winner known to every lane. `warp(row, lane)`: those
 * statements for any subgroup (all its lanes, `lane` its index), leaving the choice in every lane's
 * registers: rt_wid[j] (u32) and rt_wt[j] (f32, final weights); `body(row, lane)`: the first subgroup
 * (tid < S) runs them and publishes rt_ids / rt_w after one barrier. `lane` should be the
 * subgroup_invocation_id builtin (the winner's score is read with subgroupShuffle); default `tid`.
 */
export function routerWgslFast(
  r: Required<MoeRouting>,
  bias: boolean,
  S: number,
): {
  decls: string;
  body: (row: string, lane?: string) => string;
  warp: (row: string, lane: string) => string;
} {
  if (r.groups !== 1) throw new RangeError("the subgroup router serves routing without expert groups");
  const E = r.experts, K = r.topK;
  const PER = Math.ceil(E / S);
  // The chosen flags: a bit mask (registers; a dynamically indexed array may live in local memory), or
  // past 32 a lane an array.
  const tk = PER <= 32
    ? {
      decl: "var taken = 0u;",
      init: `taken |= select(0u, 1u << i, e >= ${E}u);`,
      free: "(taken & (1u << i)) == 0u",
      take: `taken |= 1u << (win / ${S}u);`,
    }
    : {
      decl: `var taken: array<bool, ${PER}>;`,
      init: `taken[i] = e >= ${E}u;`,
      free: "!taken[i]",
      take: `taken[win / ${S}u] = true;`,
    };
  const scale = Math.fround(r.scale);
  const f = (v: number) => (Number.isInteger(v) ? `${v}.0` : `${v}`);
  const warp = (row: string, lane: string) => {
    const score = r.scoring === "softmax"
      ? `
    var m = -3.4e38;
    for (var i = 0u; i < ${PER}u; i++) {
      let e = i * ${S}u + ${lane};
      if (e < ${E}u) { m = max(m, logits[row + e]); }
    }
    m = subgroupMax(m);
    var tot = 0.0;
    for (var i = 0u; i < ${PER}u; i++) {
      let e = i * ${S}u + ${lane};
      if (e < ${E}u) { let v = exp(logits[row + e] - m); sc[i] = v; tot += v; }
    }
    tot = subgroupAdd(tot);
    for (var i = 0u; i < ${PER}u; i++) { sc[i] = sc[i] / tot; }`
      : `
    for (var i = 0u; i < ${PER}u; i++) {
      let e = i * ${S}u + ${lane};
      if (e < ${E}u) { sc[i] = 1.0 / (1.0 + exp(-logits[row + e])); }
    }`;
    const norm = !r.normTopK ? "" : `
    var sum = 0.0;
    for (var j = 0u; j < ${K}u; j++) { sum += pick[j]; }
    for (var j = 0u; j < ${K}u; j++) { rt_wt[j] = pick[j] / (sum + ${
      r.scoring === "sigmoid" ? "1e-20" : "0.0"
    }); }`;
    return `
  var rt_wid: array<u32, ${K}>;
  var rt_wt: array<f32, ${K}>;
  {
    let row = ${row};
    var sc: array<f32, ${PER}>;
    var ch: array<f32, ${PER}>;
    ${tk.decl}
    var pick: array<f32, ${K}>;
    ${score}
    for (var i = 0u; i < ${PER}u; i++) {
      let e = i * ${S}u + ${lane};
      ${tk.init}
      ch[i] = sc[i]${bias ? " + bias[min(e, " + (E - 1) + "u)]" : ""};
    }
    for (var j = 0u; j < ${K}u; j++) {
      var bv = -3.40282347e38;
      var be = 0xffffffffu;
      for (var i = 0u; i < ${PER}u; i++) {
        if (${tk.free} && (be == 0xffffffffu || ch[i] > bv)) { bv = ch[i]; be = i * ${S}u + ${lane}; }
      }
      let mv = subgroupMax(select(-3.40282347e38, bv, be != 0xffffffffu));
      let win = subgroupMin(select(0xffffffffu, be, be != 0xffffffffu && bv == mv));
      if (win % ${S}u == ${lane}) { ${tk.take} }
      rt_wid[j] = win;
      // The winner's score from its lane (constant indices: the arrays stay in registers).
      var own = sc[0];
      for (var i = 1u; i < ${PER}u; i++) { own = select(own, sc[i], win / ${S}u == i); }
      pick[j] = subgroupShuffle(own, win % ${S}u);
      rt_wt[j] = pick[j];
    }${norm}
    for (var j = 0u; j < ${K}u; j++) { rt_wt[j] = rt_wt[j] * ${f(scale)}; }
  }`;
  };
  const decls = `
var<workgroup> rt_ids: array<u32, ${K}>;
var<workgroup> rt_w: array<f32, ${K}>;`;
  // Every lane holds all K choices; lanes j, j + S, ... publish them (K may exceed S: subgroups of 4, top-8).
  const body = (row: string, lane = "tid") => `
  if (tid < ${S}u) {${warp(row, lane)}
    for (var j = tid; j < ${K}u; j += ${S}u) {
      rt_ids[j] = ${registerAt("rt_wid", "j", K)};
      rt_w[j] = ${registerAt("rt_wt", "j", K)};
    }
  }
  workgroupBarrier();`;
  return { decls, body, warp };
}

function source(r: Required<MoeRouting>, bias: boolean): string {
  const K = r.topK;
  const rt = routerWgsl(r, bias);
  return `
@group(0) @binding(0) var<storage, read> logits: array<f32>;
@group(0) @binding(1) var<storage, read_write> ids: array<u32>;
@group(0) @binding(2) var<storage, read_write> wts: array<f32>;
${bias ? "@group(0) @binding(3) var<storage, read> bias: array<f32>;" : ""}
${rt.decls}
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
  let t = wg.x;
  ${rt.body(`t * ${r.experts}u`)}
  if (tid < ${K}u) {
    ids[t * ${K}u + tid] = rt_ids[tid];
    wts[t * ${K}u + tid] = rt_w[tid];
  }
}`;
}

/**
 * Routing for T tokens: reads logits [T, experts] (f32), writes ids [T, topK] (u32) and routeWeights
 * [T, topK] (f32), slot 0 the best. `bias` (f32 [experts], e_score_correction_bias) is added to the scores
 * for selection only.
 */
export function moeRouterCall(
  gpu: Gpu,
  bufs: { logits: GPUBuffer; ids: GPUBuffer; routeWeights: GPUBuffer; bias?: GPUBuffer },
  d: MoeRouting & { T: number },
): KernelCall {
  const r = checkRouting(d);
  if (!(Number.isInteger(d.T) && d.T >= 1)) throw new RangeError(`T must be a positive integer, got ${d.T}`);
  const buffers = [bufs.logits, bufs.ids, bufs.routeWeights];
  if (bufs.bias) buffers.push(bufs.bias);
  return kernelCall(gpu, pipeline(gpu, source(r, bufs.bias !== undefined)), buffers, [d.T], "moe_router");
}

/** What the router chose: ids [T, topK] and weights [T, topK], slot 0 the best. */
export interface MoeRoute {
  ids: Uint32Array;
  weights: Float32Array;
}

/** CPU reference of moeRouterCall (f64 arithmetic, the same selection order and ties). */
export function moeRouterRef(logits: Float32Array, r: MoeRouting & { bias?: Float32Array }): MoeRoute {
  const { experts: E, topK: K, groups: G, topKGroups: KG, scale } = checkRouting(r);
  if (logits.length % E !== 0) throw new RangeError(`${logits.length} logits is not T x ${E}`);
  const T = logits.length / E;
  const GS = E / G;
  const ids = new Uint32Array(T * K);
  const weights = new Float32Array(T * K);
  // a beats b: larger value, or equal and a lower index.
  const beats = (v: number[], a: number, b: number) => v[a] > v[b] || (v[a] === v[b] && a < b);
  const best = (v: number[], n: number) =>
    Array.from(v.keys()).sort((a, b) => beats(v, a, b) ? -1 : beats(v, b, a) ? 1 : 0).slice(0, n);
  for (let t = 0; t < T; t++) {
    const l = Array.from(logits.subarray(t * E, t * E + E));
    let s: number[];
    if (r.scoring === "softmax") {
      const m = Math.max(...l);
      const ex = l.map((v) => Math.exp(v - m));
      const tot = ex.reduce((a, b) => a + b, 0);
      s = ex.map((v) => v / tot);
    } else s = l.map((v) => 1 / (1 + Math.exp(-v)));
    const c = s.map((v, e) => v + (r.bias ? r.bias[e] : 0));
    if (G > 1) {
      const gscore = Array.from({ length: G }, (_, g) => {
        const [a, b] = c.slice(g * GS, g * GS + GS).sort((x, y) => y - x);
        return a + b;
      });
      const kept = new Set(best(gscore, KG));
      for (let e = 0; e < E; e++) if (!kept.has(Math.floor(e / GS))) c[e] = -Infinity;
    }
    const chosen = best(c, K);
    const picked = chosen.map((e) => s[e]);
    const sum = picked.reduce((a, b) => a + b, 0) + (r.scoring === "sigmoid" ? 1e-20 : 0);
    chosen.forEach((e, j) => {
      ids[t * K + j] = e;
      weights[t * K + j] = (r.normTopK ? picked[j] / sum : picked[j]) * scale;
    });
  }
  return { ids, weights };
}
