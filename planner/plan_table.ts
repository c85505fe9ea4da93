// A Plan as a table a person reads: one row per node in use, then the prediction.
import type { Plan } from "./plan.ts";
import { formatIds } from "./expert_ranges.ts";
import { humanBytes } from "./units.ts";

function expertsText(rec: Record<string, number[]> | undefined, total: (layer: number) => number): string {
  if (!rec) return "-";
  const keys = Object.keys(rec);
  if (keys.length === 0) return "-";
  const all = keys.every((k) => rec[k].length === total(Number(k)));
  if (all) return `all (${keys.length} MoE layers)`;
  const counts = keys.map((k) => rec[k].length);
  return `${counts.reduce((a, b) => a + b, 0)} in ${keys.length} layers` +
    (keys.length === 1 ? ` [${formatIds(rec[keys[0]])}]` : "");
}

/** Formats the plan; `expertsPerLayer` gives each MoE layer's routed-expert count (for "all"). */
export function formatPlanTable(plan: Plan, expertsPerLayer: (layer: number) => number = () => -1): string {
  const rows: string[][] = [[
    "stage",
    "node",
    "layers",
    "experts",
    "mem used",
    "mem free",
    "compute ms",
    "hop ms",
    "fan-out ms",
  ]];
  for (const s of plan.stages) {
    const n = plan.nodes.find((x) => x.id === s.node)!;
    const p = plan.predicted.stages[s.index];
    rows.push([
      String(s.index),
      s.node,
      `${s.layers[0]}..${s.layers[1]}${s.embeds ? " +emb" : ""}${s.head ? " +head" : ""}`,
      expertsText(s.experts, expertsPerLayer),
      humanBytes(n.memory.used),
      humanBytes(n.memory.free),
      (p.computeMs + p.overheadMs).toFixed(2),
      p.hopMs.toFixed(2),
      p.fanoutMs.toFixed(2),
    ]);
  }
  for (const h of plan.expertHosts) {
    const n = plan.nodes.find((x) => x.id === h.node)!;
    rows.push([
      "-",
      h.node,
      "experts",
      expertsText(h.experts, expertsPerLayer),
      humanBytes(n.memory.used),
      humanBytes(n.memory.free),
      "",
      "",
      "",
    ]);
  }
  const widths = rows[0].map((_, c) => Math.max(...rows.map((r) => r[c].length)));
  const lines = rows.map((r) =>
    r.map((v, c) => c >= 4 ? v.padStart(widths[c]) : v.padEnd(widths[c])).join("  ").trimEnd()
  );
  lines.splice(1, 0, widths.map((w) => "-".repeat(w)).join("  "));
  const idle = plan.nodes.filter((n) => n.role === "idle").map((n) => n.id);
  const pr = plan.predicted;
  lines.push(
    "",
    `model ${plan.model.name}: ${plan.model.layers} layers, context ${plan.context}, experts ${plan.expertMode}; ` +
      `cluster ${plan.cluster}: ${plan.stages.length} stages` +
      (idle.length
        ? `, ${idle.length} idle (${idle.slice(0, 8).join(", ")}${idle.length > 8 ? ", ..." : ""})`
        : ""),
    `predicted: ${pr.tokenMs.toFixed(1)} ms/token = ${
      pr.tokS.toFixed(2)
    } tok/s (limited by ${pr.limitedBy}; ` +
      `compute ${sumOf(plan, "computeMs")} ms, overhead ${sumOf(plan, "overheadMs")} ms, hops ${
        sumOf(plan, "hopMs")
      } ms, fan-out ${sumOf(plan, "fanoutMs")} ms)`,
    `search: ${plan.search.exact ? "exact" : "heuristic"}, ${plan.search.evaluated} orders in ${
      plan.search.ms.toFixed(0)
    } ms`,
  );
  return lines.join("\n");
}

function sumOf(plan: Plan, k: "computeMs" | "overheadMs" | "hopMs" | "fanoutMs"): string {
  return plan.predicted.stages.reduce((a, s) => a + s[k], 0).toFixed(1);
}
