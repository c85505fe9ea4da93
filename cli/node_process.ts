// What `up` and `join` share: start a node, serve its control API, and run until a stop signal (SIGINT,
// SIGTERM, SIGHUP), POST /down or, for a worker, the end of its parent; then leave gracefully (state
// `left` at the others) within a bounded time, and resolve with the exit code. The control API's token
// (node/api/guard.ts) is made here and recorded, owner-only, in the node's state file for the CLI.
import { createApp, newApiToken, nodeServices, serveApi } from "../node/api/mod.ts";
import { clearNodeState, writeNodeState } from "../node/state_file.ts";
import { startNode, type SwactorNode } from "../node/node.ts";
import { presets } from "../node/membership/mod.ts";
import { BindError } from "../node/transport/errors.ts";
import { addressFlag, UsageError } from "./command.ts";
import { dialTableFromEnv } from "./dial_table.ts";
import { onStopSignal } from "./signals.ts";
import { MEASUREMENT_FROM_ENV } from "./workers.ts";
import type { PipelineNode } from "../node/stage/mod.ts";
import type { SpeculationSource } from "../node/stage/speculative.ts";
import type { KvBudget } from "../node/api/kv_budget.ts";

/** How long leaving the cluster may take before the process exits anyway (the others then see it dead). */
export const LEAVE_TIMEOUT_MS = 3000;
/** How long the command's own cleanup (its pipeline, its workers) may take after that. */
export const CLEANUP_TIMEOUT_MS = 8000;
import type { RelayChoice } from "./relay_flag.ts";

export interface NodeProcessOptions {
  secret: Uint8Array;
  /** --listen, as given (checked here). */
  listen?: string;
  /** --relay (default none). */
  relay?: RelayChoice;
  /** --api, as given (checked here: loopback only unless `exposeApi`). */
  api?: string;
  /** --expose-api: allow a non-loopback --api. */
  exposeApi?: boolean;
  membership?: string;
  /** Most memory the node offers, bytes (`--memory`); it measures itself within it (node/measure.ts). */
  memoryCap?: number;
  /** The node's name in its descriptor (`--name`; default: the host name). */
  name?: string;
  /** Offer no GPU (as SWACTOR_NO_GPU=1 does, without setting it for the whole process). */
  noGpu?: boolean;
  plan?: unknown;
  /** The node's pipeline, once attached (served by the control API). */
  pipeline?: () => PipelineNode | undefined;
  /** The node's KV budget, when another server (the OpenAI API) admits requests against it too. */
  budget?: KvBudget;
  /** The node's drafters (`up --model DIR --draft ...`): POST /generate may ask to speculate. */
  speculation?: SpeculationSource;
  /** Resolves when the process that started this node is gone (a worker's stdin ended): leave then. */
  parentGone?: Promise<void>;
  /**
   * Runs once the node and its API are up; may join a cluster. `signal` aborts when the node is told to
   * stop meanwhile (the process then leaves without waiting for it). Throwing stops the node.
   */
  ready(node: SwactorNode, api: { addr: string; token: string }, signal: AbortSignal): Promise<void>;
  /** Runs after the node left, before the process exits. */
  cleanup?(): Promise<void>;
  /** How long `cleanup` may take before the process exits anyway (default CLEANUP_TIMEOUT_MS). */
  cleanupTimeoutMs?: number;
  /**
   * The process exits once this returns (`up`, `join`), so leaving skips waits that only free its own
   * resources (transport.ts CloseOptions). Default false (a caller that goes on, such as a test).
   */
  exitsAfter?: boolean;
}

export function membershipPreset(name: string | undefined) {
  const key = (name ?? "lan") as keyof typeof presets;
  if (!(key in presets)) {
    throw new UsageError(`--membership must be one of ${Object.keys(presets).join(", ")}, got "${name}"`);
  }
  return presets[key];
}

/** The --api address to serve on: loopback unless the user said otherwise with --expose-api. */
export function apiAddress(value: string | undefined, expose: boolean): string | undefined {
  if (value === undefined) return undefined;
  const a = addressFlag(value, "api", { localhost: true });
  if (!a.loopback && !expose) {
    throw new UsageError(
      `--api ${value} is reachable from other machines, and the control API shows the cluster and runs ` +
        `generations for anyone who reaches it: use a loopback address (127.0.0.1:PORT), or add ` +
        `--expose-api to mean it`,
    );
  }
  return a.host === "localhost" ? `127.0.0.1:${a.port}` : a.text;
}

