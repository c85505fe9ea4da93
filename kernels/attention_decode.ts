// Decode attention with RoPE and the KV-cache write folded in: one dispatch replaces ropeKvCall +
// attentionCall for steps of 1..16 tokens (longer prefill chunks keep those two). Needs subgroups.
// Several tokens (a speculative-verification step): grid z is the token t; its workgroups read the cache
// for positions below pos0 only and the step's tokens 0..t from qkv (k rotated on the fly), since those
// positions are written by other workgroups of the same dispatch: right after the prologue's barrier, key j
// is scored by a whole subgroup (lanes over its rotation pairs, one round of loads) and its value row kept
// in workgroup memory for the combine (newKeyWgsl). Long caches: flash-decoding splits
// (docs/KERNELS.md), the keys of a head shared by several workgroups and a combine dispatch.
// GQA-grouped variant (AttentionDecodeTuning.grouped, gpu.tuning.attentionGrouped; by default only where it
// measured faster on the H200, attentionGroupedDefault): one workgroup per kv head for all its q heads, each K / V row read once, coalesced, and scored
// against every q head of the group (attentionDecodeGroupedSource).
//
// One workgroup per q head h (kv head h / group), WG threads = WARPS subgroups of S lanes:
//   - prologue: (with qNorm / kNorm: Qwen3's RMSNorm of the q head and of the k head first, folded in
//     here instead of a dispatch of its own: a subgroupAdd and one barrier) RoPE of q and of this kv head's k at pos = step.pos0 (rotate-half, the cs table as in
//     rope.ts) into workgroup memory with v; one barrier (the workgroupUniformLoad that makes the key
//     count uniform, and returns when step.T == 0). The group's first q head writes rotated k and v into
//     the caches at pos; no workgroup reads position pos from the cache (each uses its own k / v for it),
//     so there is no cross-workgroup dependence;
//   - keys 0..pos-1 from the cache in chunks of S, chunk c to subgroup c % WARPS, online softmax per
//     subgroup (subgroupMax / subgroupAdd for the chunk's max and sum, no barrier). Key and value rows
//     are read coalesced as vec4 (vec2 when head_dim % 4 != 0), of f32 or, with an f16 cache (d.kv), of
//     f16 widened to f32 as read (8-byte loads, the same lanes): a row is HDV vectors, read by a group of
//     HDV lanes (S / HDV rows per load) or, for HDV > S, by all S lanes. Scores: each lane holds partial
//     dot products of its q slots with the S / (groups) keys of its group, and a butterfly of
//     shuffle-xors leaves every lane the full score of one key (shapes whose HDV leaves lanes idle, e.g.
//     head_dim 40 at S = 32, score lane per key instead: lane l reads key l's whole row). Values: each
//     lane accumulates its output slots, a key's weight taken from the lane that scored it by
//     subgroupShuffle. All loads of a block (`unroll`) are issued before any is used, the first block of
//     value loads before the scores: the chunk costs about one memory latency;
//   - the last subgroup scores the current key (k from workgroup memory, subgroupAdd over dims; a step of
//     several tokens has scored its own keys 0..t before the chunks, see above);
//   - one barrier, then each thread combines one output slot over the subgroups' (m, l, acc) and the
//     current key, and writes out[h * hd ..].
// Barriers stay in uniform control flow: the chunk loop's trip count is the same for every thread (a
// subgroup without a chunk in a round skips it inside an `if`).
// H200 (32 / 8 heads, 16 layers of 4096-position caches, us per layer in one pass), at 30 / 100 / 300 /
// 1000 / 4000 keys: hd 64: 3.7 / 4.2 / 5.5 / 9.7 / 23 against 11.5 / 18 / 48 / 204 / 793 for
// rope + attention; hd 128: 19 / 22 / 21 / 13 / 36 against 69 / 129 / 319 / 394 / 1482.
import type { Gpu, KernelCall, WeightType } from "./gpu.ts";
import type { Int8CopyOut } from "./gemv_fused.ts";
import { kernelCall, memoSource, pipeline, storageBuffer, uniformBuffer } from "./gpu.ts";
import { type KvType, type KvWgsl, kvWgsl } from "./kv.ts";
import { STEP_WGSL } from "./step.ts";
import type { QuantType } from "./quant.ts";
import { int8CopyBindingsWgsl, int8CopyTailWgsl, range } from "./wgsl.ts";
import {
  type OProjDims,
  oProjFits,
  oProjRowSplits,
  oProjScratchBytes,
  oProjSharedBytes,
  oProjWgsl,
} from "./attention_oproj.ts";

/** The largest head_dim the decode kernel supports. */
export const DECODE_MAX_HEAD_DIM = 256;

/**
 * Threads per workgroup asked for by default. H200 (2026-12-01, one workgroup a head, us a layer at 128 /
 * 2048 keys): 8 subgroups 4.54 / 24.4 (hd 64) and 6.04 / 44.2 (hd 128) against 16's 4.60 / 43.8 and 7.58 /
 * 81.8; Llama-1B f16 decode 1,084 against 1,076-1,080 tok/s, q4 1,467 against 1,450-1,452.
 */
const WG_WANTED = 256;

/** The kernel's shape (see attentionDecodeDefaultTuning). */
export interface AttentionDecodeTuning {
  /** Subgroups per workgroup. */
  warps: number;
  /** Vector loads a lane issues before using any (per block of the key row or of the value rows). */
  unroll: number;
  /** Score with coalesced row reads and a shuffle butterfly where the shape allows (else lane per key). */
  butterfly?: boolean;
  /**
   * Flash-decoding: workgroups per head, each taking a contiguous share of the cached keys (at least
   * `minChunks` chunks of S keys, so short contexts leave the later splits idle), writing a partial
   * (max, sum, unnormalised output) that a second dispatch combines. 1: one workgroup per head, no combine.
   */
  splits?: number;
  /** Fewest key chunks a split takes (default 4). */
  minChunks?: number;
  /**
   * One workgroup per KV head serving all its q heads (attentionDecodeGroupedSource: each K / V row read
   * once for the group) instead of one per q head. Default: gpu.tuning.attentionGrouped, else
   * attentionGroupedDefault (head_dim >= 128, groups >= 4, > 4096 positions). Falls back to the per-head
   * kernel where the group's workgroup memory does not fit.
   */
  grouped?: boolean;
  /**
   * Grouped kernel: q heads scored per pass over the keys (registers grow with it; a group larger than
   * this takes several passes). Default 4 / (vector slots a lane holds of a row), the largest divisor of
   * the group at most that.
   */
  groupBatch?: number;
}

export interface AttentionDecodeDims {
  heads: number;
  kvHeads: number;
  headDim: number;
  /** Capacity of the KV cache in positions. */
  maxSeq: number;
  /**
   * The most keys the call's steps attend to, where its program serves a cache-length bucket
   * (attentionLengthBucket; default maxSeq). Only the kernel's choice follows it (splits, their subgroups, the
   * grouped kernel): every call is right at any length up to maxSeq.
   */
  keys?: number;
  /**
   * RMSNorm each q head and k head (over head_dim, this epsilon; weights qNorm / kNorm) before RoPE:
   * Qwen3's q_norm / k_norm, as head_norm.ts does in place, here without touching qkv.
   */
  normEps?: number;
  /**
   * Tokens dispatched (1..DECODE_MAX_T; default 1): a step of T tokens, each attending causally to the
   * cache and to the step's earlier tokens. The step's T may be fewer (tokens past it do nothing).
   */
  T?: number;
  /**
   * The caches' element type (default f32). f16: rows are read as vec4<f16> (8 bytes) and widened, the
   * step's own k and v are rounded to f16 as soon as they are rotated (so this step attends to them as
   * later steps, and prefill, read them back from the cache).
   */
  kv?: KvType;
}

/** The most tokens one decode-attention dispatch takes (a multi-token step: speculative verification). */
export const DECODE_MAX_T = 16;

/** Whether attentionDecodeCall serves this shape on this GPU (else use ropeKvCall + attentionCall). */
export function attentionDecodeFits(gpu: Gpu, d: AttentionDecodeDims): boolean {
  return gpu.subgroupSize !== null && d.headDim >= 2 && d.headDim % 2 === 0 &&
    d.headDim <= DECODE_MAX_HEAD_DIM && d.kvHeads >= 1 && d.heads % d.kvHeads === 0 &&
    sharedBytes(d.headDim, 1, d.T ?? 1) <= gpu.maxWorkgroupStorage &&
    gpu.subgroupSize <= gpu.device.limits.maxComputeInvocationsPerWorkgroup;
}

/**
 * Workgroup memory of the kernel: q, k, v of the head (and its output, with copyOut), each subgroup's (m, l,
 * acc[hd]), its norm partials and a q8 cache's row magnitudes, and, T > 1, the step's own keys' scores and values.
 */
function sharedBytes(hd: number, warps: number, T: number): number {
  return 4 * hd * 4 + warps * (hd + 6) * 4 + (T > 1 ? T * (hd + 1) * 4 : 0) + 16;
}

/**
 * The default tuning, from H200 sweeps (hd 64 and 128, 32 / 8 heads, 30..8192 keys): WG_WANTED threads
 * (fewer where workgroup memory or the device's limit is short), value prefetch and the butterfly on,
 * the whole chunk's loads in one block when they are at most 32 a lane (the grouped kernel, which holds
 * several heads' partials: 16), else blocks of 8. hd 128 (32 loads a lane) at 32 q / 4 kv heads, us a layer
 * with blocks of 8 / 16 / 32: 5.84 / 4.94 / 4.65 at 128 keys, split 12.33 / 11.48 / 10.11 at 2048; the
 * Qwen3-30B-A3B q4 step 2.66 -> 2.55 ms (2026-12-01, docs/BENCHMARKS.md).
 */
export function attentionDecodeDefaultTuning(
  gpu: Gpu,
  headDim: number,
  grouped = false,
  T = 1,
): AttentionDecodeTuning {
  const S = gpu.subgroupSize ?? 32;
  const maxThreads = Math.min(WG_WANTED, gpu.device.limits.maxComputeInvocationsPerWorkgroup);
  let warps = Math.max(1, Math.floor(maxThreads / S));
  while (warps > 1 && sharedBytes(headDim, warps, T) > gpu.maxWorkgroupStorage) warps--;
  const HDV = headDim / (headDim % 4 === 0 ? 4 : 2);
  const loadsPerChunk = HDV <= S ? Math.ceil(S / Math.floor(S / HDV)) : S * Math.ceil(HDV / S);
  const whole = grouped ? 16 : 32;
  return { warps, unroll: loadsPerChunk <= whole ? whole : 8, butterfly: true };
}

