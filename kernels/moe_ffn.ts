// A whole mixture-of-experts FFN block as kernel calls, and its CPU reference. Given the normalised hidden
// state xn [T, H] (post_attention_layernorm's output) it adds the block's output into the residual stream:
//   logits = xn @ router^T                              [T, E]      matmul.ts (f32 out)
//   ids, w = route(logits)                              [T, k]      moe_router.ts
//   gu[t, j] = gate_up[ids[t, j]] @ xn[t]               [T, k, 2I]  moe_gemv.ts, output "slots"
//   y[t] += sum_j w[t, j] * down[ids[t, j]] @ silu_mul(gu[t, j])    moe_gemv.ts, "silu_mul" + "combine"
//   y[t] += shared_down @ silu_mul(shared_gate_up @ xn[t])         (deepseek_v3 / kimi_k2 shared experts)
// Expert stacks are [E, 2I, H] (gate rows then up rows per expert) and [E, H, I]; the shared expert is an
// ordinary MLP with intermediate n_shared_experts * moe_intermediate_size.
import {
  gemvFusedCalls,
  type GemvFusedDims,
  gemvFusedFits,
  type GemvTuning,
  int8CopyBuffers,
  type Int8CopyOut,
  int8NormCopyOutFits,
} from "./gemv_fused.ts";
import { type Gpu, type KernelCall, storageBuffer, type WeightType } from "./gpu.ts";
import { GEMV_MAX_T, matmulCall, type MatmulDims, matmulRef } from "./matmul.ts";
import { prefillLinearCalls } from "./gemm.ts";
import { GEMV_MULTI_MAX_T, gemvInt8InputCall } from "./gemv_multi.ts";
import { int8TileFits } from "./matmul_int8.ts";
import { moeGemvCall, moeGemvFits } from "./moe_gemv.ts";
import { moeRouterGemvCall, moeSgCall, type MoeSgDims, moeSgFits } from "./moe_sg.ts";
import {
  moeFusedCall,
  type MoeFusedDims,
  moeFusedFits,
  moeFusedRows,
  moeFusedScratchBytes,
} from "./moe_fused.ts";
import { moeCombineCall, moeGroupCall, moeGroupedMatmulCall, moeMaxTiles } from "./moe_grouped.ts";
import { checkRouting, moeRouterCall, moeRouterRef, type MoeRouting } from "./moe_router.ts";
import { isQuant, quantFits, type QuantType } from "./quant.ts";
import { siluMulCall } from "./silu_mul.ts";

type Storage = WeightType | QuantType;

export interface MoeFfnDims {
  /** Hidden size H. */
  hidden: number;
  /** Each routed expert's intermediate size I (moe_intermediate_size; mixtral: intermediate_size). */
  intermediate: number;
  /** The shared expert's intermediate size (n_shared_experts * moe_intermediate_size); 0 or absent: none. */
  sharedIntermediate?: number;
  /** Tokens in the step (<= the scratch's T). */
  T: number;
  routing: MoeRouting;
  /** Storage of each matrix (shared ones only with a shared expert). */
  weights: { router: Storage; gateUp: Storage; down: Storage; sharedGateUp?: Storage; sharedDown?: Storage };
  /** Team shapes of the expert GEMVs (default: by row length). */
  tuning?: { gateUp?: GemvTuning; down?: GemvTuning };
  /**
   * Tokens grouped by expert (moe_grouped.ts: each expert's weights read once per 16 of its tokens) instead
   * of a GEMV per token and slot. Default: T > GEMV_MAX_T (prefill).
   */
  grouped?: boolean;
  /**
   * The down stack is stored in column blocks of this many columns (convert.ts packColumnBlocksCall; the
   * loader does it where moeFusedPlan applies); absent: row-major [E, H, I].
   */
  downBlock?: number;
  /**
   * false: only the router (ids and weights left in the scratch) and the shared expert; the routed experts
   * run elsewhere (expert parallelism: models/experts.ts) and their sum is added into y later. Default true.
   */
  routed?: boolean;
}

/** Activations of a MoE block for up to T tokens (one set can serve every layer of a sequence). */
export interface MoeScratch {
  /** Router logits, f32 [T, E]. */
  logits: GPUBuffer;
  /** Chosen experts, u32 [T, k]. */
  ids: GPUBuffer;
  /** Their weights, f32 [T, k]. */
  routeWeights: GPUBuffer;
  /** Gate/up outputs per slot, f32 [T, k, 2I]. */
  gu: GPUBuffer;
  /** The grouped path's: slots by expert (u32 [T * k]), tiles (vec4<u32> each) and down outputs [T, k, H]. */
  order: GPUBuffer;
  tiles: GPUBuffer;
  down: GPUBuffer;
  /**
   * The grouped path's int8 inputs (moe_grouped.ts with int8): the words of xn's T rows for gate_up, then of
   * silu_mul(gu)'s T * k rows for down, in the same buffer ([max(T H, T k I)] bytes), and their (scale,
   * scale * sum q) pairs.
   */
  groupedQ: GPUBuffer;
  groupedQs: GPUBuffer;
  /**
   * The decode path's normalised input from the router GEMV (MoeTuning.xn): f32 [T, H], or its int8
   * words in the same bytes and their (scale, scale * sum) [T, H / 32] in xnScales.
   */
  xn: GPUBuffer;
  xnScales: GPUBuffer;
  /** The fused expert MLP's (moe_fused.ts) fixed-point accumulator, i32 [T, 2, H], and counts, u32 [T]; zeroed. */
  acc: GPUBuffer;
  count: GPUBuffer;
  /** The shared expert's gate/up output [T, 2Is] and silu_mul of it [T, Is] (absent without one). */
  sharedGu?: GPUBuffer;
  sharedAct?: GPUBuffer;
}

