// The expert GEMVs of a mixture-of-experts layer: for each token t and slot j (its j-th chosen expert
// e = ids[t, j], written by moe_router.ts on the GPU) multiply the input row by expert e's matrix only:
//   out[t, j, n] = sum_k f(x)[row, k] * W[e, n, k]
// The weights are stacked per layer: W [experts, N, K] (gate+up fused as [E, 2I, H], down [E, H, I]),
// stored f32, f16 or q8 / q4. A quantised stack is quantize() of the [E * N, K] matrix (kernels/quant.ts:
// all experts' values, then all their group scales), so expert e's row n is simply row e * N + n.
//   input      "token": x [T, K], each token's row shared by its slots (gate_up)
//              "slot":  x [T, topK, K'] with a row per slot (down, after gate_up)
//   transform  "none", or "silu_mul": the row is a fused gate/up row of width 2K and f(x) = silu(gate) * up
//              (kernels/silu_mul.ts's semantics, computed as the row is read)
//   output     "slots":   y [T, topK, N]
//              "combine": y [T, N] (+)= sum_j routeWeights[t, j] * out[t, j]: the weighted sum of the
//                         experts (the MoE block's combine), optionally added into the residual stream
// So a MoE layer is: router logits (matmul.ts) -> moeRouterCall -> gate_up (input "token", output
// "slots") -> down (input "slot", transform "silu_mul", output "combine", accumulate): 4 dispatches.
//
// One WGSL generator serves every weight type: the work is cut into 16-byte units of a row (4 f32, 8 f16,
// 16 q8 or 32 q4 weights; f32 / f16 rows whose K is not a multiple of that fall back to one weight a unit),
// and only the unit's dot product differs. Teams of threads own R rows of one expert, as gemv_fused.ts's
// team GEMV does (its TEAM_REDUCE_STORE and tuning are reused, and matmul_quant.ts's q8 / q4 decoding).
// The expert id is read once per workgroup and slot, so a token reads exactly its k experts' rows.
// `firstExpert` lets a layer's experts span several buffers (2 GiB bindings) or nodes: a call serves the
// experts in its buffer and skips slots that chose others; the calls of one layer sum into the same y.
import { defaultTuning, type GemvTuning, TEAM_REDUCE_STORE } from "./gemv_fused.ts";
import {
  ceilDiv,
  type Gpu,
  type KernelCall,
  kernelCall,
  pipeline,
  uniformBuffer,
  type WeightType,
} from "./gpu.ts";
import { QUANT_DECODE_WGSL } from "./matmul_quant.ts";
import { isQuant, QUANT_GROUP, quantFits, quantScaleWord, type QuantType } from "./quant.ts";

export interface MoeGemvDims {
  /** Input features: the row length of each expert matrix (for silu_mul, the width of the gate half). */
  K: number;
  /** Output features: rows of each expert matrix. */
  N: number;
  /** Tokens. */
  T: number;
  /** Slots per token (the router's topK); ids and routeWeights are [T, topK]. */
  topK: number;
  /** Experts stacked in the weight buffer, which is [experts, N, K]. */
  experts: number;
  /** Expert id of the buffer's first matrix; slots choosing an expert outside the buffer are skipped. Default 0. */
  firstExpert?: number;
  /** Matrix storage; q8 / q4 need K % 32 == 0. */
  weights: WeightType | QuantType;
  /** "token": x [T, K(*2)]; "slot": x [T, topK, K(*2)]. Default "token". */
  input?: "token" | "slot";
  /** "silu_mul": each input row is [gate | up] of width 2K, used as silu(gate) * up. Default "none". */
  transform?: "none" | "silu_mul";
  /** "slots": y [T, topK, N]; "combine": y [T, N] gets sum_j routeWeights[t, j] * out[t, j]. Default "slots". */
  output?: "slots" | "combine";
  /** Add into y instead of overwriting it (the residual add). Default false. */
  accumulate?: boolean;
  /** Team shape (gemv_fused.ts's); default from the row length. */
  tuning?: GemvTuning;
}

const THREADS = 256;

/** Weights per 16-byte unit. */
function unitWeights(wt: WeightType | QuantType): number {
  return wt === "f32" ? 4 : wt === "f16" ? 8 : wt === "q8" ? 16 : 32;
}

/** Weights a unit of the kernel holds for this shape: a 16-byte load, or one weight for odd float rows. */
function unitOf(K: number, wt: WeightType | QuantType): number {
  const U = unitWeights(wt);
  return K % U === 0 ? U : 1;
}

/** Whether the kernel takes this row length and storage (any K for floats; q8 / q4 need K % 32 == 0). */
export function moeGemvFits(K: number, wt: WeightType | QuantType): boolean {
  return Number.isInteger(K) && K >= 1 && (!isQuant(wt) || quantFits(K));
}

interface Variant {
  wt: WeightType | QuantType;
  unit: number;
  slotInput: boolean;
  silu: boolean;
  combine: boolean;
  team: number;
  rows: number;
}

