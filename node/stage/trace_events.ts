// The per-token, per-hop trace as Chrome trace-event JSON (opens in Perfetto or chrome://tracing): one
// track per stage with its compute span for every step, and a "wire" track with every hop between them,
// including the token's way back from the last stage to stage 0. Pure: built from the HopTraces that ride
// on the pipeline's messages (node/stage/messages.ts). Timestamps are the stages' own clocks (epoch ms),
// exact on one machine (--local) and skewed by the clock offsets across machines.
import type { HopTrace } from "./messages.ts";

export interface TraceEvent {
  name: string;
  ph: "X" | "M";
  pid: number;
  tid: number;
  ts?: number;
  dur?: number;
  args?: Record<string, unknown>;
}

/** Track (pid) of the wire hops; stages use their index. */
export const WIRE_PID = 1000;
/** Track of the recoveries (docs/RECOVERY.md). */
export const RECOVERY_PID = 1001;

/** One step of the chain: its trace; speculative decoding names it and adds its drafting time. */
export interface TraceStep {
  token: number;
  trace: HopTrace[];
  /** Default: "prefill" for the first step, then "token k". */
  label?: string;
  /** When the drafter ran for this step (epoch ms) and for how long, on the client beside stage 0. */
  draft?: { at: number; ms: number };
}

/**
 * Chrome trace events for a generation: `steps[k]` is the trace of the step that produced generated token
 * k (k = 0 is the prefill). Times are microseconds from the first stage's first arrival.
 */
export function chromeTrace(
  steps: TraceStep[],
  stages: { index: number; node: string }[],
  recoveries: {
    stage: number | null;
    node: string | null;
    reason: string;
    ms: number;
    gap_ms: number;
    at: number;
  }[] = [],
): { traceEvents: TraceEvent[]; displayTimeUnit: "ms" } {
  const t0 = Math.min(...steps.flatMap((s) => s.trace.map((h) => h.in)));
  const us = (ms: number) => Math.round((ms - t0) * 1000);
  const events: TraceEvent[] = stages.map((s) => ({
    name: "process_name",
    ph: "M" as const,
    pid: s.index,
    tid: 0,
    args: { name: `stage-${s.index} (${s.node.slice(0, 10)})` },
  }));
  events.push({ name: "process_name", ph: "M", pid: WIRE_PID, tid: 0, args: { name: "wire" } });
  steps.forEach((step, k) => {
    const label = step.label ?? (k === 0 ? "prefill" : `token ${k}`);
    if (step.draft) {
      events.push({
        name: `draft: ${label}`,
        ph: "X",
        pid: step.trace[0]?.s ?? 0,
        tid: 1,
        ts: us(step.draft.at),
        dur: Math.round(step.draft.ms * 1000),
      });
    }
    step.trace.forEach((h, i) => {
      events.push({
        name: label,
        ph: "X",
        pid: h.s,
        tid: 0,
        ts: us(h.in + (h.w ?? 0)), // compute starts after the step's wait at the stage
        dur: Math.round(h.c * 1000),
        args: { token: step.token, bytes_out: h.b },
      });
      const next = step.trace[i + 1];
      if (next) {
        events.push({
          name: `${label}: stage ${h.s} -> ${next.s}`,
          ph: "X",
          pid: WIRE_PID,
          tid: h.s,
          ts: us(h.out),
          dur: Math.max(0, Math.round((next.in - h.out) * 1000)),
          args: { bytes: h.b },
        });
      }
    });
    const first = step.trace[0], last = step.trace.at(-1);
    if (first?.r !== undefined && last) {
      events.push({
        name: `${label}: token back to stage ${first.s}`,
        ph: "X",
        pid: WIRE_PID,
        tid: last.s,
        ts: us(first.in - first.r),
        dur: Math.round(first.r * 1000),
      });
    }
  });
  // Each recovery: a span on its own track from the lost attempt's last message to the first token after
  // the resume (a lost stage's track may belong to a node that is gone).
  if (recoveries.length) {
    events.push({ name: "process_name", ph: "M", pid: RECOVERY_PID, tid: 0, args: { name: "recoveries" } });
  }
  for (const r of recoveries) {
    events.push({
      name: `recovery: stage ${r.stage ?? "?"} (${(r.node ?? "?").slice(0, 10)}) ${r.reason}`,
      ph: "X",
      pid: RECOVERY_PID,
      tid: 0,
      ts: us(r.at - r.gap_ms),
      dur: Math.round(r.gap_ms * 1000),
      args: { ...r },
    });
  }
  return { traceEvents: events, displayTimeUnit: "ms" };
}
