// `swactor plan`: prints the Plan for a model (a directory holding config.json) on a cluster (a file in
// the planner language), as a table or as JSON. Bad input exits 2 naming the file (and line:col).
import { type Command, numberFlag, parseFlags, UsageError } from "./command.ts";
import {
  compileHfConfig,
  formatPlanTable,
  LangError,
  parseCluster,
  PlacementError,
  planPipeline,
  routingShares,
} from "../planner/mod.ts";
import { moeOf } from "../planner/model_graph.ts";
import { planLive } from "./plan_live.ts";
import { parseKv, parseWeights } from "./load_model.ts";
import { LAB_CONTEXT, labCluster, planRegional } from "./cluster_plan.ts";
import { readInputFile } from "./input_file.ts";

const usage =
  `Usage: swactor plan --model DIR --cluster FILE [--json] [--context N] [--experts auto|local|spread]
                    [--spread compact|wide] [--routing FILE]
       swactor plan --model DIR --cluster FILE --experts regional [--weights W] [--kv K] [--memory-scale F]
                    [--json]
       swactor plan --model DIR --live [--api HOST:PORT] [--nodes N] [--weights W] [--kv K] [--save-cluster FILE]
                    [--json]

Plans which node runs which layers (and experts) of the model, and predicts per-token latency.
  --model DIR       a directory with a Hugging Face config.json
  --cluster FILE    a cluster description in the planner language (docs/PLANNER.md)
  --live            plan for the running cluster (the node at --api, default: the one \`up\` started here)
                    from what its members measured, as \`up --model\` would place it: a chain over the
                    members (--nodes N: the first N, that node first)
  --weights W       with --live: the weights' form the chain would load (auto, f32, f16, q8, q4; default:
                    the running chain's, else auto)
  --kv K            with --live or --experts regional: the KV cache's element type the chain would hold
                    (auto, f32, f16, q8: q8 about halves f16's bytes; default: the running chain's, else
                    auto)
  --save-cluster F  with --live: write the measured cluster to F in the planner language
  --context N       tokens of KV cache each stage must hold (default 4096)
  --experts MODE    auto (default): the faster of local and spread; local: a stage holds its
                    layers' experts; spread: experts may live on other nodes; regional: the plan that
                    \`generate --cluster FILE\` runs (layers across the regions, each MoE layer's experts over
                    its region's nodes; --context defaults to ${LAB_CONTEXT} there, --weights to auto, and
                    --memory-scale F multiplies every node's memory: docs/DOD.md)
  --spread HOW      with experts spread: compact (default: fewest nodes per layer) or wide (every
                    MoE layer on >= 2 nodes, every node hosting some: expert parallelism)
  --routing FILE    observed routing counts, JSON {"<layer>": [count per routed expert]}: the busiest
                    experts are placed nearest and hot ones replicated where memory allows
  --json            print the Plan as JSON (docs/PLAN_FORMAT.md)
Exit codes: 0 ok, 1 runtime failure, 2 bad input or no placement fits.`;

