// GEMV microbenchmark at the decode step's own shapes (Llama 3.2 1B): GB/s of weight reads of the team
// kernel (gemv_fused.ts), the subgroup kernel (gemv_sg.ts) at its default tuning and, with --sweep, a
// grid of subgroup tunings (how sgDefaultTuning's table is made). Timed with GPU timestamps over many
// back-to-back dispatches that rotate over weight copies (>= 256 MB, so the 50 MB L2 does not flatter
// small shapes), after keeping the GPU busy long enough to reach its clocks. torch's number comes from
// scripts/bench/torch_gemv.py in the same device run. Quantised rows count their own bytes (8.5 / 4.5
// bits a weight), so their GB/s compare with f16's directly. One JSON line per case.
// --k 2,4,8,16: also the multi-token GEMV (gemv_multi.ts) at T rows, its default tuning (and with --sweep
// a grid of rows x workgroup for each x staging: f32, "_xh" f16, "_dp4" int8 for q8/q4; each also
// "_pl", pipelined weight loads), as "k<T>_..." entries. --persistent: the sweep's grid is persistent workgroups instead: GB/s of the weights read once for all T rows.
// The one-row kernel's prologue variants at its default tuning: sg_default, _pf (first weight loads before
// staging x), _dn (RMSNorm's 1 / rms applied to the sums: deferNorm), _pf_dn. Cases gate_up_pairs and
// down_plain are the paired MLP's (gpu.tuning.pairGateUp): one GEMV computing silu(gate) * up over the
// [gate; up] matrix (GB/s of both halves), and down reading that I-wide row as it is; compare them with
// gate_up and down (the unpaired MLP: gate_up writes [gate | up], down computes silu_mul as it stages).
// --prologue: the sweep's tunings each also with prefetch and deferNorm (p / n in their names).
// Direct mode (SgTuning `direct`, gpu.tuning.direct: x read in place, K split over warps): f16 cases with
// no transform or RMSNorm, unpaired, also time "direct_default" (sgDirectTuning), and with --direct a grid
// of rows x splitK x workgroup x unroll ("dir_r<R>k<splitK>w<wg>u<U>"); e.g. the small-N decode matrices:
//   deno run -A scripts/bench/gemv.ts --weights f16 --direct --cases o,qkv,down_plain,gate_up,head
// The multi-token GEMV's direct mode (MultiTuning `direct`, gpu.tuning.multiDirect): f16 cases with no
// transform or RMSNorm (paired or not) also time "k<T>_dir_default" (multiDirectTuning) and with --sweep a
// grid of rows x splitK x unroll at 256 threads plus each splitK at 1024 ("k<T>_dir_r<R>k<splitK>w<wg>u<U>",
// ~40 a case); --direct-only times only these (no team, staged multi or one-row variants), e.g.
//   deno run -A scripts/bench/gemv.ts --weights f16 --k 8 --sweep --direct-only --cases o,qkv,gate_up_pairs,down_plain,head
//   deno run -A scripts/bench/gemv.ts [--quick] [--sweep [--prologue]] [--direct] [--direct-only] [--weights f16,q8,q4]
//     [--k 2,4,8,16] [--cases qkv,gate_up,gate_up_pairs,down,down_plain,head,qkv_plain,head_plain] [--copies N]
//     [--only A,B]
// --copies: how many weight copies the dispatches rotate over (default: enough for 256 MB; 1 keeps a matrix
// that fits the 50 MB L2 there, the time a GEMV would take if its weights had been prefetched). --only: just
// the variants of these names (e.g. --sweep --direct-only --k 8 --cases head --only
// k8_dir_default,k8_dir_r4k2w256u2: a full sweep of the head compiles ~40 kernels and outran a 280 s limit).
import { parseArgs } from "node:util";
import { scriptArgs } from "../args.ts";
import {
  defaultTuning,
  gemvFusedCall,
  getGpu,
  type InputTransform,
  type KernelCall,
  multiDefaultTuning,
  multiDirectTuning,
  type MultiTuning,
  quantBytes,
  type QuantType,
  sgDefaultTuning,
  sgDirectTuning,
  sgFits,
  type SgTuning,
  storageBuffer,
} from "../../kernels/mod.ts";
import { gpuMs } from "../../kernels/timer.ts";

const { values } = scriptArgs(import.meta.url, (args) =>
  parseArgs({
    args,
    options: {
      quick: { type: "boolean", default: false },
      sweep: { type: "boolean", default: false },
      weights: { type: "string", default: "f16,q8,q4" },
      k: { type: "string" },
      cases: { type: "string" },
      "no-single": { type: "boolean", default: false },
      persistent: { type: "boolean", default: false },
      prologue: { type: "boolean", default: false },
      direct: { type: "boolean", default: false },
      "direct-only": { type: "boolean", default: false },
      copies: { type: "string" },
      only: { type: "string" },
    },
  }));
