// The control API: `GET /status`, `GET /registry`, `POST /down`, and, on a node that runs a pipeline,
// `GET /pipeline` and `POST /generate` (pipeline_routes.ts). `status`, `down` and `generate` are its clients
// (client.ts). Built by a factory over ApiServices, which nodeServices (services.ts) makes from a running
// node and tests make from fakes (app.request()); serveApi (serve.ts) serves it, on 127.0.0.1 by default.
// A guard (guard.ts) runs before every route: loopback is not enough, a browser page can reach it too.
import type { LoopLagStats } from "../loop_lag.ts";
import { Hono } from "hono";
import type { PipelineNode } from "../stage/mod.ts";
import type { LiveDescriptor } from "../../planner/live.ts";
import { type PipelineRouteOptions, pipelineRoutes, pipelineStatus } from "./pipeline_routes.ts";
import { type ApiGuard, guard } from "./guard.ts";

export interface MemberView {
  id: string;
  state: "alive" | "suspect" | "dead" | "left";
  /** Names this member hosts in the registry ("leader", "stage-3", ...). */
  roles: string[];
  name?: string;
  addrs?: string[];
  adapter?: string;
  gpuMemoryBytes?: number;
  version?: string;
  /** What the member measured about itself and its links (node/descriptor.ts descriptorView). */
  descriptor?: LiveDescriptor;
  /** Its process id, for a member on this machine. */
  pid?: number;
  /** How this node's data to the member travels while they are linked (Transport.dataPath). */
  dataPath?: "tls" | "iroh";
}

export interface ApiServices {
  /** This node's id. */
  self(): string;
  members(): MemberView[];
  /** name -> owner id. */
  registry(): [string, string][];
  /** A Plan to show: `up --plan` without --model gives one; else null, and /status shows the Assignment's. */
  plan(): unknown;
  /** Starts a graceful leave; the process exits once it is done. */
  down(): void;
  /** The node's pipeline, when it runs one (adds `pipeline` to /status, and /pipeline, /generate). */
  pipeline?(): PipelineNode | undefined;
  /** How long this node's event loop was held (node/loop_lag.ts; adds `loop` to /status). */
  loop?(): LoopLagStats | undefined;
}

export interface ApiOptions extends ApiGuard, PipelineRouteOptions {}

/** The app over `services`; every request passes the guard (guard.ts): the token opens POST routes. */
export function createApp(services: ApiServices, opts: ApiOptions): Hono {
  const app = new Hono();
  app.use(guard(opts));
  app.get("/status", async (c) => {
    const p = services.pipeline?.();
    const loop = services.loop?.();
    return c.json({
      self: services.self(),
      members: services.members(),
      plan: services.plan() ?? p?.board.current?.plan ?? null,
      ...(p ? { pipeline: await pipelineStatus(p) } : {}),
      ...(loop ? { loop } : {}),
    });
  });
  pipelineRoutes(app, () => services.pipeline?.(), opts);
  app.get(
    "/registry",
    (c) => c.json({ entries: services.registry().map(([name, owner]) => ({ name, owner })) }),
  );
  app.post("/down", (c) => {
    // Reply first, then leave: the caller learns the request was taken even though the server goes away.
    setTimeout(() => services.down(), 0);
    return c.json({ leaving: true }, 202);
  });
  app.notFound((c) => c.json({ error: `no such endpoint: ${c.req.method} ${c.req.path}` }, 404));
  return app;
}
