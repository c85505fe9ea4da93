// What the chain-stage benchmarks (keep_warm.ts, stage_step.ts) share: a stage of a real shape's first layers
// with random weights (embeds, no head), the shapes they take, and a wait that keeps the gap asked for.
import { setImmediate } from "node:timers";
import { UsageError } from "../../cli/command.ts";
import { configSetArg, countArg } from "../args.ts";
import type { Gpu } from "../../kernels/mod.ts";
import { weightsOption } from "../../models/engine.ts";
import { Model } from "../../models/model.ts";
import { RandomWeights } from "../../models/random_weights.ts";
import type { StageRole } from "../../models/backend.ts";
import { LLAMA_3_2_1B, MOE_SHAPES } from "./random_checkpoint.ts";

export const STAGE_SHAPES: Record<string, Record<string, unknown>> = {
  "llama-3.2-1b": LLAMA_3_2_1B,
  ...MOE_SHAPES,
};

/** The flags every stage bench takes (parseArgs options): --shape, --weights, --layers, --set. */
export const STAGE_FLAGS = {
  shape: { type: "string", default: "llama-3.2-1b" },
  weights: { type: "string", default: "q4" },
  layers: { type: "string", default: "14" },
  set: { type: "string" },
} as const;

/** The stage STAGE_FLAGS' values describe (--shape checked, --layers and --set parsed), for loadBenchStage. */
export function stageFlags(
  v: { shape: string; weights: string; layers: string; set?: string },
): { shape: string; weights: string; layers: number; overrides: Record<string, number> } {
  return {
    shape: stageShapeArg(v.shape),
    weights: v.weights,
    layers: countArg("layers", v.layers),
    overrides: configSetArg(v.set),
  };
}

/** --shape checked against STAGE_SHAPES (a UsageError naming the choices). */
export function stageShapeArg(shape: string): string {
  if (!STAGE_SHAPES[shape]) {
    throw new UsageError(`--shape takes ${Object.keys(STAGE_SHAPES).join(", ")}, got "${shape}"`);
  }
  return shape;
}

/** The first `layers` layers of `shape` (config keys overridden by `overrides`) as a stage on `gpu`. */
export async function loadBenchStage(
  gpu: Gpu,
  o: { shape: string; weights: string; layers: number; overrides: Record<string, number> },
): Promise<{ model: Model; role: StageRole; vocab: number }> {
  const cfg: Record<string, unknown> = { ...STAGE_SHAPES[o.shape], ...o.overrides };
  const role = { index: 0, stages: 2, layers: [0, o.layers] as [number, number], embeds: true, head: false };
  const model = await Model.load(gpu, new RandomWeights(cfg, 1, `random ${o.shape}`), {
    weights: weightsOption(o.weights),
    layers: role.layers,
    embed: true,
    head: false,
  });
  return { model, role, vocab: cfg.vocab_size as number };
}

/**
 * Waits `ms` to within ~0.02 ms: Deno's timers fire ~2 ms late (a 1 ms setTimeout takes ~2.1), so the end
 * of the wait is setImmediate turns, which also let work queued by setImmediate (a keep-warm filler, the
 * next step's encode) go meanwhile, as a chain's gap would.
 */
export async function waitMs(ms: number): Promise<void> {
  const end = performance.now() + ms;
  if (ms > 3) await new Promise((r) => setTimeout(r, ms - 3));
  while (performance.now() < end) await new Promise((r) => setImmediate(r));
}
