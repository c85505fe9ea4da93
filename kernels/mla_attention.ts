// Multi-head latent attention (DeepSeek-V2/V3, Kimi K2) over the COMPRESSED cache, with the key
// up-projection absorbed into the query (kernels/mla.ts makes qLatent) and the value up-projection left for
// after (mla.ts's value GEMV). For token t at position pos = pos0 + t and head h:
//   score(s) = scale * (qLatent[t, h] . c_s + qRope[t, h] . kRope_s)        s = 0..pos
//   ctx[t, h] = sum_s softmax(score)_s c_s                                  [kv_lora_rank]
// where cache row s = [c_s (kv_lora_rank), kRope_s (qk_rope_head_dim)]. Every head reads the same rows, so a
// workgroup serves G heads of one token: each row read once is used G times.
//
// Workgroup (head group, token, split) of 64 threads, keys in chunks of 64:
//   - thread j scores key base + j for the G heads (its row read as vec4 when the widths allow; the G
//     queries sit in workgroup memory and are read as broadcasts), online softmax per head with tree
//     reductions over the chunk (the G heads side by side, so a chunk costs 12 barriers whatever G is);
//   - thread j accumulates output slots j, j + 64, ... of all G heads (coalesced row reads, vec4 slots).
// Decode (T = 1) has few workgroups (heads / G), so the keys can be split: split z takes chunks z, z + S,
// ... and writes its unnormalised (acc, m, l) to scratch; a second dispatch combines the S partials
// (flash-decoding). splits = 1 writes ctx directly.
import {
  ceilDiv,
  type Gpu,
  type KernelCall,
  kernelCall,
  pipeline,
  storageBuffer,
  uniformBuffer,
} from "./gpu.ts";
import type { MlaDims } from "./mla.ts";
import { STEP_WGSL } from "./step.ts";

const WG = 64;

/** How the work is cut (defaults: mlaAttentionDefaultTuning). */
export interface MlaAttentionTuning {
  /** Heads per workgroup (each cache row read is used this many times). */
  headsPerGroup: number;
  /** Key splits per (head group, token), combined by a second dispatch when > 1. */
  splits: number;
}

const range = (n: number) => Array.from({ length: n }, (_, i) => i);

/** Workgroup memory of the attention kernel for G heads. */
function sharedBytes(d: MlaDims, G: number): number {
  return (G * (d.kvLoraRank + d.qkRopeHeadDim) + 2 * G * WG + 4) * 4;
}

/**
 * Heads per group: up to 8 (fewer where workgroup memory is short), splits: enough workgroups to fill a
 * large GPU (about 128) at decode sizes, at most 32; prefill (T > 1) has T times the workgroups already.
 */
export function mlaAttentionDefaultTuning(gpu: Gpu, d: MlaDims): MlaAttentionTuning {
  let G = Math.min(8, d.heads);
  while (G > 1 && sharedBytes(d, G) > gpu.maxWorkgroupStorage) G--;
  const groups = ceilDiv(d.heads, G) * d.T;
  const splits = d.T === 1 ? Math.max(1, Math.min(32, Math.floor(128 / groups))) : 1;
  return { headsPerGroup: G, splits };
}

