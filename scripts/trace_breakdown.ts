// Where the time went, per token, from a `--trace FILE` (node/stage/trace_events.ts):
//
//   deno run -A scripts/trace_breakdown.ts TRACE.json [--json]
//
// Prints two markdown tables: per token (the prefill is token 0), its time split into the stages' own
// compute (GPU work, readbacks, the host's encode: a stage's compute minus its MoE fan-outs), the MoE
// fan-outs (per layer, the slowest destination's call: its wire both ways and the host's compute, which is
// also shown on its own), the hops
// on the wire (the hidden state stage to stage, and the token back to stage 0) and the bytes moved, plus one
// column per other kind of event found (recoveries, speculation: TraceNote's `cat`), and the mean over the
// decode tokens with each part's share; then per stage, the mean decode compute, fan-out and outgoing hop.
// A token's total is its stages' compute plus its hops: a batch-1 chain runs them one after another.
import { parseFlags } from "../cli/command.ts";
import { scriptArgs } from "./args.ts";

interface Event {
  name: string;
  ph: string;
  pid: number;
  tid: number;
  cat?: string;
  ts?: number;
  dur?: number;
  args?: Record<string, unknown>;
}

export interface TokenRow {
  token: number;
  totalMs: number;
  computeMs: number;
  fanoutMs: number;
  /** Of fanoutMs: the hosts' own compute (the slowest destination's, per layer). */
  hostMs: number;
  wireMs: number;
  hopBytes: number;
  fanoutBytes: number;
  /** Other event kinds (TraceNote cat) -> ms. */
  other: Record<string, number>;
}

export interface StageRow {
  stage: number;
  node: string;
  computeMs: number;
  fanoutMs: number;
  hopMs: number;
}

const CORE = new Set(["compute", "fanout", "expert", "hop"]);

/** The per-token and per-stage (decode mean) breakdown of a trace's events. */
export function breakdown(events: Event[]): { tokens: TokenRow[]; stages: StageRow[]; kinds: string[] } {
  const names = new Map<number, string>();
  for (const e of events) {
    if (e.ph === "M" && e.name === "process_name") names.set(e.pid, String(e.args?.name ?? e.pid));
  }
  const rows = new Map<number, TokenRow>();
  const row = (t: number) => {
    let r = rows.get(t);
    if (!r) {
      r = {
        token: t,
        totalMs: 0,
        computeMs: 0,
        fanoutMs: 0,
        hostMs: 0,
        wireMs: 0,
        hopBytes: 0,
        fanoutBytes: 0,
        other: {},
      };
      rows.set(t, r);
    }
    return r;
  };
  const kinds = new Set<string>();
  // per token and (stage, layer): the slowest destination, and its host's compute
  const layerMax = new Map<string, { ms: number; host: number }>();
  const stageAcc = new Map<number, { node: string; c: number; f: number; h: number }>();
  const stage = (s: number, pid: number) => {
    let a = stageAcc.get(s);
    if (!a) {
      a = { node: names.get(pid) ?? String(pid), c: 0, f: 0, h: 0 };
      stageAcc.set(s, a);
    }
    return a;
  };
  const tokens = new Set<number>();
  for (const e of events) {
    if (e.ph === "M") continue;
    const t = Number(e.args?.token);
    if (!Number.isInteger(t) || t < 0) continue;
    const ms = (e.dur ?? 0) / 1000;
    const r = row(t);
    const decode = t > 0;
    if (decode) tokens.add(t);
    if (e.cat === "compute") {
      r.computeMs += ms;
      if (decode) stage(Number(e.args!.stage), e.pid).c += ms;
    } else if (e.cat === "hop") {
      r.wireMs += ms;
      r.hopBytes += Number(e.args?.bytes ?? 0);
      if (decode) stage(Number(e.args!.from), e.pid).h += ms;
    } else if (e.cat === "fanout") {
      const key = `${t}:${e.args!.stage}:${e.args!.layer}`;
      const host = typeof e.args?.host_ms === "number" ? e.args.host_ms as number : 0;
      if (ms >= (layerMax.get(key)?.ms ?? -1)) layerMax.set(key, { ms, host });
      r.fanoutBytes += Number(e.args?.bytes ?? 0);
    } else if (e.cat && !CORE.has(e.cat)) {
      kinds.add(e.cat);
      r.other[e.cat] = (r.other[e.cat] ?? 0) + ms;
    }
  }
  for (const [key, { ms, host }] of layerMax) {
    const [t, s] = key.split(":").map(Number);
    rows.get(t)!.fanoutMs += ms;
    rows.get(t)!.hostMs += host;
    if (t > 0) {
      const a = stageAcc.get(s);
      if (a) a.f += ms;
    }
  }
  for (const r of rows.values()) {
    r.totalMs = r.computeMs + r.wireMs;
    r.computeMs -= r.fanoutMs; // the stages' own part
  }
  const n = Math.max(1, tokens.size);
  return {
    tokens: [...rows.values()].sort((a, b) => a.token - b.token),
    stages: [...stageAcc].sort((a, b) => a[0] - b[0]).map(([s, a]) => ({
      stage: s,
      node: a.node,
      computeMs: (a.c - a.f) / n,
      fanoutMs: a.f / n,
      hopMs: a.h / n,
    })),
    kinds: [...kinds].sort(),
  };
}

