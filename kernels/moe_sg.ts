// The decode-time expert GEMVs on adapters with subgroups (moe_gemv.ts's team kernel is the fallback and
// the reference): a MoE block's routed experts in two dispatches, each built like gemv_sg.ts's GEMV (the
// input staged once per workgroup in workgroup memory, warps owning rows, lanes reading 16-byte units of a
// row coalesced, subgroupAdd reducing it, no barrier while weights stream):
//   gate_up  act[t, j, n] = silu(gate_e . f(x[t])) * (up_e . f(x[t]))     e = ids[t, j], n < I
//            a warp computes R (gate row, up row) pairs; f = rmsnorm(x) * norm (fused: the block's
//            post_attention_layernorm, so no separate norm dispatch) or the identity
//   down     y[t, h] (+)= sum_j w[t, j] * down_e[h] . act[t, j]          the weighted combine, fused
//            the k slots' rows of output h are one virtual row of k * I weights read from k experts, its
//            input the k slots' activations staged pre-multiplied by their route weights, so a warp's
//            row is k times longer and nothing is combined afterwards
// Weight storage: f32, f16, q8, q4 (kernels/quant.ts's layout over the [E * N, K] stack), as moe_gemv.ts.
// Slots whose expert lies outside [firstExpert, firstExpert + experts) read nothing and add nothing.
import {
  type Gpu,
  type KernelCall,
  kernelCall,
  memoSource,
  pipeline,
  uniformBuffer,
  type WeightType,
} from "./gpu.ts";
import { isQuant, QUANT_GROUP, quantScaleWord, type QuantType } from "./quant.ts";
import { checkRouting, type MoeRouting, registerAt, routerWgsl, routerWgslFast } from "./moe_router.ts";
import { dp4Dot, int8BlocksWgsl, QUANT_CODES_WGSL, siluMul } from "./wgsl.ts";

type Storage = WeightType | QuantType;

/** Weights per 16-byte unit. */
function unitWeights(wt: Storage): number {
  return wt === "f16" ? 8 : wt === "f32" ? 4 : wt === "q8" ? 16 : 32;
}

const WG = 256;

export interface MoeSgDims {
  /** "gate_up": K = hidden, N = intermediate I (the stack is [E, 2I, K]); "down": K = I, N = hidden. */
  kind: "gate_up" | "down";
  K: number;
  N: number;
  T: number;
  topK: number;
  /** Experts in the stack, and the id of its first. */
  experts: number;
  firstExpert?: number;
  weights: Storage;
  /** gate_up: normalise x with this RMSNorm epsilon and `norm` weights (f32 or f16) first. */
  rmsnorm?: { eps: number; weights: WeightType };
  /** down: add into y instead of overwriting it. Default true (the residual add). */
  accumulate?: boolean;
  /** Rows (gate_up: gate/up pairs) per warp at a time. Default: 2. */
  rows?: number;
  /**
   * Most workgroups launched, each warp then walking several row blocks (as gemv_sg.ts's `groups`): fewer
   * prologues (routing, staging) when the grid would not be resident at once. Default 0: one block a warp.
   */
  groups?: number;
  /**
   * gate_up: choose the experts here from the router's logits (moe_router.ts's routing, run by every
   * workgroup on its own: no dispatch of its own), writing ids and routeWeights from workgroup 0 for the
   * down GEMV and anyone after; `bias` is e_score_correction_bias. Without expert groups the first warp
   * routes in registers (routerWgslFast), unless `rank`: then routerWgsl with the softmax by the first warp
   * and the top-k by ranking, a thread an expert (k dependent rounds of subgroup reductions against one
   * pass over the choices in workgroup memory). Default rank false.
   */
  route?: { routing: MoeRouting; bias: boolean; rank?: boolean };
  /**
   * q8 / q4: multiply int8 activations with dot4I8Packed (gemv_sg.ts's dp4: the staged input quantised
   * per block of 32, wgsl.ts's int8BlocksWgsl) instead of converting every weight to f32. Needs WGSL's
   * packed_4x8_integer_dot_product. Default false.
   */
  dp4?: boolean;
  /**
   * Issue the first pass's weight loads before staging the input, so their memory latency overlaps the
   * staging (and, for down, its quantisation); the slots then come from the ids in memory. Not with
   * `route` (the ids are this kernel's own). Default false.
   */
  prefetch?: boolean;
  /**
   * The shared expert folded in as this many slots of weight 1 (its intermediate is sharedSlots x the
   * routed one; its matrices, in the routed storage, are bound as `shared`: gate_up [2 Is, K], down [N, Is]).
   * gate_up's act and down's input are then [T, topK + sharedSlots, I]. Default 0.
   */
  sharedSlots?: number;
  /**
   * gate_up: x is already normalised, written by the router GEMV (moeRouterGemvCall's `xn`): f32 [T, K], or
   * with dp4 its int8 copy in the staged layout ([T, K / 16] vec4<u32>, scales [T, K / 32] vec2<f32> bound
   * as `xScales`), so staging is a plain copy (no sum of squares, no quantisation) and, with `route`, the
   * routing's barrier is the only one before the weights stream (the slots read from the routing's ids).
   * Not with `rmsnorm`. Default false.
   */
  prenormed?: boolean;
  /**
   * gate_up (with `route`): write each slot's activations times its route weight; down: its input is so
   * (the shared slots' weight is 1), so staging needs no coefficient table first (one barrier, not two).
   * Default false.
   */
  scaled?: boolean;
}