export function createMoeScratch(
  gpu: Gpu,
  d: { T: number; hidden: number; intermediate: number; sharedIntermediate?: number; routing: MoeRouting },
): MoeScratch {
  const { experts: E, topK: k } = checkRouting(d.routing);
  const Is = d.sharedIntermediate ?? 0;
  const fused = moeFusedScratchBytes(d.T, d.hidden);
  return {
    logits: storageBuffer(gpu, d.T * E * 4, "moe logits"),
    ...createMoeRoutedScratch(gpu, { ...d, topK: k, experts: E }),
    xn: storageBuffer(gpu, d.T * d.hidden * 4, "moe normalised x"),
    xnScales: storageBuffer(gpu, d.T * Math.ceil(d.hidden / 32) * 8, "moe normalised x scales"),
    acc: storageBuffer(gpu, fused.acc, "moe fused accumulator"),
    count: storageBuffer(gpu, fused.count, "moe fused counts"),
    ...(Is > 0
      ? {
        sharedGu: storageBuffer(gpu, d.T * 2 * Is * 4, "moe shared gate/up"),
        sharedAct: storageBuffer(gpu, d.T * Is * 4, "moe shared act"),
      }
      : {}),
  };
}

/** What moeRoutedCalls needs for up to T tokens (the part of a MoeScratch an expert host keeps). */
export function createMoeRoutedScratch(
  gpu: Gpu,
  d: { T: number; hidden: number; intermediate: number; topK: number; experts: number },
): MoeRoutedScratch {
  const { T, topK: k } = d;
  const groupedQ = Math.max(T * d.hidden, T * k * d.intermediate);
  return {
    ids: storageBuffer(gpu, T * k * 4, "moe ids"),
    routeWeights: storageBuffer(gpu, T * k * 4, "moe route weights"),
    gu: storageBuffer(gpu, T * k * 2 * d.intermediate * 4, "moe gate/up"),
    order: storageBuffer(gpu, T * k * 4, "moe order"),
    tiles: storageBuffer(gpu, moeMaxTiles(T, k, d.experts) * 16, "moe tiles"),
    down: storageBuffer(gpu, T * k * d.hidden * 4, "moe down"),
    groupedQ: storageBuffer(gpu, Math.ceil(groupedQ / 4) * 4, "moe grouped int8 x"),
    groupedQs: storageBuffer(gpu, Math.ceil(groupedQ / 32) * 8, "moe grouped int8 x scales"),
  };
}

export interface MoeFfnBuffers {
  /** The normalised input, f32 [T, H]. */
  x: GPUBuffer;
  /** The residual stream, f32 [T, H]: the block's output is added into it. */
  y: GPUBuffer;
  /** Router weight [E, H] (the `gate` linear); bias: e_score_correction_bias, f32 [E]. */
  router: GPUBuffer;
  bias?: GPUBuffer;
  /** Expert stacks: [E, 2I, H] and [E, H, I] (absent with `routed: false`). */
  gateUp?: GPUBuffer;
  down?: GPUBuffer;
  /** Shared expert: [2Is, H] (gate rows, then up rows) and [H, Is]. */
  sharedGateUp?: GPUBuffer;
  sharedDown?: GPUBuffer;
  scratch: MoeScratch;
}

/**
 * A dense linear layer of the block (the router, a shared expert's): the GEMV family for steps of up to
 * GEMV_MULTI_MAX_T tokens, the prefill GEMM above (multiplying in f32: f16's roundings of the router's
 * input or of a residual would move tokens to other experts). matmul.ts's 16 x 16 tiled kernel took 0.15
 * ms a layer for Qwen3-30B-A3B's router whatever the prompt (H100).
 */
function linearCalls(
  gpu: Gpu,
  bufs: { x: GPUBuffer; w: GPUBuffer; y: GPUBuffer },
  d: MatmulDims,
): KernelCall[] {
  if (d.T <= GEMV_MULTI_MAX_T) return [matmulCall(gpu, bufs, d)];
  return prefillLinearCalls(gpu, bufs, { ...d, f16Math: false });
}

/**
 * The calls of one MoE FFN block, in order: 4 dispatches per token and slot (decode), 6 grouped (prefill);
 * 2 or 3 more with a shared expert.
 */