const f = (x: number, d = 1) => x.toFixed(d);

/** The two markdown tables. */
export function breakdownMarkdown(b: ReturnType<typeof breakdown>): string {
  const head = [
    "token",
    "total ms",
    "stage compute ms",
    "MoE fan-out ms",
    "of which host compute",
    "hops (wire) ms",
    "hop bytes",
    "fan-out bytes",
    ...b.kinds.map((k) => `${k} ms`),
  ];
  const line = (cells: string[]) => `| ${cells.join(" | ")} |`;
  const out = [line(head), line(head.map(() => "---"))];
  const cells = (r: TokenRow, label: string) => [
    label,
    f(r.totalMs),
    f(r.computeMs),
    f(r.fanoutMs),
    f(r.hostMs),
    f(r.wireMs),
    String(Math.round(r.hopBytes)),
    String(Math.round(r.fanoutBytes)),
    ...b.kinds.map((k) => f(r.other[k] ?? 0)),
  ];
  for (const r of b.tokens) out.push(line(cells(r, r.token === 0 ? "prefill" : String(r.token))));
  const decode = b.tokens.filter((r) => r.token > 0);
  if (decode.length) {
    const mean = (g: (r: TokenRow) => number) => decode.reduce((s, r) => s + g(r), 0) / decode.length;
    const m: TokenRow = {
      token: -1,
      totalMs: mean((r) => r.totalMs),
      computeMs: mean((r) => r.computeMs),
      fanoutMs: mean((r) => r.fanoutMs),
      hostMs: mean((r) => r.hostMs),
      wireMs: mean((r) => r.wireMs),
      hopBytes: mean((r) => r.hopBytes),
      fanoutBytes: mean((r) => r.fanoutBytes),
      other: Object.fromEntries(b.kinds.map((k) => [k, mean((r) => r.other[k] ?? 0)])),
    };
    out.push(line(cells(m, "**decode mean**")));
    const pct = (x: number) => `${f((100 * x) / m.totalMs, 0)}%`;
    out.push(line([
      "share",
      "100%",
      pct(m.computeMs),
      pct(m.fanoutMs),
      pct(m.hostMs),
      pct(m.wireMs),
      "",
      "",
      ...b.kinds.map((k) => pct(m.other[k])),
    ]));
  }
  out.push("");
  const sh = ["stage", "node", "compute ms (own)", "MoE fan-out ms", "hop out ms"];
  out.push(line(sh), line(sh.map(() => "---")));
  for (const s of b.stages) {
    out.push(line([String(s.stage), s.node, f(s.computeMs, 2), f(s.fanoutMs, 2), f(s.hopMs, 2)]));
  }
  return out.join("\n");
}

if (import.meta.main) {
  const { values, positionals } = scriptArgs(
    import.meta.url,
    (args) =>
      parseFlags(args, { json: { type: "boolean" } }, {
        allowPositionals: true,
      }),
  );
  if (positionals.length !== 1) {
    console.error("Usage: deno run -A scripts/trace_breakdown.ts TRACE.json [--json]");
    Deno.exit(2);
  }
  let events: Event[];
  try {
    const t = JSON.parse(await Deno.readTextFile(positionals[0]));
    events = Array.isArray(t) ? t : t.traceEvents;
    if (!Array.isArray(events)) throw new Error("no traceEvents");
  } catch (e) {
    console.error(`trace_breakdown: ${positionals[0]}: not a trace: ${(e as Error).message}`);
    Deno.exit(2);
  }
  const b = breakdown(events);
  console.log(values.json ? JSON.stringify(b) : breakdownMarkdown(b));
}
