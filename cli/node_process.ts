// What `up` and `join` share: start a node, serve its control API, and run until SIGINT/SIGTERM or
// POST /down, then leave gracefully (state `left` at the others) and resolve with the exit code.
import { createApp, nodeServices, serveApi } from "../node/api/mod.ts";
import { startNode, type SwactorNode } from "../node/node.ts";
import { presets } from "../node/membership/mod.ts";
import { UsageError } from "./command.ts";
import { dialTableFromEnv } from "./dial_table.ts";
import type { PipelineNode } from "../node/stage/mod.ts";
import type { RelayChoice } from "./relay_flag.ts";

export interface NodeProcessOptions {
  secret: Uint8Array;
  listen?: string;
  /** --relay (default none). */
  relay?: RelayChoice;
  api?: string;
  membership?: string;
  plan?: unknown;
  /** The node's pipeline, once attached (served by the control API). */
  pipeline?: () => PipelineNode | undefined;
  /** Runs once the node and its API are up; may join a cluster. Throwing stops the node. */
  ready(node: SwactorNode, api: string): Promise<void>;
  /** Runs after the node left, before the process exits. */
  cleanup?(): Promise<void>;
}

export function membershipPreset(name: string | undefined) {
  const key = (name ?? "lan") as keyof typeof presets;
  if (!(key in presets)) {
    throw new UsageError(`--membership must be one of ${Object.keys(presets).join(", ")}, got "${name}"`);
  }
  return presets[key];
}

export async function runNodeProcess(opts: NodeProcessOptions): Promise<number> {
  const config = membershipPreset(opts.membership);
  const node = await startNode({
    secret: opts.secret,
    listen: opts.listen,
    preset: opts.relay?.preset,
    relayUrl: opts.relay?.relayUrl,
    membership: config,
    dialOverrides: await dialTableFromEnv(),
  });
  let stop!: () => void;
  const stopped = new Promise<void>((r) => (stop = r));
  const api = serveApi(
    createApp(nodeServices(node, { plan: opts.plan, down: () => stop(), pipeline: opts.pipeline })),
    opts.api,
  );
  const signals: Deno.Signal[] = ["SIGINT", "SIGTERM"];
  for (const s of signals) Deno.addSignalListener(s, stop);
  let code = 0;
  try {
    await opts.ready(node, api.addr);
    await stopped;
    console.error(`swactor: node ${node.membership.id.slice(0, 10)} leaving the cluster`);
  } catch (e) {
    console.error(`swactor: ${e instanceof Error ? e.message : e}`);
    code = 1;
  }
  for (const s of signals) Deno.removeSignalListener(s, stop);
  await node.leave().catch(() => {});
  await api.close().catch(() => {});
  await opts.cleanup?.();
  return code;
}