export function moeFfnCalls(gpu: Gpu, b: MoeFfnBuffers, d: MoeFfnDims): KernelCall[] {
  const r = checkRouting(d.routing);
  const { hidden: H, intermediate: I, T } = d;
  const Is = d.sharedIntermediate ?? 0;
  const s = b.scratch;
  const calls = [
    ...linearCalls(gpu, { x: b.x, w: b.router, y: s.logits }, {
      K: H,
      N: r.experts,
      T,
      weights: d.weights.router,
    }),
    moeRouterCall(gpu, { logits: s.logits, ids: s.ids, routeWeights: s.routeWeights, bias: b.bias }, {
      ...r,
      T,
    }),
  ];
  if (d.routed !== false) {
    if (!b.gateUp || !b.down) throw new TypeError("routed experts need the gateUp and down stacks");
    calls.push(...moeRoutedCalls(gpu, { scratch: s, x: b.x, y: b.y, gateUp: b.gateUp, down: b.down }, {
      hidden: H,
      intermediate: I,
      T,
      topK: r.topK,
      experts: r.experts,
      weights: { gateUp: d.weights.gateUp, down: d.weights.down },
      grouped: d.grouped,
      downBlock: d.downBlock,
      tuning: d.tuning,
      accumulate: true,
    }));
  }
  // (else the routed experts run elsewhere: expert parallelism, models/experts.ts)
  if (Is > 0) {
    const { sharedGateUp, sharedDown } = b;
    const gt = d.weights.sharedGateUp;
    const dt = d.weights.sharedDown;
    if (!sharedGateUp || !sharedDown || !gt || !dt || !s.sharedGu || !s.sharedAct) {
      throw new TypeError(
        "sharedIntermediate > 0 needs sharedGateUp / sharedDown buffers, weights and scratch",
      );
    }
    const gu = s.sharedGu;
    calls.push(...linearCalls(gpu, { x: b.x, w: sharedGateUp, y: gu }, { K: H, N: 2 * Is, T, weights: gt }));
    const down = { K: Is, N: H, T, accumulate: true, weights: dt };
    if (T <= GEMV_MAX_T && gemvFusedFits(Is) && (!isQuant(dt) || quantFits(Is))) {
      calls.push(
        ...gemvFusedCalls(gpu, { x: gu, w: sharedDown, y: b.y }, { ...down, transform: "silu_mul" }),
      );
    } else {
      calls.push(
        siluMulCall(gpu, { gu, a: s.sharedAct }, { intermediate: Is, T }),
        ...linearCalls(gpu, { x: s.sharedAct, w: sharedDown, y: b.y }, down),
      );
    }
  }
  return calls;
}

/** The scratch the routed experts' calls use (MoeScratch's fields of those names). */
export type MoeRoutedScratch = Pick<
  MoeScratch,
  "ids" | "routeWeights" | "gu" | "order" | "tiles" | "down" | "groupedQ" | "groupedQs"
>;

/**
 * The routed experts of a MoE block given its routing (`ids` and `routeWeights` [T, topK] in the scratch):
 *   y[t] (+)= sum over slots j with ids[t, j] < experts of routeWeights[t, j] * expert_ids[t, j](x[t])
 * over stacks [experts, 2I, H] and [experts, H, I]. Grouped by expert (moe_grouped.ts, the prefill path,
 * 4 dispatches; 6 on int8 inputs) or a GEMV per token and slot (moe_gemv.ts, 2). Ids at or past `experts`
 * are slots held elsewhere (expert parallelism: models/experts.ts writes 0xffffffff and weight 0 there):
 * both paths skip them. moeFfnCalls runs it after the router; an expert host runs it alone.
 */
export function moeRoutedCalls(
  gpu: Gpu,
  b: { scratch: MoeRoutedScratch; x: GPUBuffer; y: GPUBuffer; gateUp: GPUBuffer; down: GPUBuffer },
  d: {
    hidden: number;
    intermediate: number;
    T: number;
    topK: number;
    /** Experts in the stacks. */
    experts: number;
    weights: { gateUp: Storage; down: Storage };
    /** Default: T > GEMV_MAX_T (MoeFfnDims.grouped). */
    grouped?: boolean;
    downBlock?: number;
    tuning?: MoeFfnDims["tuning"];
    /** Add into y (the residual); else y is the experts' sum. */
    accumulate: boolean;
  },
): KernelCall[] {
  const { hidden: H, intermediate: I, T } = d;
  const experts = { T, topK: d.topK, experts: d.experts };
  const s = b.scratch;
  // down reads each slot's silu(gate) * up row.
  const downDims = {
    ...experts,
    K: I,
    N: H,
    weights: d.weights.down,
    input: "slot" as const,
    transform: "silu_mul" as const,
  };
  if (d.grouped ?? T > GEMV_MAX_T) {
    const { order, tiles } = s;
    // Each grouped matmul of q8 / q4 experts reads its input rows as int8, quantised once by a pass before it.
    const dp4 = moeSwitches(gpu).dp4;
    const int8 = { xq: s.groupedQ, xqs: s.groupedQs };
    const int8Pass = (wt: Storage, x: GPUBuffer, rows: number, K: number, transform: "none" | "silu_mul") =>
      dp4 && int8TileFits(gpu, wt)
        ? [gemvInt8InputCall(gpu, { x, out: int8 }, { K, T: rows, wt, transform, normWeights: "f32" }).call]
        : [];
    const gateUpPass = int8Pass(d.weights.gateUp, b.x, T, H, "none");
    const downPass = int8Pass(d.weights.down, s.gu, T * d.topK, I, "silu_mul");
    return [
      moeGroupCall(gpu, { ids: s.ids, order, tiles }, experts),
      ...gateUpPass,
      moeGroupedMatmulCall(gpu, {
        x: b.x,
        w: b.gateUp,
        y: s.gu,
        order,
        tiles,
        int8: gateUpPass.length ? int8 : undefined,
      }, {
        ...experts,
        K: H,
        N: 2 * I,
        weights: d.weights.gateUp,
      }),
      ...downPass,
      moeGroupedMatmulCall(gpu, {
        x: s.gu,
        w: b.down,
        y: s.down,
        order,
        tiles,
        int8: downPass.length ? int8 : undefined,
      }, { ...downDims, columnBlock: d.downBlock }),
      moeCombineCall(gpu, { src: s.down, routeWeights: s.routeWeights, y: b.y }, {
        N: H,
        T,
        topK: d.topK,
        accumulate: d.accumulate,
      }),
    ];
  }
  if (d.downBlock !== undefined) {
    throw new RangeError(
      `the down stack is packed in column blocks of ${d.downBlock} (for the fused decode kernel); steps of ` +
        `${T} tokens here take the grouped path or the fused one`,
    );
  }
  return [
    moeGemvCall(gpu, { x: b.x, w: b.gateUp, y: s.gu, ids: s.ids }, {
      ...experts,
      K: H,
      N: 2 * I,
      weights: d.weights.gateUp,
      tuning: d.tuning?.gateUp,
    }),
    moeGemvCall(gpu, { x: s.gu, w: b.down, y: b.y, ids: s.ids, routeWeights: s.routeWeights }, {
      ...downDims,
      output: "combine",
      accumulate: d.accumulate,
      tuning: d.tuning?.down,
    }),
  ];
}