/** Where a q8 cache's scales start (kernels/kv.ts), in the decode kernels' names. */
const Q8_SCALES = "NKV * p.max_seq * HDV";

/** The cache row of the chunk's key `k` (clamped to the cached keys), in the decode kernels' names. */
const rowIdx = (k: string) => `(kv0 + min(base + ${k}, nc - 1u))`;

/**
 * A q8 cache's key scales in the decode kernels: each lane loads, once a chunk, the k and v scales of the key
 * whose score it ends with (`lane`, a WGSL expression of the key's index in the chunk); its score is multiplied
 * by the first (`k`) and its softmax weight by the second (`v`) before the lanes share the weights, so no value
 * is scaled. Empty for other caches.
 */
function keyScales(w: KvWgsl, lane: string): { loads: string[]; k: string; v: string } {
  if (!w.q8) return { loads: [], k: "", v: "" };
  return {
    loads: [`let sk = ${w.rowScale("kc", rowIdx(lane))};`, `let sv = ${w.rowScale("vc", rowIdx(lane))};`],
    k: " * sk",
    v: " * sv",
  };
}

/**
 * WGSL of the step's new k and v rows in the decode kernels' prologue. With a q8 cache the rows are kept as
 * computed (`stash`), each thread takes the largest magnitudes of its elements (into mk / mv), and
 * after the prologue's barrier the rows' scale pairs sik / siv (`scales`) round them where they are used
 * (`own`) and written (`write`); other caches round each element as it is kept.
 */
function newRowsWgsl(w: KvWgsl, VW: number) {
  const q8 = w.q8;
  const keep = (e: string) => q8 ? `(${e})` : w.round(1, e);
  return {
    init: q8 ? "var mk = 0.0;\n  var mv = 0.0;" : "",
    /** Keeps the rotation pair (i, i + HALF) of k (r0, r1) and of v (v0, v1) in ks / vs (a statement list). */
    stash: `ks[i / VW][i % VW] = ${keep("r0")};
    ks[(i + HALF) / VW][(i + HALF) % VW] = ${keep("r1")};
    vs[i / VW][i % VW] = ${keep("v0")};
    vs[(i + HALF) / VW][(i + HALF) % VW] = ${keep("v1")};${
      q8
        ? `
    mk = max(mk, max(abs(r0), abs(r1)));
    mv = max(mv, max(abs(v0), abs(v1)));`
        : ""
    }`,
    publish: q8 ? "let kvm = subgroupMax(vec2<f32>(mk, mv));\n  if (lane == 0u) { kvmx[warp] = kvm; }" : "",
    decl: q8 ? "var<workgroup> kvmx: array<vec2<f32>, WARPS>;" : "",
    scales: q8
      ? `var mkv = vec2<f32>(0.0);
  for (var w = 0u; w < WARPS; w++) { mkv = max(mkv, kvmx[w]); }
  let sik = ${w.scaleOf("mkv.x")};
  let siv = ${w.scaleOf("mkv.y")};`
      : "",
    own: (e: string, kv: "k" | "v") => q8 ? w.round(VW, e, `si${kv}`) : e,
    /** Writes the rows into the caches at row `row` (a statement block). */
    write: (row: string) =>
      `let cb = ${row} * HDV;
    for (var e = tid; e < HDV; e += WG) {
      kc[cb + e] = ${w.store(VW, "ks[e]", "sik")};
      vc[cb + e] = ${w.store(VW, "vs[e]", "siv")};
    }${
        q8
          ? `
    if (tid == 0u) {
      ${w.storeScale("kc", row, "sik")}
      ${w.storeScale("vc", row, "siv")}
    }`
          : ""
      }`,
  };
}

/** WGSL for element `o` (an expression) of a workgroup array of vec<VW> rows, as `qs`, `ks`, `vs` and `nv` are. */
function elemAt(array: string, o: string): string {
  return `${array}[(${o}) / VW][(${o}) % VW]`;
}

/**
 * WGSL of a multi-token step's own keys, shared by both decode kernels: new_scores (key j of the step, read from
 * qkv, q/k-normed with `norm` (wk, p.eps), RoPE'd at pos0 + j and rounded as the cache stores it, dotted with
 * each of the workgroup's NQ q heads in qs (head hh at qs[hh * HD ..]) and stored, times `scale`, at
 * sn[hh * TT + j]) and new_value (its value slot e). new_scores is called by a whole subgroup: its lanes take
 * the rotation pairs (i, i + HALF) of the key and one subgroupAdd a head sums them, so a key costs one round
 * of loads, not HALF dependent ones as a lane walking the row alone did.
 */
function newKeyWgsl(
  norm: boolean,
  VW: number,
  w: KvWgsl,
  NQ: number,
  scale: string,
): string {
  const vt = `vec${VW}<f32>`;
  // Rounded as the cache stores it (q8: with the row's scale pair, from a first pass over the row).
  const rn = (e: string, si: string) => w.round(1, e, si);
  const qAt = (o: string) => elemAt("qs", o);
  const hs = range(NQ);
  return `// Scores of new key j (this step's token j, RoPE at position pos0 + j, read from qkv) against the q head${
    NQ > 1 ? "s" : ""
  } into sn; called by every lane of a subgroup.
fn new_scores(j: u32, pos0: u32, kvh: u32, lane: u32) {
  let kb = j * ROW + (NH + kvh) * HD;
  let vb = j * ROW + (NH + NKV + kvh) * HD;${
    w.q8
      ? `
  var mv = 0.0;
  for (var i = lane; i < HD; i += S) { mv = max(mv, abs(qkv[vb + i])); }
  let siv = ${w.scaleOf("subgroupMax(mv)")};`
      : ""
  }
  for (var i = lane; i < HD; i += S) { ${elemAt("nv", "j * HD + i")} = ${rn("qkv[vb + i]", "siv")}; }${
    norm
      ? `
  var ss = 0.0;
  for (var i = lane; i < HD; i += S) { let v = qkv[kb + i]; ss += v * v; }
  let ik = inverseSqrt(subgroupAdd(ss) / f32(HD) + p.eps);`
      : ""
  }
${
    w.q8
      ? `
  var mk = 0.0;
  for (var i = lane; i < HALF; i += S) {
    let c = cs[(pos0 + j) * HALF + i];
    let k0 = qkv[kb + i]${norm ? " * ik * wk[i]" : ""};
    let k1 = qkv[kb + i + HALF]${norm ? " * ik * wk[i + HALF]" : ""};
    mk = max(mk, max(abs(k0 * c.x - k1 * c.y), abs(k1 * c.x + k0 * c.y)));
  }
  let sik = ${w.scaleOf("subgroupMax(mk)")};`
      : ""
  }
  ${hs.map((h) => `var s${h} = 0.0;`).join("\n  ")}
  for (var i = lane; i < HALF; i += S) {
    let c = cs[(pos0 + j) * HALF + i];
    let k0 = qkv[kb + i]${norm ? " * ik * wk[i]" : ""};
    let k1 = qkv[kb + i + HALF]${norm ? " * ik * wk[i + HALF]" : ""};
    let r0 = ${rn("k0 * c.x - k1 * c.y", "sik")};
    let r1 = ${rn("k1 * c.x + k0 * c.y", "sik")};
    ${
    hs.map((h) => `s${h} += ${qAt(`${h}u * HD + i`)} * r0 + ${qAt(`${h}u * HD + i + HALF`)} * r1;`).join(
      "\n    ",
    )
  }
  }
  ${hs.map((h) => `let t${h} = subgroupAdd(s${h});`).join("\n  ")}
  if (lane == 0u) {
    ${hs.map((h) => `sn[${h}u * TT + j] = t${h}${scale};`).join("\n    ")}
  }
}
// The step's own values (rounded as the cache stores them), written by new_scores.
var<workgroup> nv: array<${vt}, TT * HDV>;
// Value slot e of new key j.
fn new_value(j: u32, e: u32) -> ${vt} {
  return nv[j * HDV + e];
}`;
}

/**
 * WGSL adding the step's earlier tokens (j < tok, their scores at `snAt(j)`) into lsum and a, in order: unrolled
 * over every j the dispatch can have, so that all their value loads (from qkv, in L2) are issued before any is
 * used (a loop over j < tok waited one L2 round trip per token); a j >= tok adds exact zeros.
 */
function earlierValuesWgsl(TT: number, snAt: (j: number) => string): string {
  const js = range(TT - 1);
  return [
    ...js.map((j) => `let nv${j} = new_value(${j}u, e);`),
    ...js.map((j) => `let ne${j} = select(0.0, exp(${snAt(j)} - mx), ${j}u < tok);`),
    ...js.map((j) =>
      `lsum += ne${j};
      a += ne${j} * nv${j};`
    ),
  ].join("\n      ");
}

/**
 * WGSL scoring a multi-token step's own keys 0..tok (split 0 only: they belong to it), right after the
 * prologue's barrier (q is in qs): key j by subgroup WARPS - 1 - j % WARPS, the last subgroups first, since
 * the cached keys' chunks go to the first ones. Read after the kernel's closing barrier.
 */
const OWN_SCORES_WGSL = `
  if (split == 0u) {
    for (var j = WARPS - 1u - warp; j <= tok; j += WARPS) { new_scores(j, pos - tok, kvh, lane); }
  }`;

/** WGSL for one shape (head counts, head_dim, subgroup size and workgroup shape baked in). */
/**
 * What both decode attention kernels (per head and GQA-grouped) start with: the bindings (partials with
 * splits, else the output; q / k norm weights with `norm`) and the shape constants.
 */