function attentionSource(d: MlaDims, G: number, S: number): string {
  const R = d.kvLoraRank, DR = d.qkRopeHeadDim, DN = d.qkNopeHeadDim, NH = d.heads;
  const CW = R + DR;
  // vec4 rows and slots when the row and both of its parts are whole vec4s.
  const V = R % 4 === 0 && DR % 4 === 0 ? 4 : 1;
  const vt = V === 4 ? "vec4<f32>" : "f32";
  const CWV = CW / V, RV = R / V;
  const ND = ceilDiv(RV, WG); // output slots per thread per head
  const gs = range(G);
  const PS = V === 4 ? RV + 1 : RV + 2; // a partial: RV slots, then (m, l) (one vec4, or two floats)
  const dotq = (g: number) => V === 4 ? `dot(qs[${g * CWV}u + e], k)` : `qs[${g * CWV}u + e] * k`;
  const tree = (op: (a: string, b: string) => string) =>
    `for (var stride = ${WG / 2}u; stride > 0u; stride >>= 1u) {
      if (j < stride) {
        ${
      gs.map((g) => `red[${g * WG}u + j] = ${op(`red[${g * WG}u + j]`, `red[${g * WG}u + j + stride]`)};`)
        .join("\n        ")
    }
      }
      workgroupBarrier();
    }`;
  const store = S === 1
    ? gs.map((g) =>
      `if (h0 + ${g}u < NH) {
    for (var i = 0u; i < ND; i++) {
      let u = j + i * ${WG}u;
      if (u < RV) { ctx[((t * NH + h0 + ${g}u) * RV) + u] = acc${g}[i] / l${g}; }
    }
  }`
    ).join("\n  ")
    : gs.map((g) =>
      `if (h0 + ${g}u < NH) {
    let pb = ((t * ${S}u + z) * NH + h0 + ${g}u) * ${PS}u;
    for (var i = 0u; i < ND; i++) {
      let u = j + i * ${WG}u;
      if (u < RV) { part[pb + u] = acc${g}[i]; }
    }
    if (j == 0u) { part[pb + RV] = ${V === 4 ? `vec4<f32>(m${g}, l${g}, 0.0, 0.0)` : `m${g}`}; ${
        V === 4 ? "" : `part[pb + RV + 1u] = l${g};`
      } }
  }`
    ).join("\n  ");
  return `${STEP_WGSL}
struct P { scale: f32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> step: Step;
@group(0) @binding(2) var<storage, read> q: array<f32>;
@group(0) @binding(3) var<storage, read> qlat: array<f32>;
@group(0) @binding(4) var<storage, read> kc: array<${vt}>;
@group(0) @binding(5) var<storage, read_write> ${S === 1 ? "ctx" : "part"}: array<${vt}>;
const NH = ${NH}u;
const R = ${R}u;
const DR = ${DR}u;
const DN = ${DN}u;
const CW = ${CW}u;
const CWV = ${CWV}u;
const RV = ${RV}u;
const ND = ${ND}u;
var<workgroup> qs: array<${vt}, ${G * CWV}>;
var<workgroup> ps: array<f32, ${G * WG}>;
var<workgroup> red: array<f32, ${G * WG}>;
var<workgroup> keys: u32;
@compute @workgroup_size(${WG})
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  let h0 = wg.x * ${G}u;
  let t = wg.y;
  let z = wg.z;
  let j = lid.x;
  if (j == 0u) { keys = select(0u, step.pos0 + t + 1u, t < step.T); }
  // The G queries [qLatent, qRope] (zero for heads past the last).
  for (var e = j; e < CW; e += ${WG}u) {
    ${
    gs.map((g) =>
      `var v${g} = 0.0;
    if (h0 + ${g}u < NH) {
      if (e < R) { v${g} = qlat[(t * NH + h0 + ${g}u) * R + e]; }
      else { v${g} = q[t * NH * (DN + DR) + (h0 + ${g}u) * (DN + DR) + DN + e - R]; }
    }
    ${V === 4 ? `qs[${g * CWV}u + e / 4u][e % 4u] = v${g};` : `qs[${g * CWV}u + e] = v${g};`}`
    ).join("\n    ")
  }
  }
  let n = workgroupUniformLoad(&keys);
  if (n == 0u) { return; }
  ${
    gs.map((g) => `var m${g} = -3.0e38;\n  var l${g} = 0.0;\n  var acc${g}: array<${vt}, ${ND}>;`).join(
      "\n  ",
    )
  }
  let nch = (n + ${WG - 1}u) / ${WG}u;
  for (var c = z; c < nch; c += ${S}u) {
    let base = c * ${WG}u;
    let s = base + j;
    ${gs.map((g) => `var sc${g} = 0.0;`).join("\n    ")}
    if (s < n) {
      let row = s * CWV;
      for (var e = 0u; e < CWV; e++) {
        let k = kc[row + e];
        ${gs.map((g) => `sc${g} += ${dotq(g)};`).join("\n        ")}
      }
    }
    ${
    gs.map((g) => `sc${g} = select(-3.0e38, sc${g} * p.scale, s < n);\n    red[${g * WG}u + j] = sc${g};`)
      .join("\n    ")
  }
    workgroupBarrier();
    ${tree((a, b) => `max(${a}, ${b})`)}
    ${gs.map((g) => `let mn${g} = max(m${g}, red[${g * WG}u]);`).join("\n    ")}
    workgroupBarrier();
    ${
    gs.map((g) =>
      `let e${g} = select(0.0, exp(sc${g} - mn${g}), s < n);\n    ps[${g * WG}u + j] = e${g};\n    red[${
        g * WG
      }u + j] = e${g};`
    ).join("\n    ")
  }
    workgroupBarrier();
    ${tree((a, b) => `${a} + ${b}`)}
    ${
    gs.map((g) =>
      `let corr${g} = exp(m${g} - mn${g});\n    l${g} = l${g} * corr${g} + red[${
        g * WG
      }u];\n    m${g} = mn${g};`
    ).join("\n    ")
  }
    let count = min(${WG}u, n - base);
    for (var i = 0u; i < ND; i++) {
      let u = j + i * ${WG}u;
      if (u < RV) {
        ${gs.map((g) => `var a${g} = acc${g}[i] * corr${g};`).join("\n        ")}
        for (var jj = 0u; jj < count; jj++) {
          let v = kc[(base + jj) * CWV + u];
          ${gs.map((g) => `a${g} += ps[${g * WG}u + jj] * v;`).join("\n          ")}
        }
        ${gs.map((g) => `acc${g}[i] = a${g};`).join("\n        ")}
      }
    }
    workgroupBarrier();
  }
  ${store}
}`;
}

