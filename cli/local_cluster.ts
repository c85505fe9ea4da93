// `--local N`: an ephemeral cluster of N real node processes on loopback (this process leads and runs
// stage 0; N-1 `swactor join` children run the others), torn down afterwards, on failure and on a stop
// signal too; and should this process be killed outright, its workers leave by themselves (cli/workers.ts).
import { join, resolve } from "node:path";
import { startNode, type SwactorNode } from "../node/node.ts";
import { type NodeMeasurement, presets } from "../node/membership/mod.ts";
import { encodeTicket, newSecret } from "../node/ticket.ts";
import { type Assignment, type Chain, type PipelineNode, publishPlan } from "../node/stage/mod.ts";
import { attachPipeline } from "./pipeline_node.ts";
import { nodesStartedBetween, stateDir } from "../node/state_file.ts";
import {
  isWorkerWarning,
  shareMeasurement,
  shareOneGpu,
  spawnWorker,
  stopWorkers,
  termWorkers,
} from "./workers.ts";

export interface LocalCluster {
  node: SwactorNode;
  pipeline: PipelineNode;
  assignment: Assignment;
  chain: Chain;
  /** Process ids of the worker processes, in the order they were started. */
  workers: number[];
  /** Node id -> process id, for the workers that said who they are. */
  workerIds: Map<string, number>;
  /** The workers' last lines of output (up to 200), for a test or a caller to show when something failed. */
  workerLog(): string[];
  close(): Promise<void>;
}

export interface LocalClusterOptions {
  modelDir: string;
  weights: string;
  /** The KV cache every stage holds (publishPlan's `kv`; default auto). */
  kv?: string;
  plan?: { stages: { node: string }[] } & Record<string, unknown>;
  /** Where MoE experts live (publishPlan's `experts`). */
  experts?: "local" | "spread";
  signal?: AbortSignal;
  /** Progress lines (default: stderr). */
  log?: (msg: string) => void;
}

/**
 * How long a `--local` cluster's measurement of this machine's GPU (node/measure.ts: ~5 s on an H100, ~2 on
 * the software adapter, before anything loads) serves the next `--local` runs instead of measuring again.
 */
export const MEASUREMENT_REUSE_MS = 10 * 60_000;

/**
 * Why a kept measurement's GPU memory may no longer be free: swactor node processes that started after it
 * was made (before this process) and still run may hold part of the GPU now. Only for a GPU's own memory
 * ("device"): a software adapter's memory is the host's, and it is the planner's share of it that counts.
 */
export async function gpuMemoryTakenSince(m: NodeMeasurement): Promise<string | undefined> {
  if (m.memoryBound !== "device") return undefined;
  const nodes = await nodesStartedBetween(m.at, performance.timeOrigin);
  if (nodes.length === 0) return undefined;
  const pids = nodes.map((s) => s.pid).join(", ");
  return `${nodes.length} swactor node process${nodes.length > 1 ? "es" : ""} (pid ${pids}) started since ` +
    `the last measurement of this GPU and may hold part of its memory`;
}

export async function startLocalCluster(n: number, opts: LocalClusterOptions): Promise<LocalCluster> {
  const log = opts.log ?? ((m: string) => console.error(`swactor: ${m}`));
  if (n > 1) shareOneGpu();
  const secret = newSecret();
  // Its measurement is this machine's for MEASUREMENT_REUSE_MS: the next `--local` run starts without one.
  const reuse = {
    path: join(stateDir(), "measurement.json"),
    maxAgeMs: MEASUREMENT_REUSE_MS,
    changed: gpuMemoryTakenSince,
  };
  const node = await startNode({ secret, membership: presets.lan, measure: { reuse } });
  const pipeline = attachPipeline(node);
  // The workers run on this GPU too: they take this node's measurement rather than make N - 1 more, in turn.
  const shared = await shareMeasurement(node.measured);
  const children: Deno.ChildProcess[] = [];
  const stderrTail: string[] = [];
  const workerIds = new Map<string, number>();
  const debug = Deno.env.get("SWACTOR_DEBUG") === "1";
  let closed = false;
  const close = async () => {
    if (closed) return;
    closed = true;
    termWorkers(children);
    await pipeline.close().catch(() => {});
    await node.leave().catch(() => {});
    await stopWorkers(children);
    await shared.close();
  };
  try {
    const ticket = encodeTicket({ secret, leader: node.transport.self });
    for (let i = 1; i < n; i++) {
      const child = spawnWorker(ticket, { env: shared.env });
      children.push(child);
      collect(child.stderr, (line) => {
        const id = /^id: (\S+)$/.exec(line);
        if (id) workerIds.set(id[1], child.pid);
        if (debug || isWorkerWarning(line)) console.error(`[worker ${i}] ${line}`);
        stderrTail.push(`[worker ${i}] ${line}`);
        if (stderrTail.length > 200) stderrTail.shift();
      });
    }
    log(`local cluster: ${n} node(s); planning ${resolve(opts.modelDir)}`);
    const assignment = await publishPlan(node, pipeline, {
      modelDir: resolve(opts.modelDir),
      weights: opts.weights,
      kv: opts.kv,
      members: n,
      plan: opts.plan,
      experts: opts.experts,
      signal: opts.signal,
    });
    const stages = assignment.plan.stages.map((s) =>
      `[${s.layers}]${s.embeds ? "+embed" : ""}${s.head ? "+head" : ""}`
    );
    log(`plan v${assignment.version}: ${stages.length} stage(s) ${stages.join(" ")}; loading`);
    const chain = await pipeline.waitReady({ signal: opts.signal });
    return {
      node,
      pipeline,
      assignment,
      chain,
      workers: children.map((c) => c.pid),
      workerIds,
      workerLog: () => [...stderrTail],
      close,
    };
  } catch (e) {
    await close();
    if (stderrTail.length && !debug) console.error(stderrTail.slice(-40).join("\n"));
    throw e;
  }
}

/** Calls `onLine` for each line of a child process's output until it ends. */
export async function collect(
  stream: ReadableStream<Uint8Array>,
  onLine: (line: string) => void,
): Promise<void> {
  let buf = "";
  try {
    for await (const chunk of stream.pipeThrough(new TextDecoderStream())) {
      buf += chunk;
      let i;
      while ((i = buf.indexOf("\n")) >= 0) {
        onLine(buf.slice(0, i));
        buf = buf.slice(i + 1);
      }
    }
  } catch { /* the child is gone */ }
}
