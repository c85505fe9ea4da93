// o_proj folded into the decode attention (attention_decode.ts's `oProj`): the kernel that finishes a head's
// output (the attention itself, or with flash-decoding splits the combine) also multiplies it by that head's
// columns of o_proj, so the step needs no o_proj dispatch. Split K by head:
//   y[t, n] += sum over heads h of  W_o[n, h hd .. (h + 1) hd) . out[t, h]
// Workgroup (h, r) of a grid of heads x R (R "row splits", each workgroup of a head computing the same head
// output; only r = 0 writes the KV cache) owns rows [r N / R, (r + 1) N / R) of its head's columns. Its
// weight loads are issued when the kernel starts (they do not depend on the attention), so their DRAM latency
// hides behind it; each thread holds its rows' units in registers. Partial sums meet as moe_fused.ts's do:
// two integer atomicAdds an output into a per-token fixed-point accumulator (whole units, and the remainder
// in units of 2^-LO), exact and the same in any order, so deterministic. The last of the heads' workgroups
// of a row split to finish (a storage barrier and an atomic count a token and split) adds the accumulator's
// rows into the residual, zeroes them for the next layer and, with `copy`, writes those rows' blocks of the
// int8 input copy of the RMSNorm GEMV after it (the MLP's gate/up), as o_proj's own copy does (gemv_fused.ts
// normCopyFor). One fold for all N rows took ~3.7 us a layer on the H200; split R ways, each fold is 1 / R of
// that and they run side by side. With `earlyTail` the fold's own loads (its residual rows, the copy's norm
// weights) are issued with the weights', so the last workgroup's tail waits on no DRAM load either.
import type { Gpu, WeightType } from "./gpu.ts";
import { isQuant, quantScaleWord, type QuantType } from "./quant.ts";
import {
  int8CopyBindingsWgsl,
  int8CopyTailWgsl,
  normWeightOf,
  normWeightVec4,
  QUANT_CODES_WGSL,
} from "./wgsl.ts";

/** o_proj's shape and storage, and the copy its fold writes (attentionDecodeCalls' `oProj`). */
export interface OProjDims {
  heads: number;
  headDim: number;
  /** o_proj's output rows (the hidden size). */
  N: number;
  weights: WeightType | QuantType;
  /** Workgroups per head, each a share of the rows (default oProjRowSplits). */
  rowSplits?: number;
  /**
   * The int8 input copy of the next RMSNorm GEMV (gemv_fused.ts int8CopyFor: its weight layout, each block
   * of 32's sum of squares) and its norm weights' storage.
   */
  copy?: { weights: QuantType; norm: WeightType };
  /**
   * The fold's own loads issued at the kernel's start too: the residual rows a thread folds and, with
   * `copy`, its block's norm weights, so that the last workgroup's tail waits on no DRAM load (neither
   * changes during the kernel: only the fold writes the residual, each row once). Default false here;
   * attentionDecodeCalls turns it on with a copy (gpu.tuning.attentionOEarlyTail). H100, Llama-1B q4 step
   * (docs/BENCHMARKS.md, the forty-first session): 0.639 ms at 128 keys against 0.659-0.663, 0.832 at
   * 8,192 against 0.837-0.842.
   */
  earlyTail?: boolean;
}

/** Weights a 16-byte unit holds. */
function perUnit(wt: WeightType | QuantType): number {
  return wt === "q4" ? 32 : wt === "q8" ? 16 : wt === "f16" ? 8 : 4;
}

/** The most 16-byte weight units a thread holds through the attention (its registers). */
const UNITS_HELD = 8;

/** Whether R row splits cut o_proj's rows into equal shares of whole vec4s (of whole blocks of 32 with a copy). */
export function oProjSplitFits(d: OProjDims, R: number): boolean {
  const unit = d.copy ? 32 : 4;
  return Number.isInteger(R) && R >= 1 && d.N % (R * unit) === 0;
}

/**
 * Row splits by default: the fewest (a power of 2, at most 16) that give a thread at most one row to fold at
 * WG threads a workgroup and at most UNITS_HELD weight units to hold, among those oProjSplitFits allows.
 * H200, Llama-1B q4 step (256 threads, docs/BENCHMARKS.md, the twenty-fourth session): 4 / 8 (the default) /
 * 16 splits 0.601-0.607 / 0.597-0.599 / 0.671 ms, against 0.643-0.644 with the o_proj GEMV.
 */
export function oProjRowSplits(d: OProjDims, WG: number): number {
  const units = d.headDim / perUnit(d.weights);
  let best = 1;
  for (let R = 1; R <= 16; R *= 2) {
    if (!oProjSplitFits(d, R)) continue;
    best = R;
    if (d.N / R <= WG && Math.ceil(d.N / R / WG) * units <= UNITS_HELD) break;
  }
  return best;
}