/** Whether the kernel runs dp4 (quantised weights and the option). */
function isDp4(d: MoeSgDims): boolean {
  return d.dp4 === true && isQuant(d.weights);
}

/**
 * Workgroup bytes the kernel stages (the staged input: f32, or with dp4 int8 and a (scale, sum) per 32;
 * q4's per-unit sums, reductions, expert bases).
 */
function sharedBytes(d: MoeSgDims): number {
  const width = d.kind === "down" ? (d.topK + (d.sharedSlots ?? 0)) * d.K : d.K;
  const units = width / unitWeights(d.weights);
  const route = d.route
    ? (2 * d.route.routing.experts + 256 + 3 * d.topK + 2 * (d.route.routing.groups ?? 1)) * 4
    : 0;
  const input = isDp4(d) ? width + (width / 32) * 8 : width * 4 + (d.weights === "q4" ? units * 4 : 0);
  return input + 64 * 4 + (d.topK + (d.sharedSlots ?? 0)) * 12 + route;
}

/** Whether the subgroup kernels serve this shape here (else moe_gemv.ts's team kernel does). */
export function moeSgFits(gpu: Gpu, d: MoeSgDims): boolean {
  const UW = unitWeights(d.weights);
  return gpu.subgroupSize !== null && d.K % UW === 0 && d.K % 4 === 0 &&
    (!isQuant(d.weights) || d.K % QUANT_GROUP === 0) && sharedBytes(d) <= gpu.maxWorkgroupStorage;
}

function unitDot(wt: Storage, w: string, x: (i: number) => string, scale: string, xsum: string): string {
  switch (wt) {
    case "f32":
      return `dot(bitcast<vec4<f32>>(${w}), ${x(0)})`;
    case "f16":
      return `dot(vec4<f32>(unpack2x16float(${w}.x), unpack2x16float(${w}.y)), ${x(0)}) + ` +
        `dot(vec4<f32>(unpack2x16float(${w}.z), unpack2x16float(${w}.w)), ${x(1)})`;
    case "q8":
      return `${scale} * (${[0, 1, 2, 3].map((i) => `dot(q8v(${w}[${i}]), ${x(i)})`).join(" + ")})`;
    case "q4":
      return `${scale} * (${
        [0, 1, 2, 3, 4, 5, 6, 7].map((i) => `dot(q4v(${w}[${i >> 1}], ${16 * (i & 1)}u), ${x(i)})`).join(
          " + ",
        )
      } - 8.0 * ${xsum})`;
  }
}

/** A unit's value with dp4: its int8 words `xq` (q4: [even, odd]) and its block's (scale, scale * sum q). */
function unitDotDp4(
  wt: QuantType,
  w: string,
  xq: string | [string, string],
  xs: string,
  scale: string,
): string {
  const d = dp4Dot(wt, w, xq);
  return wt === "q4" ? `${scale} * (${xs}.x * f32(${d}) - 8.0 * ${xs}.y)` : `${scale} * ${xs}.x * f32(${d})`;
}

// Slots: the k routed ones, then NSH pseudo-slots of the shared expert (its intermediate cut into NSH
// pieces of the routed width, each a slot of weight 1). Slot j's matrix starts at unit sb[j] of its buffer
// (W routed, WS shared); gate_up: gate row n at sb + n * UNITS, its up row su[j] units further; down: row h
// at sb + h * sr[j]. A quantised unit i has its scale at group i (q4) or i / 2 (q8) in either buffer.
const sources = memoSource(source);