/**
 * The MoE expert kernels' settings (gpu.tuning.moe; each absent field takes the default below, which the H200
 * sweep of 2026-12-01 chose: Qwen3-30B-A3B shape, q4, 8 layers, GPU ms a step; docs/BENCHMARKS.md). Read
 * when a program is built, so one process can compare them (`scripts/bench/moe.ts --tunings`); `fused` and
 * `fusedShared` are also read at load.
 */
export interface MoeTuning {
  /**
   * Output features a workgroup of the grouped prefill matmul: 64 or 128 (defaults: the float matmul's
   * MOE_GROUPED_WIDTH, the int8 one's MOE_GROUPED_INT8_TILE).
   */
  groupedWidth?: number;
  /** Quantisation groups a slice of the int8 grouped matmul stages: 1, 2 or 4 (MOE_GROUPED_INT8_TILE). */
  groupedBlocks?: number;
  /** The int8 grouped matmul loads a slice's weights into registers while the slice before is multiplied. */
  groupedPrefetch?: boolean;
  /**
   * The path: "team" (the portable kernels), "router" (the subgroup GEMVs with the router's own dispatch),
   * "unfolded" (a shared expert's own GEMVs instead of slots of moe_sg's); default the subgroup kernels.
   */
  path?: "team" | "router" | "unfolded";
  /** Rows per warp of the expert GEMVs [gate_up, down]; default [2, 1] (0.549 ms against 0.570 for [2, 2]). */
  rows?: [number, number];
  /**
   * Most workgroups of each expert GEMV [gate_up, down], their warps looping over row blocks; 0 or absent:
   * one block a warp.
   */
  groups?: [number, number];
  /**
   * false: the quantised expert GEMVs, and the grouped prefill matmul, convert weights to f32 instead of
   * multiplying int8 activations; default dp4 wherever the dense GEMVs use it (the adapter has it,
   * gpu.tuning.dp4 not false; the grouped matmul also needs subgroups, for its input pass).
   */
  dp4?: boolean;
  /**
   * [gate_up, down]: the expert GEMVs issue their first weight loads before staging their input; default
   * [false, true] (0.554 against 0.571 for neither; gate_up's ruled out: 2.2 ms).
   */
  prefetch?: [boolean, boolean];
  /**
   * The router GEMV also writes the normalised x (int8 for dp4), which gate_up stages instead of normalising
   * in every workgroup; default on (0.570 / 0.585).
   */
  xn?: boolean;
  /** gate_up writes its activations times their route weights (what down's early loads build on); default on. */
  scaled?: boolean;
  /** gate_up's routing ranks the experts a thread each instead of k rounds of reductions; default on. */
  rank?: boolean;
  /**
   * The routed experts' gate/up and down (q8 / q4 with dp4) as one dispatch (moe_fused.ts): false, or the
   * rows of h and threads a workgroup; default on with moe_fused.ts's defaults.
   */
  fused?: boolean | { rows?: number; threads?: number };
  /**
   * Blocks with a shared expert take that dispatch too (the shared expert as more slots); default off (H200,
   * DeepSeek-V2-Lite's shape q4: 2.117-2.120 ms a step at 64 x 1,024, 2.020-2.044 at 64 x 512, against
   * 2.022-2.039 for the two dispatches; twenty-first session).
   */
  fusedShared?: boolean;
}