export async function runNodeProcess(opts: NodeProcessOptions): Promise<number> {
  const config = membershipPreset(opts.membership);
  const listen = opts.listen === undefined ? undefined : addressFlag(opts.listen, "listen").text;
  const apiAddr = apiAddress(opts.api, opts.exposeApi ?? false);
  let dialOverrides;
  try {
    dialOverrides = await dialTableFromEnv();
  } catch (e) {
    throw new UsageError((e as Error).message);
  }
  let node: SwactorNode;
  try {
    node = await startNode({
      secret: opts.secret,
      listen,
      preset: opts.relay?.preset,
      relayUrl: opts.relay?.relayUrl,
      membership: config,
      dialOverrides,
      memoryCap: opts.memoryCap,
      name: opts.name,
      noGpu: opts.noGpu,
      // `--local N`'s workers share its leader's GPU: they take its measurement instead of making their own.
      measure: Deno.env.get(MEASUREMENT_FROM_ENV) ? { adoptFrom: Deno.env.get(MEASUREMENT_FROM_ENV) } : true,
    });
  } catch (e) {
    if (e instanceof BindError) throw new UsageError(`--listen: ${e.message}`);
    throw e;
  }
  const stopping = new AbortController();
  const stop = (why: string) => stopping.signal.aborted || stopping.abort(why);
  const stopped = new Promise<void>((r) => stopping.signal.addEventListener("abort", () => r()));
  const token = newApiToken();
  let api;
  try {
    api = serveApi(
      createApp(
        nodeServices(node, { plan: opts.plan, down: () => stop("down"), pipeline: opts.pipeline }),
        { token, budget: opts.budget, speculation: opts.speculation },
      ),
      apiAddr,
    );
  } catch (e) {
    await node.leave().catch(() => {});
    throw new UsageError(`--api ${apiAddr}: cannot serve there: ${(e as Error).message}`);
  }
  const record = {
    pid: Deno.pid,
    api: api.addr,
    token,
    id: node.membership.id,
    startedAt: new Date().toISOString(),
  };
  await writeNodeState(record);
  const removeSignals = onStopSignal((signal, exitCode) => {
    if (!stopping.signal.aborted) return stop(signal);
    // A second signal: the user does not want to wait for the graceful leave.
    console.error(`swactor: ${signal} again: exiting without waiting`);
    Deno.exit(exitCode);
  });
  opts.parentGone?.then(() => {
    if (!stopping.signal.aborted) console.error("swactor: the process that started this node is gone");
    stop("parent gone");
  });
  let code = 0;
  try {
    const ready = opts.ready(node, { addr: api.addr, token }, stopping.signal);
    ready.catch(() => {}); // once stopped, how the abandoned start ends no longer matters
    await Promise.race([ready, stopped]);
    await stopped;
    console.error(`swactor: node ${node.membership.id.slice(0, 10)} leaving the cluster`);
  } catch (e) {
    if (!stopping.signal.aborted) {
      console.error(`swactor: ${e instanceof Error ? e.message : e}`);
      code = 1;
    }
  }
  const left = await within(
    LEAVE_TIMEOUT_MS,
    node.leave({ exiting: opts.exitsAfter }).then(() => api.close()),
  );
  if (!left) console.error(`swactor: leaving took over ${LEAVE_TIMEOUT_MS / 1000} s; exiting anyway`);
  const cleanupMs = opts.cleanupTimeoutMs ?? CLEANUP_TIMEOUT_MS;
  if (opts.cleanup && !(await within(cleanupMs, opts.cleanup()))) {
    console.error(`swactor: cleanup took over ${cleanupMs / 1000} s; exiting anyway`);
  }
  await clearNodeState(Deno.pid);
  removeSignals();
  return code;
}

/** Whether `p` settled (either way) within `ms`. */
async function within(ms: number, p: Promise<unknown>): Promise<boolean> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const late = new Promise<false>((r) => (timer = setTimeout(() => r(false), ms)));
  const done = await Promise.race([p.then(() => true, () => true), late]);
  clearTimeout(timer);
  return done;
}
