// Prefill attention, flash-style: causal, grouped-query, online softmax over tiles of keys, so a block of
// queries reads each key and value once from the cache (attention.ts, one workgroup per query, reads the
// whole prefix once per query: quadratic traffic). A workgroup of 256 threads owns BQ queries of one head:
//   - Q [BQ, hd] is staged once in workgroup memory, dim-major (qs[d][q], vec4 over 4 queries);
//   - per tile of BKV keys: K is staged dim-major, each thread scores 4 queries x KPL keys (keys lane,
//     lane + L, ...: a q-group of L lanes covers the tile), the row max is reduced over the q-group's lanes
//     (subgroup ops when a subgroup is 32 lanes, else workgroup memory), p = exp(s - m) goes to workgroup
//     memory, V replaces K there, and each thread adds p V into its 4 queries x DV vec4s of output dims;
//   - the row sums stay per lane (all scaled by the same running max) and are reduced once at the end.
// Tiles: hd <= 64: BQ = 64, L = 16, KPL = 2 (BKV = 32); hd <= 128: BQ = 32, L = 32, KPL = 1 (BKV = 32),
// both 256 threads and at most 40 KB of workgroup memory (docs/KERNELS.md). hd must be a multiple of 4.
// q comes from the fused qkv activations (after RoPE), K and V from the layer's cache [nKV, maxSeq, hd]
// where rope_kv put this step's rows; out is [T, heads * hd]. attentionRef (attention.ts) is the reference.
import { ceilDiv, type Gpu, type KernelCall, kernelCall, pipeline, uniformBuffer } from "./gpu.ts";
import type { AttentionDims } from "./attention.ts";
import { STEP_WGSL } from "./step.ts";

export interface FlashTile {
  /** Queries per workgroup (a multiple of 4). */
  bq: number;
  /** Lanes per group of 4 queries. */
  lanes: number;
  /** Keys per lane per tile. */
  kpl: number;
}

/** Whether the flash kernel takes this head size. */
export function flashAttentionFits(headDim: number): boolean {
  return headDim >= 4 && headDim <= 128 && headDim % 4 === 0;
}

/** The tile for a head size (see the top of the file). */
export function flashTile(hd: number): FlashTile {
  return hd <= 64 ? { bq: 64, lanes: 16, kpl: 2 } : { bq: 32, lanes: 32, kpl: 1 };
}