/** gpu.tuning.moe with every default filled in (and checked: a bad value is a TypeError naming it). */
function moeSwitches(gpu: Gpu): {
  path: string | undefined;
  rows: number[];
  groups: number[];
  dp4: boolean;
  prefetch: [boolean, boolean];
  xn: boolean;
  scaled: boolean;
  rank: boolean;
  fused: { on: boolean; rows?: number; threads?: number };
  fusedShared: boolean;
} {
  const t = gpu.tuning.moe ?? {};
  const pair = (name: string, v: unknown, ok: (x: unknown) => boolean) => {
    if (v !== undefined && !(Array.isArray(v) && v.length === 2 && v.every(ok))) {
      throw new TypeError(`gpu.tuning.moe.${name} must be a pair [gate_up, down], got ${JSON.stringify(v)}`);
    }
  };
  const count = (x: unknown) => Number.isInteger(x) && (x as number) >= 0;
  pair("rows", t.rows, count);
  pair("groups", t.groups, count);
  pair("prefetch", t.prefetch, (x) => typeof x === "boolean");
  if (t.path !== undefined && !["team", "router", "unfolded"].includes(t.path)) {
    throw new TypeError(
      `gpu.tuning.moe.path must be team, router or unfolded, got ${JSON.stringify(t.path)}`,
    );
  }
  const f = t.fused ?? true;
  const fusedRows = typeof f === "object" ? f.rows : undefined;
  if (fusedRows !== undefined && !(Number.isInteger(fusedRows) && fusedRows > 0 && fusedRows % 32 === 0)) {
    throw new TypeError(`gpu.tuning.moe.fused.rows must be a multiple of 32, got ${fusedRows}`);
  }
  return {
    path: t.path,
    rows: t.rows ?? [2, 1],
    groups: t.groups ?? [],
    dp4: (t.dp4 ?? true) && gpu.hasDp4 && gpu.tuning.dp4 !== false,
    prefetch: t.prefetch ?? [false, true],
    xn: t.xn ?? true,
    scaled: t.scaled ?? true,
    rank: t.rank ?? true,
    fused: f === false
      ? { on: false }
      : f === true
      ? { on: true }
      : { on: true, rows: f.rows, threads: f.threads },
    fusedShared: t.fusedShared ?? false,
  };
}

/**
 * The fused expert kernel's shape for this block (moe_fused.ts: gate/up, SiLU, down and the combine in one
 * dispatch, its rows of h resolved), or null where decode takes the two-dispatch path: it serves q8 / q4
 * stacks of one storage multiplied with dp4 (with MoeTuning.fusedShared, a shared expert stored the same
 * way, its intermediate a multiple of the routed one's: MoeFusedDims.sharedSlots), the router GEMV writing the
 * int8 normalised x, with the default switches. The loader asks too, to pack the down stack in column blocks of its rows.
 * `copyOut`: the plan with the last workgroup also writing the next RMSNorm GEMV's int8 input copy
 * (MoeFusedDims.copyOut), or null where that does not fit.
 */
export function moeFusedPlan(
  gpu: Gpu,
  d: Omit<MoeFfnDims, "T"> & { T?: number },
  bias: boolean,
  copyOut?: MoeFusedDims["copyOut"],
  input?: MoeFusedDims["input"],
): (MoeFusedDims & { rows: number }) | null {
  const sw = moeSwitches(gpu);
  const wt = d.weights.gateUp;
  // A shared expert rides along as Is / I slots where it is stored like the routed experts (when asked:
  // MoeTuning.fusedShared; not measured faster).
  const Is = d.sharedIntermediate ?? 0;
  const sharedSlots = Is / d.intermediate;
  if (
    !sw.fused.on || sw.path !== undefined || !sw.xn || !sw.dp4 || !gpu.subgroupSize || d.routed === false ||
    !isQuant(wt) || d.weights.down !== wt || d.weights.router !== "f32" || d.hidden % 4 !== 0 ||
    (Is > 0 &&
      (!sw.fusedShared || !Number.isInteger(sharedSlots) || d.weights.sharedGateUp !== wt ||
        d.weights.sharedDown !== wt))
  ) {
    return null;
  }
  const dims: MoeFusedDims = {
    hidden: d.hidden,
    intermediate: d.intermediate,
    T: d.T ?? 1,
    routing: d.routing,
    weights: wt,
    bias,
    rows: sw.fused.rows,
    threads: sw.fused.threads,
    copyOut,
    sharedSlots,
    input,
  };
  return moeFusedFits(gpu, dims) ? { ...dims, rows: moeFusedRows(dims) } : null;
}

/** What the GEMV before a fused MoE block needs to write the block's input (moeInputCopy). */
export interface MoeInput {
  hidden: number;
  experts: number;
  /** The expert stacks' storage (the copy's int8 layout). */
  weights: QuantType;
  /** post_attention_layernorm's weights and their storage. */
  norm: GPUBuffer;
  normWeights: WeightType;
  /** The router, f32 [experts, hidden]. */
  router: GPUBuffer;
}

/**
 * The block's MoeInput where decode of T tokens runs it as the fused expert kernel reading its input from
 * the GEMV before it (moe_fused.ts input "copy": no router GEMV), else undefined. The plan is asked with a
 * copy out too, as moeDecodeCalls may make it (the layer after is not known yet), and
 * gpu.tuning.moeCopyIn false turns it off (A/B runs).
 */
