// The per-token trace as Chrome trace-event JSON (opens in Perfetto or chrome://tracing): one track (a trace
// "process") per node, stage nodes first in chain order, then the expert hosts. Pure: built from the
// HopTraces that ride on the pipeline's messages (node/stage/messages.ts). Timestamps are the nodes' own
// clocks (epoch ms), exact on one machine (--local, --cluster) and skewed by the clock offsets across machines.
//
// On a node's track, per token (each event's `cat` says what it is, `args.token` which token; the prefill is
// token 0):
//   thread "compute"      cat "compute": a stage's step, from the end of its wait to its output leaving
//                         (args: stage, wait_ms, bytes_out; it includes the stage's MoE fan-outs)
//   thread "wire out"     cat "hop": the step's hidden state on its way to the next stage, or the token back
//                         to stage 0 (args: from, to, bytes, wire_ms)
//   thread "fan-out -> X" cat "fanout": one MoE layer's message to node X and its reply (args: layer,
//                         bytes, experts, host_ms: the host's compute of it)
//   thread "expert host"  cat "expert": the host's compute of that call on the host's track (centred in the
//                         call: the wire takes about as long each way)
//   thread "events"       anything else: recoveries, speculation (below)
//
// THE PLACE TO ADD TRACE EVENTS: a stage attaches a `TraceNote` to the hop it is about to send
// (`addTraceNote(hop, {...})`: it travels with the step's trace to the client), and code on the client side
// passes notes of its own to `chromeTrace(..., { notes })`. Either way a note lands on its node's "events"
// thread with its `cat` ("recovery", "speculation", ...), and scripts/trace_breakdown.ts adds a column per
// `cat` it finds. docs/DOD.md shows the result.
import type { HopTrace } from "./messages.ts";

export interface TraceEvent {
  name: string;
  ph: "X" | "M" | "i";
  pid: number;
  tid: number;
  cat?: string;
  ts?: number;
  dur?: number;
  s?: "t" | "p" | "g";
  args?: Record<string, unknown>;
}

/** One step of the chain: its trace; speculative decoding names it and adds its drafting time. */
export interface TraceStep {
  token: number;
  trace: HopTrace[];
  /** Default: "prefill" for the first step, then "token k". */
  label?: string;
  /** When the drafter ran for this step (epoch ms) and for how long, on the client beside stage 0. */
  draft?: { at: number; ms: number };
}

/** Something to show on a node's track besides the steps: a recovery, a speculation round, ... */
export interface TraceNote {
  /** What it is, shown as the event's name. */
  name: string;
  /** Its kind: "recovery", "speculation", ... (scripts/trace_breakdown.ts sums each kind per token). */
  cat: string;
  /** When it started, ms since the epoch (performance.timeOrigin + performance.now()). */
  at: number;
  /** How long it took, ms; absent: an instant. */
  ms?: number;
  /** The node it happened on (default: the stage whose hop carries it). */
  node?: string;
  args?: Record<string, unknown>;
}

/** Attaches a note to a hop's trace record (a stage's side of "the place to add trace events"). */
export function addTraceNote(hop: HopTrace, note: TraceNote): void {
  (hop.n ??= []).push(note);
}

const THREADS = { compute: 0, wire: 1, host: 2, events: 3, draft: 4, fanout: 10 } as const;

/**
 * Each recovery (docs/RECOVERY.md) as a note: a span from the lost attempt's last message to the first token
 * after the resume, on the lost stage's node (which may be gone: it keeps its track) or `fallback`'s.
 */
export function recoveryNotes(
  recoveries: readonly {
    stage: number | null;
    node: string | null;
    reason: string;
    ms: number;
    gap_ms: number;
    at: number;
  }[],
  fallback: string,
): TraceNote[] {
  return recoveries.map((r) => ({
    name: `recovery: stage ${r.stage ?? "?"} (${(r.node ?? "?").slice(0, 10)}) ${r.reason}`,
    cat: "recovery",
    at: r.at - r.gap_ms,
    ms: r.gap_ms,
    node: r.node ?? fallback,
    args: { ...r },
  }));
}

/**
 * Chrome trace events for a generation: `steps[k]` is the trace of the step that produced generated token
 * k (k = 0 is the prefill). Times are microseconds from the first stage's first arrival. `names` gives the
 * nodes' names (node id -> name) and `notes` more events (TraceNote; `node` is required there).
 */
