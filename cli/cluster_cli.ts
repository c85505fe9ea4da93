// The CLI side of `--cluster FILE`: the flags generate and up share, `generate --cluster` (run the request on
// a fresh lab cluster, then tear it down) and `up --cluster` (keep the lab cluster up until a stop signal or
// `swactor down`; status, generate and down on this machine reach its leader). cli/cluster_run.ts starts it.
import { resolve } from "node:path";
import { numberFlag, UsageError } from "./command.ts";
import { LAB_CONTEXT, readLabCluster } from "./cluster_plan.ts";
import { type ClusterRun, startClusterRun } from "./cluster_run.ts";
import {
  type ChainGenerateOptions,
  checkPrompt,
  generateOnCluster,
  writeLogits,
} from "./pipeline_generate.ts";
import { apiError, apiFetch } from "../node/api/mod.ts";
import { Checkpoint } from "../models/checkpoint.ts";
import { onStopSignal } from "./signals.ts";
import { parseKv, parseWeights } from "./load_model.ts";
import { claimState, clearState, statePath, writeState } from "../node/state_file.ts";
import type { WireDtype } from "../node/stage/mod.ts";
import { MTP_ONE_NODE, speculateFlags } from "./speculate_flags.ts";

/** The --cluster flags' help, its descriptions at column `col` (each command aligns its own). */
export const clusterHelp = (col: number) =>
  alignHelp(
    `  --cluster FILE        start one local node process per node of this cluster file (planner language,
                        docs/PLANNER.md): each with the file's memory as its budget, slowed to its declared
                        memory bandwidth relative to the fastest, named after it; the first node leads and
                        plans (layers pipelined across the regions, experts spread inside each: docs/DOD.md)
  --emulate-wan         with --cluster: each node in its own network namespace, the file's links (latency,
                        bandwidth) between every pair applied by the WAN emulation's relays (needs root)
  --memory-scale F      with --cluster: multiply every node's declared memory by F (default 1)
  --context N           with --cluster: KV context the plan holds per request (default ${LAB_CONTEXT})
  --draft ...           with --cluster: the leader drafts (the speculative decoding flags, --draft-noise
                        included, are given to its \`up\`: docs/SPECULATIVE.md)`,
    col,
  );

/** Moves a help block's description column (two or more spaces after the flag, and continuation lines) to `col`. */
function alignHelp(text: string, col: number): string {
  return text.split("\n").map((l) => {
    const m = /^( {2}-\S+(?: \S+)?)\s{2,}(.*)$/.exec(l);
    return m ? m[1].padEnd(col) + m[2] : " ".repeat(col) + l.trimStart();
  }).join("\n");
}

/** The flags of clusterHelp, for parseFlags (`--cluster-plan` is the leader's, set by cluster_run.ts). */
export const clusterFlags = {
  cluster: { type: "string" },
  "emulate-wan": { type: "boolean" },
  "memory-scale": { type: "string" },
  context: { type: "string" },
  "cluster-plan": { type: "string" },
} as const;

export interface ClusterValues {
  cluster?: string;
  "emulate-wan"?: boolean;
  "memory-scale"?: string;
  context?: string;
  model?: string;
  weights?: string;
  kv?: string;
  experts?: string;
  local?: string;
  draft?: string;
  speculate?: string;
  "speculate-depth"?: string;
  "draft-noise"?: string;
}

/** Reads the cluster flags; UsageError for bad ones. */
async function clusterSetup(values: ClusterValues, modelDir: string) {
  if (values.experts !== undefined && values.experts !== "spread") {
    throw new UsageError(
      `--cluster places each MoE layer's experts over its region's nodes: --experts ${values.experts} ` +
        `cannot be combined with it (give --experts spread, or leave it out)`,
    );
  }
  const memoryScale = values["memory-scale"] === undefined
    ? undefined
    : numberFlag(values["memory-scale"], "memory-scale", { min: Number.MIN_VALUE, fallback: 1 });
  const context = values.context === undefined
    ? undefined
    : numberFlag(values.context, "context", { min: 1, integer: true, fallback: LAB_CONTEXT });
  // Speculative decoding: the leader serves the requests, so it drafts (`up --draft ...`, its flags as given).
  const speculate = speculateFlags(values as Record<string, unknown>);
  if (speculate?.draft === "mtp") throw new UsageError(MTP_ONE_NODE);
  const lab = await readLabCluster(values.cluster!, { memoryScale });
  if (values.local !== undefined && Number(values.local) !== lab.nodes.length) {
    throw new UsageError(
      `--local ${values.local} with --cluster ${values.cluster}: the file has ${lab.nodes.length} nodes ` +
        `(give --local ${lab.nodes.length}, or leave --local out)`,
    );
  }
  return {
    file: values.cluster!,
    lab,
    modelDir: resolve(modelDir),
    weights: parseWeights(values.weights),
    kv: parseKv(values.kv),
    emulateWan: values["emulate-wan"] ?? false,
    memoryScale,
    context,
    speculate,
  };
}