function source(v: Variant): string {
  const { wt, unit: U } = v;
  const vec = U > 1;
  const XV = vec ? U / 4 : 1; // x loads per unit (vec4s, or one f32)
  // The unit's x values, transformed: x0..x{XV-1}. `half` is the offset of the up half in x's elements.
  const xs: string[] = [];
  for (let i = 0; i < XV; i++) {
    const at = vec ? `xrow + ${XV}u * j + ${i}u` : "xrow + j";
    if (v.silu) {
      xs.push(`let g${i} = x[${at}];`, `let x${i} = g${i} / (1.0 + exp(-g${i})) * x[${at} + half];`);
    } else xs.push(`let x${i} = x[${at}];`);
  }
  // The unit's weights `wv` for matrix row `row`, and their dot product with the x values.
  let load: string, dot: string;
  const sum = (n: number, f: (i: number) => string) => Array.from({ length: n }, (_, i) => f(i)).join(" + ");
  if (!vec) {
    load = wt === "f16"
      ? "let wv = unpack2x16float(W[(row * p.K + j) / 2u])[(row * p.K + j) % 2u];"
      : "let wv = bitcast<f32>(W[row * p.K + j]);";
    dot = "wv * x0";
  } else {
    load = "let wv = W[row * units + j];";
    switch (wt) {
      case "f32":
        dot = "dot(bitcast<vec4<f32>>(wv), x0)";
        break;
      case "f16":
        dot = "dot(vec4<f32>(unpack2x16float(wv.x), unpack2x16float(wv.y)), x0) + " +
          "dot(vec4<f32>(unpack2x16float(wv.z), unpack2x16float(wv.w)), x1)";
        break;
      case "q8":
        // Two units a group.
        dot = `group_scale(row * gpr + j / 2u) * (${sum(4, (i) => `dot(q8v(wv[${i}]), x${i})`)})`;
        break;
      case "q4":
        // One unit a group; codes are q + 8, so sum (c - 8) x = dot(c, x) - 8 sum(x).
        dot = `group_scale(row * gpr + j) * (${
          sum(8, (i) => `dot(q4v(wv[${i >> 1}], ${16 * (i & 1)}u), x${i})`)
        }` +
          ` - 8.0 * xsum)`;
    }
  }
  const xsum = wt === "q4" ? `let xsum = dot(${sum(8, (i) => `x${i}`)}, vec4<f32>(1.0));` : "";
  const xType = vec ? "vec4<f32>" : "f32";
  const wType = vec ? "vec4<u32>" : "u32";
  return `
struct P { K: u32, N: u32, T: u32, acc: u32, soff: u32, topk: u32, e0: u32, ne: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> x: array<${xType}>;
@group(0) @binding(2) var<storage, read> W: array<${wType}>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<storage, read> ids: array<u32>;
${v.combine ? "@group(0) @binding(5) var<storage, read> rw: array<f32>;" : ""}
const TH = ${THREADS}u;
const TEAM = ${v.team}u;
const R = ${v.rows}u;
var<workgroup> part: array<f32, ${THREADS * v.rows}>;
${isQuant(wt) ? QUANT_DECODE_WGSL : ""}
@compute @workgroup_size(${THREADS})
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
  let team = tid / TEAM;
  let lane = tid % TEAM;
  let tok = wg.z;
  let n0 = (wg.x * (TH / TEAM) + team) * R;
  let units = p.K / ${U}u;
  let gpr = p.K / ${QUANT_GROUP}u;
  let half = ${v.silu ? `p.K / ${vec ? 4 : 1}u` : "0u"};
  let width = ${v.silu ? "2u * " : ""}p.K / ${vec ? 4 : 1}u;
  // Slots this workgroup sums over: all of the token's (combine) or the one it writes (wg.y).
  let s0 = ${v.combine ? "0u" : "wg.y"};
  let s1 = ${v.combine ? "p.topk" : "wg.y + 1u"};
  var served = false;
  var acc: array<f32, ${v.rows}>;
  for (var s = s0; s < s1; s++) {
    let slot = tok * p.topk + s;
    let id = ids[slot];
    if (id >= p.e0 && id - p.e0 < p.ne) {
      served = true;
      let base = (id - p.e0) * p.N;
      let xrow = ${v.slotInput ? "slot" : "tok"} * width;
      let coef = ${v.combine ? "rw[slot]" : "1.0"};
      for (var j = lane; j < units; j += TEAM) {
        ${xs.join("\n        ")}
        ${xsum}
        for (var r = 0u; r < R; r++) {
          let row = base + min(n0 + r, p.N - 1u);
          ${load}
          acc[r] += coef * (${dot});
        }
      }
    }
  }
  // TEAM_REDUCE_STORE writes output row t (< p.T) at t * N + n; a slot of another buffer writes nothing.
  let t = ${v.combine ? "tok" : "select(p.T, tok * p.topk + wg.y, served)"};
${TEAM_REDUCE_STORE}
}`;
}