const gpu = await getGpu();
const quick = values.quick;
const directOnly = values["direct-only"];
type Wt = "f16" | QuantType;
interface Case {
  name: string;
  N: number;
  K: number;
  f: InputTransform;
  /** N (gate, up) row pairs of a [gate; up] matrix of 2N rows, writing silu(gate) * up. */
  pairs?: boolean;
}
// The decode step's GEMVs (and 8192 x 2048, one of issue 6's shapes, with no transform).
const allCases: Case[] = quick
  ? [{ name: "tiny", N: 64, K: 256, f: "rmsnorm" }, {
    name: "tiny_pairs",
    N: 32,
    K: 256,
    f: "rmsnorm",
    pairs: true,
  }]
  : [
    { name: "o", N: 2048, K: 2048, f: "none" },
    { name: "qkv", N: 3072, K: 2048, f: "rmsnorm" },
    { name: "down", N: 2048, K: 8192, f: "silu_mul" },
    { name: "8192x2048", N: 8192, K: 2048, f: "none" },
    { name: "gate_up", N: 16384, K: 2048, f: "rmsnorm" },
    { name: "gate_up_pairs", N: 8192, K: 2048, f: "rmsnorm", pairs: true },
    { name: "down_plain", N: 2048, K: 8192, f: "none" },
    { name: "head", N: 128256, K: 2048, f: "rmsnorm" },
    // The RMSNorm cases without it: what the norm costs the kernel (x normalised by a pass before it).
    { name: "qkv_plain", N: 3072, K: 2048, f: "none" },
    { name: "head_plain", N: 128256, K: 2048, f: "none" },
  ];
const cases = allCases.filter((c) => !values.cases || values.cases.split(",").includes(c.name));
const kList = values.k ? values.k.split(",").map(Number) : [];
const maxT = Math.max(1, ...kList);

function bytesOf(N: number, K: number, wt: Wt): number {
  return wt === "f16" ? N * K * 2 : quantBytes(N, K, wt);
}

/**
 * --sweep persistent: the one-token kernel with few, wide, persistent workgroups (each stages and
 * normalises x once and then walks many row blocks): short rows (q4: 2 units a lane at K 2048) spend as
 * long on that prologue as on their weights when every workgroup has one row block.
 */
function persistentTunings(K: number, wt: Wt, S: number): SgTuning[] {
  const perUnit = wt === "f16" ? 8 : wt === "q8" ? 16 : 32;
  const perLane = K / perUnit / S;
  const out: SgTuning[] = [];
  const rowsSet = wt === "f16" ? [1, 2, 4] : [2, 4, 8];
  for (const rows of rowsSet) {
    for (const unroll of [1, 2, 4].filter((u) => perLane % u === 0 && rows * u <= 16)) {
      for (const wg of [256, 1024]) {
        for (const groups of [132, 264]) {
          for (const prefetch of [false, true]) {
            out.push({
              rows,
              unroll,
              wg,
              groups,
              prefetch,
              ...(wt !== "f16" && gpu.hasDp4 ? { dp4: true } : {}),
            });
          }
        }
      }
    }
  }
  return out;
}

function sweepTunings(K: number, wt: Wt, S: number): SgTuning[] {
  if (values.persistent) return persistentTunings(K, wt, S);
  const perUnit = wt === "f16" ? 8 : wt === "q8" ? 16 : 32;
  const perLane = K / perUnit / S;
  const out: SgTuning[] = [];
  const rowsSet = wt === "f16" ? [1, 2, 4] : [2, 4, 8];
  const unrolls = [1, 2, 4, 8].filter((u) => perLane % u === 0 && (wt === "f16" || u <= 4));
  for (const rows of rowsSet) {
    for (const unroll of unrolls) {
      if (wt !== "f16" && rows * unroll > 16) continue;
      for (const groups of [0, 512]) {
        if (wt === "f16") out.push({ rows, unroll, wg: 256, groups });
        else {for (const dp4 of gpu.hasDp4 ? [false, true] : [false]) {
            out.push({ rows, unroll, wg: 256, groups, dp4 });
          }}
      }
    }
  }
  return out;
}

/**
 * --k --sweep, the multi-token GEMV's direct mode: rows (R x T <= 32 sums a lane, paired rows counting
 * twice) x splitK x unroll (RR x U <= 16 loads in flight) at 256 threads, every split having a chunk, and
 * each splitK at 1024 threads with the default's rows and unroll.
 */