/** Starts the lab cluster, aborting on a stop signal meanwhile. */
async function start(
  setup: Awaited<ReturnType<typeof clusterSetup>> & { wire?: WireDtype },
): Promise<ClusterRun | number> {
  const abort = new AbortController();
  let code = 130;
  const remove = onStopSignal((signal, c) => {
    code = c;
    abort.abort(new Error(`interrupted (${signal})`));
  });
  try {
    return await startClusterRun({ ...setup, signal: abort.signal });
  } catch (e) {
    if (abort.signal.aborted) {
      console.error("swactor: interrupted; the cluster is torn down");
      return code;
    }
    throw e;
  } finally {
    remove();
  }
}

/** generate --cluster FILE: the request on a fresh lab cluster, torn down afterwards. */
export async function generateCluster(
  values: ClusterValues,
  o: Omit<ChainGenerateOptions, "modelDir" | "names">,
  modelDir: string,
): Promise<number> {
  const setup = await clusterSetup(values, modelDir);
  const run = await start(setup);
  if (typeof run === "number") return run;
  try {
    return await generateOnCluster(run.target, {
      ...o,
      // The leader applies --draft-noise (it drafts); the request names the drafter and k only.
      speculate: o.speculate && { ...o.speculate, noise: 0 },
      modelDir: setup.modelDir,
      names: run.names,
      nodes: setup.lab.nodes.length,
    });
  } finally {
    const datagrams = run.relayDatagrams();
    await run.close();
    console.error(
      `swactor: the ${setup.lab.nodes.length} node processes are torn down` +
        (datagrams !== undefined ? ` (the relays delivered ${datagrams} datagrams)` : ""),
    );
  }
}

/** logits --cluster FILE: teacher-forced logits on a fresh lab cluster (POST /logits on its leader). */
export async function logitsCluster(
  values: ClusterValues,
  o: { ids: number[]; out: string; wire: "f16" | "f32" },
  modelDir: string,
): Promise<number> {
  const setup = await clusterSetup(values, modelDir);
  const config = (await Checkpoint.open(setup.modelDir)).config;
  checkPrompt(o.ids, config, 0);
  const run = await start(setup);
  if (typeof run === "number") return run;
  try {
    const res = await apiFetch(run.target, "/logits", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ tokens: o.ids, wire: o.wire }),
    });
    if (!res.ok) throw new Error(`the cluster refused the request: ${await apiError(res)}`);
    const logits = new Float32Array(await res.arrayBuffer());
    if (logits.length !== o.ids.length * config.vocabSize) {
      throw new Error(
        `the cluster sent ${logits.length} logits; expected ${o.ids.length} x ${config.vocabSize}`,
      );
    }
    await writeLogits(o.out, o.ids, config.vocabSize, logits);
    console.error(
      `swactor: wrote logits [${o.ids.length}, ${config.vocabSize}] to ${o.out} (${setup.lab.nodes.length} nodes)`,
    );
    return 0;
  } finally {
    await run.close();
  }
}

/** up --cluster FILE: the lab cluster until a stop signal, `swactor down`, or its leader's end. */
export async function upCluster(values: ClusterValues, wire?: WireDtype): Promise<number> {
  if (!values.model) throw new UsageError("up --cluster needs --model DIR");
  const setup = await clusterSetup(values, values.model);
  const running = await claimState(Deno.pid, () => {});
  if (running) {
    throw new UsageError(
      `a cluster already runs on this machine: \`up\` pid ${running.pid} (state in ${statePath()}); stop it ` +
        `with \`swactor down\``,
    );
  }
  try {
    const run = await start({ ...setup, wire });
    if (typeof run === "number") return run;
    try {
      const api = run.target.base.replace(/^http:\/\//, "");
      await writeState({
        pid: Deno.pid,
        api,
        token: run.target.token!,
        ticket: run.ticket,
        id: [...run.names].find(([, name]) => name === setup.lab.nodes[0].name)?.[0] ?? "",
        startedAt: new Date().toISOString(),
      });
      console.log(`ticket: ${run.ticket}`);
      console.error(`api: ${api}`);
      for (const [id, name] of run.names) console.error(`node ${name}: ${id}`);
      console.error(
        `swactor: ${setup.lab.nodes.length} nodes of ${setup.file} serving ${setup.modelDir}; ` +
          `\`swactor status\` shows them, \`swactor down\` stops them`,
      );
      let code = 0;
      await new Promise<void>((done) => {
        const remove = onStopSignal((_, c) => {
          code = c === 130 ? 0 : c;
          remove();
          done();
        });
        run.exited.then(() => {
          remove();
          done();
        });
      });
      return code;
    } finally {
      await run.close();
    }
  } finally {
    await clearState(Deno.pid);
  }
}