/** The WGSL for one head size and tile; `sg`: row reductions by subgroup operations (32-lane subgroups). */
export function flashSource(hd: number, t: FlashTile, sg: boolean): string {
  const { bq: BQ, lanes: L, kpl: KPL } = t;
  const QG = BQ / 4; // query groups (4 queries each)
  const TH = QG * L;
  const BKV = L * KPL;
  const H4 = hd / 4;
  const DV = Math.ceil(H4 / L); // output vec4s per lane per query
  const rowMax = sg
    ? (v: string) => L === 32 ? `subgroupMax(${v})` : `lane_max(${v})`
    : (v: string) => `wg_max(${v}, q0i)`;
  const sgFns = sg && L !== 32
    ? `
fn lane_max(v: f32) -> f32 {
  var m = v;
  for (var o = ${L / 2}u; o > 0u; o >>= 1u) { m = max(m, subgroupShuffleXor(m, o)); }
  return m;
}
fn lane_sum(v: f32) -> f32 {
  var s = v;
  for (var o = ${L / 2}u; o > 0u; o >>= 1u) { s += subgroupShuffleXor(s, o); }
  return s;
}`
    : "";
  const lines: string[] = [];
  const L_ = (s: string) => lines.push(s);
  L_(`
${STEP_WGSL}
struct P { n_heads: u32, n_kv: u32, max_seq: u32, scale: f32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> step: Step;
@group(0) @binding(2) var<storage, read> qkv: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> kc: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read> vc: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read_write> out: array<vec4<f32>>;
const H4 = ${H4}u;
var<workgroup> qs: array<vec4<f32>, ${hd * QG}>;
var<workgroup> kv: array<vec4<f32>, ${(BKV * hd) / 4}>;
var<workgroup> ps: array<vec4<f32>, ${BKV * QG}>;
var<workgroup> red: array<f32, ${sg ? 1 : BQ * L}>;
var<workgroup> keys: u32;
${sgFns}
${
    sg ? "" : `
fn wg_max(v: f32, row: u32) -> f32 {
  let lane = local_lane;
  red[row * ${L}u + lane] = v;
  workgroupBarrier();
  var m = red[row * ${L}u];
  for (var i = 1u; i < ${L}u; i++) { m = max(m, red[row * ${L}u + i]); }
  workgroupBarrier();
  return m;
}
var<private> local_lane: u32;`
  }
@compute @workgroup_size(${TH})
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
  let h = wg.y;
  let q0 = wg.x * ${BQ}u;
  let qg = tid / ${L}u;
  let lane = tid % ${L}u;
  ${sg ? "" : "local_lane = lane;"}
  // The step is in a storage buffer (a pipeline stage's steps share the program), so the key count is
  // made workgroup-uniform before it bounds the loop with barriers.
  if (tid == 0u) { keys = select(0u, step.pos0 + min(q0 + ${BQ}u, step.T), q0 < step.T); }
  let nkeys = workgroupUniformLoad(&keys);
  if (nkeys == 0u) { return; }
  let T = step.T;
  let pos0 = step.pos0;
  let kvh = h / (p.n_heads / p.n_kv);
  let row4 = (p.n_heads + 2u * p.n_kv) * H4; // vec4s per qkv row
  // Q, dim-major: qs[d * QG + g][i] = q[q0 + 4 g + i][d].
  for (var u = tid; u < ${BQ}u * H4; u += ${TH}u) {
    let r = u / H4;
    let d4 = u % H4;
    let t = min(q0 + r, T - 1u);
    let v = select(vec4<f32>(0.0), qkv[t * row4 + h * H4 + d4], q0 + r < T);
    for (var c = 0u; c < 4u; c++) { qs[(4u * d4 + c) * ${QG}u + r / 4u][r % 4u] = v[c]; }
  }
  var m = vec4<f32>(-3.0e38);
  var l = vec4<f32>(0.0);
  ${Array.from({ length: DV }, (_, j) => `var o${j} = array<vec4<f32>, 4>();`).join("\n  ")}
  let cache0 = kvh * p.max_seq;
  // The last position of each of this thread's 4 queries (keys past it are masked).
  let last = vec4<u32>(pos0 + q0 + 4u * qg) + vec4<u32>(0u, 1u, 2u, 3u);
  for (var kb = 0u; kb < nkeys; kb += ${BKV}u) {
    workgroupBarrier();
    // K tile, dim-major: kv holds k[kb + j][d] at scalar index d * BKV + j.
    for (var u = tid; u < ${BKV}u * H4; u += ${TH}u) {
      let j = u / H4;
      let d4 = u % H4;
      let key = kb + j;
      let v = select(vec4<f32>(0.0), kc[(cache0 + min(key, nkeys - 1u)) * H4 + d4], key < nkeys);
      for (var c = 0u; c < 4u; c++) {
        let e = (4u * d4 + c) * ${BKV}u + j;
        kv[e / 4u][e % 4u] = v[c];
      }
    }
    workgroupBarrier();
    ${Array.from({ length: KPL }, (_, c) => `var s${c} = vec4<f32>(0.0);`).join("\n    ")}
    for (var d = 0u; d < ${hd}u; d++) {
      let q = qs[d * ${QG}u + qg];
      ${
    Array.from({ length: KPL }, (_, c) => {
      const e = `d * ${BKV}u + ${c * L}u + lane`;
      return `s${c} += q * kv[(${e}) / 4u][(${e}) % 4u];`;
    }).join("\n      ")
  }
    }
    ${
    Array.from({ length: KPL }, (_, c) =>
      `let key${c} = kb + ${c * L}u + lane;
    s${c} = select(vec4<f32>(-3.0e38), s${c} * p.scale, (vec4<u32>(key${c}) <= last) & vec4<bool>(key${c} < nkeys));`)
      .join("\n    ")
  }
    var tmax = ${Array.from({ length: KPL }, (_, c) => `s${c}`).reduce((a, b) => `max(${a}, ${b})`)};
    ${
    [0, 1, 2, 3].map((i) => `tmax[${i}] = ${rowMax(`tmax[${i}]`).replace("q0i", `4u * qg + ${i}u`)};`).join(
      "\n    ",
    )
  }
    let m_new = max(m, tmax);
    let corr = exp(m - m_new);
    m = m_new;
    ${
    Array.from({ length: KPL }, (_, c) =>
      `let p${c} = select(vec4<f32>(0.0), exp(s${c} - m_new), s${c} > vec4<f32>(-1.0e38));
    ps[(${c * L}u + lane) * ${QG}u + qg] = p${c};`).join("\n    ")
  }
    l = l * corr + ${Array.from({ length: KPL }, (_, c) => `p${c}`).join(" + ")};
    ${
    Array.from({ length: DV }, (_, j) => `for (var i = 0u; i < 4u; i++) { o${j}[i] *= corr[i]; }`).join(
      "\n    ",
    )
  }
    workgroupBarrier();
    // V tile, row-major: kv[j * H4 + d4].
    for (var u = tid; u < ${BKV}u * H4; u += ${TH}u) {
      let key = kb + u / H4;
      kv[u] = select(vec4<f32>(0.0), vc[(cache0 + min(key, nkeys - 1u)) * H4 + u % H4], key < nkeys);
    }
    workgroupBarrier();
    let jn = min(${BKV}u, nkeys - kb);
    for (var j = 0u; j < jn; j++) {
      let pj = ps[j * ${QG}u + qg];
      ${
    Array.from({ length: DV }, (_, j) => {
      const d4 = `lane + ${j * L}u`;
      const body = `let v = kv[j * H4 + ${d4}];
        o${j}[0] += pj.x * v;
        o${j}[1] += pj.y * v;
        o${j}[2] += pj.z * v;
        o${j}[3] += pj.w * v;`;
      return (j + 1) * L <= H4
        ? `{\n        ${body}\n      }`
        : `if (${d4} < H4) {\n        ${body}\n      }`;
    }).join("\n      ")
  }
    }
  }
  // Each lane summed its own keys' p: the row sums are the q-group's total.
  ${
    [0, 1, 2, 3].map((i) =>
      sg
        ? `l[${i}] = ${L === 32 ? "subgroupAdd" : "lane_sum"}(l[${i}]);`
        : `l[${i}] = wg_sum(l[${i}], 4u * qg + ${i}u);`
    ).join("\n  ")
  }
  for (var i = 0u; i < 4u; i++) {
    let r = q0 + 4u * qg + i;
    if (r >= T) { continue; }
    ${
    Array.from({ length: DV }, (_, j) => {
      const d4 = `lane + ${j * L}u`;
      const st = `out[(r * p.n_heads + h) * H4 + ${d4}] = o${j}[i] / l[i];`;
      return (j + 1) * L <= H4 ? st : `if (${d4} < H4) { ${st} }`;
    }).join("\n    ")
  }
  }
}`);
  if (!sg) {
    lines.push(`
fn wg_sum(v: f32, row: u32) -> f32 {
  let lane = local_lane;
  red[row * ${L}u + lane] = v;
  workgroupBarrier();
  var s = 0.0;
  for (var i = 0u; i < ${L}u; i++) { s += red[row * ${L}u + i]; }
  workgroupBarrier();
  return s;
}`);
  }
  return lines.join("\n");
}