function headerWgsl(
  d: Pick<AttentionDecodeDims, "heads" | "kvHeads" | "headDim" | "kv">,
  o: { VW: number; S: number; warps: number; SP: number; norm: boolean; copyOut?: QuantType },
): string {
  const w = kvWgsl(d.kv, Q8_SCALES);
  const HD = d.headDim;
  const vt = `vec${o.VW}<f32>`;
  return `${w.enable}${STEP_WGSL}
struct P { max_seq: u32, scale: f32, eps: f32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> step: Step;
@group(0) @binding(2) var<storage, read> cs: array<vec2<f32>>;
@group(0) @binding(3) var<storage, read> qkv: array<f32>;
@group(0) @binding(4) var<storage, read_write> kc: array<${w.vec(o.VW)}>;
@group(0) @binding(5) var<storage, read_write> vc: array<${w.vec(o.VW)}>;
${
    o.SP > 1
      ? "@group(0) @binding(6) var<storage, read_write> part: array<vec2<f32>>;"
      : `@group(0) @binding(6) var<storage, read_write> out: array<${vt}>;`
  }${
    o.norm
      ? `
@group(0) @binding(7) var<storage, read> wq: array<f32>;
@group(0) @binding(8) var<storage, read> wk: array<f32>;`
      : ""
  }${o.SP === 1 && o.copyOut ? `\n${int8CopyBindingsWgsl(o.norm ? 9 : 7)}` : ""}
const HD = ${HD}u;
const HALF = ${HD / 2}u;
const HDV = ${HD / o.VW}u;
const VW = ${o.VW}u;
const GROUP = ${d.heads / d.kvHeads}u;
const NH = ${d.heads}u;
const NKV = ${d.kvHeads}u;
const S = ${o.S}u;
const WARPS = ${o.warps}u;
const WG = ${o.warps * o.S}u;`;
}

/**
 * How both decode kernels (per head and grouped) lay a chunk's cache rows over a subgroup of S lanes, and the
 * WGSL pieces they share. Every vector is VW floats (key, value and output slots), a row HDV of them. Rows are
 * read coalesced: with HDV <= S (`packed`), KG groups of HDV lanes read KG rows a load (group g = lane / HDV,
 * slot sl = lane % HDV; lanes past KG * HDV idle), else each lane reads NSLOT slots lane, lane + S, ... of
 * every row. IT steps cover the chunk's S keys. Scores take the shuffle butterfly where a row's lanes tile the
 * subgroup or a row spans it; else lane per key (lane l reads key l's whole row: uncoalesced, kept for odd
 * shapes).
 */
function chunkLayout(d: AttentionSourceDims, S: number, t: AttentionDecodeTuning) {
  const HD = d.headDim;
  const VW = HD % 4 === 0 ? 4 : 2;
  const HDV = HD / VW;
  const packed = HDV <= S;
  const KG = packed ? Math.floor(S / HDV) : 1;
  const NSLOT = Math.ceil(HDV / S);
  const IT = Math.ceil(S / KG);
  const UB = t.unroll;
  const w = kvWgsl(d.kv, Q8_SCALES);
  // Blocks of up to UB loads, each block's loads issued before any is used.
  const blocks = (n: number, load: (x: number) => string, use: (x: number) => string[]): string[] => {
    const out: string[] = [];
    for (let b = 0; b < n; b += UB) {
      const xs = range(Math.min(UB, n - b)).map((i) => b + i);
      out.push(...xs.map(load), ...xs.flatMap(use));
    }
    return out;
  };
  // (step, slot) of every vector a lane loads of a chunk's rows.
  const pairs = range(IT * NSLOT).map((x) => [Math.floor(x / NSLOT), x % NSLOT]);
  return {
    norm: d.normEps !== undefined,
    SP: t.splits ?? 1,
    TT: d.T ?? 1, // tokens dispatched (grid z); the step's T may be fewer
    MINC: t.minChunks ?? 4,
    HD,
    VW,
    vt: `vec${VW}<f32>`,
    HDV,
    packed,
    KG,
    NSLOT,
    IT,
    w,
    nr: newRowsWgsl(w, VW),
    butterfly: (t.butterfly ?? true) && (!packed || KG * HDV === S),
    slot: (i: number) => packed ? "sl" : `min(lane + ${i * S}u, ${HDV - 1}u)`,
    // A cache vector of key k's row, as f32 (q8: its int8 values; keyScales applies the key's scale once).
    ld: (arr: string, k: string, sl: string) => w.loadUnscaled(VW, arr, `${rowIdx(k)} * HDV + ${sl}`),
    blocks,
    pairs,
    /**
     * A chunk's value loads and uses in blocks: the first block's loads (`prefetch`) are issued before its
     * keys are scored.
     */
    values(vLoad: (x: number) => string, vUse: (x: number) => string[]) {
      const first = Math.min(UB, pairs.length);
      return {
        prefetch: range(first).map(vLoad),
        values: [
          ...range(first).flatMap(vUse),
          ...blocks(pairs.length - first, (x) => vLoad(x + first), (x) => vUse(x + first)),
        ],
      };
    },
    /** Unpacked rows: a lane's NSLOT accumulators (`acc(i)`) into workgroup memory at `at` + its slots. */
    slotStores(at: string, acc: (i: number) => string): string[] {
      return range(NSLOT).map((i) => {
        const st = `accs[${at}lane + ${i * S}u] = ${acc(i)};`;
        return (i + 1) * S <= HDV ? st : `if (lane + ${i * S}u < HDV) { ${st} }`;
      });
    },
  };
}

/** What the decode attention's WGSL is built for (the per-head and the grouped kernel). */
interface AttentionSourceDims {
  heads: number;
  kvHeads: number;
  headDim: number;
  /** Tokens dispatched (grid z); the step's T may be fewer. */
  T?: number;
  /** q_norm / k_norm folded in, with this epsilon. */
  normEps?: number;
  kv?: KvType;
  /** Also write the int8 copy of the output in this weight type's layout (copyTail). */
  copyOut?: QuantType;
  /** o_proj folded in (attention_oproj.ts), its row splits resolved; not with copyOut. */
  oProj?: OProjDims & { rowSplits: number };
}