function multiDirectTunings(
  K: number,
  N: number,
  T: number,
  wt: Wt,
  S: number,
  pairs: boolean,
): MultiTuning[] {
  const perLane = Math.ceil(K / (wt === "f16" ? 8 : 4) / S);
  const def = multiDirectTuning(K, N, T, wt, S, pairs);
  const out: MultiTuning[] = [];
  const ok = (rows: number, splitK: number, unroll: number) =>
    (!pairs || rows <= 4) && (pairs ? 2 : 1) * rows * T <= 32 && (pairs ? 2 : 1) * rows * unroll <= 16 &&
    Math.ceil(perLane / unroll) >= splitK;
  for (const rows of [1, 2, 4, 8]) {
    for (const splitK of [1, 2, 4, 8]) {
      for (const unroll of [1, 2, 4]) {
        if (ok(rows, splitK, unroll)) out.push({ rows, wg: 256, direct: true, splitK, unroll });
      }
    }
  }
  for (const splitK of [1, 2, 4, 8]) {
    if (ok(def.rows, splitK, def.unroll ?? 1)) out.push({ ...def, wg: 1024, splitK });
  }
  return out;
}

/** --direct: rows x splitK x workgroup x unroll, every split having at least one chunk (U x S units). */
function directTunings(K: number, S: number): SgTuning[] {
  const perLane = K / 8 / S;
  const out: SgTuning[] = [];
  for (const rows of [1, 2, 4]) {
    for (const splitK of [1, 2, 4, 8]) {
      for (const unroll of [1, 2, 4, 8]) {
        if (perLane % unroll !== 0 || perLane / unroll < splitK || rows * unroll > 16) continue;
        for (const warps of new Set([Math.max(splitK, 4), Math.max(2 * splitK, 8)])) {
          out.push({ rows, unroll, wg: warps * S, groups: 0, direct: true, splitK });
        }
      }
    }
  }
  return out;
}

const name = (t: SgTuning) =>
  `sg_r${t.rows}u${t.unroll}w${t.wg}g${t.groups}${t.dp4 ? "d" : ""}${t.prefetch ? "p" : ""}${
    t.deferNorm ? "n" : ""
  }`;

/** --prologue: each swept tuning also with prefetch, deferNorm (RMSNorm cases) and both. */
function withPrologues(ts: SgTuning[], f: InputTransform): SgTuning[] {
  if (!values.prologue) return ts;
  const pro = f === "rmsnorm"
    ? [{}, { prefetch: true }, { deferNorm: true }, { prefetch: true, deferNorm: true }]
    : [{}, { prefetch: true }];
  return ts.flatMap((t) => pro.map((p) => ({ ...t, ...p })));
}

