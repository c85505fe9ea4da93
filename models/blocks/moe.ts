// A mixture-of-experts FFN (Mixtral, Qwen3-MoE, DeepSeek-V3 / Kimi K2), pre-normed, adding into the residual
// (kernels/moe_ffn.ts computes it on the GPU, no readback per layer):
//   xn     = rmsnorm(x) * post_attention_layernorm                    [H]
//   ids, w = route(xn @ router^T)                                      [k]      (the family's rule)
//   x     += sum_j w_j * expert_{ids_j}(xn)  (+ shared experts(xn))    [H]
// Experts are stacked per layer: gate+up [E, 2I, H] and down [E, H, I]; the router stays f32.
import {
  createMoeScratch,
  int8CopyFor,
  type Int8CopyOut,
  isQuant,
  type KernelCall,
  moeDecodeCalls,
  moeFfnCalls,
  moeFusedPlan,
  type MoeInput,
  moeInputFor,
  type MoeScratch,
  rmsnormCall,
} from "../../kernels/mod.ts";
import type { MoeFfn } from "../config.ts";
import type { BlockContext, LayerLink, StepBuffers, TensorReader } from "./context.ts";

export interface MoeWeights {
  norm: GPUBuffer;
  router: GPUBuffer;
  bias?: GPUBuffer;
  /** The routed experts' stacks; absent when they are held elsewhere (expert parallelism). */
  gateUp?: GPUBuffer;
  down?: GPUBuffer;
  sharedGateUp?: GPUBuffer;
  sharedDown?: GPUBuffer;
  /** `down` is stored in column blocks of this many columns (for the fused decode kernel); absent: row-major. */
  downBlock?: number;
}

/** The block's tensors; with `routed` false, without the routed experts (they are held elsewhere). */
export function moeTensors(f: MoeFfn, hidden: number, p: string, routed = true): [string, number[]][] {
  const { experts: E } = f.routing;
  const I = f.intermediate;
  const t: [string, number[]][] = [[p + f.names.router, [E, hidden]]];
  if (f.names.bias) t.push([p + f.names.bias, [E]]);
  for (let e = 0; e < (routed ? E : 0); e++) {
    const n = f.names.expert(e);
    t.push([p + n.gate, [I, hidden]], [p + n.up, [I, hidden]], [p + n.down, [hidden, I]]);
  }
  if (f.names.shared && f.sharedIntermediate > 0) {
    const s = p + f.names.shared, Is = f.sharedIntermediate;
    t.push(
      [s + "gate_proj.weight", [Is, hidden]],
      [s + "up_proj.weight", [Is, hidden]],
      [s + "down_proj.weight", [hidden, Is]],
    );
  }
  return t;
}

export async function loadMoe(
  ctx: BlockContext,
  read: TensorReader,
  f: MoeFfn,
  hidden: number,
  p: string,
  routed = true,
): Promise<MoeWeights> {
  const E = f.routing.experts;
  const experts = Array.from({ length: E }, (_, e) => f.names.expert(e));
  const w: MoeWeights = {
    norm: await read([`${p}post_attention_layernorm.weight`]),
    router: await read([p + f.names.router], undefined, "f32"),
  };
  if (routed) {
    w.gateUp = await read(experts.flatMap((n) => [p + n.gate, p + n.up]), hidden);
    w.down = await read(experts.map((n) => p + n.down), f.intermediate);
  }
  if (f.names.bias) w.bias = await read([p + f.names.bias], undefined, "f32");
  if (f.names.shared && f.sharedIntermediate > 0) {
    const s = p + f.names.shared;
    w.sharedGateUp = await read([s + "gate_proj.weight", s + "up_proj.weight"], hidden);
    w.sharedDown = await read([s + "down_proj.weight"], f.sharedIntermediate);
  }
  // Where decode will run the experts as one dispatch, the routed down stack is stored as that kernel reads
  // it: each workgroup's columns of every row contiguous (docs/KERNELS.md, "The routed experts in one
  // dispatch"). The shared expert's stays row-major (the prefill reads it as a plain matrix).
  const plan = w.gateUp && w.down && moeFusedPlan(ctx.gpu, moeDims(ctx, f, w, hidden), w.bias !== undefined);
  if (plan && w.down) {
    w.down = await ctx.packColumns(w.down, { matrices: E, N: hidden, K: f.intermediate, C: plan.rows });
    w.downBlock = plan.rows;
  }
  return w;
}

/**
 * Where one step's program runs this block's experts as the fused kernel reading its input from the GEMV
 * before it (o_proj, models/blocks/gqa.ts): what that GEMV needs (LayerLink `moeInput`), else undefined.
 */
export function moeLinkInput(
  ctx: BlockContext,
  f: MoeFfn,
  w: MoeWeights,
  d: { hidden: number; T: number },
): MoeInput | undefined {
  if (!w.gateUp || !w.down) return undefined;
  return moeInputFor(ctx.gpu, { ...moeDims(ctx, f, w, d.hidden), T: d.T, normWeights: ctx.normType }, {
    norm: w.norm,
    router: w.router,
    bias: w.bias !== undefined,
  });
}

