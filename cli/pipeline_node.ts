// Where the CLI picks the stage loader: every command that runs a pipeline attaches it through here.
// (The leader's plan publication is node/stage/publish.ts.)
import type { SwactorNode } from "../node/node.ts";
import { PipelineNode } from "../node/stage/mod.ts";
import { loadExpertHost, loadStage } from "../models/engine.ts";

export function attachPipeline(
  node: SwactorNode,
  opts: { modelDir?: string; stallMs?: number } = {},
): PipelineNode {
  return new PipelineNode(node, {
    loader: loadStage,
    expertLoader: loadExpertHost,
    modelDir: opts.modelDir,
    stallMs: opts.stallMs,
    // A generation survives the loss of a node: re-plan, reload, resume (docs/RECOVERY.md).
    recover: true,
  });
}