export const planCommand: Command = {
  name: "plan",
  summary: "plan what runs where for a model on a cluster, with predicted tok/s",
  usage,
  async run(argv) {
    const { values } = parseFlags(argv, {
      model: { type: "string" },
      cluster: { type: "string" },
      context: { type: "string" },
      experts: { type: "string" },
      spread: { type: "string" },
      routing: { type: "string" },
      json: { type: "boolean" },
      live: { type: "boolean" },
      api: { type: "string" },
      nodes: { type: "string" },
      weights: { type: "string" },
      kv: { type: "string" },
      "save-cluster": { type: "string" },
      "memory-scale": { type: "string" },
    });
    if (!values.model) throw new UsageError("--model DIR is required");
    if (values.live && values.cluster) throw new UsageError("--live and --cluster exclude each other");
    if (!values.live && !values.cluster) throw new UsageError("--cluster FILE (or --live) is required");
    const experts = values.experts ?? "auto";
    if (!["auto", "local", "spread", "regional"].includes(experts)) {
      throw new UsageError(`--experts expects auto, local, spread or regional, got "${experts}"`);
    }
    const kv = values.kv === undefined ? undefined : parseKv(values.kv);
    if (kv !== undefined && !values.live && experts !== "regional") {
      throw new UsageError(
        "--kv needs --live or --experts regional (a cluster file's plan counts its own dtypes)",
      );
    }
    if (values["memory-scale"] !== undefined && experts !== "regional") {
      throw new UsageError("--memory-scale needs --experts regional");
    }
    const spread = values.spread ?? "compact";
    if (spread !== "compact" && spread !== "wide") {
      throw new UsageError(`--spread expects compact or wide, got "${spread}"`);
    }
    let routing: Record<string, number[]> | undefined;
    if (values.routing) {
      try {
        routing = JSON.parse(await readInputFile(values.routing, "--routing"));
      } catch (e) {
        if (e instanceof UsageError) throw e;
        throw new UsageError(`--routing ${values.routing}: ${(e as Error).message}`);
      }
      if (typeof routing !== "object" || routing === null || Array.isArray(routing)) {
        throw new UsageError(`--routing ${values.routing}: expected {"<layer>": [counts]}`);
      }
    }
    const context = numberFlag(values.context, "context", {
      min: 1,
      integer: true,
      fallback: experts === "regional" ? LAB_CONTEXT : 4096,
    });
    const configPath = `${values.model.replace(/\/$/, "")}/config.json`;
    let json: unknown;
    try {
      json = JSON.parse(await readInputFile(configPath, "model config"));
    } catch (e) {
      if (e instanceof UsageError) throw e;
      throw new UsageError(`${configPath}: ${(e as Error).message}`);
    }
    const name = values.model.replace(/\/$/, "").split("/").pop()!;
    let model;
    try {
      model = compileHfConfig(json, { name });
    } catch (e) {
      throw new UsageError(`${configPath}: ${(e as Error).message}`);
    }
    if (values.live) {
      if (experts !== "auto") throw new UsageError("--experts is not supported with --live yet");
      const { plan } = await planLive({
        config: json,
        api: values.api,
        nodes: values.nodes === undefined
          ? undefined
          : numberFlag(values.nodes, "nodes", { min: 1, integer: true, fallback: 1 }),
        context,
        weights: values.weights === undefined ? undefined : parseWeights(values.weights),
        kv,
        saveCluster: values["save-cluster"],
      });
      if (values.json) console.log(JSON.stringify(plan));
      else console.log(formatPlanTable(plan, (l) => moeOf(model.layers[l])?.experts ?? -1));
      return 0;
    }
    let cluster;
    try {
      cluster = parseCluster(await readInputFile(values.cluster!, "--cluster"), { file: values.cluster });
    } catch (e) {
      if (e instanceof LangError) throw new UsageError(e.message);
      throw e;
    }
    if (experts === "regional") {
      if (routing) throw new UsageError("--routing is not supported with --experts regional");
      const memoryScale = values["memory-scale"] === undefined
        ? undefined
        : numberFlag(values["memory-scale"], "memory-scale", { min: Number.MIN_VALUE, fallback: 1 });
      let plan;
      try {
        plan = planRegional(json, labCluster(cluster, { memoryScale }).cluster, {
          context,
          weights: parseWeights(values.weights),
          kv,
          name,
        });
      } catch (e) {
        if (e instanceof PlacementError) {
          throw new UsageError(`no placement fits (${e.constraint}): ${e.message}`);
        }
        throw e;
      }
      if (values.json) console.log(JSON.stringify(plan));
      else console.log(formatPlanTable(plan, (l) => moeOf(model.layers[l])?.experts ?? -1));
      return 0;
    }
    if (routing) {
      try {
        routingShares(model, routing);
      } catch (e) {
        throw new UsageError(`--routing ${values.routing}: ${(e as Error).message}`);
      }
    }
    let plan;
    try {
      plan = planPipeline(model, cluster, {
        context,
        experts: experts as "auto" | "local" | "spread",
        expertSpread: spread,
        routing,
      });
    } catch (e) {
      if (e instanceof PlacementError) {
        throw new UsageError(`no placement fits (${e.constraint}): ${e.message}`);
      }
      if (e instanceof RangeError && routing) {
        throw new UsageError(`--routing ${values.routing}: ${e.message}`);
      }
      throw e;
    }
    if (values.json) console.log(JSON.stringify(plan));
    else console.log(formatPlanTable(plan, (l) => moeOf(model.layers[l])?.experts ?? -1));
    return 0;
  },
};