/**
 * The expert GEMV (see the file's comment). Buffers: x (f32), w (the stacked experts as `weights` says),
 * y (f32), ids (u32 [T, topK]), routeWeights (f32 [T, topK], output "combine" only).
 */
export function moeGemvCall(
  gpu: Gpu,
  bufs: { x: GPUBuffer; w: GPUBuffer; y: GPUBuffer; ids: GPUBuffer; routeWeights?: GPUBuffer },
  d: MoeGemvDims,
): KernelCall {
  const wt = d.weights;
  const int = (v: number) => Number.isInteger(v) && v >= 1;
  for (
    const [name, v] of [["K", d.K], ["N", d.N], ["T", d.T], ["topK", d.topK], ["experts", d.experts]] as const
  ) {
    if (!int(v)) throw new RangeError(`moe GEMV ${name} must be a positive integer, got ${v}`);
  }
  if (!moeGemvFits(d.K, wt)) {
    throw new RangeError(`${wt} expert weights need K % ${QUANT_GROUP} == 0, got K = ${d.K}`);
  }
  const combine = d.output === "combine";
  if (combine && !bufs.routeWeights) throw new TypeError(`output "combine" needs routeWeights`);
  const firstExpert = d.firstExpert ?? 0;
  if (!(Number.isInteger(firstExpert) && firstExpert >= 0)) {
    throw new RangeError(`firstExpert must be a non-negative integer, got ${firstExpert}`);
  }
  const unit = unitOf(d.K, wt);
  const slots = combine ? d.topK : 1;
  // A team's row is `slots` expert rows of K / unit loads; tune it as the f16 row of as many loads.
  const tuning = d.tuning ?? defaultTuning(Math.min(65536, (d.K / unit) * 8 * slots), d.N);
  const variant: Variant = {
    wt,
    unit,
    slotInput: d.input === "slot",
    silu: d.transform === "silu_mul",
    combine,
    team: tuning.team,
    rows: tuning.rows,
  };
  const soff = isQuant(wt) ? quantScaleWord(d.experts * d.N, d.K, wt) : 0;
  const outRows = combine ? d.T : d.T * d.topK;
  const params = uniformBuffer(gpu, [
    d.K,
    d.N,
    outRows,
    d.accumulate ? 1 : 0,
    soff,
    d.topK,
    firstExpert,
    d.experts,
  ]);
  const buffers = [params, bufs.x, bufs.w, bufs.y, bufs.ids];
  if (combine) buffers.push(bufs.routeWeights!);
  const rowsPerGroup = (THREADS / tuning.team) * tuning.rows;
  return kernelCall(gpu, pipeline(gpu, source(variant)), buffers, [
    ceilDiv(d.N, rowsPerGroup),
    combine ? 1 : d.topK,
    d.T,
  ], `moe_gemv_${combine ? "combine" : "slots"}`);
}

/**
 * CPU reference of moeGemvCall (f64 accumulation): `w` is the stack's floats [experts, N, K] (for q8 / q4
 * the dequantised values), `y0` the prior content of y when accumulating.
 */
export function moeGemvRef(
  a: { x: Float32Array; w: Float32Array; ids: Uint32Array; routeWeights?: Float32Array; y0?: Float32Array },
  d: MoeGemvDims,
): Float32Array {
  const { K, N, T, topK } = d;
  const e0 = d.firstExpert ?? 0;
  const combine = d.output === "combine";
  const silu = d.transform === "silu_mul";
  const width = silu ? 2 * K : K;
  const rows = combine ? T : T * topK;
  // y keeps its prior content where nothing is written (slots of experts in other buffers); a written row
  // starts from 0 unless accumulating. "combine" writes every token's row.
  const y = new Float64Array(rows * N);
  if (a.y0) y.set(a.y0.subarray(0, rows * N));
  for (let t = 0; t < T; t++) {
    if (combine && !d.accumulate) y.fill(0, t * N, t * N + N);
    for (let s = 0; s < topK; s++) {
      const slot = t * topK + s;
      const e = a.ids[slot] - e0;
      if (e < 0 || e >= d.experts) continue;
      const o = (combine ? t : slot) * N;
      if (!combine && !d.accumulate) y.fill(0, o, o + N);
      const row = (d.input === "slot" ? slot : t) * width;
      const f = new Float64Array(K);
      for (let k = 0; k < K; k++) {
        const g = a.x[row + k];
        f[k] = silu ? (g / (1 + Math.exp(-g))) * a.x[row + K + k] : g;
      }
      const coef = combine ? a.routeWeights![slot] : 1;
      for (let n = 0; n < N; n++) {
        let acc = 0;
        for (let k = 0; k < K; k++) acc += f[k] * a.w[(e * N + n) * K + k];
        y[o + n] += coef * acc;
      }
    }
  }
  return new Float32Array(y);
}