export function moeInputFor(
  gpu: Gpu,
  d: Omit<MoeFfnDims, "T"> & { T: number; normWeights: WeightType },
  b: { norm: GPUBuffer; router: GPUBuffer; bias: boolean },
): MoeInput | undefined {
  const wt = d.weights.gateUp;
  if (
    gpu.tuning.moeCopyIn === false || !gpu.subgroupSize || d.T > GEMV_MAX_T || !isQuant(wt) ||
    d.hidden % 32 !== 0 ||
    !moeFusedPlan(gpu, d, b.bias, { weights: wt, norm: d.normWeights }, "copy")
  ) return undefined;
  return {
    hidden: d.hidden,
    experts: checkRouting(d.routing).experts,
    weights: wt,
    norm: b.norm,
    normWeights: d.normWeights,
    router: b.router,
  };
}

/**
 * The int8 copy of a fused MoE block's input with its router's partial logits (gemv_fused.ts Int8CopyOut
 * with `router`), for `producer` (the GEMV before the block, adding into the residual) to write, or
 * undefined where it cannot. Only by workgroups of whole blocks of 32 rows unless
 * gpu.tuning.multiInt8CopyArrive is true: copies by the last workgroup of a block (`arrive`) were slower
 * than the router GEMV (H200, Qwen3-30B-A3B q4 one-token step: 2.159 / 2.245 ms against 2.132 / 2.117, the
 * widened workgroups' 2.087 / 2.089; docs/BENCHMARKS.md, the thirtieth session). The block's fused call
 * owns the buffers (moeDecodeCalls with copyIn).
 */
export function moeInputCopy(gpu: Gpu, producer: GemvFusedDims, m: MoeInput): Int8CopyOut | undefined {
  const arrive = gpu.tuning.multiInt8CopyArrive === true;
  if (producer.N !== m.hidden || !int8NormCopyOutFits(gpu, producer, { arrive })) return undefined;
  const T = producer.T, H = m.hidden, NB = H / 32;
  return {
    ...int8CopyBuffers(gpu, T, H, true),
    weights: m.weights,
    norm: { w: m.norm, type: m.normWeights },
    router: {
      w: m.router,
      experts: m.experts,
      parts: storageBuffer(gpu, T * NB * m.experts * 4, "MoE router partials"),
    },
  };
}

/**
 * The decode path on adapters with subgroups (T <= GEMV_MAX_T): the block from the residual stream itself,
 * its RMSNorm fused into the router GEMV and the gate_up GEMV (kernels/moe_sg.ts), so no normalised copy
 * is written:
 *   router logits = rmsnorm(x) @ router^T        moe_sg.ts's router GEMV (a workgroup a row: latency)
 *   ids, w        = route(logits)                moe_router.ts's routing, inside the next kernel
 *   act           = silu(gate) * up, k slots      moe_sg gate_up (routing and norm fused)
 *   x            += sum_j w_j down_j . act_j      moe_sg down (combine fused)
 * The shared expert (deepseek_v3, kimi_k2) rides along as Is / I more slots of weight 1 when it is stored
 * like the routed experts; else it is two GEMVs more (norm fused, then down with silu_mul fused).
 * 3 dispatches, against moeFfnCalls' 4 (6 with a shared expert) plus the norm; 2 where q8 / q4 experts (a
 * shared expert stored like them with MoeTuning.fusedShared) run as one dispatch (moe_fused.ts: act = ...
 * and x += ... together, MoeTuning.fused).
 * Null when a shape does not fit the subgroup kernels (the caller then normalises and uses moeFfnCalls).
 */