export function attentionDecodeSource(
  d: AttentionSourceDims,
  S: number,
  t: AttentionDecodeTuning,
): string {
  const L = chunkLayout(d, S, t);
  const {
    norm,
    SP,
    TT,
    MINC,
    HD,
    VW,
    vt,
    w,
    nr,
    HDV,
    packed,
    KG,
    NSLOT,
    IT,
    slot,
    ld,
    blocks,
    pairs,
  } = L;
  const { warps } = t;
  // Step it reads key it * KG + g of the chunk. Scores: with R = IT lanes per group a power of two (KG * R =
  // S), each lane takes partial dot products of its slots with the R keys of its group, and a butterfly of R
  // - 1 shuffles leaves lane (g, j) the score of key j * KG + g. Otherwise ("lane per key") lane l reads the
  // whole row of key l.
  const keyOf = (it: number) => packed ? `${it * KG}u + g` : `${it}u`;
  const butterfly = L.butterfly;
  // The key whose score this lane ends with: (g, j) holds key j * KG + g after the butterfly, else its own.
  const keyLane = butterfly && packed ? `sl * ${KG}u + g` : "lane";
  const ks = keyScales(w, keyLane);
  const score: string[] = [...ks.loads];
  const qDecl: string[] = [];
  if (butterfly) {
    // q slots of this lane, read once; a clamped duplicate slot (unpacked, last slot) counts zero.
    for (let i = 0; i < NSLOT; i++) {
      const q = `qs[${slot(i)}]`;
      qDecl.push(
        `let q${i} = ${
          !packed && (i + 1) * S > HDV ? `select(${vt}(0.0), ${q}, lane + ${i * S}u < HDV)` : q
        };`,
      );
    }
    score.push(...range(IT).map((it) => `var x${it} = 0.0;`));
    score.push(...blocks(pairs.length, (x) => {
      const [it, i] = pairs[x];
      return `let k${it}_${i} = ${ld("kc", keyOf(it), slot(i))};`;
    }, (x) => {
      const [it, i] = pairs[x];
      return [`x${it} += dot(q${i}, k${it}_${i});`];
    }));
    let vals = range(IT).map((it) => `x${it}`);
    for (let m = IT / 2, step = 0; m >= 1; m /= 2, step++) {
      score.push(`let b${step} = (lane & ${m}u) != 0u;`);
      const next: string[] = [];
      for (let k = 0; k < m; k++) {
        const lo = vals[k], hi = vals[k + m], y = `y${step}_${k}`;
        score.push(
          `let ${y} = select(${lo}, ${hi}, b${step}) + subgroupShuffleXor(select(${hi}, ${lo}, b${step}), ${m}u);`,
        );
        next.push(y);
      }
      vals = next;
    }
    score.push(`let sc = select(-3.0e38, ${vals[0]} * p.scale${ks.k}, base + ${keyLane} < nc);`);
  } else {
    score.push(`let kr = ${rowIdx("lane")};`, `var dv = ${vt}(0.0);`);
    score.push(
      ...blocks(HDV, (e) => `let k${e} = ${w.loadUnscaled(VW, "kc", `kr * HDV + ${e}u`)};`, (e) => [
        `dv += qs[${e}u] * k${e};`,
      ]),
    );
    score.push(`let sc = select(-3.0e38, dot(dv, ${vt}(1.0)) * p.scale${ks.k}, base + lane < nc);`);
  }
  // Values: the weight of step it's key, from the lane that scored it.
  const pOf = (it: number): string => {
    if (butterfly) return `subgroupShuffle(pw, ${packed ? `g * ${IT}u + ${it}u` : `${it}u`})`;
    const kk = packed ? `min(${keyOf(it)}, ${S - 1}u)` : `${it}u`;
    const sh = `subgroupShuffle(pw, ${kk})`;
    // Lanes whose key index falls outside the chunk (idle groups, the last step) get weight 0.
    const needMask = packed && (KG * HDV < S || IT * KG > S);
    return needMask ? `select(0.0, ${sh}, ${keyOf(it)} < ${S}u && g < ${KG}u)` : sh;
  };
  const vLoad = (x: number) => {
    const [it, i] = pairs[x];
    const kk = packed && !butterfly ? `min(${keyOf(it)}, ${S - 1}u)` : keyOf(it);
    return `let v${it}_${i} = ${ld("vc", kk, slot(i))};`;
  };
  const vUse = (x: number) => {
    const [it, i] = pairs[x];
    return [...(i === 0 ? [`let p${it} = ${pOf(it)};`] : []), `acc${i} += p${it} * v${it}_${i};`];
  };
  const { prefetch: vPrefetch, values } = L.values(vLoad, vUse);
  // The warp's partial output into workgroup memory.
  const store: string[] = [];
  if (packed) {
    const sum = range(KG).map((gg) => `subgroupShuffle(acc0, sl + ${gg * HDV}u)`).join(" + ");
    store.push(`let tot = ${sum};`, `if (lane < HDV) { accs[warp * HDV + sl] = tot; }`);
  } else {
    store.push(...L.slotStores("warp * HDV + ", (i) => `acc${i}`));
  }
  const op = SP === 1 && d.oProj
    ? oProjWgsl(d.oProj, { first: norm ? 9 : 7, WG: warps * S, osAt: (k) => `os[${k}]` })
    : undefined;
  return `${headerWgsl(d, { VW, S, warps, SP, norm, copyOut: d.copyOut })}${op ? `\n${op.decls}` : ""}${
    norm
      ? `
var<workgroup> nred: array<vec2<f32>, ${warps}>;`
      : ""
  }
var<workgroup> qs: array<${vt}, ${HDV}>;
var<workgroup> ks: array<${vt}, ${HDV}>;
var<workgroup> vs: array<${vt}, ${HDV}>;
var<workgroup> accs: array<${vt}, ${warps * HDV}>;${
    SP === 1 && (d.copyOut || op) ? `\nvar<workgroup> os: array<${vt}, ${HDV}>;` : ""
  }
var<workgroup> ms: array<f32, ${warps}>;
var<workgroup> ls: array<f32, ${warps}>;
var<workgroup> keys: u32;
var<workgroup> s_cur: f32;${nr.decl ? `\n${nr.decl}` : ""}
${
    TT === 1 ? "" : `const TT = ${TT}u;
const ROW = ${(d.heads + 2 * d.kvHeads) * HD}u;
var<workgroup> sn: array<f32, TT>;
${newKeyWgsl(norm, VW, w, 1, " * p.scale")}`
  }
@compute @workgroup_size(${warps * S})
fn main(
  @builtin(workgroup_id) wg: vec3<u32>,
  @builtin(local_invocation_index) tid: u32,
  @builtin(subgroup_invocation_id) lane: u32,
) {
  ${
    op
      ? "let h = wg.x % NH;\n  let orow = wg.x / NH; // o_proj's row split (each computes the head's output)"
      : "let h = wg.x;"
  }
  let split = wg.y;
  let tok = wg.z; // this workgroup's token of the step
  let kvh = h / GROUP;
  let warp = tid / S;${op ? `\n  ${op.prefetch}` : ""}
  // Every thread reads the step itself; the key count is made uniform by the barrier below, which also
  // publishes q, k, v. Nothing is written outside the workgroup before it.
  let pos = step.pos0 + tok;
  if (tid == 0u) { keys = select(0u, pos + 1u, step.T > tok); }
  let rb = ${TT === 1 ? "0u" : "tok * ROW"};
  let qb = rb + h * HD;
  let kb = rb + (NH + kvh) * HD;${
    norm
      ? `
  // RMSNorm of the q head and the k head (q_norm / k_norm), before RoPE.
  var nq = 0.0;
  var nk = 0.0;
  for (var i = tid; i < HD; i += WG) {
    let a = qkv[qb + i];
    let b = qkv[kb + i];
    nq += a * a;
    nk += b * b;
  }
  let nr = subgroupAdd(vec2<f32>(nq, nk));
  if (lane == 0u) { nred[warp] = nr; }
  workgroupBarrier();
  var ntot = vec2<f32>(0.0);
  for (var w = 0u; w < WARPS; w++) { ntot += nred[w]; }
  let iq = inverseSqrt(ntot.x / f32(HD) + p.eps);
  let ik = inverseSqrt(ntot.y / f32(HD) + p.eps);`
      : ""
  }
  ${nr.init}
  for (var i = tid; i < HALF; i += WG) {
    let c = cs[pos * HALF + i];
    let q0 = qkv[qb + i]${norm ? " * iq * wq[i]" : ""};
    let q1 = qkv[qb + i + HALF]${norm ? " * iq * wq[i + HALF]" : ""};
    let k0 = qkv[kb + i]${norm ? " * ik * wk[i]" : ""};
    let k1 = qkv[kb + i + HALF]${norm ? " * ik * wk[i + HALF]" : ""};
    let vb = rb + (NH + NKV + kvh) * HD;
    let v0 = qkv[vb + i];
    let v1 = qkv[vb + i + HALF];
    let r0 = k0 * c.x - k1 * c.y;
    let r1 = k1 * c.x + k0 * c.y;
    qs[i / VW][i % VW] = q0 * c.x - q1 * c.y;
    qs[(i + HALF) / VW][(i + HALF) % VW] = q1 * c.x + q0 * c.y;
    ${nr.stash}
  }
  ${nr.publish}
  let n = workgroupUniformLoad(&keys);
  if (n == 0u) { return; }
  ${nr.scales}
  // Keys read from the cache: positions 0..pos0-1 (this step's own tokens, written by other workgroups of
  // this dispatch, are read from qkv instead).
  let nc = n - 1u - tok;
  let kv0 = kvh * p.max_seq;
  if (h % GROUP == 0u && split == 0u${op ? " && orow == 0u" : ""}) {
    ${nr.write("(kv0 + pos)")}
  }${TT === 1 ? "" : OWN_SCORES_WGSL}
  ${packed ? "let g = lane / HDV;\n  let sl = lane % HDV;" : ""}
  ${qDecl.join("\n  ")}
  var m = -3.0e38;
  var l = 0.0;
  ${range(NSLOT).map((i) => `var acc${i} = ${vt}(0.0);`).join("\n  ")}
  let nch_all = (nc + S - 1u) / S;
  // This split's chunks [c_lo, c_lo + nch) (all of them without splits).
  let per = max((nch_all + ${SP - 1}u) / ${SP}u, ${SP > 1 ? MINC : 1}u);
  let c_lo = min(split * per, nch_all);
  let nch = min(nch_all - c_lo, per);
  let rounds = (nch + WARPS - 1u) / WARPS;
  for (var r = 0u; r < rounds; r++) {
    let c = r * WARPS + warp;
    if (c < nch) {
      let base = (c_lo + c) * S;
      // Keys past the last are read clamped to it, score -3e38 and weigh 0.
      ${vPrefetch.join("\n      ")}
      ${score.join("\n      ")}
      let m_new = max(m, subgroupMax(sc));
      let corr = exp(m - m_new);
      let pr = exp(sc - m_new);
      l = l * corr + subgroupAdd(pr);
      let pw = pr${ks.v}; // the weight of the lane's key's value row
      ${range(NSLOT).map((i) => `acc${i} *= corr;`).join("\n      ")}
      ${values.join("\n      ")}
      m = m_new;
    }
  }
  ${store.join("\n  ")}
  if (lane == 0u) {
    ms[warp] = m;
    ls[warp] = l;
  }
  ${
    TT === 1
      ? `if (warp == WARPS - 1u) {
    var t = 0.0;
    for (var e = lane; e < HDV; e += S) { t += dot(qs[e], ${nr.own("ks[e]", "k")}); }
    t = subgroupAdd(t);
    if (lane == 0u) { s_cur = t * p.scale; }
  }`
      : ""
  }
  workgroupBarrier();
  let act = min(nch, WARPS);
  // The step's own keys (not read from the cache) belong to split 0.
  let own = split == 0u;
  ${
    TT === 1
      ? `let sk = s_cur;
  var mx = select(-3.0e38, sk, own);
  for (var w = 0u; w < act; w++) { mx = max(mx, ms[w]); }
  let ek = select(0.0, exp(sk - mx), own);`
      : `var mx = -3.0e38;
  if (own) { for (var j = 0u; j <= tok; j++) { mx = max(mx, sn[j]); } }
  for (var w = 0u; w < act; w++) { mx = max(mx, ms[w]); }`
  }
  for (var e = tid; e < HDV; e += WG) {
    ${
    TT === 1
      ? `var lsum = ek;
    var a = ek * ${nr.own("vs[e]", "v")};`
      : `var lsum = 0.0;
    var a = ${vt}(0.0);
    if (own) {
      ${earlierValuesWgsl(TT, (j) => `sn[${j}]`)}
      let et = exp(sn[tok] - mx);
      lsum += et;
      a += et * ${nr.own("vs[e]", "v")};
    }`
  }
    for (var w = 0u; w < act; w++) {
      let wt = exp(ms[w] - mx);
      lsum += ls[w] * wt;
      a += accs[w * HDV + e] * wt;
    }
    ${
    SP > 1
      ? `// Partial of split (h, split): slot 0 (max, sum), then the unnormalised output.
    let pb = ((tok * NH + h) * ${SP}u + split) * (HDV * VW / 2u + 1u);
    if (e == 0u) { part[pb] = vec2<f32>(mx, lsum); }
    ${VW === 4 ? "part[pb + 1u + 2u * e] = a.xy; part[pb + 2u + 2u * e] = a.zw;" : "part[pb + 1u + e] = a;"}`
      : `let o = a / lsum;
    out[(tok * NH + h) * HDV + e] = o;${d.copyOut || op ? "\n    os[e] = o;" : ""}`
  }
  }${op ? `\n  workgroupBarrier();${op.tail}` : ""}${
    SP === 1 && d.copyOut
      ? copyTail(d.copyOut, d, {
        heads: 1,
        h0: "h",
        vec4At: (k) => `os[${k}]`,
        WG: "WG",
      })
      : ""
  }
}`;
}

/**
 * Workgroup memory of the grouped kernel: q of the group's heads, k, v, the heads' output (with copyOut), each
 * subgroup's (m, l, acc[hd]) per head, the norm partials, a q8 cache's row magnitudes and the step's new-key
 * scores (T > 1) per head.
 */
function groupedSharedBytes(hd: number, group: number, warps: number, T: number): number {
  return (2 * group + 2) * hd * 4 + warps * group * (hd + 2) * 4 + (group + 3) * warps * 4 +
    group * (T + 1) * 4 + (T > 1 ? T * hd * 4 : 0) +
    16;
}

/** Subgroups a grouped workgroup gets by default (fewest 1; 0 where even one does not fit). */
function groupedWarps(gpu: Gpu, d: AttentionDecodeDims, want: number): number {
  let warps = want;
  while (
    warps > 0 && groupedSharedBytes(d.headDim, d.heads / d.kvHeads, warps, d.T ?? 1) > gpu.maxWorkgroupStorage
  ) {
    warps--;
  }
  return warps;
}

/**
 * q heads a pass of the grouped kernel scores: the largest divisor of the group at most `want` (default
 * 4 / NSLOT, at least 1: about the registers of the per-head kernel's loads in flight again).
 */