function source(d: MoeSgDims, S: number, R: number): string {
  const wt = d.weights;
  const quant = isQuant(wt);
  const dp4 = isDp4(d);
  const UW = unitWeights(wt);
  const XV = UW / 4;
  const UNITS = d.K / UW; // units of one expert row
  const down = d.kind === "down";
  const k = d.topK;
  const NSH = d.sharedSlots ?? 0;
  const SL = k + NSH;
  const WIDTH = down ? SL * d.K : d.K; // staged floats
  const VU = down ? SL * UNITS : UNITS; // units of a (virtual) row
  const routing = d.route && checkRouting(d.route.routing);
  const fast = routing && routing.groups === 1 && !d.route!.rank
    ? routerWgslFast(routing, d.route!.bias, S)
    : undefined;
  const rt = !routing ? undefined : fast ?? routerWgsl(routing, d.route!.bias, d.route!.rank ? S : undefined);
  // Issue the first pass's weight loads before staging: the slots read from the ids in memory, or, when
  // this kernel routes without expert groups, every warp routes on its own (the choice in its registers,
  // no barrier) and loads at once.
  const warpRoute = d.prefetch === true && fast !== undefined;
  const prefetch = d.prefetch === true && (!rt || warpRoute);
  // The slot table in workgroup memory (routed slots from the ids; shared ones fixed): slot_at's
  // (base, row stride) and the slot's input coefficient (down: its route weight).
  const idOf = warpRoute
    ? registerAt("rt_wid", "tid", k)
    : rt
    ? "rt_ids[min(tid, K_SLOTS - 1u)]"
    : "ids[t * K_SLOTS + min(tid, K_SLOTS - 1u)]";
  const table = `
  if (tid < SL) {
    let sa = slot_at(${idOf}, tid);
    sb[tid] = sa.x;
    sr[tid] = sa.y;
    coef[tid] = ${
    down ? "select(select(0.0, rw[t * K_SLOTS + tid], sa.x != 0xffffffffu), 1.0, tid >= K_SLOTS)" : "1.0"
  };
  }`;
  // Slot j's base and row stride: from the table, or (prefetch) straight from the ids.
  const fromTable = { sb: (j: string) => `sb[${j}]`, sr: (j: string) => `sr[${j}]` };
  const idAt = (j: string) =>
    warpRoute ? registerAt("rt_wid", j, k) : `ids[t * K_SLOTS + min(${j}, K_SLOTS - 1u)]`;
  const fromIds = {
    sb: (j: string) => `slot_at(${idAt(j)}, ${j}).x`,
    sr: (j: string) => `slot_at(${idAt(j)}, ${j}).y`,
  };
  // Prenormed with the routing here: no table (its barrier would be a second one), the slots from rt_ids.
  const fromRt = {
    sb: (j: string) => `slot_at(rt_ids[min(${j}, K_SLOTS - 1u)], ${j}).x`,
    sr: (j: string) => `slot_at(rt_ids[min(${j}, K_SLOTS - 1u)], ${j}).y`,
  };
  const slots = !down && d.prenormed && rt && !warpRoute ? fromRt : fromTable;
  // The staged input: vec4 i of it (down: the slots' activations times their route weights; gate_up: x or
  // rmsnorm(x) * norm), f32 in xs, or with dp4 its int8 copy.
  let stage: string;
  const put = (vin: (i: string) => string, width: string) =>
    dp4 ? int8BlocksWgsl(wt as QuantType, vin, `${width} / 32u`, "WG", "VU") : `
  for (var i = tid; i < ${width} / 4u; i += WG) { xs[xi(i)] = ${vin("i")}; }`;
  if (down) {
    stage = d.scaled ? `${table}${put((i) => `x[t * (WIDTH / 4u) + ${i}]`, "WIDTH")}` : `${table}
  workgroupBarrier();${put((i) => `x[t * (WIDTH / 4u) + ${i}] * coef[(${i}) / (K / 4u)]`, "WIDTH")}`;
    stage += "\n  workgroupBarrier();";
  } else if (d.prenormed) {
    // A plain copy of the router's normalised x; its loads overlap the routing's.
    stage = dp4
      ? `
  for (var i = tid; i < K / 16u; i += WG) { xq[i] = x[t * (K / 16u) + i]; }
  for (var i = tid; i < K / 32u; i += WG) { xqs[i] = xsc[t * (K / 32u) + i]; }`
      : `
  for (var i = tid; i < K / 4u; i += WG) { xs[xi(i)] = x[t * (K / 4u) + i]; }`;
    if (rt && !warpRoute) {
      stage += rt.body(`t * ${d.route!.routing.experts}u`, "sg_lane") + `
  if (wg.x == 0u && tid < K_SLOTS) {
    ids[t * K_SLOTS + tid] = rt_ids[tid];
    rw[t * K_SLOTS + tid] = rt_w[tid];
  }`;
    } else stage += table + "\n  workgroupBarrier();";
  } else {
    // The sum of squares of x first: the routing's barriers publish it (its loads overlap the routing).
    stage = d.rmsnorm
      ? `
  var ss = 0.0;
  for (var i = tid; i < K / 4u; i += WG) { let v = x[t * (K / 4u) + i]; ss += dot(v, v); }
  ss = subgroupAdd(ss);
  if (lane == 0u) { red[warp] = ss; }`
      : "";
    if (rt && !warpRoute) {
      stage += rt.body(`t * ${d.route!.routing.experts}u`, "sg_lane") + `
  if (wg.x == 0u && tid < K_SLOTS) {
    ids[t * K_SLOTS + tid] = rt_ids[tid];
    rw[t * K_SLOTS + tid] = rt_w[tid];
  }`;
    } else if (d.rmsnorm) stage += "\n  workgroupBarrier();";
    if (d.rmsnorm) {
      const nwv = (i: string) =>
        d.rmsnorm!.weights === "f16"
          ? `vec4<f32>(unpack2x16float(nw[${i}].x), unpack2x16float(nw[${i}].y))`
          : `nw[${i}]`;
      stage += `
  var tot = 0.0;
  for (var w = 0u; w < WARPS; w++) { tot += red[w]; }
  let inv = inverseSqrt(tot / f32(K) + p.eps);${put((i) => `x[t * (K / 4u) + ${i}] * inv * ${nwv(i)}`, "K")}`;
    } else stage += put((i) => `x[t * (K / 4u) + ${i}]`, "K");
    stage += table + "\n  workgroupBarrier();";
  }
  if (wt === "q4" && !dp4) {
    stage += `
  for (var j = tid; j < VU; j += WG) {
    var s4 = vec4<f32>(0.0);
    for (var i = 0u; i < ${XV}u; i++) { s4 += xs[i * VU + j]; }
    xsum[j] = dot(s4, vec4<f32>(1.0));
  }
  workgroupBarrier();`;
  }
  const rows = Array.from({ length: R }, (_, r) => r);
  // Units a lane loads before using any: all of its row's (up to 8) per pass of the loop.
  const U = Math.max(1, Math.min(8, Math.ceil(VU / S)));
  const us = Array.from({ length: U }, (_, u) => u);
  // Loads a unit (and its scale) from the slot's buffer.
  const load = (w: string, sh: string, idx: string) =>
    `let ${w} = ld(${sh}, ${idx});${quant ? `\n      let ${w}s = gsc(${sh}, ${idx});` : ""}`;
  const dotOf = (w: string, u: number) =>
    !dp4
      ? unitDot(wt, w, (i) => `xs[${i}u * VU + v${u}]`, `${w}s`, `xsm${u}`)
      : wt === "q4"
      ? unitDotDp4(wt, w, [`xe${u}`, `xo${u}`], `xb${u}`, `${w}s`)
      : unitDotDp4(wt as QuantType, w, `xe${u}`, `xb${u}`, `${w}s`);
  // A unit's input, loaded once for the R rows: f32 (q4: and its sum), or int8 words and block scale.
  const inputOf = (u: number) =>
    !dp4
      ? (wt === "q4" ? `\n      let xsm${u} = xsum[v${u}];` : "")
      : wt === "q4"
      ? `\n      let xe${u} = xq[v${u}];\n      let xo${u} = xq[VU + v${u}];\n      let xb${u} = xqs[v${u}];`
      : `\n      let xe${u} = xq[v${u}];\n      let xb${u} = xqs[v${u} / 2u];`;
  type Tab = typeof fromTable;
  // A pass over units p0, p0 + S, ... of the row: addresses, inputs, weight loads, multiply-adds.
  const addr = (tab: Tab) =>
    us.map((u) =>
      `let v${u} = min(p0 + ${u * S}u, VU - 1u);
      let ok${u} = p0 + ${u * S}u < VU;${
        down
          ? `
      let j${u} = v${u} / UNITS;
      let b${u} = ${tab.sb(`j${u}`)};
      let on${u} = ok${u} && b${u} != 0xffffffffu;
      let base${u} = select(0u, b${u}, on${u}) + v${u} % UNITS;
      let sh${u} = j${u} >= K_SLOTS;
      let st${u} = ${tab.sr(`j${u}`)};`
          : ""
      }`
    ).join("\n      ");
  const inputs = us.map((u) => inputOf(u)).join("");
  let rowsDecl: (tab: Tab) => string, loads: string, dots: string, stores: string;
  if (down) {
    rowsDecl = () =>
      rows.map((r) => `let h${r} = min(n0 + ${r}u, N - 1u);\n    var a${r} = 0.0;`).join("\n    ");
    loads = us.flatMap((u) => rows.map((r) => load(`w${u}_${r}`, `sh${u}`, `base${u} + h${r} * st${u}`)))
      .join("\n      ");
    dots = us.flatMap((u) => rows.map((r) => `a${r} += select(0.0, ${dotOf(`w${u}_${r}`, u)}, on${u});`))
      .join("\n      ");
    stores = rows.map((r) =>
      `let s${r} = subgroupAdd(a${r});
    if (lane == 0u && n0 + ${r}u < N) {
      let o = t * N + n0 + ${r}u;
      y[o] = select(0.0, y[o], p.acc != 0u) + s${r};
    }`
    ).join("\n    ");
  } else {
    // scaled: times slot j's route weight (the shared slots': 1).
    const scale = (j: string) =>
      !d.scaled
        ? ""
        : ` * select(${
          warpRoute ? registerAt("rt_wt", j, k) : `rt_w[min(${j}, K_SLOTS - 1u)]`
        }, 1.0, ${j} >= K_SLOTS)`;
    // Pairs P = n0 + r: slot j = P / N, row n = P % N.
    rowsDecl = (tab) =>
      rows.map((r) =>
        `let q${r} = min(n0 + ${r}u, SL * N - 1u);
    let j${r} = q${r} / N;
    let b${r} = ${tab.sb(`j${r}`)};
    let sh${r} = j${r} >= K_SLOTS;
    let g${r} = select(b${r}, 0u, b${r} == 0xffffffffu) + (q${r} % N) * UNITS;
    let u${r} = g${r} + ${tab.sr(`j${r}`)};
    var ag${r} = 0.0;
    var au${r} = 0.0;`
      ).join("\n    ");
    loads = us.flatMap((u) =>
      rows.map((r) =>
        `${load(`wg${u}_${r}`, `sh${r}`, `g${r} + v${u}`)}\n      ${
          load(`wu${u}_${r}`, `sh${r}`, `u${r} + v${u}`)
        }`
      )
    ).join("\n      ");
    dots = us.flatMap((u) =>
      rows.map((r) =>
        `ag${r} += select(0.0, ${dotOf(`wg${u}_${r}`, u)}, ok${u});\n      au${r} += select(0.0, ${
          dotOf(`wu${u}_${r}`, u)
        }, ok${u});`
      )
    ).join("\n      ");
    stores = rows.map((r) =>
      `let sg${r} = subgroupAdd(ag${r});
    let su${r} = subgroupAdd(au${r});
    if (lane == 0u && n0 + ${r}u < SL * N && b${r} != 0xffffffffu) {
      act[t * SL * N + n0 + ${r}u] = ${siluMul(`sg${r}`, `su${r}`)}${scale(`j${r}`)};
    }`
    ).join("\n    ");
  }
  const loop = (from: string) => `
    for (var p0 = ${from}; p0 < VU; p0 += ${S * U}u) {
      ${addr(fromTable)}${inputs}
      ${loads}
      ${dots}
    }`;
  // The warp's blocks of rows: with prefetch, the first block's first pass loads before the stage (its
  // addresses from the ids) and is finished after it; the rest as usual.
  const nblk = `let nblk = (${down ? "N" : "SL * N"} + R - 1u) / R;\n  let blk0 = wg.x * WARPS + warp;`;
  const route = !warpRoute ? "" : `${fast!.warp(`t * ${routing!.experts}u`, "sg_lane")}
  if (wg.x == 0u && warp == 0u) {
    for (var j = lane; j < K_SLOTS; j += ${S}u) { // K_SLOTS may exceed the subgroup (4 lanes, top-8)
      ids[t * K_SLOTS + j] = ${registerAt("rt_wid", "j", k)};
      rw[t * K_SLOTS + j] = ${registerAt("rt_wt", "j", k)};
    }
  }`;
  const body = prefetch
    ? `${route}
  ${nblk}
  let n0 = min(blk0, nblk - 1u) * R;
  ${rowsDecl(fromIds)}
  let p0 = lane;
  ${addr(fromIds)}
  ${loads}
  ${stage}
  if (blk0 < nblk) {${inputs}
    ${dots}
    ${loop(`lane + ${S * U}u`)}
    ${stores}
  }
  for (var blk = blk0 + ng.x * WARPS; blk < nblk; blk += ng.x * WARPS) {
    let n0 = blk * R;
    ${rowsDecl(fromTable)}
    ${loop("lane")}
    ${stores}
  }`
    : `${stage}
  ${nblk}
  for (var blk = blk0; blk < nblk; blk += ng.x * WARPS) {
    let n0 = blk * R;
    ${rowsDecl(slots)}
    ${loop("lane")}
    ${stores}
  }`;
  // Bindings after x, W and the output, in moeSgCall's order.
  const more: string[] = [`var<storage, ${rt ? "read_write" : "read"}> ids: array<u32>`];
  if (down) more.push("var<storage, read> rw: array<f32>");
  if (!down && d.rmsnorm) {
    more.push(`var<storage, read> nw: array<${d.rmsnorm.weights === "f16" ? "vec2<u32>" : "vec4<f32>"}>`);
  }
  if (rt) {
    more.push("var<storage, read> logits: array<f32>", "var<storage, read_write> rw: array<f32>");
    if (d.route!.bias) more.push("var<storage, read> bias: array<f32>");
  }
  if (NSH > 0) more.push("var<storage, read> WS: array<vec4<u32>>");
  if (!down && d.prenormed && dp4) more.push("var<storage, read> xsc: array<vec2<f32>>");
  const extra = more.map((b, i) => `@group(0) @binding(${4 + i}) ${b};`).join("\n") + (rt ? rt.decls : "");
  const gscale = (buf: string, off: string) => `
  let sw = ${buf}[${off} / 4u + g / 8u][(g / 2u) % 4u];
  return bitcast<f32>(select(sw << 16u, sw & 0xffff0000u, (g & 1u) == 1u));`;
  const group = wt === "q4" ? "i" : "i / 2u";
  const helpers = `
// Slot j's matrix: (first unit, units between rows) in W (routed, expert e; 0xffffffff: not in this
// stack) or WS (the shared expert's pseudo-slots).
fn slot_at(e: u32, j: u32) -> vec2<u32> {
  if (j < K_SLOTS) {
    let on = e >= p.e0 && e - p.e0 < p.ne;
    return vec2<u32>(select(0xffffffffu, (e - p.e0) * ${down ? "N" : "2u * N"} * UNITS, on), ${
    down ? "UNITS" : "N * UNITS"
  });
  }
  return vec2<u32>((j - K_SLOTS) * ${down ? "UNITS" : "N * UNITS"}, ${
    down ? "NSH * UNITS" : "NSH * N * UNITS"
  });
}
fn ld(sh: bool, i: u32) -> vec4<u32> {
  ${NSH > 0 ? "if (sh) { return WS[i]; }" : ""}
  return W[i];
}
${
    quant
      ? `fn gsc(sh: bool, i: u32) -> f32 {
  let g = ${group};
  if (sh) {${NSH > 0 ? gscale("WS", "p.soff2") : "return 0.0;"}
  }${gscale("W", "p.soff")}
}
${QUANT_CODES_WGSL}`
      : ""
  }`;
  return `
struct P { eps: f32, soff: u32, e0: u32, ne: u32, acc: u32, soff2: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> x: array<${!down && d.prenormed && dp4 ? "vec4<u32>" : "vec4<f32>"}>;
@group(0) @binding(2) var<storage, read> W: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read_write> ${down ? "y" : "act"}: array<f32>;
${extra}
const K = ${d.K}u;
const N = ${d.N}u;
const K_SLOTS = ${k}u;
const NSH = ${NSH}u;
const SL = ${SL}u;
const UNITS = ${UNITS}u;
const VU = ${VU}u;
const WIDTH = ${WIDTH}u;
const S = ${S}u;
const WG = ${WG}u;
const WARPS = ${WG / S}u;
const R = ${R}u;
${
    dp4
      ? `var<workgroup> xq: array<vec4<u32>, ${WIDTH / 16}>;\nvar<workgroup> xqs: array<vec2<f32>, ${
        WIDTH / 32
      }>;`
      : `var<workgroup> xs: array<vec4<f32>, ${WIDTH / 4}>;
// vec4 i of the staged row is component i % XV of unit i / XV: staged component-major ([XV][VU]) so a warp's
// lanes, one unit each, read consecutive vec4s.
fn xi(i: u32) -> u32 { return (i % ${XV}u) * VU + i / ${XV}u; }`
  }
var<workgroup> red: array<f32, ${WG / S}>;
var<workgroup> sb: array<u32, ${SL}>;
var<workgroup> sr: array<u32, ${SL}>;
var<workgroup> coef: array<f32, ${SL}>;
${wt === "q4" && !dp4 ? `var<workgroup> xsum: array<f32, ${VU}>;` : ""}
${helpers}
@compute @workgroup_size(${WG})
fn main(
  @builtin(workgroup_id) wg: vec3<u32>,
  @builtin(local_invocation_index) tid: u32,
  @builtin(num_workgroups) ng: vec3<u32>,
  @builtin(subgroup_invocation_id) sg_lane: u32,
) {
  let warp = tid / S;
  let lane = tid % S;
  let t = wg.y;
  _ = &red;
  _ = &coef;
  ${body}
}`;
}

