// Where the CLI picks the stage loader: every command that runs a pipeline attaches it through here.
// (The leader's plan publication is node/stage/publish.ts.)
import { join } from "node:path";
import type { SwactorNode } from "../node/node.ts";
import { PipelineNode, type StageLoader } from "../node/stage/mod.ts";
import type { ExpertLoader } from "../node/stage/backend.ts";
import { loadExpertHost, loadStage } from "../models/engine.ts";
import { threadExpertLoader, threadStageLoader } from "../models/gpu_thread.ts";
import { EnvError } from "../kernels/env.ts";
import { compileHfConfig } from "../planner/mod.ts";
import { servedDtype } from "../node/stage/plan_chain.ts";
import { humanBytes } from "../planner/units.ts";

export function attachPipeline(
  node: SwactorNode,
  opts: { modelDir?: string; stallMs?: number; memoryBudget?: number } = {},
): PipelineNode {
  const budget = opts.memoryBudget ? new WeightBudget(opts.memoryBudget) : undefined;
  const [stage, experts] = gpuThreadOn()
    ? [threadStageLoader, threadExpertLoader]
    : [loadStage, loadExpertHost];
  return new PipelineNode(node, {
    loader: budget ? budget.stage(stage) : stage,
    expertLoader: budget ? budget.experts(experts) : experts,
    modelDir: opts.modelDir,
    stallMs: opts.stallMs,
    // A generation survives the loss of a node: re-plan, reload, resume (docs/RECOVERY.md).
    recover: true,
  });
}

/**
 * SWACTOR_GPU_THREAD=1: the node's stages and expert hosts run on a thread of their own (models/gpu_thread.ts),
 * so that pipeline compiles and GPU waits never hold the thread membership answers its probes on (a hold of
 * 3-5 s gets a live node declared dead: docs/RECOVERY.md, "Known limits"). Inherited by the node processes
 * `--local` and `--cluster` start. Off by default: on the 2-core CI machine a 5-process `--local` chain of
 * mixtral-tiny (short steps) decoded 15-35% slower with it (a worker round trip, 0.1 ms alone, took ~0.5 ms
 * beside five processes on two cores), llama3-tiny's as fast; on the H200's host (16 cores) a 5-stage chain
 * of the demo model made 118.5 against 154.4 tok/s (docs/RECOVERY.md, `scripts/bench/engine_paths.ts
 * --gpu-thread`).
 */
export function gpuThreadOn(): boolean {
  const v = Deno.env.get("SWACTOR_GPU_THREAD");
  if (v === undefined || v === "" || v === "0") return false;
  if (v === "1") return true;
  throw new EnvError(`SWACTOR_GPU_THREAD must be 0 or 1, got "${v.slice(0, 20)}"`);
}

/**
 * A node's memory budget (`--memory`) as the loaders enforce it: before loading, the weights a stage or an
 * expert host would hold (counted as the planner counts them, at the served bytes per element) are added to
 * what the node holds already, and a load past the budget is refused with an error naming both. What is
 * freed (a stage or host closed) is given back. The KV cache, allocated per request, is the planner's to
 * fit (it plans each node's memory for the Plan's context).
 */
export class WeightBudget {
  #held = 0;
  constructor(readonly bytes: number) {}

  get held(): number {
    return this.#held;
  }

  #take(need: number, what: string): void {
    if (this.#held + need > this.bytes) {
      throw new Error(
        `${what} needs ${need} bytes of weights; this node's memory budget (--memory) is ${this.bytes} ` +
          `bytes (${humanBytes(this.bytes)}), ${this.#held} of them held already`,
      );
    }
    this.#held += need;
  }

  stage(load: StageLoader): StageLoader {
    return async (role, o) => {
      const graph = await graphOf(o.model.dir);
      const dtype = servedDtype(o.model);
      const remote = new Set(o.experts?.remote ?? []);
      let n = 0;
      if (role.embeds) n += graph.embedParams * dtype.embed!;
      if (role.head) n += graph.headParams * dtype.embed!;
      for (let l = role.layers[0]; l < role.layers[1]; l++) {
        for (const op of graph.layers[l].ops) {
          if (op.kind !== "moe") n += op.params * dtype.dense!;
          else {
            n += (op.routerParams + op.shared * op.sharedParams) * dtype.dense!;
            if (!remote.has(l)) n += op.experts * op.expertParams * dtype.experts!;
          }
        }
      }
      const need = Math.round(n);
      this.#take(need, `stage ${role.index} (layers [${role.layers}])`);
      try {
        const backend = await load(role, o);
        const close = backend.close.bind(backend);
        backend.close = () => {
          this.#held -= need;
          close();
        };
        return backend;
      } catch (e) {
        this.#held -= need;
        throw e;
      }
    };
  }

  experts(load: ExpertLoader): ExpertLoader {
    return async (hold, o) => {
      const graph = await graphOf(o.model.dir);
      const dtype = servedDtype(o.model);
      let n = 0, count = 0;
      for (const [l, ids] of hold) {
        const op = graph.layers[l]?.ops.find((x) => x.kind === "moe");
        if (op?.kind === "moe") n += ids.length * op.expertParams * dtype.experts!;
        count += ids.length;
      }
      const need = Math.round(n);
      this.#take(need, `holding ${count} experts`);
      try {
        const service = await load(hold, o);
        const close = service.close.bind(service);
        service.close = () => {
          this.#held -= need;
          close();
        };
        return service;
      } catch (e) {
        this.#held -= need;
        throw e;
      }
    };
  }
}

async function graphOf(dir: string) {
  return compileHfConfig(JSON.parse(await Deno.readTextFile(join(dir, "config.json"))));
}