export function moeDecodeCalls(
  gpu: Gpu,
  b: Omit<MoeFfnBuffers, "x" | "y"> & {
    x: GPUBuffer;
    norm: GPUBuffer;
    copyOut?: Int8CopyOut;
    /** The block's input as the GEMV before wrote it (moeInputCopy): the fused kernel, no router GEMV. */
    copyIn?: Int8CopyOut;
  },
  d: MoeFfnDims & { eps: number; normWeights: WeightType },
): KernelCall[] | null {
  const r = checkRouting(d.routing);
  const { hidden: H, intermediate: I, T } = d;
  const Is = d.sharedIntermediate ?? 0;
  const s = b.scratch;
  if (!gpu.subgroupSize || T > GEMV_MAX_T || d.routed === false || !b.gateUp || !b.down) return null;
  // MoeTuning.path (team, router, unfolded): see there.
  const { path: MOE_PATH, rows: MOE_ROWS, groups: MOE_GROUPS, dp4, prefetch, xn, scaled, rank } = moeSwitches(
    gpu,
  );
  if (MOE_PATH === "team") return null;
  if (H % 4 !== 0 || d.weights.router !== "f32") return null;
  // The routed experts in one dispatch (moe_fused.ts), after the router GEMV writes the int8 normalised x.
  const copyOut = b.copyOut && { weights: b.copyOut.weights, norm: b.copyOut.norm?.type ?? "f32" };
  const copyIn = b.copyIn;
  if (copyIn && (!copyIn.router || !copyIn.ssq)) {
    throw new TypeError("copyIn: the block's input copy needs its sums of squares and router partials");
  }
  const plan = moeFusedPlan(gpu, d, b.bias !== undefined, copyOut, copyIn ? "copy" : undefined);
  if (b.copyOut && !plan) {
    throw new RangeError("copyOut: only the fused expert kernel writes a copy (check moeFusedPlan with it)");
  }
  if (copyIn && (!plan || copyIn.weights !== plan.weights)) {
    throw new RangeError("copyIn: only the fused expert kernel reads the block's input copy (moeInputFor)");
  }
  if (d.downBlock !== undefined && plan?.rows !== d.downBlock) {
    throw new RangeError(
      `the down stack was packed in column blocks of ${d.downBlock} at load for the fused expert kernel, ` +
        `which this program would not run (${plan ? `${plan.rows} rows` : "the fused path is off"}): load ` +
        "the model again with the settings it is run with",
    );
  }
  if (plan) {
    // The block's input: the copy the GEMV before wrote (its router's partial logits and sums of squares),
    // or the router GEMV's normalised int8 x and logits.
    const input = copyIn
      ? { xn: copyIn.q, xnScales: copyIn.s, xssq: copyIn.ssq, logits: copyIn.router!.parts }
      : { xn: s.xn, xnScales: s.xnScales, logits: s.logits };
    const fused = moeFusedCall(gpu, {
      ...input,
      gateUp: b.gateUp,
      down: b.down,
      bias: b.bias,
      ids: s.ids,
      routeWeights: s.routeWeights,
      acc: s.acc,
      count: s.count,
      y: b.x,
      copy: b.copyOut,
      ...(plan.sharedSlots ? { sharedGateUp: b.sharedGateUp, sharedDown: b.sharedDown } : {}),
    }, { ...plan, T, packed: d.downBlock !== undefined, ...(copyIn ? { eps: d.eps } : {}) });
    if (copyIn) {
      // The copy the GEMV before wrote for this block is released with this call.
      fused.owned = [...(fused.owned ?? []), copyIn.q, copyIn.s, copyIn.ssq!, copyIn.router!.parts];
      return [fused];
    }
    return [
      moeRouterGemvCall(
        gpu,
        { x: b.x, router: b.router, norm: b.norm, logits: s.logits, xn: s.xn, xnScales: s.xnScales },
        { K: H, experts: r.experts, T, eps: d.eps, normWeights: d.normWeights, xn: plan.weights },
      ),
      fused,
    ];
  }
  const experts = { T, topK: r.topK, experts: r.experts };
  const gateUp: MoeSgDims = {
    kind: "gate_up",
    K: H,
    N: I,
    ...experts,
    weights: d.weights.gateUp,
    rmsnorm: { eps: d.eps, weights: d.normWeights },
    rows: MOE_ROWS[0] || undefined,
    groups: MOE_GROUPS[0] || undefined,
    dp4: dp4 && isQuant(d.weights.gateUp),
    prefetch: prefetch[0],
    route: MOE_PATH === "router" ? undefined : { routing: r, bias: b.bias !== undefined, rank },
  };
  const down: MoeSgDims = {
    kind: "down",
    K: I,
    N: H,
    ...experts,
    weights: d.weights.down,
    accumulate: true,
    rows: MOE_ROWS[1] || undefined,
    groups: MOE_GROUPS[1] || undefined,
    dp4: dp4 && isQuant(d.weights.down),
    prefetch: prefetch[1],
  };
  const sgt = d.weights.sharedGateUp, sdt = d.weights.sharedDown;
  if (Is > 0) {
    if (!b.sharedGateUp || !b.sharedDown || !sgt || !sdt || !s.sharedGu) {
      throw new TypeError(
        "sharedIntermediate > 0 needs sharedGateUp / sharedDown buffers, weights and scratch",
      );
    }
    if (!gemvFusedFits(Is) || (isQuant(sdt) && !quantFits(Is))) return null;
    // The shared expert as Is / I more slots of the expert kernels, when it is stored like the routed
    // ones and its activations fit the scratch (gu holds T * k * 2I floats).
    const NSH = Is / I;
    const fold = { ...gateUp, sharedSlots: NSH }, foldDown = { ...down, sharedSlots: NSH };
    if (
      MOE_PATH !== "unfolded" && Number.isInteger(NSH) && NSH <= r.topK && sgt === d.weights.gateUp &&
      sdt === d.weights.down && moeSgFits(gpu, fold) && moeSgFits(gpu, foldDown)
    ) {
      gateUp.sharedSlots = down.sharedSlots = NSH;
    }
  }
  if (!moeSgFits(gpu, gateUp)) return null;
  // A down row too long to stage (k * I values: Kimi K2's 8 x 2048 as f32; as int8 with dp4 it fits) goes to
  // the team kernel, which reads the activations from memory.
  const sgDown = moeSgFits(gpu, down);
  if (!sgDown) gateUp.sharedSlots = down.sharedSlots = undefined;
  if (!sgDown && !moeGemvFits(I, d.weights.down)) return null;
  const folded = (gateUp.sharedSlots ?? 0) > 0;
  const norm = { normWeight: b.norm };
  // The router GEMV's normalised x (int8 for dp4) staged as it is by gate_up.
  const xnForm = !xn ? undefined : gateUp.dp4 ? d.weights.gateUp as QuantType : "f32";
  if (xnForm) {
    gateUp.rmsnorm = undefined;
    gateUp.prenormed = true;
  }
  // Activations pre-weighted by gate_up for down (needs the routing in gate_up and the subgroup down).
  if (scaled && gateUp.route && sgDown) gateUp.scaled = down.scaled = true;
  const calls = [
    moeRouterGemvCall(gpu, {
      x: b.x,
      router: b.router,
      norm: b.norm,
      logits: s.logits,
      xn: s.xn,
      xnScales: s.xnScales,
    }, {
      K: H,
      experts: r.experts,
      T,
      eps: d.eps,
      normWeights: d.normWeights,
      xn: xnForm,
    }),
  ];
  if (!gateUp.route) {
    calls.push(
      moeRouterCall(gpu, { logits: s.logits, ids: s.ids, routeWeights: s.routeWeights, bias: b.bias }, {
        ...r,
        T,
      }),
    );
  }
  calls.push(moeSgCall(gpu, {
    x: xnForm ? s.xn : b.x,
    xScales: s.xnScales,
    w: b.gateUp,
    out: s.gu,
    ids: s.ids,
    norm: b.norm,
    logits: s.logits,
    routeWeights: s.routeWeights,
    bias: b.bias,
    shared: folded ? b.sharedGateUp : undefined,
  }, gateUp));
  if (Is > 0 && !folded) {
    calls.push(
      ...gemvFusedCalls(gpu, { x: b.x, w: b.sharedGateUp!, y: s.sharedGu!, ...norm }, {
        K: H,
        N: 2 * Is,
        T,
        weights: sgt!,
        normWeights: d.normWeights,
        transform: "rmsnorm",
        eps: d.eps,
      }),
      ...gemvFusedCalls(gpu, { x: s.sharedGu!, w: b.sharedDown!, y: b.x }, {
        K: Is,
        N: H,
        T,
        accumulate: true,
        weights: sdt!,
        transform: "silu_mul",
      }),
    );
  }
  calls.push(
    sgDown
      ? moeSgCall(gpu, {
        x: s.gu,
        w: b.down,
        out: b.x,
        ids: s.ids,
        routeWeights: s.routeWeights,
        shared: folded ? b.sharedDown : undefined,
      }, down)
      : moeGemvCall(gpu, { x: s.gu, w: b.down, y: b.x, ids: s.ids, routeWeights: s.routeWeights }, {
        ...experts,
        K: I,
        N: H,
        weights: d.weights.down,
        input: "slot",
        output: "combine",
        accumulate: true,
      }),
  );
  return calls;
}

