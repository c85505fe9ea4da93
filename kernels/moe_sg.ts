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
import { type Gpu, type KernelCall, kernelCall, pipeline, uniformBuffer, type WeightType } from "./gpu.ts";
import { QUANT_DECODE_WGSL } from "./matmul_quant.ts";
import { isQuant, QUANT_GROUP, quantScaleWord, type QuantType } from "./quant.ts";
import { checkRouting, type MoeRouting, routerWgsl } from "./moe_router.ts";

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
   * gate_up: choose the experts here from the router's logits (moe_router.ts's routing, run by every
   * workgroup on its own: no dispatch of its own), writing ids and routeWeights from workgroup 0 for the
   * down GEMV and anyone after; `bias` is e_score_correction_bias.
   */
  route?: { routing: MoeRouting; bias: boolean };
}

/** Workgroup bytes the kernel stages (the staged input, q4's per-unit sums, reductions, expert bases). */
function sharedBytes(d: MoeSgDims): number {
  const width = d.kind === "down" ? d.topK * d.K : d.K;
  const units = width / unitWeights(d.weights);
  const route = d.route
    ? (2 * d.route.routing.experts + 256 + 3 * d.topK + 2 * (d.route.routing.groups ?? 1)) * 4
    : 0;
  return width * 4 + (d.weights === "q4" ? units * 4 : 0) + 64 * 4 + d.topK * 8 + route;
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

function source(d: MoeSgDims, S: number, R: number): string {
  const wt = d.weights;
  const UW = unitWeights(wt);
  const XV = UW / 4;
  const UNITS = d.K / UW; // units of one expert row
  const down = d.kind === "down";
  const k = d.topK;
  const WIDTH = down ? k * d.K : d.K; // staged floats
  const VU = down ? k * UNITS : UNITS; // units of a (virtual) row
  const scaleOf = (row: string, u: string) =>
    wt === "q4" ? `group_scale(${row} * UNITS + ${u})` : `group_scale(${row} * GPR + ${u} / 2u)`;
  // The staged input.
  let stage: string;
  if (down) {
    stage = `
  if (tid < K_SLOTS) {
    let e = ids[t * K_SLOTS + tid];
    let ok = e >= p.e0 && e - p.e0 < p.ne;
    ebase[tid] = select(0xffffffffu, (e - p.e0) * N, ok);
    coef[tid] = select(0.0, rw[t * K_SLOTS + tid], ok);
  }
  workgroupBarrier();
  for (var i = tid; i < WIDTH / 4u; i += WG) {
    xs[i] = x[t * (WIDTH / 4u) + i] * coef[i / (K / 4u)];
  }`;
  } else if (d.rmsnorm) {
    const nwv = d.rmsnorm.weights === "f16"
      ? "vec4<f32>(unpack2x16float(nw[i].x), unpack2x16float(nw[i].y))"
      : "nw[i]";
    stage = `
  var ss = 0.0;
  for (var i = tid; i < K / 4u; i += WG) { let v = x[t * (K / 4u) + i]; ss += dot(v, v); }
  ss = subgroupAdd(ss);
  if (lane == 0u) { red[warp] = ss; }
  workgroupBarrier();
  var tot = 0.0;
  for (var w = 0u; w < WARPS; w++) { tot += red[w]; }
  let inv = inverseSqrt(tot / f32(K) + p.eps);
  for (var i = tid; i < K / 4u; i += WG) { xs[i] = x[t * (K / 4u) + i] * inv * ${nwv}; }`;
  } else {
    stage = `
  for (var i = tid; i < K / 4u; i += WG) { xs[i] = x[t * (K / 4u) + i]; }`;
  }
  const rt = d.route ? routerWgsl(checkRouting(d.route.routing), d.route.bias) : undefined;
  if (rt) {
    stage = rt.body(`t * ${d.route!.routing.experts}u`) + `
  if (wg.x == 0u && tid < K_SLOTS) {
    ids[t * K_SLOTS + tid] = rt_ids[tid];
    rw[t * K_SLOTS + tid] = rt_w[tid];
  }` + stage;
  }
  if (!down) {
    stage += `
  if (tid < K_SLOTS) {
    let e = ${rt ? "rt_ids[tid]" : "ids[t * K_SLOTS + tid]"};
    let ok = e >= p.e0 && e - p.e0 < p.ne;
    ebase[tid] = select(0xffffffffu, (e - p.e0) * 2u * N, ok);
  }`;
  }
  stage += "\n  workgroupBarrier();";
  if (wt === "q4") {
    stage += `
  for (var j = tid; j < VU; j += WG) {
    var s4 = vec4<f32>(0.0);
    for (var i = 0u; i < ${XV}u; i++) { s4 += xs[${XV}u * j + i]; }
    xsum[j] = dot(s4, vec4<f32>(1.0));
  }
  workgroupBarrier();`;
  }
  const xAt = (i: number) => `xs[${XV}u * v + ${i}u]`;
  let rowsDecl: string, loop: string, stores: string;
  if (down) {
    // Output rows h0 + r; unit v of the virtual row is unit u = v % UNITS of slot j = v / UNITS.
    const rows = Array.from({ length: R }, (_, r) => r);
    rowsDecl = rows.map((r) => `let h${r} = min(n0 + ${r}u, N - 1u);\n    var a${r} = 0.0;`).join("\n    ");
    loop = `
    for (var v = lane; v < VU; v += S) {
      let j = v / UNITS;
      let u = v % UNITS;
      let eb = ebase[j];
      if (eb == 0xffffffffu) { continue; }
      ${wt === "q4" ? "let xsm = xsum[v];" : ""}
      ${
      rows.map((r) => `let row${r} = eb + h${r};\n      let w${r} = W[row${r} * UNITS + u];`).join("\n      ")
    }
      ${
      rows.map((r) => `a${r} += ${unitDot(wt, `w${r}`, xAt, scaleOf(`row${r}`, "u"), "xsm")};`).join(
        "\n      ",
      )
    }
    }`;
    stores = rows.map((r) =>
      `let s${r} = subgroupAdd(a${r});
    if (lane == 0u && n0 + ${r}u < N) {
      let o = t * N + n0 + ${r}u;
      y[o] = select(0.0, y[o], p.acc != 0u) + s${r};
    }`
    ).join("\n    ");
  } else {
    // Pairs P = n0 + r: slot j = P / N, row n = P % N; gate row eb + n, up row eb + N + n.
    const rows = Array.from({ length: R }, (_, r) => r);
    rowsDecl = rows.map((r) =>
      `let q${r} = min(n0 + ${r}u, K_SLOTS * N - 1u);
    let eb${r} = ebase[q${r} / N];
    let g${r} = select(eb${r} + q${r} % N, 0u, eb${r} == 0xffffffffu);
    let u${r} = g${r} + N;
    var ag${r} = 0.0;
    var au${r} = 0.0;`
    ).join("\n    ");
    loop = `
    for (var v = lane; v < VU; v += S) {
      ${wt === "q4" ? "let xsm = xsum[v];" : ""}
      ${
      rows.map((r) =>
        `let wg${r} = W[g${r} * UNITS + v];
      let wu${r} = W[u${r} * UNITS + v];`
      ).join("\n      ")
    }
      ${
      rows.map((r) =>
        `ag${r} += ${unitDot(wt, `wg${r}`, xAt, scaleOf(`g${r}`, "v"), "xsm")};
      au${r} += ${unitDot(wt, `wu${r}`, xAt, scaleOf(`u${r}`, "v"), "xsm")};`
      ).join("\n      ")
    }
    }`;
    stores = rows.map((r) =>
      `let sg${r} = subgroupAdd(ag${r});
    let su${r} = subgroupAdd(au${r});
    if (lane == 0u && n0 + ${r}u < K_SLOTS * N && eb${r} != 0xffffffffu) {
      act[t * K_SLOTS * N + n0 + ${r}u] = sg${r} / (1.0 + exp(-sg${r})) * su${r};
    }`
    ).join("\n    ");
  }
  const total = down ? "N" : "K_SLOTS * N";
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
  const extra = more.map((b, i) => `@group(0) @binding(${4 + i}) ${b};`).join("\n") + (rt ? rt.decls : "");
  return `
struct P { eps: f32, soff: u32, e0: u32, ne: u32, acc: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> W: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read_write> ${down ? "y" : "act"}: array<f32>;
${extra}
const K = ${d.K}u;
const N = ${d.N}u;
const K_SLOTS = ${k}u;
const UNITS = ${UNITS}u;
const GPR = ${d.K / QUANT_GROUP >= 1 ? Math.floor(d.K / QUANT_GROUP) : 1}u;
const VU = ${VU}u;
const WIDTH = ${WIDTH}u;
const S = ${S}u;
const WG = ${WG}u;
const WARPS = ${WG / S}u;
const R = ${R}u;
var<workgroup> xs: array<vec4<f32>, ${WIDTH / 4}>;
var<workgroup> red: array<f32, ${WG / S}>;
var<workgroup> ebase: array<u32, ${k}>;
${down ? `var<workgroup> coef: array<f32, ${k}>;` : ""}
${wt === "q4" ? `var<workgroup> xsum: array<f32, ${VU}>;` : ""}
${isQuant(wt) ? QUANT_DECODE_WGSL : ""}
@compute @workgroup_size(${WG})
fn main(
  @builtin(workgroup_id) wg: vec3<u32>,
  @builtin(local_invocation_index) tid: u32,
  @builtin(num_workgroups) ng: vec3<u32>,
) {
  let warp = tid / S;
  let lane = tid % S;
  let t = wg.y;
  _ = &red;
  ${stage}
  let nblk = (${total} + R - 1u) / R;
  for (var blk = wg.x * WARPS + warp; blk < nblk; blk += ng.x * WARPS) {
    let n0 = blk * R;
    ${rowsDecl}
    ${loop}
    ${stores}
  }
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
  const R = d.rows ?? 2;
  const rowsOut = down ? d.N : d.topK * d.N;
  const soff = isQuant(d.weights)
    ? quantScaleWord(d.experts * d.N * (down ? 1 : 2), d.K, d.weights as QuantType)
    : 0;
  const params = uniformBuffer(gpu, [
    d.rmsnorm?.eps ?? 0,
    soff,
    d.firstExpert ?? 0,
    d.experts,
    (d.accumulate ?? true) ? 1 : 0,
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
  const warps = WG / S;
  const groups = Math.ceil(Math.ceil(rowsOut / R) / warps);
  return kernelCall(gpu, pipeline(gpu, source(d, S, R)), buffers, [groups, d.T], `moe_sg_${d.kind}`);
}