/**
 * One of the two decode expert GEMVs (the file's comment). Buffers: gate_up: x [T, K] (the residual
 * stream when `rmsnorm`, with `norm` its weights; else the normalised input), w [E, 2N, K], out = act
 * [T, topK, N]; down: x = act [T, topK, K], w [E, N, K], out = y [T, N], routeWeights [T, topK]. ids [T, topK].
 */
export function moeSgCall(
  gpu: Gpu,
  bufs: {
    x: GPUBuffer;
    w: GPUBuffer;
    out: GPUBuffer;
    ids: GPUBuffer;
    routeWeights?: GPUBuffer;
    norm?: GPUBuffer;
    logits?: GPUBuffer;
    bias?: GPUBuffer;
    shared?: GPUBuffer;
    xScales?: GPUBuffer;
  },
  d: MoeSgDims,
): KernelCall {
  const S = gpu.subgroupSize;
  if (!S || !moeSgFits(gpu, d)) {
    throw new RangeError(`the subgroup expert GEMV does not fit ${d.kind} K = ${d.K} (${d.weights}) here`);
  }
  const down = d.kind === "down";
  if (down && !bufs.routeWeights) throw new TypeError("the down GEMV needs routeWeights");
  if (!down && d.rmsnorm && !bufs.norm) throw new TypeError("rmsnorm needs the norm weights");
  if (d.dp4 && isQuant(d.weights) && !gpu.hasDp4) {
    throw new RangeError("the dp4 expert GEMV needs WGSL's packed_4x8_integer_dot_product");
  }
  if (d.prenormed && (down || d.rmsnorm)) {
    throw new TypeError("prenormed is gate_up's, without rmsnorm (the router GEMV normalised x)");
  }
  if (d.prenormed && isDp4(d) && !bufs.xScales) throw new TypeError("prenormed dp4 needs xScales");
  if (d.scaled && !down && !d.route) throw new TypeError("scaled gate_up needs route (its route weights)");
  const R = d.rows ?? 2;
  const NSH = d.sharedSlots ?? 0;
  if (!(Number.isInteger(NSH) && NSH >= 0)) throw new RangeError(`sharedSlots must be >= 0, got ${NSH}`);
  if (NSH > 0 && !bufs.shared) throw new TypeError("sharedSlots > 0 needs the shared expert's matrix");
  const rowsOut = down ? d.N : (d.topK + NSH) * d.N;
  const q = isQuant(d.weights) ? d.weights as QuantType : undefined;
  const soff = q ? quantScaleWord(d.experts * d.N * (down ? 1 : 2), d.K, q) : 0;
  // The shared matrix: gate_up [2 NSH N, K], down [N, NSH K].
  const soff2 = q && NSH > 0
    ? (down ? quantScaleWord(d.N, NSH * d.K, q) : quantScaleWord(2 * NSH * d.N, d.K, q))
    : 0;
  const params = uniformBuffer(gpu, [
    d.rmsnorm?.eps ?? 0,
    soff,
    d.firstExpert ?? 0,
    d.experts,
    (d.accumulate ?? true) ? 1 : 0,
    soff2,
  ], [0]);
  const buffers = [params, bufs.x, bufs.w, bufs.out, bufs.ids];
  if (down) buffers.push(bufs.routeWeights!);
  else if (d.rmsnorm) buffers.push(bufs.norm!);
  if (!down && d.route) {
    if (d.route.routing.topK !== d.topK) {
      throw new RangeError(`routing topK ${d.route.routing.topK} != ${d.topK}`);
    }
    if (!bufs.logits || !bufs.routeWeights || (d.route.bias && !bufs.bias)) {
      throw new TypeError("routing in the gate_up GEMV needs logits, routeWeights (and bias)");
    }
    buffers.push(bufs.logits, bufs.routeWeights);
    if (d.route.bias) buffers.push(bufs.bias!);
  }
  if (NSH > 0) buffers.push(bufs.shared!);
  if (!down && d.prenormed && isDp4(d)) buffers.push(bufs.xScales!);
  const warps = WG / S;
  const need = Math.ceil(Math.ceil(rowsOut / R) / warps);
  const cap = d.groups ?? 0;
  if (!(Number.isInteger(cap) && cap >= 0)) {
    throw new RangeError(`groups must be an integer >= 0, got ${cap}`);
  }
  const groups = cap > 0 ? Math.min(need, cap) : need;
  return kernelCall(gpu, pipeline(gpu, sources(d, S, R)), buffers, [groups, d.T], `moe_sg_${d.kind}`);
}