/** The floats of a MoE block's weights (layouts as in MoeFfnBuffers). */
export interface MoeFfnWeights {
  router: Float32Array;
  bias?: Float32Array;
  gateUp: Float32Array;
  down: Float32Array;
  sharedGateUp?: Float32Array;
  sharedDown?: Float32Array;
}

/**
 * CPU reference of the whole block (f64 inside; router logits rounded to f32 as the GPU's are), written
 * from the families' definitions rather than from the kernels: out [T, H] = sum_j w[t, j] * expert_j(x[t])
 * + shared(x[t]), the value moeFfnCalls adds into the residual. Also returns the routing.
 */
export function moeFfnRef(
  a: MoeFfnWeights & { x: Float32Array },
  d: Omit<MoeFfnDims, "T" | "weights">,
): { out: Float32Array; ids: Uint32Array; weights: Float32Array } {
  const r = checkRouting(d.routing);
  const { hidden: H, intermediate: I } = d;
  const E = r.experts;
  const T = a.x.length / H;
  const logits = matmulRef(a.x, a.router, { K: H, N: E, T, weights: "f32" });
  const route = moeRouterRef(logits, { ...r, bias: a.bias });
  const out = new Float32Array(T * H);
  const silu = (v: number) => v / (1 + Math.exp(-v));
  // An MLP on row t of x: down @ (silu(gate @ x) * (up @ x)); gate rows at `gu`, down rows of width `width`.
  const mlp = (t: number, gu: Float32Array, guAt: number, dn: Float32Array, dnAt: number, width: number) => {
    const act = new Float64Array(width);
    for (let i = 0; i < width; i++) {
      let g = 0, u = 0;
      for (let h = 0; h < H; h++) {
        const xv = a.x[t * H + h];
        g += gu[guAt + i * H + h] * xv;
        u += gu[guAt + (width + i) * H + h] * xv;
      }
      act[i] = silu(g) * u;
    }
    const y = new Float64Array(H);
    for (let h = 0; h < H; h++) {
      let s = 0;
      for (let i = 0; i < width; i++) s += dn[dnAt + h * width + i] * act[i];
      y[h] = s;
    }
    return y;
  };
  const Is = d.sharedIntermediate ?? 0;
  for (let t = 0; t < T; t++) {
    const acc = new Float64Array(H);
    for (let j = 0; j < r.topK; j++) {
      const e = route.ids[t * r.topK + j];
      const y = mlp(t, a.gateUp, e * 2 * I * H, a.down, e * H * I, I);
      for (let h = 0; h < H; h++) acc[h] += route.weights[t * r.topK + j] * y[h];
    }
    if (Is > 0) {
      if (!a.sharedGateUp || !a.sharedDown) {
        throw new TypeError("sharedIntermediate > 0 needs shared weights");
      }
      const y = mlp(t, a.sharedGateUp, 0, a.sharedDown, 0, Is);
      for (let h = 0; h < H; h++) acc[h] += y[h];
    }
    out.set(acc, t * H);
  }
  return { out, ids: route.ids, weights: route.weights };
}