/** Combines the S partials of each (token, head): one workgroup each. */
function combineSource(d: MlaDims, S: number): string {
  const R = d.kvLoraRank;
  const V = R % 4 === 0 && d.qkRopeHeadDim % 4 === 0 ? 4 : 1;
  const vt = V === 4 ? "vec4<f32>" : "f32";
  const RV = R / V;
  const PS = V === 4 ? RV + 1 : RV + 2;
  return `${STEP_WGSL}
@group(0) @binding(0) var<storage, read> step: Step;
@group(0) @binding(1) var<storage, read> part: array<${vt}>;
@group(0) @binding(2) var<storage, read_write> ctx: array<${vt}>;
const NH = ${d.heads}u;
const RV = ${RV}u;
const S = ${S}u;
var<workgroup> wz: array<f32, ${S}>;
var<workgroup> lsum: f32;
var<workgroup> live: u32;
@compute @workgroup_size(${WG})
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  let h = wg.x;
  let t = wg.y;
  let j = lid.x;
  if (j == 0u) { live = select(0u, 1u, t < step.T); }
  if (workgroupUniformLoad(&live) == 0u) { return; }
  let base = (t * S * NH + h) * ${PS}u;
  if (j == 0u) {
    var mx = -3.0e38;
    for (var z = 0u; z < S; z++) {
      let at = base + z * NH * ${PS}u + RV;
      mx = max(mx, ${V === 4 ? "part[at].x" : "part[at]"});
    }
    var ls = 0.0;
    for (var z = 0u; z < S; z++) {
      let at = base + z * NH * ${PS}u + RV;
      let w = exp(${V === 4 ? "part[at].x" : "part[at]"} - mx);
      wz[z] = w;
      ls += w * ${V === 4 ? "part[at].y" : "part[at + 1u]"};
    }
    lsum = ls;
  }
  workgroupBarrier();
  let inv = 1.0 / lsum;
  for (var u = j; u < RV; u += ${WG}u) {
    var a = ${vt}(0.0);
    for (var z = 0u; z < S; z++) { a += part[base + z * NH * ${PS}u + u] * wz[z]; }
    ctx[(t * NH + h) * RV + u] = a * inv;
  }
}`;
}

/**
 * Attention over the latent cache for T tokens at positions step.pos0 + t (causal: token t sees positions
 * 0..pos0 + t, which must all be in the cache, mlaRopeCacheCall having written this step's rows).
 *   q       [T, heads * (qkNope + qkRope)]  the query projection's output, its rope parts already rotated
 *                                          (only the rope parts are read)
 *   qLatent [T, heads, kvLoraRank]          W_UK_h^T q_nope (mlaAbsorbCall)
 *   cache   [maxSeq, kvLoraRank + qkRope]   rows [c, rotated k_rope] (mlaRopeCacheCall)
 *   ctx     [T, heads, kvLoraRank]          output: sum_s p_s c_s per head (f32)
 * `scale` is the softmax scale (mlaSoftmaxScale). One dispatch, or two when the keys are split (then the
 * first call owns a scratch buffer; releaseCalls frees it).
 */
export function mlaAttentionCalls(
  gpu: Gpu,
  bufs: { step: GPUBuffer; q: GPUBuffer; qLatent: GPUBuffer; cache: GPUBuffer; ctx: GPUBuffer },
  d: MlaDims & { scale: number; tuning?: Partial<MlaAttentionTuning> },
): KernelCall[] {
  checkDims(d);
  const t = { ...mlaAttentionDefaultTuning(gpu, d), ...d.tuning };
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
  const params = uniformBuffer(gpu, [d.scale], [0]);
  const grid: [number, number, number] = [ceilDiv(d.heads, G), d.T, S];
  const R = d.kvLoraRank;
  if (S === 1) {
    const call = kernelCall(
      gpu,
      pipeline(gpu, attentionSource(d, G, 1)),
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
  const partFloats = d.T * S * d.heads * (R + (R % 4 === 0 && d.qkRopeHeadDim % 4 === 0 ? 4 : 2));
  const part = storageBuffer(gpu, partFloats * 4, "mla_part");
  const call = kernelCall(
    gpu,
    pipeline(gpu, attentionSource(d, G, S)),
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
  call.owned = [part];
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