/**
 * The block's shape and storage as the kernels' plans take them (moeFusedPlan, moeInputFor,
 * moeDecodeCalls): without routed experts (held elsewhere) their storage reads "f32" and `routed` false.
 */
function moeDims(ctx: BlockContext, f: MoeFfn, w: MoeWeights, hidden: number) {
  const wt = (b?: GPUBuffer) => b && ctx.typeOf(b);
  return {
    hidden,
    intermediate: f.intermediate,
    sharedIntermediate: f.sharedIntermediate,
    routing: f.routing,
    routed: w.gateUp !== undefined,
    weights: {
      router: "f32" as const,
      gateUp: wt(w.gateUp) ?? "f32",
      down: wt(w.down) ?? "f32",
      sharedGateUp: wt(w.sharedGateUp),
      sharedDown: wt(w.sharedDown),
    },
  };
}

/** Scratch for T tokens of MoE layers of this shape (one serves every such layer of a sequence). */
export function moeScratch(ctx: BlockContext, f: MoeFfn, hidden: number, T: number): MoeScratch {
  return createMoeScratch(ctx.gpu, {
    T,
    hidden,
    intermediate: f.intermediate,
    sharedIntermediate: f.sharedIntermediate,
    routing: f.routing,
  });
}

export function moeProgram(
  ctx: BlockContext,
  f: MoeFfn,
  w: MoeWeights,
  bufs: StepBuffers & { moe: MoeScratch },
  d: { hidden: number; T: number; link?: LayerLink },
): KernelCall[] {
  const { gpu, normType, eps } = ctx;
  const { x, xn } = bufs;
  const dims = { ...moeDims(ctx, f, w, d.hidden), T: d.T, downBlock: w.downBlock };
  // The fused expert kernel writes the int8 input copy of the RMSNorm GEMV after the block (the next
  // layer's qkv or the LM head: LayerLink `after`), where that GEMV takes the int8 direct mode and the
  // kernel fits with the copy's workgroup row; the GEMV then reads it instead of staging x itself.
  const after = d.link?.after;
  const copyOut = after && moeCopyFor(ctx, after, dims, w.bias !== undefined);
  if (copyOut && d.link) d.link.afterCopy = copyOut;
  // Decode with subgroups: the norm fused into the kernels that read it (no xn), SiLU and the combine fused.
  const decode = moeDecodeCalls(gpu, {
    x,
    norm: w.norm,
    router: w.router,
    bias: w.bias,
    gateUp: w.gateUp,
    down: w.down,
    sharedGateUp: w.sharedGateUp,
    sharedDown: w.sharedDown,
    scratch: bufs.moe,
    copyOut,
    copyIn: moeCopyIn(d.link),
  }, { ...dims, eps, normWeights: normType });
  if (decode) return decode;
  return [
    rmsnormCall(gpu, { x, w: w.norm, y: xn }, { hidden: d.hidden, rows: d.T, eps, weights: normType }),
    ...moeFfnCalls(gpu, {
      x: xn,
      y: x,
      router: w.router,
      bias: w.bias,
      gateUp: w.gateUp,
      down: w.down,
      sharedGateUp: w.sharedGateUp,
      sharedDown: w.sharedDown,
      scratch: bufs.moe,
    }, dims),
  ];
}

/**
 * The copy of `after`'s input the fused expert kernel can write (moeProgram), else undefined. The plan is
 * asked first (with the copy's layout and norm storage, as int8CopyFor would make it), so no buffers are
 * made for a block that cannot write them.
 */
function moeCopyFor(
  ctx: BlockContext,
  after: NonNullable<LayerLink["after"]>,
  dims: Parameters<typeof moeFusedPlan>[1],
  bias: boolean,
) {
  const wt = after.dims.weights;
  if (!isQuant(wt) || after.dims.transform !== "rmsnorm") return undefined;
  if (!moeFusedPlan(ctx.gpu, dims, bias, { weights: wt, norm: after.dims.normWeights ?? "f32" })) {
    return undefined;
  }
  const copy = int8CopyFor(ctx.gpu, after.dims, after.norm);
  return copy?.norm ? copy : undefined;
}

/** The block's input copy that o_proj wrote for it (LayerLink `moeInput`), if it did. */
function moeCopyIn(link?: LayerLink): Int8CopyOut | undefined {
  const c = link?.moeInput && link.copy;
  return c && "router" in c && c.router ? c : undefined;
}

export function moeBuffers(w: MoeWeights): GPUBuffer[] {
  return [w.norm, w.router, w.bias, w.gateUp, w.down, w.sharedGateUp, w.sharedDown].filter((
    b,
  ): b is GPUBuffer => !!b);
}

export function moeScratchBuffers(s: MoeScratch): GPUBuffer[] {
  return Object.values(s).filter((b): b is GPUBuffer => !!b);
}