export function chromeTrace(
  steps: TraceStep[],
  stages: { index: number; node: string }[],
  opts: { names?: ReadonlyMap<string, string>; notes?: TraceNote[] } = {},
): { traceEvents: TraceEvent[]; displayTimeUnit: "ms" } {
  const t0 = Math.min(...steps.flatMap((s) => s.trace.map((h) => h.in)));
  const us = (ms: number) => Math.round((ms - t0) * 1000);
  const nodes: string[] = [];
  const pid = (node: string) => {
    let i = nodes.indexOf(node);
    if (i < 0) i = nodes.push(node) - 1;
    return i + 1;
  };
  const nodeOf = (stage: number) => stages.find((s) => s.index === stage)?.node ?? `stage-${stage}`;
  for (const s of stages) pid(s.node);
  const events: TraceEvent[] = [];
  const threads = new Map<string, string>();
  const thread = (p: number, tid: number, name: string) => threads.set(`${p}:${tid}`, name);
  const noteEvent = (n: TraceNote, node: string, token: number) => {
    const p = pid(n.node ?? node);
    thread(p, THREADS.events, "events");
    events.push({
      name: n.name,
      cat: n.cat,
      ph: n.ms === undefined ? "i" : "X",
      ...(n.ms === undefined ? { s: "t" as const } : { dur: Math.round(n.ms * 1000) }),
      pid: p,
      tid: THREADS.events,
      ts: us(n.at),
      args: { token, ...n.args },
    });
  };
  steps.forEach((step, k) => {
    const label = step.label ?? (k === 0 ? "prefill" : `token ${k}`);
    if (step.draft) {
      const p = pid(nodeOf(step.trace[0]?.s ?? 0));
      thread(p, THREADS.draft, "drafter");
      events.push({
        name: `draft: ${label}`,
        cat: "draft",
        ph: "X",
        pid: p,
        tid: THREADS.draft,
        ts: us(step.draft.at),
        dur: Math.round(step.draft.ms * 1000),
        args: { token: k },
      });
    }
    step.trace.forEach((h, i) => {
      const node = nodeOf(h.s);
      const p = pid(node);
      const start = h.in + (h.w ?? 0); // compute starts after the step's wait at the stage
      thread(p, THREADS.compute, "compute");
      events.push({
        name: label,
        cat: "compute",
        ph: "X",
        pid: p,
        tid: THREADS.compute,
        ts: us(start),
        dur: Math.round(h.c * 1000),
        args: { token: k, stage: h.s, wait_ms: h.w ?? 0, bytes_out: h.b },
      });
      for (const [layer, dests] of Object.entries(h.x ?? {})) {
        for (const [dest, [bytes, ms, experts, at, hostMs]] of Object.entries(dests)) {
          const d = pid(dest);
          const tid = THREADS.fanout + d;
          const name = opts.names?.get(dest) ?? dest.slice(0, 10);
          thread(p, tid, `fan-out -> ${name}`);
          const ts = us(at ?? start);
          const args = {
            token: k,
            layer: Number(layer),
            stage: h.s,
            bytes,
            experts,
            host_ms: hostMs ?? null,
          };
          events.push({
            name: `${label}: layer ${layer} -> ${name}`,
            cat: "fanout",
            ph: "X",
            pid: p,
            tid,
            ts,
            dur: Math.round(ms * 1000),
            args,
          });
          if (dest !== node) {
            // The host's compute, where it ran: centred in the call (the wire takes about as long each way);
            // the whole call when the host did not say (older nodes).
            const compute = hostMs ?? ms;
            thread(d, THREADS.host, "expert host");
            events.push({
              name: `${label}: layer ${layer} experts [${experts}] for stage ${h.s}`,
              cat: "expert",
              ph: "X",
              pid: d,
              tid: THREADS.host,
              ts: ts + Math.round(((ms - compute) / 2) * 1000),
              dur: Math.round(compute * 1000),
              args,
            });
          }
        }
      }
      for (const n of h.n ?? []) noteEvent(n, node, k);
      const next = step.trace[i + 1];
      if (next) {
        thread(p, THREADS.wire, "wire out");
        const wire = Math.max(0, next.in - h.out);
        events.push({
          name: `${label}: stage ${h.s} -> ${next.s}`,
          cat: "hop",
          ph: "X",
          pid: p,
          tid: THREADS.wire,
          ts: us(h.out),
          dur: Math.round(wire * 1000),
          args: { token: k, from: h.s, to: next.s, bytes: h.b, wire_ms: Number(wire.toFixed(3)) },
        });
      }
    });
    const first = step.trace[0], last = step.trace.at(-1);
    if (first?.r !== undefined && last) {
      const p = pid(nodeOf(last.s));
      thread(p, THREADS.wire, "wire out");
      events.push({
        name: `${label}: token back to stage ${first.s}`,
        cat: "hop",
        ph: "X",
        pid: p,
        tid: THREADS.wire,
        ts: us(first.in - first.r),
        dur: Math.round(first.r * 1000),
        args: { token: k, from: last.s, to: first.s, bytes: last.b, wire_ms: first.r },
      });
    }
  });
  for (const n of opts.notes ?? []) noteEvent(n, n.node ?? nodes[0], -1);
  const meta: TraceEvent[] = nodes.flatMap((node, i) => {
    const stageList = stages.filter((s) => s.node === node).map((s) => s.index);
    const role = stageList.length ? `stage ${stageList.join(", ")}` : "experts";
    const name = opts.names?.get(node);
    return [
      {
        name: "process_name",
        ph: "M" as const,
        pid: i + 1,
        tid: 0,
        args: { name: `${name ? `${name} ` : ""}(${node.slice(0, 10)}): ${role}` },
      },
      { name: "process_sort_index", ph: "M" as const, pid: i + 1, tid: 0, args: { sort_index: i } },
    ];
  });
  for (const [key, name] of threads) {
    const [p, tid] = key.split(":").map(Number);
    meta.push({ name: "thread_name", ph: "M", pid: p, tid, args: { name } });
  }
  return { traceEvents: [...meta, ...events], displayTimeUnit: "ms" };
}