function groupBatchOf(group: number, nslot: number, want?: number): number {
  const cap = Math.max(1, want ?? Math.floor(4 / nslot));
  let gb = Math.min(group, cap);
  while (group % gb !== 0) gb--;
  return gb;
}

// GQA-grouped decode attention (AttentionDecodeTuning.grouped): ONE workgroup per KV head (x split x
// token) serving its GROUP = heads / kvHeads q heads, so each K and V row is read from memory once for the
// group instead of once per q head (Llama-3.2-1B: 4 workgroups re-read every row; Qwen3-30B-A3B: 8).
//   - prologue: (q/k RMSNorm: one subgroupAdd per head and one barrier) RoPE of the group's q heads, scaled
//     by 1 / sqrt(hd), into workgroup memory, and of the kv head's k with v (rounded as the cache stores
//     them); split 0 writes k and v into the caches at pos (as the per-head kernel's first q head does);
//   - keys: chunks of S to subgroup c % WARPS, read as the per-head kernel reads them: coalesced vec4 (vec2)
//     rows, KG rows of HDV lanes a load (or every lane NSLOT slots of a row), f16 widened. Each lane holds
//     its q slots of GB heads (registers) and takes GB partial dot products per loaded key vector; a
//     butterfly of shuffle-xors per head (walked depth first, so about log2(IT) + 1 partials a head are
//     live, not IT) leaves every lane one key's score for each of the GB heads; online softmax per
//     (subgroup, q head) with subgroupMax / subgroupAdd. So each K row is read once a pass and used GB
//     times. Shapes whose rows leave lanes idle (HDV not dividing S, e.g. head_dim 40 at S = 32) score
//     lane per key instead (lane l reads key l's whole row: uncoalesced, as the per-head kernel does there);
//   - values: each V vector read once a pass and weighted into GB accumulators, each head's key weight
//     taken by subgroupShuffle from the lane that scored it;
//   - passes: GB = groupBatch heads (default the largest divisor of the group at most 4 / NSLOT) a pass
//     over the split's keys; a larger group takes G / GB passes, the later ones re-reading the rows (from
//     L2, mostly) rather than holding G heads' registers (Qwen3-30B-A3B: G 8, hd 128: 2 passes of 4);
//   - end: one barrier, then each thread combines one (head, slot) over the subgroups and the step's own
//     keys and writes out[h * hd ..] or, split, the partial in the layout attentionCombineSource reads.
export function attentionDecodeGroupedSource(
  d: AttentionSourceDims,
  S: number,
  t: AttentionDecodeTuning,
): string {
  const L = chunkLayout(d, S, t);
  const { norm, SP, TT, MINC, HD, VW, vt, w, nr, HDV, packed, KG, NSLOT, IT, slot, ld, blocks, pairs } = L;
  const { warps } = t;
  const UB = t.unroll;
  const G = d.heads / d.kvHeads;
  const butterfly = L.butterfly;
  // Heads per pass over the keys: each pass holds GB heads' q slots, partial scores and accumulators in
  // registers, so a large group takes several passes (the later ones re-read rows, mostly from L2).
  const GB = butterfly ? groupBatchOf(G, NSLOT, t.groupBatch) : G;
  const NB = G / GB;
  const keyOf = (it: number) =>
    packed ? (butterfly ? `${it * KG}u + g` : `min(${it * KG}u + g, ${S - 1}u)`) : `${it}u`;
  // Lanes whose key falls outside the chunk (idle lanes of a packed row, the last step) weigh 0.
  const needMask = !butterfly && packed && (KG * HDV < S || IT * KG > S);
  const hs = range(GB);
  // The key whose score this lane ends with: (g, j) holds key j * KG + g after a packed butterfly, else its own.
  const keyLane = butterfly && packed ? `sl * ${KG}u + g` : "lane";
  const ks = keyScales(w, keyLane);
  const score: string[] = [...ks.loads];
  const qDecl: string[] = [];
  let scoreOf = (h: number) => `s${h}`;
  if (butterfly) {
    // This lane's q slots of every head of the pass (a clamped duplicate slot, non-packed, counts zero).
    for (const h of hs) {
      for (let i = 0; i < NSLOT; i++) {
        const q = `qs[(h0 + ${h}u) * HDV + ${slot(i)}]`;
        qDecl.push(
          `let q${h}_${i} = ${
            !packed && (i + 1) * S > HDV ? `select(${vt}(0.0), ${q}, lane + ${i * S}u < HDV)` : q
          };`,
        );
      }
    }
    // The butterfly as a tree walked depth first: node (m, k) = combine over lane bit m of nodes (2m, k)
    // and (2m, k + m), leaves (IT, k) the partial dots with step k's key. Walking it depth first keeps
    // about log2(IT) + 1 partials a head live instead of IT, which is what lets GB heads share the pass.
    const node = (h: number, m: number, k: number) => m === IT ? `x${h}_${k}` : `y${h}_${m}_${k}`;
    const ev: [number, number][] = []; // (m, k) in post-order; m === IT a leaf
    const kPairs: [number, number][] = []; // key loads (step, slot) in leaf order
    const walk = (m: number, k: number) => {
      if (m < IT) (walk(2 * m, k), walk(2 * m, k + m));
      else kPairs.push(...range(NSLOT).map((i): [number, number] => [k, i]));
      ev.push([m, k]);
    };
    walk(1, 0);
    for (let m = 1; m < IT; m *= 2) score.push(`let b${m} = (lane & ${m}u) != 0u;`);
    let issued = 0;
    let leaves = 0;
    for (const [m, k] of ev) {
      if (m === IT) {
        // Blocks of UB key loads, each issued before any of its vectors is used.
        for (const need = ++leaves * NSLOT; issued < need;) {
          for (const [it, i] of kPairs.slice(issued, issued + UB)) {
            score.push(`let k${it}_${i} = ${ld("kc", keyOf(it), slot(i))};`);
          }
          issued = Math.min(issued + UB, kPairs.length);
        }
        for (const h of hs) {
          const dots = range(NSLOT).map((i) => `dot(q${h}_${i}, k${k}_${i})`).join(" + ");
          score.push(`let ${node(h, m, k)} = ${dots};`);
        }
      } else {
        for (const h of hs) {
          const lo = node(h, 2 * m, k), hi = node(h, 2 * m, k + m);
          score.push(
            `let ${
              node(h, m, k)
            } = select(${lo}, ${hi}, b${m}) + subgroupShuffleXor(select(${hi}, ${lo}, b${m}), ${m}u);`,
          );
        }
      }
    }
    scoreOf = (h) => node(h, 1, 0);
  } else {
    score.push(
      `let kr = ${rowIdx("lane")};`,
      ...hs.map((h) => `var s${h} = 0.0;`),
      ...blocks(
        HDV,
        (e) => `let k${e} = ${w.loadUnscaled(VW, "kc", `kr * HDV + ${e}u`)};`,
        (e) => hs.map((h) => `s${h} += dot(qs[${h * HDV + e}u], k${e});`),
      ),
    );
  }
  const softmax = hs.flatMap((h) => [
    `let sc${h} = select(-3.0e38, ${scoreOf(h)}${ks.k}, base + ${keyLane} < nc);`,
    `let mn${h} = max(m${h}, subgroupMax(sc${h}));`,
    `let cr${h} = exp(m${h} - mn${h});`,
    `let pr${h} = exp(sc${h} - mn${h});`,
    `l${h} = l${h} * cr${h} + subgroupAdd(pr${h});`,
    `let pw${h} = pr${h}${ks.v};`,
    `m${h} = mn${h};`,
    ...range(NSLOT).map((i) => `acc${h}_${i} *= cr${h};`),
  ]);
  // The weight of step it's key for head h, from the lane that scored it.
  const pOf = (it: number, h: number): string => {
    if (butterfly) return `subgroupShuffle(pw${h}, ${packed ? `g * ${IT}u + ${it}u` : `${it}u`})`;
    const sh = `subgroupShuffle(pw${h}, ${keyOf(it)})`;
    return needMask ? `select(0.0, ${sh}, ${it * KG}u + g < ${S}u && g < ${KG}u)` : sh;
  };
  const vLoad = (x: number) => {
    const [it, i] = pairs[x];
    return `let v${it}_${i} = ${ld("vc", keyOf(it), slot(i))};`;
  };
  const vUse = (x: number) => {
    const [it, i] = pairs[x];
    return [
      ...(i === 0 ? hs.map((h) => `let p${h}_${it} = ${pOf(it, h)};`) : []),
      ...hs.map((h) => `acc${h}_${i} += p${h}_${it} * v${it}_${i};`),
    ];
  };
  const { prefetch: vPrefetch, values } = L.values(vLoad, vUse);
  const store: string[] = [];
  for (const h of hs) {
    const at = `(warp * GROUP + h0 + ${h}u) * HDV`;
    if (packed) {
      const sum = range(KG).map((gg) => `subgroupShuffle(acc${h}_0, sl + ${gg * HDV}u)`).join(" + ");
      store.push(`let t${h} = ${sum};`, `if (lane < HDV) { accs[${at} + sl] = t${h}; }`);
    } else {
      store.push(...L.slotStores(`${at} + `, (i) => `acc${h}_${i}`));
    }
  }
  store.push(
    `if (lane == 0u) {`,
    ...hs.flatMap((h) => [
      `  ms[warp * GROUP + h0 + ${h}u] = m${h};`,
      `  ls[warp * GROUP + h0 + ${h}u] = l${h};`,
    ]),
    `}`,
  );
  // q element o (head-major) of workgroup memory.
  const qAt = (o: string) => elemAt("qs", o);
  return `${headerWgsl(d, { VW, S, warps, SP, norm, copyOut: d.copyOut })}
const TT = ${TT}u;
const ROW = ${(d.heads + 2 * d.kvHeads) * HD}u;
var<workgroup> qs: array<${vt}, ${G * HDV}>;
var<workgroup> ks: array<${vt}, ${HDV}>;
var<workgroup> vs: array<${vt}, ${HDV}>;
var<workgroup> accs: array<${vt}, ${warps * G * HDV}>;${
    SP === 1 && d.copyOut ? `\nvar<workgroup> os: array<${vt}, ${G * HDV}>;` : ""
  }
var<workgroup> ms: array<f32, ${warps * G}>;
var<workgroup> ls: array<f32, ${warps * G}>;
var<workgroup> keys: u32;${nr.decl ? `\n${nr.decl}` : ""}
// Scores of the step's own keys (tokens 0..tok) per q head: sn[h * TT + j].
var<workgroup> sn: array<f32, ${G * TT}>;
${
    norm
      ? `// Sums of squares per subgroup: the GROUP q heads, then k.
var<workgroup> nred: array<f32, ${(G + 1) * warps}>;
fn inv_rms(hh: u32) -> f32 {
  var t = 0.0;
  for (var w = 0u; w < WARPS; w++) { t += nred[hh * WARPS + w]; }
  return inverseSqrt(t / f32(HD) + p.eps);
}`
      : ""
  }
${newKeyWgsl(norm, VW, w, G, "")}
@compute @workgroup_size(${warps * S})
fn main(
  @builtin(workgroup_id) wg: vec3<u32>,
  @builtin(local_invocation_index) tid: u32,
  @builtin(subgroup_invocation_id) lane: u32,
) {
  let kvh = wg.x;
  let split = wg.y;
  let tok = wg.z;
  let warp = tid / S;
  let pos = step.pos0 + tok;
  if (tid == 0u) { keys = select(0u, pos + 1u, step.T > tok); }
  let rb = tok * ROW;
  let qb = rb + kvh * GROUP * HD; // the group's q heads are contiguous
  let kb = rb + (NH + kvh) * HD;
  let vb = rb + (NH + NKV + kvh) * HD;${
    norm
      ? `
  // RMSNorm of the group's q heads and the k head (q_norm / k_norm), before RoPE.
  for (var hh = 0u; hh <= GROUP; hh++) {
    let b = select(qb + hh * HD, kb, hh == GROUP);
    var ss = 0.0;
    for (var i = tid; i < HD; i += WG) { let a = qkv[b + i]; ss += a * a; }
    let r = subgroupAdd(ss);
    if (lane == 0u) { nred[hh * WARPS + warp] = r; }
  }
  workgroupBarrier();`
      : ""
  }
  for (var x = tid; x < GROUP * HALF; x += WG) {
    let hh = x / HALF;
    let i = x % HALF;
    let c = cs[pos * HALF + i];
    let b = qb + hh * HD;${norm ? "\n    let iq = inv_rms(hh);" : ""}
    let q0 = qkv[b + i]${norm ? " * iq * wq[i]" : ""};
    let q1 = qkv[b + i + HALF]${norm ? " * iq * wq[i + HALF]" : ""};
    let o = hh * HD + i;
    ${qAt("o")} = (q0 * c.x - q1 * c.y) * p.scale;
    ${qAt("o + HALF")} = (q1 * c.x + q0 * c.y) * p.scale;
  }${norm ? "\n  let ik = inv_rms(GROUP);" : ""}
  ${nr.init}
  for (var i = tid; i < HALF; i += WG) {
    let c = cs[pos * HALF + i];
    let k0 = qkv[kb + i]${norm ? " * ik * wk[i]" : ""};
    let k1 = qkv[kb + i + HALF]${norm ? " * ik * wk[i + HALF]" : ""};
    let r0 = k0 * c.x - k1 * c.y;
    let r1 = k1 * c.x + k0 * c.y;
    let v0 = qkv[vb + i];
    let v1 = qkv[vb + i + HALF];
    ${nr.stash}
  }
  ${nr.publish}
  let n = workgroupUniformLoad(&keys);
  if (n == 0u) { return; }
  ${nr.scales}
  let nc = n - 1u - tok;
  let kv0 = kvh * p.max_seq;
  if (split == 0u) {
    ${nr.write("(kv0 + pos)")}
  }${TT === 1 ? "" : OWN_SCORES_WGSL}
  ${packed ? "let g = lane / HDV;\n  let sl = lane % HDV;" : ""}
  let nch_all = (nc + S - 1u) / S;
  let per = max((nch_all + ${SP - 1}u) / ${SP}u, ${SP > 1 ? MINC : 1}u);
  let c_lo = min(split * per, nch_all);
  let nch = min(nch_all - c_lo, per);
  let rounds = (nch + WARPS - 1u) / WARPS;
  // Passes over this split's keys, GB q heads (h0 ..) each.
  for (var hb = 0u; hb < ${NB}u; hb++) {
    let h0 = hb * ${GB}u;
    ${qDecl.join("\n    ")}
    ${hs.map((h) => `var m${h} = -3.0e38;\n    var l${h} = 0.0;`).join("\n    ")}
    ${hs.flatMap((h) => range(NSLOT).map((i) => `var acc${h}_${i} = ${vt}(0.0);`)).join("\n    ")}
    for (var r = 0u; r < rounds; r++) {
      let c = r * WARPS + warp;
      if (c < nch) {
        let base = (c_lo + c) * S;
        // Keys past the last are read clamped to it, score -3e38 and weigh 0.
        ${vPrefetch.join("\n        ")}
        ${score.join("\n        ")}
        ${softmax.join("\n        ")}
        ${values.join("\n        ")}
      }
    }
    ${store.join("\n    ")}
  }
  ${
    TT === 1
      ? `// The step's own key (ks).
  if (warp == WARPS - 1u) {
    for (var hh = lane; hh < GROUP; hh += S) {
      var s = 0.0;
      for (var e = 0u; e < HDV; e++) { s += dot(qs[hh * HDV + e], ${nr.own("ks[e]", "k")}); }
      sn[hh] = s;
    }
  }`
      : ""
  }
  workgroupBarrier();
  let act = min(nch, WARPS);
  let own = split == 0u; // the step's own keys belong to split 0
  for (var x = tid; x < GROUP * HDV; x += WG) {
    let hh = x / HDV;
    let e = x % HDV;
    var mx = -3.0e38;
    if (own) { for (var j = 0u; j <= tok; j++) { mx = max(mx, sn[hh * TT + j]); } }
    for (var w = 0u; w < act; w++) { mx = max(mx, ms[w * GROUP + hh]); }
    var lsum = 0.0;
    var a = ${vt}(0.0);
    if (own) {
      ${earlierValuesWgsl(TT, (j) => `sn[hh * TT + ${j}]`)}
      let et = exp(sn[hh * TT + tok] - mx);
      lsum += et;
      a += et * ${nr.own("vs[e]", "v")};
    }
    for (var w = 0u; w < act; w++) {
      let wt = exp(ms[w * GROUP + hh] - mx);
      lsum += ls[w * GROUP + hh] * wt;
      a += accs[(w * GROUP + hh) * HDV + e] * wt;
    }
    let hq = kvh * GROUP + hh;
    ${
    SP > 1
      ? `// Partial of split (hq, split), as the per-head kernel writes it.
    let pb = ((tok * NH + hq) * ${SP}u + split) * (HDV * VW / 2u + 1u);
    if (e == 0u) { part[pb] = vec2<f32>(mx, lsum); }
    ${VW === 4 ? "part[pb + 1u + 2u * e] = a.xy; part[pb + 2u + 2u * e] = a.zw;" : "part[pb + 1u + e] = a;"}`
      : `let o = a / lsum;
    out[(tok * NH + hq) * HDV + e] = o;${d.copyOut ? "\n    os[hh * HDV + e] = o;" : ""}`
  }
  }${
    SP === 1 && d.copyOut
      ? copyTail(d.copyOut, d, {
        heads: G,
        h0: "kvh * GROUP",
        vec4At: (k) => `os[${k}]`,
        WG: "WG",
      })
      : ""
  }
}`;
}