/**
 * Flash attention of the step's T queries (rows of qkv after RoPE) over the cache's positions
 * 0..pos0 + t, for every head. Subgroup reductions where the adapter's subgroups are 32 lanes.
 */
export function flashAttentionCall(
  gpu: Gpu,
  bufs: { step: GPUBuffer; qkv: GPUBuffer; kcache: GPUBuffer; vcache: GPUBuffer; out: GPUBuffer },
  d: AttentionDims,
  opts: { subgroups?: boolean } = {},
): KernelCall {
  if (!flashAttentionFits(d.headDim)) {
    throw new RangeError(`flash attention needs head_dim % 4 == 0 and <= 128, got ${d.headDim}`);
  }
  if (d.heads % d.kvHeads !== 0) {
    throw new RangeError(`heads (${d.heads}) must be a multiple of kv heads (${d.kvHeads})`);
  }
  const tile = flashTile(d.headDim);
  const sg = opts.subgroups ?? gpu.subgroupSize === 32;
  if (sg && gpu.subgroupSize !== 32) throw new RangeError("subgroup flash attention needs 32-lane subgroups");
  const params = uniformBuffer(gpu, [d.heads, d.kvHeads, d.maxSeq, 1 / Math.sqrt(d.headDim)], [3]);
  return kernelCall(
    gpu,
    pipeline(gpu, flashSource(d.headDim, tile, sg)),
    [
      params,
      bufs.step,
      bufs.qkv,
      bufs.kcache,
      bufs.vcache,
      bufs.out,
    ],
    [ceilDiv(d.T, tile.bq), d.heads],
    "flash_attention",
  );
}