/**
 * The router's logits with the block's RMSNorm fused, built for latency (decode): one workgroup per
 * expert row and token, each thread loading its few 16-byte units of the row, of x and of the norm weights
 * at once (one memory round trip), then one reduction of the sum of squares and the dot product together:
 *   logits[t, e] = rsqrt(mean(x[t]^2) + eps) * sum_k router[e, k] * x[t, k] * norm[k]
 * (the same value as rmsnorm then the GEMV, up to f32 summation order). Router f32 [E, K], K % 4 == 0.
 * With `xn`, every workgroup also writes its share of the normalised x[t] * rsqrt(...) * norm, for the
 * gate_up GEMV to stage as it is (MoeSgDims.prenormed): "f32" [T, K] into `xn`, or "q8" / "q4" the int8
 * copy the dp4 GEMV stages (wgsl.ts's int8BlocksWgsl, q4 split: [T, K / 16] vec4<u32> words into `xn`,
 * [T, K / 32] vec2<f32> (scale, scale * sum q) into `xnScales`), so the expert workgroups skip the
 * RMSNorm reduction and the quantisation. Workgroup e writes vec4s (f32) or blocks e, e + E, ...
 */
export function moeRouterGemvCall(
  gpu: Gpu,
  bufs: {
    x: GPUBuffer;
    router: GPUBuffer;
    norm: GPUBuffer;
    logits: GPUBuffer;
    xn?: GPUBuffer;
    xnScales?: GPUBuffer;
  },
  d: { K: number; experts: number; T: number; eps: number; normWeights: WeightType; xn?: "f32" | QuantType },
): KernelCall {
  const S = gpu.subgroupSize;
  if (!S || d.K % 4 !== 0) {
    throw new RangeError(`the router GEMV needs subgroups and K % 4 == 0, got K = ${d.K}`);
  }
  const q = d.xn === "q4" || d.xn === "q8" ? d.xn : undefined;
  if (d.xn && (!bufs.xn || (q && !bufs.xnScales))) throw new TypeError(`xn "${d.xn}" needs its buffers`);
  if (q && d.K % QUANT_GROUP !== 0) throw new RangeError(`the int8 xn needs K % 32 == 0, got K = ${d.K}`);
  const K4 = d.K / 4;
  const nwAt = (i: string) =>
    d.normWeights === "f16"
      ? `vec4<f32>(unpack2x16float(nw[${i}].x), unpack2x16float(nw[${i}].y))`
      : `nw[${i}]`;
  const nwv = nwAt("i");
  const xnv = (i: string) => `x[t * K4 + ${i}] * inv * ${nwAt(i)}`;
  const xnOut = !d.xn
    ? ""
    : q
    ? int8BlocksWgsl(q, xnv, `${d.K / 32}u`, `E * ${WG}u`, q === "q4" ? `${d.K / 32}u` : undefined, {
      first: "e + E * tid",
      q: (i) => `xn[t * ${d.K / 16}u + ${i}]`,
      s: (b) => `xns[t * ${d.K / 32}u + ${b}]`,
    })
    : `
  for (var i = e + E * tid; i < K4; i += E * ${WG}u) { xn[t * K4 + i] = ${xnv("i")}; }`;
  const xnDecl = !d.xn ? "" : q
    ? `@group(0) @binding(5) var<storage, read_write> xn: array<vec4<u32>>;
@group(0) @binding(6) var<storage, read_write> xns: array<vec2<f32>>;`
    : "@group(0) @binding(5) var<storage, read_write> xn: array<vec4<f32>>;";
  const code = `
struct P { eps: f32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> W: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> logits: array<f32>;
@group(0) @binding(4) var<storage, read> nw: array<${d.normWeights === "f16" ? "vec2<u32>" : "vec4<f32>"}>;
const K4 = ${K4}u;
const E = ${d.experts}u;
const WARPS = ${WG / S}u;
${xnDecl}
var<workgroup> red: array<vec2<f32>, ${WG / S}>;
@compute @workgroup_size(${WG})
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
  let e = wg.x;
  let t = wg.y;
  var ss = 0.0;
  var dt = 0.0;
  for (var i = tid; i < K4; i += ${WG}u) {
    let xv = x[t * K4 + i];
    ss += dot(xv, xv);
    dt += dot(W[e * K4 + i], xv * ${nwv});
  }
  let r = subgroupAdd(vec2<f32>(ss, dt));
  if (tid % ${S}u == 0u) { red[tid / ${S}u] = r; }
  workgroupBarrier();
  var tot = vec2<f32>(0.0);
  for (var w = 0u; w < WARPS; w++) { tot += red[w]; }
  let inv = inverseSqrt(tot.x / f32(${d.K}) + p.eps);
  if (tid == 0u) { logits[t * E + e] = inv * tot.y; }${xnOut}
}`;
  const params = uniformBuffer(gpu, [d.eps], [0]);
  const xnBufs = !d.xn ? [] : q ? [bufs.xn!, bufs.xnScales!] : [bufs.xn!];
  return kernelCall(
    gpu,
    pipeline(gpu, code),
    [params, bufs.x, bufs.router, bufs.logits, bufs.norm, ...xnBufs],
    [d.experts, d.T],
    "moe_router_gemv",
  );
}
