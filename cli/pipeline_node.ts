// Where the CLI picks the stage loader: every command that runs a pipeline attaches it through here.
// (The leader's plan publication is node/stage/publish.ts.)
import type { SwactorNode } from "../node/node.ts";
import { PipelineNode } from "../node/stage/mod.ts";
import { loadLlamaStage } from "../models/llama_stage.ts";

export function attachPipeline(
  node: SwactorNode,
  opts: { modelDir?: string; stallMs?: number } = {},
): PipelineNode {
  return new PipelineNode(node, { loader: loadLlamaStage, modelDir: opts.modelDir, stallMs: opts.stallMs });
}