/** WGSL of the flash-decoding combine: one workgroup per head merges its splits' partials into out. */
export function attentionCombineSource(
  d: { heads: number; headDim: number; copyOut?: QuantType; oProj?: OProjDims & { rowSplits: number } },
  splits: number,
  earlySlots = true,
): string {
  const NH = d.heads;
  const HD = d.headDim;
  const P2 = HD / 2; // vec2 slots of a partial's output
  const SP = splits;
  const WG = combineThreads(d);
  const op = d.oProj
    ? oProjWgsl(d.oProj, { first: 3, WG, osAt: (k) => `vec4<f32>(os[2u * (${k})], os[2u * (${k}) + 1u])` })
    : undefined;
  // Every split's loads are issued before any is used (a loop would wait one L2 latency per split).
  const ml = range(SP).map((s) => `let ml${s} = part[(hs + ${s}u) * PW];`);
  const mx = range(SP).map((s) => `ml${s}.x`).reduce((a, b) => `max(${a}, ${b})`);
  const w = range(SP).map((s) => `let w${s} = select(0.0, exp(ml${s}.x - mx), ml${s}.y > 0.0);`);
  const l = range(SP).map((s) => `ml${s}.y * w${s}`).join(" + ");
  const vs = (e: string) => range(SP).map((s) => `let v${s} = part[(hs + ${s}u) * PW + 1u + ${e}];`);
  const a = range(SP).map((s) => `v${s} * w${s}`).join(" + ");
  // Where a thread has at most one slot (head_dim <= 2 WG), its slot's loads are issued with the (max, sum)
  // loads, not after the weights are computed from them: one L2 round trip instead of two.
  const one = earlySlots && P2 <= WG;
  // As the attention kernel: a token past the step's writes nothing. With earlySlots checked after the
  // loads (which stay in the buffers, sized for the most tokens), so that they do not wait for step's.
  const check = "if (step.T <= tok) { return; }";
  const write = (e: string) =>
    `let o = (${a}) / l;
    out[(tok * ${NH}u + h) * ${P2}u + ${e}] = o;${d.copyOut || op ? `\n    os[${e}] = o;` : ""}`;
  return `${STEP_WGSL}
@group(0) @binding(0) var<storage, read> step: Step;
@group(0) @binding(1) var<storage, read> part: array<vec2<f32>>;
@group(0) @binding(2) var<storage, read_write> out: array<vec2<f32>>;${
    d.copyOut ? `\n${int8CopyBindingsWgsl(3)}` : ""
  }${op ? `\n${op.decls}` : ""}${d.copyOut || op ? `\nvar<workgroup> os: array<vec2<f32>, ${P2}>;` : ""}
const PW = ${P2 + 1}u;
@compute @workgroup_size(${WG})
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
  ${op ? `let h = wg.x % ${NH}u;\n  let orow = wg.x / ${NH}u;` : "let h = wg.x;"}
  let tok = wg.y;
  ${earlySlots ? "" : check}${op ? `\n  ${op.prefetch}` : ""}
  let hs = (tok * ${NH}u + h) * ${SP}u;
  ${ml.join("\n  ")}${one ? `\n  let se = min(tid, ${P2 - 1}u);\n  ${vs("se").join("\n  ")}` : ""}
  ${earlySlots ? check : ""}
  let mx = ${mx};
  ${w.join("\n  ")}
  let l = ${l};
  ${
    one ? `if (tid < ${P2}u) {\n    ${write("se")}\n  }` : `for (var e = tid; e < ${P2}u; e += ${WG}u) {
    ${vs("e").join("\n    ")}
    ${write("e")}
  }`
  }${op ? `\n  workgroupBarrier();${op.tail}` : ""}${
    d.copyOut
      ? copyTail(d.copyOut, d, {
        heads: 1,
        h0: "h",
        vec4At: (k) => `vec4<f32>(os[2u * (${k})], os[2u * (${k}) + 1u])`,
        WG: `${WG}u`,
      })
      : ""
  }
}`;
}

