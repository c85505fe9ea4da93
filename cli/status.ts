// `swactor status`: the members a node sees, as a table or as JSON.
import { apiError, apiFetch, apiTarget, type MemberView } from "../node/api/mod.ts";
import { type Command, parseFlags } from "./command.ts";

export const status: Command = {
  name: "status",
  summary: "show the cluster's members as a node sees them",
  usage: `Usage: swactor status [--json] [--api HOST:PORT]

Asks the node at --api (default: the node \`up\` started on this machine) for its view of the cluster.
  --json   print {"members": [{"id", "state", "roles", ...}], "plan": ...} on one line`,
  async run(argv) {
    const { values } = parseFlags(argv, { json: { type: "boolean" }, api: { type: "string" } });
    const res = await apiFetch(await apiTarget(values.api), "/status");
    if (!res.ok) throw new Error(`the control API refused: ${await apiError(res)}`);
    const body = await res.json() as {
      self: string;
      members: MemberView[];
      plan: unknown;
      pipeline?: {
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
      m.adapter || "-",
      m.roles.join(","),
    ]);
    const head = ["  ID", "STATE", "NAME", "ADDRESS", "ADAPTER", "ROLES"];
    const widths = head.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i].length)));
    for (const r of [head, ...rows]) console.log(r.map((c, i) => c.padEnd(widths[i])).join("  ").trimEnd());
    for (const s of body.pipeline?.stages ?? []) {
      console.log(
        `stage ${s.index}  node ${(s.node ?? "?").slice(0, 16)}  layers [${s.layers ?? "?"}]  ` +
          (s.error ? `error: ${s.error}` : `active requests ${s.active}  KV bytes ${s.kvBytes}`),
      );
    }
    return 0;
  },
};