for (const wt of values.weights!.split(",") as Wt[]) {
  if (wt === "f16" && !gpu.hasF16) continue;
  for (const c of cases) {
    const { N, K, f } = c;
    const pairs = c.pairs === true;
    // The matrix's rows (paired: gate and up).
    const MR = pairs ? 2 * N : N;
    const bytes = bytesOf(MR, K, wt);
    // Buffers sized for f16 hold the quantised layouts too; their bytes decode to finite weights.
    const alloc = MR * K * 2;
    const copies = values.copies
      ? Number(values.copies)
      : quick
      ? 1
      : Math.max(1, Math.min(16, Math.ceil(256e6 / alloc)));
    const ws = Array.from({ length: copies }, () => storageBuffer(gpu, alloc));
    for (const w of ws) {
      // Random-ish contents: zeros can run faster than real data (device METHOD.md).
      gpu.device.queue.writeBuffer(
        w,
        0,
        new Uint16Array(alloc / 2).map((_, i) => 0x3000 + (i * 2654435761 >>> 22)),
      );
    }
    const width = f === "silu_mul" ? 2 * K : K;
    const x = storageBuffer(gpu, maxT * width * 4),
      y = storageBuffer(gpu, maxT * N * 4),
      nw = storageBuffer(gpu, K * 2);
    const call = (w: GPUBuffer, tuning?: Parameters<typeof gemvFusedCall>[2]["tuning"]): KernelCall =>
      gemvFusedCall(gpu, { x, w, y, normWeight: nw }, {
        K,
        N,
        T: 1,
        weights: wt,
        transform: f,
        eps: 1e-5,
        tuning,
        pairs,
      });
    const rows: Record<string, number> = {};
    const variants: [string, KernelCall[]][] = [];
    // Each variant is timed in two passes over all of them (the best kept), so none is measured only
    // while the clocks ramp or after an idle gap.
    // --only: time just the named variants (each builds its pipeline, which is most of a sweep's time at the
    // LM head's shape).
    const only = values.only?.split(",");
    const time = (label: string, make: (w: GPUBuffer) => KernelCall) => {
      if (!only || only.includes(label)) variants.push([label, ws.map(make)]);
    };
    // The H200 idles at 345 MHz and ramps up under load: ~0.4 s of this shape's work first.
    if (!quick) {
      // (Paired: the default kernel; the team kernel does not pair.)
      const warm = ws.map((w) => call(w, pairs ? undefined : { team: 64, rows: 1 }));
      for (let spent = 0; spent < 400;) spent += (await gpuMs(gpu, warm, 20)) * 20;
    }
    if (!values["no-single"] && !directOnly && !pairs) time("team", (w) => call(w, defaultTuning(K, N)));
    const S = gpu.subgroupSize;
    for (const T of kList) {
      const multi = (w: GPUBuffer, t?: MultiTuning) =>
        gemvFusedCall(gpu, { x, w, y, normWeight: nw }, {
          K,
          N,
          T,
          weights: wt,
          transform: f,
          eps: 1e-5,
          multi: t,
          pairs,
        });
      // The default multi tuning (q4: int8 activations where WGSL has them) and, with --sweep, the grid
      // for each x staging: f32, f16 (xh) and, quantised weights, int8 (dp4).
      const quant = wt === "q8" || wt === "q4";
      const dp4 = quant && gpu.hasDp4;
      const def = multiDefaultTuning(K, N, T, wt, wt === "q4" && dp4, pairs);
      // Direct mode: f16 with no transform or RMSNorm.
      if (S && wt === "f16" && f !== "silu_mul" && T >= 2) {
        time(`k${T}_dir_default`, (w) => multi(w, multiDirectTuning(K, N, T, wt, S, pairs)));
        if (values.sweep) {
          for (const t of multiDirectTunings(K, N, T, wt, S, pairs)) {
            time(`k${T}_dir_r${t.rows}k${t.splitK}w${t.wg}u${t.unroll}`, (w) => multi(w, t));
          }
        }
      }
      if (directOnly) continue;
      time(`k${T}_default`, (w) => multi(w, def));
      time(`k${T}_default_nopf`, (w) => multi(w, { ...def, prefetch: false }));
      if (values.sweep) {
        const stages: [string, Partial<MultiTuning>][] = [["", {}], ["_xh", { xh: true }]];
        if (dp4) stages.push(["_dp4", { dp4: true }]);
        for (const [tag, st] of stages) {
          for (const rows of [1, 2, 4, 8]) {
            if (rows * T > 64 || (pairs && rows > 4)) continue;
            for (const wg of [256, 1024]) {
              time(`k${T}_r${rows}w${wg}${tag}`, (w) => multi(w, { rows, wg, ...st }));
              time(`k${T}_r${rows}w${wg}${tag}_pl`, (w) => multi(w, { rows, wg, ...st, pipeline: true }));
            }
          }
        }
      }
    }
    if (S && sgFits(gpu, K, wt) && !values["no-single"] && !directOnly) {
      const def = sgDefaultTuning(K, N, wt, S, gpu.hasDp4, pairs);
      time("sg_default", (w) => call(w, def));
      time("sg_default_pf", (w) => call(w, { ...def, prefetch: true }));
      if (f === "rmsnorm") {
        time("sg_default_dn", (w) => call(w, { ...def, deferNorm: true }));
        time("sg_default_pf_dn", (w) => call(w, { ...def, prefetch: true, deferNorm: true }));
      }
      if (wt === "f16" && f !== "silu_mul") {
        time("direct_default", (w) => call(w, sgDirectTuning(K, N, wt, S, pairs)));
        if (values.direct) {
          for (const t of directTunings(K, S).filter((t) => !pairs || t.rows <= 4)) {
            time(`dir_r${t.rows}k${t.splitK}w${t.wg}u${t.unroll}`, (w) => call(w, t));
          }
        }
      }
      if (values.sweep) {
        // Paired: rows are pairs (at most 4).
        const ts = withPrologues(sweepTunings(K, wt, S).filter((t) => !pairs || t.rows <= 4), f);
        for (const t of ts) time(name(t), (w) => call(w, t));
      }
    }
    if (variants.length === 0) {
      // (--direct-only on weights or a transform direct mode does not serve.)
      for (const b of [...ws, x, y, nw]) b.destroy();
      continue;
    }
    for (let pass = 0; pass < 2; pass++) {
      for (const [label, calls] of variants) {
        const once = await gpuMs(gpu, calls, 1);
        const reps = quick ? 1 : Math.max(2, Math.round(20 / once));
        const gbs = Number((bytes / (await gpuMs(gpu, calls, reps) / copies) / 1e6).toFixed(0));
        rows[label] = Math.max(rows[label] ?? 0, gbs);
      }
    }
    const best = Object.entries(rows).reduce((a, b) => (b[1] > a[1] ? b : a));
    console.log(JSON.stringify({
      bench: "gemv",
      adapter: gpu.adapterName,
      case: c.name,
      weights: wt,
      N,
      K,
      transform: f,
      pairs,
      copies,
      gb_s: rows,
      best: best[0],
      best_gb_s: best[1],
    }));
    for (const w of ws) w.destroy();
    for (const b of [x, y, nw]) b.destroy();
  }
}