/** The combine's threads: a head's vec2 slots, 32..256, or 256 with o_proj folded in. */
function combineThreads(d: { headDim: number; oProj?: unknown }): number {
  return d.oProj ? 256 : Math.min(256, Math.max(32, d.headDim / 2));
}

/**
 * The end of a kernel that wrote whole heads of the attention output, keeping them in workgroup memory too
 * (`os`, read by `vec4At`): a workgroup barrier, then the int8 copy of those heads (`heads` of them from head
 * `h0`, contiguous, of token `tok`) for the o_proj GEMV after it (gemv_fused.ts int8CopyFor: its input pass
 * is then not needed). head_dim % 32 == 0 (attentionCopyOutFits).
 */
function copyTail(
  wt: QuantType,
  d: { heads: number; headDim: number },
  o: { heads: number; h0: string; vec4At: (k: string) => string; WG: string },
): string {
  const HB = d.headDim / 32;
  return `
  workgroupBarrier();${
    int8CopyTailWgsl(wt, {
      K: d.heads * d.headDim,
      row0: "tok",
      rows: "1u",
      blocks: `${o.heads * HB}u`,
      gb0: `(${o.h0}) * ${HB}u`,
      vec4At: (i) => o.vec4At(`8u * cb + ${i}u`),
      WG: o.WG,
    })
  }`;
}

/** Whether the decode attention can write the int8 copy of its output (attentionDecodeCalls' copyOut). */
export function attentionCopyOutFits(d: { headDim: number }): boolean {
  return d.headDim % 32 === 0;
}

/** Caches of more keys than this take flash-decoding splits by default (attentionDecodeSplits). */
export const ATTENTION_SPLIT_KEYS = 1024;
/** Past this many keys small heads' splits take 8 subgroups and large head groups the grouped kernel. */
export const ATTENTION_LONG_KEYS = 4096;

/** The most keys a decode attention call's steps attend to: its `keys` bound, else the cache's capacity. */
export function attendedKeys(d: { maxSeq: number; keys?: number }): number {
  return Math.min(d.keys ?? d.maxSeq, d.maxSeq);
}

/**
 * The cache-length bucket of a step of a sequence of `maxSeq` positions attending to `keys` keys: the most keys
 * of the bucket it falls in (ATTENTION_SPLIT_KEYS, ATTENTION_LONG_KEYS: where the default kernel changes), or
 * undefined for the unbounded one, the cache's capacity (and where the length is unknown). A step program built
 * with the bound (AttentionDecodeDims.keys) serves every step of its bucket, so a long request's first
 * thousand tokens decode without splits rather than through the split attention and its combine. H100,
 * Llama-1B q4 step at 256 / 512 / 768 / 1,024 keys: 0.657 / 0.683 / 0.714 / 0.743 ms unsplit against 0.716 /
 * 0.716 / 0.719 / 0.720 with 16 splits (f16: 1.123 / 1.155 / 1.189 / 1.221 against 1.204 / 1.202 / 1.205 /
 * 1.209; docs/BENCHMARKS.md, the forty-fifth session). (Called for every decode step: no allocation.)
 */
export function attentionLengthBucket(maxSeq: number, keys: number | undefined): number | undefined {
  if (keys === undefined) return undefined;
  if (keys <= ATTENTION_SPLIT_KEYS && ATTENTION_SPLIT_KEYS < maxSeq) return ATTENTION_SPLIT_KEYS;
  if (keys <= ATTENTION_LONG_KEYS && ATTENTION_LONG_KEYS < maxSeq) return ATTENTION_LONG_KEYS;
  return undefined;
}

/**
 * Whether sequences of `a` and `b` positions build the same decode attention for every cache length both
 * hold: attentionLengthBucket agrees for each, and where it gives no bucket the capacity falls on the same
 * side of both thresholds (splits, split subgroups and the grouped kernel follow only those; the capacity is
 * otherwise the cache's row stride). What lets a released sequence serve a shorter request exactly.
 */
export function sameLengthBuckets(a: number, b: number): boolean {
  return [ATTENTION_SPLIT_KEYS, ATTENTION_LONG_KEYS].every((k) => (k < a) === (k < b));
}

/**
 * Flash-decoding splits by default: enough workgroups to fill a large GPU, for steps attending to more than
 * ATTENTION_SPLIT_KEYS keys.
 */
export function attentionDecodeSplits(heads: number, keys: number): number {
  if (keys <= ATTENTION_SPLIT_KEYS) return 1;
  return Math.max(1, Math.min(32, Math.ceil(512 / heads)));
}

/**
 * Subgroups a split workgroup of the per-head kernel gets by default: 4, or 8 for head_dim <= 64 past
 * ATTENTION_LONG_KEYS keys, where a split's keys are many. H200, Llama-1B q4 step at 8192 keys (2026-12-02,
 * fifteenth session; 32 heads of 64, 16 splits): 8 subgroups 0.801 ms against 0.812-0.818 with 32 splits of 4
 * (the default before; 16 splits of 4 were slower still: 18.8 against 15.6 us a layer), 16 subgroups 0.869, 16
 * splits of 8 0.814; at 2048 keys 8 subgroups 0.711-0.712 against 0.709-0.712.
 */
export function attentionDecodeSplitWarps(keys: number, headDim: number): number {
  return keys > ATTENTION_LONG_KEYS && headDim <= 64 ? 8 : 4;
}

/**
 * Flash-decoding splits of the grouped kernel: it runs kvHeads workgroups per split (not heads), so it takes
 * more splits for the same fill: enough that kvHeads x splits is about two workgroups per SM of a
 * 132-SM GPU (264 / kvHeads, at most 64), for steps attending to more than ATTENTION_SPLIT_KEYS keys.
 */
export function attentionDecodeGroupedSplits(kvHeads: number, keys: number): number {
  if (keys <= ATTENTION_SPLIT_KEYS) return 1;
  return Math.max(1, Math.min(64, Math.ceil(264 / kvHeads)));
}

/**
 * Where the grouped kernel serves by default: head_dim >= 128, groups of >= 4 q heads and steps attending to
 * more than ATTENTION_LONG_KEYS keys. H200 (2026-12-01, us a layer, per-head against grouped): hd 128 / 8-head
 * groups 28.3 against 22.0 at 8192 keys, but 12.5 against 18-20 at 2048 and 5.8 against 11.6 at 128; hd 64 /
 * 4-head groups never faster (4.5 / 9.7 / 15.3 against 5.6 / 10.2 / 15.9); Qwen3-30B-A3B q4 at a short context
 * 0.593 against 0.740 ms a step (8 layers).
 */
export function attentionGroupedDefault(d: AttentionDecodeDims): boolean {
  return d.headDim >= 128 && d.heads / d.kvHeads >= 4 && attendedKeys(d) > ATTENTION_LONG_KEYS;
}

/**
 * Whether the grouped kernel is asked for: the call's tuning, else gpu.tuning.attentionGrouped, else
 * attentionGroupedDefault (read when the call is built).
 */
function groupedSwitch(gpu: Gpu, d: AttentionDecodeDims, tuning?: Partial<AttentionDecodeTuning>): boolean {
  if (tuning?.grouped !== undefined) return tuning.grouped;
  return gpu.tuning.attentionGrouped ?? attentionGroupedDefault(d);
}

const decodeSources = memoSource(attentionDecodeSource);
const groupedSources = memoSource(attentionDecodeGroupedSource);

/**
 * Attention for a decode step of ONE token (step.T must be 1; with step.T == 0 it does nothing): RoPE on
 * this token's q and k (from row 0 of the fused qkv activations), rotated k and v written into the caches
 * at step.pos0, and causal GQA attention over positions 0..pos0 into out [heads * hd]. Replaces
 * ropeKvCall + attentionCall in T = 1 programs only; q in qkv is left unrotated. Needs subgroups: check
 * attentionDecodeFits first (it throws a RangeError without them or for an unsupported shape).
 * One dispatch; with flash-decoding splits (the default for steps attending to more than 1024 keys:
 * attentionDecodeSplits, attendedKeys) two, the split attention and the combine.
 */