/** Whether o_proj can be folded into the decode attention: head_dim a multiple of 32, N of 4 (of 32 with copy). */
export function oProjFits(gpu: Gpu, d: OProjDims): boolean {
  return gpu.subgroupSize !== null && d.headDim % 32 === 0 && d.N % 4 === 0 && (!d.copy || d.N % 32 === 0);
}

/** Bytes of the accumulator and counters of T tokens. */
export function oProjScratchBytes(T: number, N: number, R: number): { acc: number; count: number } {
  return { acc: T * 2 * N * 4, count: T * R * 4 };
}

/** Workgroup memory the fold adds (the new residual row, kept for the copy). */
export function oProjSharedBytes(d: OProjDims, R = 1): number {
  return (d.copy ? (d.N / R) * 4 : 0) + 16;
}

/**
 * The WGSL pieces the host kernel splices in: `decls` (bindings from `first`, the fold's workgroup memory,
 * helpers), `prefetch` (at the top of main, after `h`, `orow`, `tok` and `tid` are named: the thread's
 * weight units into registers) and `tail` (in uniform control flow after a barrier that publishes the head's
 * output, vec4 k of it at `osAt(k)`).
 */
export function oProjWgsl(
  d: OProjDims,
  o: { first: number; WG: number; osAt: (k: string) => string },
): { decls: string; prefetch: string; tail: string } {
  const { heads: NH, headDim: HD, N, weights: wt } = d;
  const K = NH * HD;
  const R = d.rowSplits ?? oProjRowSplits(d, o.WG);
  if (!oProjSplitFits(d, R)) {
    throw new RangeError(`o_proj row splits ${R} do not divide ${N} rows in whole blocks`);
  }
  const RN = N / R; // rows of a workgroup
  const RPT = Math.ceil(RN / o.WG); // rows of a thread
  const PU = perUnit(wt);
  const UH = HD / PU; // units of a row's head slice
  const LO = Math.min(24, 30 - Math.ceil(Math.log2(Math.max(2, NH))));
  const rows = Array.from({ length: RPT }, (_, i) => i);
  const units = Array.from({ length: UH }, (_, u) => u);
  const quant = isQuant(wt);
  const soff = quant ? quantScaleWord(N, K, wt) : 0;
  // Unit u of row n's head slice, and (quantised) its group's bf16 scale.
  const unitAt = (n: string, u: number) => `(${n}) * ${K / PU}u + h * ${UH}u + ${u}u`;
  const groupOf = (n: string, u: number) =>
    wt === "q4"
      ? `(${n}) * ${K / 32}u + h * ${HD / 32}u + ${u}u`
      : `(${n}) * ${K / 32}u + h * ${HD / 32}u + ${u >> 1}u`;
  const prefetch = rows.flatMap((i) => [
    `let on${i} = orow * ${RN}u + min(tid + ${i * o.WG}u, ${RN - 1}u);`,
    ...units.flatMap((u) => [
      `let ow${i}_${u} = Wo[${unitAt(`on${i}`, u)}];`,
      ...(quant ? [`let osc${i}_${u} = wo_scale(${groupOf(`on${i}`, u)});`] : []),
    ]),
  ]).join("\n  ");
  // A unit's dot product with the head output's elements u PU .. (u + 1) PU.
  const unitDot = (w: string, u: number): string => {
    const v = (k: number) => o.osAt(`${(u * PU) / 4 + k}u`);
    const c = ["x", "y", "z", "w"];
    if (wt === "q4") {
      return c.map((x, i) =>
        `dot(q4s(${w}.${x}, 0u), ${v(2 * i)}) + dot(q4s(${w}.${x}, 16u), ${v(2 * i + 1)})`
      )
        .join(" + ");
    }
    if (wt === "q8") return c.map((x, i) => `dot(q8v(${w}.${x}), ${v(i)})`).join(" + ");
    if (wt === "f16") {
      return [0, 1].map((i) =>
        `dot(vec4<f32>(unpack2x16float(${w}.${c[2 * i]}), unpack2x16float(${w}.${c[2 * i + 1]})), ${v(i)})`
      ).join(" + ");
    }
    return `dot(bitcast<vec4<f32>>(${w}), ${v(0)})`;
  };
  const copy = d.copy;
  const FT = Array.from({ length: Math.ceil(RN / o.WG) }, (_, j) => j); // rows a thread folds
  // A thread's rows to fold (j) and, with the copy, its block's norm weights (the copy's block b = tid).
  const foldRow = (j: number) =>
    `let fl${j} = min(tid + ${j * o.WG}u, ${RN - 1}u);
    let fi${j} = orow * ${RN}u + fl${j};
    let fy${j} = oy[tok * ${N}u + fi${j}];`;
  const early = d.earlyTail === true;
  const earlyNorm = early && copy !== undefined && RN / 32 <= o.WG;
  const earlyLoads = !early ? "" : `
  ${FT.map(foldRow).join("\n  ")}${
    earlyNorm
      ? `\n  let ncg = orow * ${RN / 32}u + min(tid, ${RN / 32 - 1}u);\n  ` +
        Array.from({ length: 8 }, (_, i) => `let onp${i} = onw[8u * ncg + ${i}u];`).join("\n  ")
      : ""
  }`;
  const blockSsq = (cb: string) =>
    Array.from({ length: 8 }, (_, i) => `dot(oyf[8u * ${cb} + ${i}u], oyf[8u * ${cb} + ${i}u])`).join(" + ");
  // The split's blocks of 32 (cb local, cg in the row).
  const copyTail = !copy ? "" : `
    workgroupBarrier();${
    int8CopyTailWgsl(copy.weights, {
      K: N,
      row0: "tok",
      rows: "1u",
      blocks: `${RN / 32}u`,
      gb0: `orow * ${RN / 32}u`,
      vec4At: (i) =>
        `oyf[8u * cb + ${i}u] * ${
          earlyNorm ? normWeightOf(copy.norm, `onp${i}`) : normWeightVec4(copy.norm, `8u * cg + ${i}u`, "onw")
        }`,
      WG: `${o.WG}u`,
      prelude: `ossq[tok * ${N / 32}u + cg] = ${blockSsq("cb")};`,
    })
  }`;
  const tail = `
  // o_proj: this head's columns times its output, for the workgroup's rows, into the accumulator.
  ${
    rows.map((i) =>
      `if (tid + ${i * o.WG}u < ${RN}u) {
    let v = ${
        units.map((u) => `${quant ? `osc${i}_${u} * ` : ""}(${unitDot(`ow${i}_${u}`, u)})`).join(" + ")
      };
    let whole = i32(round(v));
    atomicAdd(&oacc[tok * ${2 * N}u + on${i}], whole);
    atomicAdd(&oacc[tok * ${2 * N}u + ${N}u + on${i}], i32(round((v - f32(whole)) * ${2 ** LO}.0)));
  }`
    ).join("\n  ")
  }
  // The last of the heads to finish this row split folds its rows.
  storageBarrier();
  if (tid == 0u) {
    let last = atomicAdd(&ocnt[tok * ${R}u + orow], 1u) == ${NH - 1}u;
    if (last) { atomicStore(&ocnt[tok * ${R}u + orow], 0u); }
    oarrived = select(0u, 1u, last);
  }
  if (workgroupUniformLoad(&oarrived) != 0u) {
    storageBarrier();
    // Every load of the thread's rows before any store (atomics are not reordered past each other: in a
    // loop each row would wait an L2 round trip).
    ${
    FT.map((j) =>
      `${early ? "" : `${foldRow(j)}\n    `}let fa${j} = atomicLoad(&oacc[tok * ${2 * N}u + fi${j}]);
    let fb${j} = atomicLoad(&oacc[tok * ${2 * N}u + ${N}u + fi${j}]);`
    ).join("\n    ")
  }
    ${
    FT.map((j) =>
      `if (tid + ${j * o.WG}u < ${RN}u) {
      atomicStore(&oacc[tok * ${2 * N}u + fi${j}], 0);
      atomicStore(&oacc[tok * ${2 * N}u + ${N}u + fi${j}], 0);
      let v = fy${j} + f32(fa${j}) + f32(fb${j}) * ${2 ** -LO};
      oy[tok * ${N}u + fi${j}] = v;${copy ? `\n      oyf[fl${j} / 4u][fl${j} % 4u] = v;` : ""}
    }`
    ).join("\n    ")
  }${copyTail}
  }`;
  let b = o.first;
  const decls = [
    `@group(0) @binding(${b++}) var<storage, read> Wo: array<vec4<u32>>;`,
    `@group(0) @binding(${b++}) var<storage, read_write> oacc: array<atomic<i32>>;`,
    `@group(0) @binding(${b++}) var<storage, read_write> ocnt: array<atomic<u32>>;`,
    `@group(0) @binding(${b++}) var<storage, read_write> oy: array<f32>;`,
  ];
  if (copy) {
    // The copy's words and scales, its norm weights and its blocks' sums of squares.
    decls.push(int8CopyBindingsWgsl(b));
    b += 2;
    decls.push(
      `@group(0) @binding(${b++}) var<storage, read> onw: array<${
        copy.norm === "f16" ? "vec2<u32>" : "vec4<f32>"
      }>;`,
      `@group(0) @binding(${b++}) var<storage, read_write> ossq: array<f32>;`,
      `var<workgroup> oyf: array<vec4<f32>, ${RN / 4}>;`,
    );
  }
  decls.push("var<workgroup> oarrived: u32;");
  if (quant) {
    decls.push(
      QUANT_CODES_WGSL,
      `fn wo_scale(g: u32) -> f32 {
  let sw = Wo[${soff / 4}u + g / 8u][(g / 2u) % 4u];
  return bitcast<f32>(select(sw << 16u, sw & 0xffff0000u, (g & 1u) == 1u));
}`,
    );
  }
  return { decls: decls.join("\n"), prefetch: prefetch + earlyLoads, tail };
}
