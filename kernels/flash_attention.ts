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
// (f32, or f16 widened as staged: d.kv) where rope_kv put this step's rows; out is [T, heads * hd]. attentionRef (attention.ts) is the reference.
import {
  ceilDiv,
  type Gpu,
  type KernelCall,
  kernelCall,
  memoSource,
  pipeline,
  uniformBuffer,
} from "./gpu.ts";
import { type KvType, kvWgsl } from "./kv.ts";
import type { AttentionDims } from "./attention.ts";
import { STEP_WGSL } from "./step.ts";

/** The 4 components of a vec4, for writing a transposing store out (constant indices: docs/KERNELS.md, GEMM). */
const range4 = [0, 1, 2, 3];

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
export function flashSource(hd: number, t: FlashTile, sg: boolean, kv: KvType = "f32"): string {
  const w = kvWgsl(kv, "p.n_kv * p.max_seq * H4");
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
${w.enable}${STEP_WGSL}
struct P { n_heads: u32, n_kv: u32, max_seq: u32, scale: f32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> step: Step;
@group(0) @binding(2) var<storage, read> qkv: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> kc: array<${w.vec(4)}>;
@group(0) @binding(4) var<storage, read> vc: array<${w.vec(4)}>;
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
    ${range4.map((c) => `qs[(4u * d4 + ${c}u) * ${QG}u + r / 4u][r % 4u] = v[${c}];`).join(" ")}
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
      let v = select(vec4<f32>(0.0), ${
    w.load(4, "kc", "(cache0 + min(key, nkeys - 1u)) * H4 + d4", "cache0 + min(key, nkeys - 1u)")
  }, key < nkeys);
      ${
    range4.map((c) =>
      `kv[((4u * d4 + ${c}u) * ${BKV}u + j) / 4u][((4u * d4 + ${c}u) * ${BKV}u + j) % 4u] = v[${c}];`
    ).join("\n      ")
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
      kv[u] = select(vec4<f32>(0.0), ${
    w.load(4, "vc", "(cache0 + min(key, nkeys - 1u)) * H4 + u % H4", "cache0 + min(key, nkeys - 1u)")
  }, key < nkeys);
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

// ---- The register-blocked variant (the default) ----

export interface FlashBlockTile {
  /** Queries per workgroup (a multiple of 4). */
  bq: number;
  /** Keys per tile (a multiple of 4); bkv / 4 lanes share a group of 4 queries. */
  bkv: number;
  /** K and V tiles share one workgroup buffer (one more barrier a tile; for head sizes where two do not fit). */
  shareKV: boolean;
  /**
   * The next tile's K and V are loaded into registers while this tile is computed (2 BKV hd / threads floats
   * a thread; default: where K and V have their own buffers). Else each tile's loads are all issued, then
   * stored, at the tile's start.
   */
  prefetch: boolean;
}

/** Bytes of workgroup memory the blocked variant takes. */
export function flashBlockBytes(hd: number, t: FlashBlockTile): number {
  const qg = t.bq / 4;
  const kg = t.bkv / 4;
  // qs, kt (+ vt), ps, red (the workgroup-memory reductions), keys
  return 4 * hd * t.bq + (t.shareKV ? 1 : 2) * 4 * hd * t.bkv + 16 * t.bkv * (qg + 1) + 16 * qg * kg + 16;
}

/**
 * The blocked tile for a head size: hd <= 64: 64 queries x 32 keys, 128 threads; larger: 32 x 32, 64 threads.
 * Where that does not fit `storage` bytes, K and V share a buffer (hd 128 on the H200's 48 KiB: 52 KB with
 * two, 38 KB with one), then the query block halves (hd 64 on lavapipe's 32 KiB: 32 x 32).
 */
export function flashBlockTile(
  hd: number,
  storage: number,
  tile: Partial<FlashBlockTile> = {},
): FlashBlockTile {
  let bq = tile.bq ?? (hd <= 64 ? 64 : 32);
  const bkv = tile.bkv ?? 32;
  const fits = (shareKV: boolean) => flashBlockBytes(hd, { bq, bkv, shareKV, prefetch: false }) <= storage;
  for (;;) {
    const shareKV = tile.shareKV ?? !fits(false);
    if (fits(shareKV) || tile.bq !== undefined || bq <= 8) {
      return { bq, bkv, shareKV, prefetch: !shareKV && (tile.prefetch ?? true) };
    }
    bq /= 2;
  }
}

/**
 * WGSL of the blocked variant. A workgroup owns BQ queries of one head, its threads a grid of BQ / 4 query
 * groups x KG = BKV / 4 key groups (the KG lanes of a query group adjacent, so they sit in one subgroup).
 * Per tile of BKV keys a thread scores its 4 queries x 4 keys from workgroup memory (Q and K dim-major:
 * one vec4 of queries and one of keys a dim, 16 FMAs for 2 reads), takes the row max over its KG lanes
 * (`sg`: shuffles; else workgroup memory), writes p, and adds p V into its 4 queries x DV vec4s of dims (V
 * row-major: 4 x 4 DV FMAs for 1 + DV reads a key). Q is staged once, scaled by log2(e) / sqrt(hd), so the
 * softmax uses exp2. Workgroups run the longest query blocks first (causal: the last block has the most keys).
 */
export function flashBlockedSource(
  hd: number,
  t: FlashBlockTile,
  sg: boolean,
  kv: KvType = "f32",
  half = false,
): string {
  const w = kvWgsl(kv, "p.n_kv * p.max_seq * H4");
  // `half`: out as f16 (the o_proj GEMM's f16 input, GemmDims.xHalf), rounded once at the store.
  const enable = w.enable || (half ? "enable f16;\n" : "");
  const { bq: BQ, bkv: BKV } = t;
  if (BQ % 4 !== 0 || BKV % 4 !== 0) {
    throw new RangeError(`flash tile ${BQ} x ${BKV}: both must be multiples of 4`);
  }
  const QG = BQ / 4;
  const KG = BKV / 4;
  const TH = QG * KG;
  const H4 = hd / 4;
  const DV = Math.ceil(H4 / KG);
  const PS = QG + 1; // ps row stride (vec4s): the 4 stores of a key group spread over the banks
  const full = (dv: number) => (dv + 1) * KG <= H4;
  const guard = (dv: number, s: string) => full(dv) ? s : `if (${dv * KG}u + kg < H4) { ${s} }`;
  const kbuf = "kt";
  const vbuf = t.shareKV ? "kt" : "vt";
  const reduce = (v: string, op: "max" | "add") => {
    if (sg) {
      const steps: string[] = [];
      for (let o = KG / 2; o >= 1; o /= 2) {
        steps.push(
          op === "max"
            ? `${v} = max(${v}, subgroupShuffleXor(${v}, ${o}u));`
            : `${v} += subgroupShuffleXor(${v}, ${o}u);`,
        );
      }
      return steps.join("\n    ");
    }
    const acc = op === "max" ? `m4 = max(m4, red[qg * ${KG}u + i]);` : `m4 += red[qg * ${KG}u + i];`;
    return `red[tid] = ${v};
    workgroupBarrier();
    {
      var m4 = red[qg * ${KG}u];
      for (var i = 1u; i < ${KG}u; i++) { ${acc} }
      ${v} = m4;
    }
    workgroupBarrier();`;
  };
  const o = (dv: number, i: number) => `o${dv}_${i}`;
  // Staging a tile of K (transposed: consecutive threads take consecutive keys, so the scalar stores do not
  // conflict) or V (row-major), NL vec4s a thread: every load is issued into a register before any is stored.
  const NL = Math.ceil((BKV * H4) / TH);
  const ragged = (BKV * H4) % TH !== 0;
  const inTile = (n: number, s: string) => ragged ? `if (tid + ${n * TH}u < ${BKV * H4}u) { ${s} }` : s;
  const regs = ["kr", "vr"].map((r) => `var ${r}: array<vec4<f32>, ${NL}>;`).join(" ");
  const loads = (r: string, kb: string, kv: "k" | "v") =>
    Array.from({ length: NL }, (_, n) => {
      const [j, d4] = kv === "k" ? [`u % ${BKV}u`, `u / ${BKV}u`] : [`u / H4`, `u % H4`];
      return inTile(
        n,
        `{ let u = tid + ${n * TH}u; let key = ${kb} + ${j}; ${r}[${n}] = select(vec4<f32>(0.0), ${
          w.load(4, `${kv}c`, `(cache0 + min(key, nkeys - 1u)) * H4 + ${d4}`, "cache0 + min(key, nkeys - 1u)")
        }, key < nkeys); }`,
      );
    }).join("\n    ");
  const stores = (buf: string, r: string, kv: "k" | "v") =>
    Array.from({ length: NL }, (_, n) =>
      inTile(
        n,
        kv === "k"
          ? `{ let u = tid + ${n * TH}u; let j = u % ${BKV}u; let d4 = u / ${BKV}u; ${
            [0, 1, 2, 3].map((c) => `${buf}[(4u * d4 + ${c}u) * ${KG}u + j / 4u][j % 4u] = ${r}[${n}][${c}];`)
              .join(" ")
          } }`
          : `${buf}[tid + ${n * TH}u] = ${r}[${n}];`,
      )).join("\n    ");
  const lines: string[] = [];
  const L_ = (s: string) => lines.push(s);
  L_(`${enable}${STEP_WGSL}
struct P { n_heads: u32, n_kv: u32, max_seq: u32, scale: f32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> step: Step;
@group(0) @binding(2) var<storage, read> qkv: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> kc: array<${w.vec(4)}>;
@group(0) @binding(4) var<storage, read> vc: array<${w.vec(4)}>;
@group(0) @binding(5) var<storage, read_write> out: array<vec4<${half ? "f16" : "f32"}>>;
const H4 = ${H4}u;
// qs[d * QG + g]: the 4 queries of group g at dim d; kt[d * KG + c]: keys 4c..4c+3 of the tile at dim d;
// vt[j * H4 + d4]: value row j; ps[j * PS + g]: p of key j for the 4 queries of group g.
var<workgroup> qs: array<vec4<f32>, ${hd * QG}>;
var<workgroup> kt: array<vec4<f32>, ${(hd * BKV) / 4}>;
${t.shareKV ? "" : `var<workgroup> vt: array<vec4<f32>, ${(hd * BKV) / 4}>;`}
var<workgroup> ps: array<vec4<f32>, ${BKV * PS}>;
${sg ? "" : `var<workgroup> red: array<vec4<f32>, ${TH}>;`}
var<workgroup> keys: u32;
@compute @workgroup_size(${TH})
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) tid: u32) {
  let h = wg.x;
  let q0 = (nwg.y - 1u - wg.y) * ${BQ}u;
  let qg = tid / ${KG}u;
  let kg = tid % ${KG}u;
  // The step is in a storage buffer (a pipeline stage's steps share the program), so the key count is
  // made workgroup-uniform before it bounds the loop with barriers.
  if (tid == 0u) { keys = select(0u, step.pos0 + min(q0 + ${BQ}u, step.T), q0 < step.T); }
  let nkeys = workgroupUniformLoad(&keys);
  if (nkeys == 0u) { return; }
  let T = step.T;
  let pos0 = step.pos0;
  let kvh = h / (p.n_heads / p.n_kv);
  let row4 = (p.n_heads + 2u * p.n_kv) * H4; // vec4s per qkv row
  let qscale = p.scale * 1.4426950408889634; // softmax in base 2
  // Consecutive threads take consecutive queries, so the transposing scalar stores do not conflict.
  for (var u = tid; u < ${BQ}u * H4; u += ${TH}u) {
    let r = u % ${BQ}u;
    let d4 = u / ${BQ}u;
    let v = select(vec4<f32>(0.0), qkv[min(q0 + r, T - 1u) * row4 + h * H4 + d4], q0 + r < T) * qscale;
    ${range4.map((c) => `qs[(4u * d4 + ${c}u) * ${QG}u + r / 4u][r % 4u] = v[${c}];`).join(" ")}
  }
  var m = vec4<f32>(-3.0e38);
  var l = vec4<f32>(0.0);
  ${
    Array.from({ length: DV }, (_, dv) =>
      [0, 1, 2, 3].map((i) => `var ${o(dv, i)} = vec4<f32>(0.0);`).join(" "))
      .join("\n  ")
  }
  let cache0 = kvh * p.max_seq;
  // The position of each of this thread's 4 queries (keys past it are masked).
  let qpos = vec4<u32>(pos0 + q0 + 4u * qg) + vec4<u32>(0u, 1u, 2u, 3u);`);
  const firstTile = t.prefetch ? `\n  ${loads("kr", "0u", "k")}\n  ${loads("vr", "0u", "v")}` : "";
  L_(`  ${regs}${firstTile}
  for (var kb = 0u; kb < nkeys; kb += ${BKV}u) {
    workgroupBarrier();`);
  if (t.prefetch) {
    L_(`    ${stores(kbuf, "kr", "k")}
    ${stores(vbuf, "vr", "v")}
    workgroupBarrier();
    // The next tile's loads, in flight while this one is computed (keys past nkeys load as zeros).
    ${loads("kr", `kb + ${BKV}u`, "k")}
    ${loads("vr", `kb + ${BKV}u`, "v")}`);
  } else {
    L_(`    ${loads("kr", "kb", "k")}
    ${t.shareKV ? "" : loads("vr", "kb", "v")}
    ${stores(kbuf, "kr", "k")}
    ${t.shareKV ? "" : stores(vbuf, "vr", "v")}`);
  }
  L_(`    ${t.prefetch ? "" : "workgroupBarrier();"}
    var s0 = vec4<f32>(0.0); var s1 = vec4<f32>(0.0); var s2 = vec4<f32>(0.0); var s3 = vec4<f32>(0.0);`);
  for (let d = 0; d < hd; d++) {
    L_(`    { let q = qs[${d * QG}u + qg]; let k = ${kbuf}[${d * KG}u + kg];
      s0 = fma(q, vec4<f32>(k.x), s0); s1 = fma(q, vec4<f32>(k.y), s1); s2 = fma(q, vec4<f32>(k.z), s2); s3 = fma(q, vec4<f32>(k.w), s3); }`);
  }
  L_(`    // Masks: key kb + 4 kg + c is seen by query i when it is at or before the query's position.
    let key0 = kb + 4u * kg;
    s0 = select(vec4<f32>(-3.0e38), s0, vec4<u32>(key0) <= qpos & vec4<bool>(key0 < nkeys));
    s1 = select(vec4<f32>(-3.0e38), s1, vec4<u32>(key0 + 1u) <= qpos & vec4<bool>(key0 + 1u < nkeys));
    s2 = select(vec4<f32>(-3.0e38), s2, vec4<u32>(key0 + 2u) <= qpos & vec4<bool>(key0 + 2u < nkeys));
    s3 = select(vec4<f32>(-3.0e38), s3, vec4<u32>(key0 + 3u) <= qpos & vec4<bool>(key0 + 3u < nkeys));
    var tmax = max(max(s0, s1), max(s2, s3));
    ${reduce("tmax", "max")}
    let m_new = max(m, tmax);
    let corr = exp2(m - m_new);
    m = m_new;
    let p0 = select(vec4<f32>(0.0), exp2(s0 - m_new), s0 > vec4<f32>(-1.0e38));
    let p1 = select(vec4<f32>(0.0), exp2(s1 - m_new), s1 > vec4<f32>(-1.0e38));
    let p2 = select(vec4<f32>(0.0), exp2(s2 - m_new), s2 > vec4<f32>(-1.0e38));
    let p3 = select(vec4<f32>(0.0), exp2(s3 - m_new), s3 > vec4<f32>(-1.0e38));
    ps[(4u * kg) * ${PS}u + qg] = p0;
    ps[(4u * kg + 1u) * ${PS}u + qg] = p1;
    ps[(4u * kg + 2u) * ${PS}u + qg] = p2;
    ps[(4u * kg + 3u) * ${PS}u + qg] = p3;
    l = l * corr + ((p0 + p1) + (p2 + p3));
    ${
    Array.from({ length: DV }, (_, dv) => [0, 1, 2, 3].map((i) => `${o(dv, i)} *= corr[${i}];`).join(" "))
      .join("\n    ")
  }
    workgroupBarrier();`);
  if (t.shareKV) {
    L_(`    ${loads("vr", "kb", "v")}
    ${stores(kbuf, "vr", "v")}
    workgroupBarrier();`);
  }
  for (let j = 0; j < BKV; j++) {
    const body = Array.from({ length: DV }, (_, dv) =>
      guard(
        dv,
        `let v = ${vbuf}[${j * H4 + dv * KG}u + kg]; ${
          [0, 1, 2, 3].map((i) => `${o(dv, i)} = fma(vec4<f32>(pj[${i}]), v, ${o(dv, i)});`).join(" ")
        }`,
      )).map((s) => `{ ${s} }`).join("\n      ");
    L_(`    { let pj = ps[${j * PS}u + qg];
      ${body} }`);
  }
  L_(`  }
  // Each lane summed its own keys' p: the row sums are the query group's total.
  ${reduce("l", "add")}
  let base = (q0 + 4u * qg) * p.n_heads * H4 + h * H4 + kg;
  let inv = 1.0 / l;
  ${
    [0, 1, 2, 3].map((i) =>
      `if (q0 + 4u * qg + ${i}u < T) {
    ${
        Array.from({ length: DV }, (_, dv) =>
          guard(
            dv,
            `out[base + ${i}u * p.n_heads * H4 + ${dv * KG}u] = ${half ? "vec4<f16>" : ""}(${
              o(dv, i)
            } * inv[${i}]);`,
          )).join(
            "\n    ",
          )
      }
  }`
    ).join("\n  ")
  }
}`);
  return lines.join("\n");
}

const flashBlockedSources = memoSource(flashBlockedSource);

/**
 * Whether the prefill attention writes its output as f16 for an o_proj GEMM reading it so (GemmDims.xHalf):
 * the blocked variant where that GEMM multiplies in f16 (`oHalf`: gemmHalfInput, which needs shader-f16),
 * unless gpu.tuning.flashHalf is false. Its tiles round x to f16 as they stage it, so the f16 store adds no rounding.
 */
export function flashHalfOut(gpu: Gpu, headDim: number, oHalf: boolean): boolean {
  return oHalf && gpu.tuning.flashHalf !== false && flashAttentionFits(headDim) &&
    (gpu.tuning.flash ?? "blocked") === "blocked";
}
const flashSources = memoSource(flashSource);

/** The flash variants: "blocked" (register-blocked 4 x 4 scores a thread, the default) and "lanes" (the first). */
export type FlashVariant = "blocked" | "lanes";

/**
 * Flash attention of the step's T queries (rows of qkv after RoPE) over the cache's positions
 * 0..pos0 + t, for every head. `variant` (default `gpu.tuning.flash`, else "blocked"); `subgroups`: row
 * reductions by subgroup shuffles (default: where the adapter has subgroups the variant can use: 32 lanes
 * for "lanes", a multiple of the key groups for "blocked"); `tile`: the blocked variant's tile (default
 * flashBlockTile).
 */
export function flashAttentionCall(
  gpu: Gpu,
  bufs: { step: GPUBuffer; qkv: GPUBuffer; kcache: GPUBuffer; vcache: GPUBuffer; out: GPUBuffer },
  d: AttentionDims,
  opts: {
    subgroups?: boolean;
    variant?: FlashVariant;
    tile?: Partial<FlashBlockTile>;
    /** Write out as f16 (the blocked variant; needs shader-f16): o_proj's GEMM then reads it so. */
    half?: boolean;
  } = {},
): KernelCall {
  if (!flashAttentionFits(d.headDim)) {
    throw new RangeError(`flash attention needs head_dim % 4 == 0 and <= 128, got ${d.headDim}`);
  }
  if (d.heads % d.kvHeads !== 0) {
    throw new RangeError(`heads (${d.heads}) must be a multiple of kv heads (${d.kvHeads})`);
  }
  const variant = opts.variant ?? gpu.tuning.flash ?? "blocked";
  if (opts.half && (variant !== "blocked" || !gpu.hasF16)) {
    throw new RangeError(`an f16 flash output needs the blocked variant and shader-f16 (${gpu.adapterName})`);
  }
  const params = uniformBuffer(gpu, [d.heads, d.kvHeads, d.maxSeq, 1 / Math.sqrt(d.headDim)], [3]);
  const buffers = [params, bufs.step, bufs.qkv, bufs.kcache, bufs.vcache, bufs.out];
  if (variant === "blocked") {
    const tile = flashBlockTile(d.headDim, gpu.maxWorkgroupStorage, opts.tile);
    const bytes = flashBlockBytes(d.headDim, tile);
    if (bytes > gpu.maxWorkgroupStorage) {
      throw new RangeError(
        `flash tile ${tile.bq} x ${tile.bkv} at head_dim ${d.headDim} needs ${bytes} bytes of workgroup memory, ` +
          `the device has ${gpu.maxWorkgroupStorage}`,
      );
    }
    const kg = tile.bkv / 4;
    const fits = gpu.subgroupSize !== null && gpu.subgroupSize % kg === 0;
    const sg = opts.subgroups ?? fits;
    if (sg && !fits) {
      throw new RangeError(`subgroup flash attention needs subgroups of a multiple of ${kg} lanes`);
    }
    return kernelCall(
      gpu,
      pipeline(gpu, flashBlockedSources(d.headDim, tile, sg, d.kv ?? "f32", opts.half === true)),
      buffers,
      [d.heads, ceilDiv(d.T, tile.bq)],
      "flash_attention",
    );
  }
  const tile = flashTile(d.headDim);
  const sg = opts.subgroups ?? gpu.subgroupSize === 32;
  if (sg && gpu.subgroupSize !== 32) throw new RangeError("subgroup flash attention needs 32-lane subgroups");
  return kernelCall(
    gpu,
    pipeline(gpu, flashSources(d.headDim, tile, sg, d.kv ?? "f32")),
    buffers,
    [ceilDiv(d.T, tile.bq), d.heads],
    "flash_attention",
  );
}