export function attentionDecodeCalls(
  gpu: Gpu,
  bufs: {
    step: GPUBuffer;
    table: GPUBuffer;
    qkv: GPUBuffer;
    kcache: GPUBuffer;
    vcache: GPUBuffer;
    out: GPUBuffer;
    /** With d.normEps: the q_norm and k_norm weights (f32 [head_dim]). */
    qNorm?: GPUBuffer;
    kNorm?: GPUBuffer;
    /**
     * Also write the int8 copy of `out` for the o_proj GEMV's int8 direct mode (gemv_fused.ts int8CopyFor;
     * check attentionCopyOutFits): the kernel that writes `out` (the attention, or with splits the combine)
     * quantises its heads' blocks after writing them.
     */
    copyOut?: { q: GPUBuffer; s: GPUBuffer; weights: QuantType };
    /**
     * o_proj folded in (attention_oproj.ts; check attentionOProjFits): `w` [N, heads * head_dim] in
     * `weights`, its products added into the residual `y` [T, N]; with `copy`, the fold also writes the
     * next RMSNorm GEMV's int8 input copy (gemv_fused.ts int8CopyFor, with ssq and norm). Not with copyOut.
     */
    oProj?: AttentionOProj;
  },
  d: AttentionDecodeDims,
  tuning?: Partial<AttentionDecodeTuning>,
): KernelCall[] {
  const S = gpu.subgroupSize;
  if (S === null) throw new RangeError("attention decode kernel needs subgroups, which this device lacks");
  if (!attentionDecodeFits(gpu, d)) {
    throw new RangeError(
      `attention decode kernel does not fit heads ${d.heads}, kv heads ${d.kvHeads}, head_dim ${d.headDim}`,
    );
  }
  const base = attentionDecodeDefaultTuning(gpu, d.headDim, false, d.T ?? 1);
  // Grouped: one workgroup per kv head, where its workgroup memory fits at least one subgroup.
  const gWarps = groupedWarps(gpu, d, base.warps);
  const grouped = groupedSwitch(gpu, d, tuning) && gWarps > 0;
  const ob = bufs.oProj;
  if (ob && (grouped || bufs.copyOut || !oProjFits(gpu, oProjDimsOf(ob, d)))) {
    throw new RangeError(
      `o_proj cannot fold into this decode attention (${
        grouped ? "grouped kernel" : bufs.copyOut ? "copyOut asked too" : `head_dim ${d.headDim}, N ${ob.N}`
      }): check attentionOProjFits`,
    );
  }
  const splits = gpu.tuning.attentionSplits ??
    (grouped
      ? attentionDecodeGroupedSplits(d.kvHeads, attendedKeys(d))
      : attentionDecodeSplits(d.heads, attendedKeys(d)));
  // Split, a workgroup's share of the keys is short: 4 subgroups a workgroup (H200, hd 64, 16 splits:
  // 9.9 us a layer at 2048 keys and 18.9 at 8192, against 20.8 and 30.9 with 16; scripts/bench/attention_decode.ts),
  // 8 for long caches of small heads (attentionDecodeSplitWarps).
  const splitWarps = grouped ? 4 : attentionDecodeSplitWarps(attendedKeys(d), d.headDim);
  const t = {
    ...base,
    ...(grouped ? { warps: gWarps, unroll: attentionDecodeDefaultTuning(gpu, d.headDim, true).unroll } : {}),
    splits,
    ...(splits > 1 ? { warps: Math.min(grouped ? gWarps : base.warps, splitWarps) } : {}),
    ...(gpu.tuning.attentionWarps !== undefined ? { warps: gpu.tuning.attentionWarps } : {}),
    ...(gpu.tuning.attentionUnroll !== undefined ? { unroll: gpu.tuning.attentionUnroll } : {}),
    ...tuning,
  };
  const sp = t.splits ?? 1;
  const T = d.T ?? 1;
  if (!(Number.isInteger(T) && T >= 1 && T <= DECODE_MAX_T)) {
    throw new RangeError(`decode attention takes 1..${DECODE_MAX_T} tokens a step, got ${T}`);
  }
  const ok = Number.isInteger(sp) && sp >= 1 && sp <= 256 &&
    (t.minChunks === undefined || (Number.isInteger(t.minChunks) && t.minChunks >= 1)) &&
    Number.isInteger(t.warps) && t.warps >= 1 &&
    t.warps * S <= gpu.device.limits.maxComputeInvocationsPerWorkgroup &&
    (grouped
        ? groupedSharedBytes(d.headDim, d.heads / d.kvHeads, t.warps, T)
        : sharedBytes(d.headDim, t.warps, T)) <= gpu.maxWorkgroupStorage &&
    Number.isInteger(t.unroll) && t.unroll >= 1 && t.unroll <= 64 &&
    (t.groupBatch === undefined || (Number.isInteger(t.groupBatch) && t.groupBatch >= 1));
  if (!ok) {
    throw new RangeError(`bad decode attention tuning ${JSON.stringify(t)} (S = ${S}, hd ${d.headDim})`);
  }
  const norm = d.normEps !== undefined;
  if (norm && (!bufs.qNorm || !bufs.kNorm)) throw new TypeError("normEps needs the qNorm and kNorm weights");
  const params = uniformBuffer(gpu, [d.maxSeq, 1 / Math.sqrt(d.headDim), d.normEps ?? 0], [1, 2]);
  const bound = [params, bufs.step, bufs.table, bufs.qkv, bufs.kcache, bufs.vcache, bufs.out];
  const normBufs = norm ? [bufs.qNorm!, bufs.kNorm!] : [];
  const copy = bufs.copyOut;
  if (copy && !attentionCopyOutFits(d)) {
    throw new RangeError(`no int8 copy of the attention output at head_dim ${d.headDim} (a multiple of 32)`);
  }
  // o_proj folded into the kernel that writes out (the attention, or with splits the combine).
  const od = ob ? oProjDimsOf(ob, d) : undefined;
  const oHost = od
    ? {
      ...od,
      rowSplits: od.rowSplits ?? oProjRowSplits(od, sp === 1 ? t.warps * S : 256),
      earlyTail: gpu.tuning.attentionOEarlyTail ?? (od.copy !== undefined),
    }
    : undefined;
  if (
    oHost && sp === 1 &&
    sharedBytes(d.headDim, t.warps, T) + oProjSharedBytes(oHost, oHost.rowSplits) > gpu.maxWorkgroupStorage
  ) {
    throw new RangeError(`o_proj folded in: workgroup memory exceeds ${gpu.maxWorkgroupStorage} bytes`);
  }
  const R = oHost?.rowSplits ?? 1;
  // The fold's accumulator and counts, left zeroed by each fold for the next: owned by the call folding.
  const oScratch = ob ? oProjScratchBytes(T, ob.N, R) : undefined;
  const oOwned = oScratch
    ? [
      storageBuffer(gpu, oScratch.acc, "o_proj accumulator"),
      storageBuffer(gpu, oScratch.count, "o_proj count"),
    ]
    : [];
  const oBufs = ob ? [ob.w, ...oOwned, ob.y, ...(ob.copy ? oCopyBuffers(ob.copy) : [])] : [];
  // The source's arguments leave out the cache's length, which it does not read (the memo would keep a
  // source a request).
  const { maxSeq: _, keys: __, ...shape } = d;
  const dc: AttentionSourceDims = {
    ...shape,
    copyOut: copy?.weights,
    ...(sp === 1 && oHost ? { oProj: oHost } : {}),
  };
  const src = grouped ? groupedSources(dc, S, t) : decodeSources(dc, S, t);
  const wgs = grouped ? d.kvHeads : d.heads; // workgroups per split and token
  const copyBufs = copy ? [copy.q, copy.s] : [];
  if (sp === 1) {
    const call = kernelCall(
      gpu,
      pipeline(gpu, src),
      [...bound, ...normBufs, ...copyBufs, ...oBufs],
      [wgs * R, 1, T],
      "attention",
    );
    if (ob) call.owned = oOwned;
    return [call];
  }
  const part = storageBuffer(gpu, T * d.heads * sp * (d.headDim / 2 + 1) * 8, "attention partials");
  // With splits, binding 6 is the partials (the combine writes out).
  const main = kernelCall(
    gpu,
    pipeline(gpu, src),
    [...bound.slice(0, 6), part, ...normBufs],
    [wgs, sp, T],
    "attention",
  );
  const combine = kernelCall(
    gpu,
    pipeline(
      gpu,
      attentionCombineSource(
        { ...dc, ...(oHost ? { oProj: oHost } : {}) },
        sp,
        gpu.tuning.attentionCombineEarly !== false,
      ),
    ),
    [bufs.step, part, bufs.out, ...copyBufs, ...oBufs],
    [d.heads * R, T],
    "attention_combine",
  );
  combine.owned = [part, ...oOwned];
  return [main, combine];
}

/** o_proj folded into the decode attention (attentionDecodeCalls' oProj). */
export interface AttentionOProj {
  w: GPUBuffer;
  weights: WeightType | QuantType;
  /** o_proj's output rows (the hidden size). */
  N: number;
  /** The residual [T, N], added into. */
  y: GPUBuffer;
  /** The next RMSNorm GEMV's int8 input copy (int8CopyFor, with ssq and norm), written by the fold. */
  copy?: Int8CopyOut;
  /** Workgroups per head (default oProjRowSplits). */
  rowSplits?: number;
}

/** A copy's bindings in the fold's order (attention_oproj.ts): words, scales, norm weights, sums of squares. */
function oCopyBuffers(c: Int8CopyOut): GPUBuffer[] {
  if (!c.ssq || !c.norm) throw new TypeError("the fold writes an RMSNorm GEMV's copy: it needs ssq and norm");
  return [c.q, c.s, c.norm.w, c.ssq];
}

function oProjDimsOf(o: AttentionOProj, d: AttentionDecodeDims): OProjDims {
  return {
    heads: d.heads,
    headDim: d.headDim,
    N: o.N,
    weights: o.weights,
    rowSplits: o.rowSplits,
    ...(o.copy ? { copy: { weights: o.copy.weights, norm: o.copy.norm!.type } } : {}),
  };
}

/**
 * Whether o_proj (weights `wt`, N rows) can be folded into this decode attention: the per-head kernel (not
 * the grouped one, which the dims and tuning may pick), head_dim a multiple of 32, and with `copy` N of 32.
 */
export function attentionOProjFits(
  gpu: Gpu,
  d: AttentionDecodeDims,
  o: { weights: WeightType | QuantType; N: number; copy?: boolean },
): boolean {
  if (!attentionDecodeFits(gpu, d) || groupedSwitch(gpu, d)) return false;
  const od: OProjDims = { heads: d.heads, headDim: d.headDim, N: o.N, weights: o.weights };
  if (o.copy) od.copy = { weights: "q4", norm: "f32" };
  const warps = attentionDecodeDefaultTuning(gpu, d.headDim, false, d.T ?? 1).warps;
  return oProjFits(gpu, od) &&
    sharedBytes(d.headDim, gpu.tuning.attentionWarps ?? warps, d.T ?? 1) + oProjSharedBytes(od) <=
      gpu.maxWorkgroupStorage;
}

/**
 * Whether blocks fold o_proj into the decode attention where it fits: gpu.tuning.attentionOProj, else on
 * (read when a program is built).
 */
export function attentionOProjDefault(gpu: Gpu): boolean {
  return gpu.tuning.attentionOProj ?? true;
}

/** attentionDecodeCalls without splits: one dispatch (tests, and callers that want exactly one call). */
export function attentionDecodeCall(
  gpu: Gpu,
  bufs: Parameters<typeof attentionDecodeCalls>[1],
  d: AttentionDecodeDims,
  tuning?: Partial<AttentionDecodeTuning>,
): KernelCall {
  return attentionDecodeCalls(gpu, bufs, d, { ...tuning, splits: 1 })[0];
}
