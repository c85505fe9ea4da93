// `swactor status`: the members a node sees, as a table or as JSON.
import type { LoopLagStats } from "../node/loop_lag.ts";
import { apiError, apiFetch, apiTarget, type MemberView } from "../node/api/mod.ts";
import { type Command, parseFlags } from "./command.ts";
import { humanBytes } from "../planner/units.ts";

/** What a member measured, for the table: memory, bandwidth, step and dispatch costs, its links' mean RTT. */
function measuredColumns(m: MemberView): string[] {
  const d = m.descriptor;
  const mem = d?.memory_bytes ? humanBytes(d.memory_bytes) : "-";
  if (!d?.measured_at) {
    return [mem, d && "measuring" in d && d.measuring ? "measuring" : "-", "-", "-", rtt(d)];
  }
  const num = (x: number | null | undefined, digits: number) => x == null ? "-" : x.toFixed(digits);
  return [mem, num(d.read_gbps, 2), num(d.readback_ms, 3), num(d.dispatch_ms, 4), rtt(d)];
}

function rtt(d: MemberView["descriptor"]): string {
  const r = Object.values(d?.links ?? {}).map((l) => l.rtt_ms);
  return r.length ? `${(r.reduce((a, b) => a + b, 0) / r.length).toFixed(2)} (${r.length})` : "-";
}

export const status: Command = {
  name: "status",
  summary: "show the cluster's members as a node sees them",
  usage: `Usage: swactor status [--json] [--api HOST:PORT]

Asks the node at --api (default: the node \`up\` started on this machine) for its view of the cluster.
  --json   print {"members": [{"id", "state", "roles", "descriptor", "pid"?, ...}], "plan": ...,
           "pipeline"?: {"ready", "stages", "replans", ...}} on one line; each member's descriptor holds what
           it measured (memory, bandwidth, per-step costs) and its links; pid is given for members on this
           machine; roles are leader, stage-{i} and expert sets; pipeline.ready is true when every stage of
           the current Plan is ready; pipeline.assignment.wire is what requests that name no wire send
           between stages (\`up --wire\`); replans lists the re-plans after lost nodes this node made as leader;
           loop: {"maxMs", "holds", "lastMs"}, how long this node's event loop was held (GPU work on its
           thread: its longest hold, and the holds of 1 s or more, which can get a live node declared dead);
           a member's dataPath is how this node's data to it travels while they are linked: "tls" (the
           direct path) or "iroh" (the fallback, a few MB/s: a firewall or NAT kept TCP from reaching it)
The table shows each member's measured memory, GEMV bandwidth (GB/s at the widest width measured), a step's
fixed cost and each dispatch's (ms), the mean round trip of its links (ms, and how many), and how this
node's data to it travels (DATA: tls, iroh, or - while not linked).`,
  async run(argv) {
    const { values } = parseFlags(argv, { json: { type: "boolean" }, api: { type: "string" } });
    const res = await apiFetch(await apiTarget(values.api), "/status");
    if (!res.ok) throw new Error(`the control API refused: ${await apiError(res)}`);
    const body = await res.json() as {
      self: string;
      members: MemberView[];
      plan: unknown;
      loop?: LoopLagStats;
      pipeline?: {
        ready?: boolean;
        assignment?: {
          version: number;
          leader: string;
          wire?: string;
          model?: { weights?: string; kv?: string };
        } | null;
        replans?: {
          from: number;
          to: number;
          lost: { node: string; reason: string }[];
          how: string;
          ms: number;
        }[];
        stages: {
          index: number;
          node?: string;
          layers?: number[];
          active?: number;
          kvBytes?: number;
          error?: string;
        }[];
      };
    };
    if (values.json) {
      console.log(JSON.stringify(body));
      return 0;
    }
    const rows = body.members.map((m) => [
      (m.id === body.self ? "* " : "  ") + m.id.slice(0, 16),
      m.state,
      m.name ?? "",
      (m.addrs ?? []).join(","),
      m.pid === undefined ? "-" : String(m.pid),
      m.adapter || "-",
      ...measuredColumns(m),
      m.dataPath ?? "-",
      m.roles.join(","),
    ]);
    const head = [
      "  ID",
      "STATE",
      "NAME",
      "ADDRESS",
      "PID",
      "ADAPTER",
      "MEMORY",
      "READ GB/S",
      "STEP MS",
      "DISPATCH MS",
      "RTT MS",
      "DATA",
      "ROLES",
    ];
    const widths = head.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i].length)));
    for (const r of [head, ...rows]) console.log(r.map((c, i) => c.padEnd(widths[i])).join("  ").trimEnd());
    if (body.loop?.holds) {
      console.log(
        `this node's event loop was held ${body.loop.holds} time(s) for 1 s or more (longest ${
          (body.loop.maxMs / 1000).toFixed(1)
        } s): GPU work on its thread; peers may declare a node dead that does not answer for ~3 s`,
      );
    }
    const p = body.pipeline;
    if (p?.assignment) {
      console.log(
        `plan v${p.assignment.version}, leader ${p.assignment.leader.slice(0, 16)}: ${
          p.ready ? "ready" : "not ready"
        }${p.assignment.model?.weights ? `, weights ${p.assignment.model.weights}` : ""}${
          p.assignment.model?.kv ? `, KV cache ${p.assignment.model.kv}` : ""
        }${p.assignment.wire ? `, activations ${p.assignment.wire} between stages` : ""}`,
      );
    }
    for (const r of p?.replans ?? []) {
      console.log(
        `re-planned v${r.from} -> v${r.to} (${r.how}) after losing ${
          r.lost.map((l) => `${l.node.slice(0, 16)} (${l.reason})`).join(", ")
        }, in ${r.ms} ms`,
      );
    }
    for (const s of body.pipeline?.stages ?? []) {
      console.log(
        `stage ${s.index}  node ${(s.node ?? "?").slice(0, 16)}  layers [${s.layers ?? "?"}]  ` +
          (s.error ? `error: ${s.error}` : `active requests ${s.active}  KV bytes ${s.kvBytes}`),
      );
    }
    return 0;
  },
};
