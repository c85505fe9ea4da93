// A Plan file given with --plan (docs/PLAN_FORMAT.md), read and checked before anything starts, so a bad
// one exits 2 with the reason instead of failing on a node once the cluster is up: the file must be JSON
// of a version this swactor reads, its stages must form one chain over exactly the model's layers, each
// node must run one stage, and the cluster must have a node for each.
import { join } from "node:path";
import { PLAN_FORMAT_VERSION } from "../planner/mod.ts";
import { rolesOf } from "../node/stage/roles.ts";
import { UsageError } from "./command.ts";
import { readInputFile } from "./input_file.ts";

export type PlanFile = { stages: { node: string }[] } & Record<string, unknown>;

export interface PlanCheck {
  /** The checkpoint the plan is for: its config.json's num_hidden_layers is the layer count to cover. */
  modelDir?: string;
  /** The nodes the cluster will have: the plan may name at most this many. */
  nodes?: number;
}

/** Reads and checks `path`; UsageError naming the file and what is wrong with it. */
export async function readPlanFile(path: string, check: PlanCheck = {}): Promise<PlanFile> {
  const bad = (why: string) => new UsageError(`--plan ${path}: ${why}`);
  const text = await readInputFile(path, "--plan");
  let plan: unknown;
  try {
    plan = JSON.parse(text);
  } catch (e) {
    throw bad(`not JSON: ${(e as Error).message}`);
  }
  checkPlan(plan, { ...check, layers: check.modelDir ? await modelLayers(check.modelDir) : undefined }, bad);
  return plan as PlanFile;
}

/** The checks of readPlanFile on parsed JSON; `bad` makes the error. `layers` undefined: any count. */
export function checkPlan(
  plan: unknown,
  check: { layers?: number; nodes?: number },
  bad: (why: string) => Error,
): asserts plan is PlanFile {
  if (typeof plan !== "object" || plan === null || Array.isArray(plan)) throw bad("expected a JSON object");
  const p = plan as Record<string, unknown>;
  if (p.version !== PLAN_FORMAT_VERSION) {
    throw bad(
      p.version === undefined
        ? `has no "version" (this swactor reads version ${PLAN_FORMAT_VERSION}; docs/PLAN_FORMAT.md)`
        : `version ${JSON.stringify(p.version)} is not one this swactor reads (it reads ` +
          `${PLAN_FORMAT_VERSION}; docs/PLAN_FORMAT.md)`,
    );
  }
  if (!Array.isArray(p.stages) || p.stages.length === 0) throw bad(`"stages" must be a non-empty array`);
  const owner = new Map<string, number>();
  p.stages.forEach((s: unknown, i: number) => {
    const st = s as Record<string, unknown>;
    const layers = st?.layers as unknown[];
    if (
      typeof s !== "object" || s === null || typeof st.node !== "string" || st.node === "" ||
      !Number.isInteger(st.index) || typeof st.embeds !== "boolean" || typeof st.head !== "boolean" ||
      !Array.isArray(layers) || layers.length !== 2 || !layers.every((l) =>
        Number.isInteger(l) && (l as number) >= 0
      )
    ) {
      throw bad(
        `stage ${i} must be {"index": int, "node": "id", "layers": [start, end], "embeds": bool, ` +
          `"head": bool}, got ${JSON.stringify(s)?.slice(0, 200)}`,
      );
    }
    if (owner.has(st.node)) {
      throw bad(`node "${st.node}" runs stages ${owner.get(st.node)} and ${i}; a node runs at most one`);
    }
    owner.set(st.node, i);
  });
  const stages = p.stages as { layers: [number, number] }[];
  try {
    rolesOf(p as unknown as Parameters<typeof rolesOf>[0], check.layers ?? stages.at(-1)!.layers[1]);
  } catch (e) {
    throw bad((e as Error).message);
  }
  if (check.nodes !== undefined && owner.size > check.nodes) {
    throw bad(`the Plan names ${owner.size} nodes; the cluster has ${check.nodes}`);
  }
}

async function modelLayers(dir: string): Promise<number> {
  let config;
  try {
    config = JSON.parse(await Deno.readTextFile(join(dir, "config.json")));
  } catch (e) {
    throw new UsageError(`--model ${dir}: cannot read config.json: ${(e as Error).message}`);
  }
  const layers = config?.num_hidden_layers;
  if (!Number.isInteger(layers) || layers < 1) {
    throw new UsageError(
      `--model ${dir}: config.json's num_hidden_layers must be an integer >= 1, got ${layers}`,
    );
  }
  return layers;
}
