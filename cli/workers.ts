// The worker node processes that `up --peers N` and `--local N` start, and the worker's side of the tie.
// A worker is `swactor join - --exit-with-stdin`: it reads the ticket from its stdin, never from its
// command line (any local user reads those in `ps` or /proc/PID/cmdline, and the ticket holds the cluster
// secret), and the parent keeps that pipe open for as long as it lives. However the parent ends, SIGKILL
// included, the kernel closes the pipe; the worker sees end of file and leaves (cli/node_process.ts).
import { selfCommand } from "./self.ts";
import { LOOP_HELD } from "../node/loop_lag.ts";
import { writeSharedMeasurement } from "../node/descriptor.ts";
import { handoffPath } from "../node/state_file.ts";
import type { NodeMeasurement } from "../node/membership/mod.ts";

/** How long a worker gets to leave after SIGTERM before it is killed. */
export const WORKER_GRACE_MS = 5000;
/**
 * The file a `--local` worker takes its leader's measurement from (selfMeasure's `adoptFrom`): set by the
 * leader in its workers' environment, not meant for users.
 */
export const MEASUREMENT_FROM_ENV = "SWACTOR_MEASUREMENT_FROM";

/**
 * Hands `measured` (the leader's self-measurement, once it settles) to the workers it starts on this GPU:
 * written to a file of the state folder that `env` names (MEASUREMENT_FROM_ENV; node/state_file.ts
 * handoff/), which each worker waits for and publishes as its own (node/descriptor.ts selfMeasure's
 * `adoptFrom`) instead of measuring the same GPU again, in turn. `close` removes the file; one left by a
 * leader killed with SIGKILL is removed by the next leader's call.
 */
export async function shareMeasurement(
  measured: Promise<NodeMeasurement | undefined>,
): Promise<{ env: Record<string, string>; close(): Promise<void> }> {
  const file = await handoffPath(Deno.pid);
  measured.then((m) => writeSharedMeasurement(file, m)).catch(() => {/* the workers measure after all */});
  return {
    env: { [MEASUREMENT_FROM_ENV]: file },
    close: () => Deno.remove(file).catch(() => {}),
  };
}

/**
 * Node processes that share this machine's GPU (`up --peers N`, `--local N`, the lab) queue no keep-warm
 * fillers (kernels/keep_warm.ts) unless SWACTOR_KEEP_WARM says otherwise: one stage's filler would delay
 * another's step, and the others' steps keep the GPU busy anyway. Call before this process loads anything;
 * its workers inherit the setting.
 */
export function shareOneGpu(): void {
  if (Deno.env.get("SWACTOR_KEEP_WARM") === undefined) Deno.env.set("SWACTOR_KEEP_WARM", "0");
}

/** Starts a worker that joins with `ticket`; `args` are more `join` flags. Its stdout is discarded. */
export function spawnWorker(
  ticket: string,
  opts: { args?: string[]; stderr?: "inherit" | "piped"; env?: Record<string, string> } = {},
): Deno.ChildProcess {
  const [program, ...args] = selfCommand(["join", "-", "--exit-with-stdin", ...(opts.args ?? [])]);
  const child = new Deno.Command(program, {
    args,
    env: opts.env,
    stdin: "piped",
    stdout: "null",
    stderr: opts.stderr ?? "piped",
  }).spawn();
  // The writer is never closed or released: the open pipe is what keeps the worker alive.
  child.stdin.getWriter().write(new TextEncoder().encode(ticket + "\n")).catch(() => {/* it died early */});
  return child;
}

/**
 * Whether a worker's stderr line is a warning its parent should pass on even when it hides the rest (the
 * workers' progress is noise; these say why a chain is slow or a node was lost): the transport's warnings
 * (a data path that fell back to iroh, a refused peer) and node/loop_lag.ts's held event loop.
 */
export function isWorkerWarning(line: string): boolean {
  return line.startsWith("[transport ") || line.includes(LOOP_HELD);
}

/** Workers sent their SIGTERM: a second one would make a worker exit without its graceful leave. */
const told = new WeakSet<Deno.ChildProcess>();

/**
 * SIGTERM to each worker not yet sent one: each starts its graceful leave. A parent that takes the whole
 * cluster down calls it before it leaves itself, so no worker sees its leader leave first and re-plans
 * (loading stages) for the moment it has left.
 */
export function termWorkers(children: Deno.ChildProcess[]): void {
  for (const c of children) {
    if (told.has(c)) continue;
    told.add(c);
    try {
      c.kill("SIGTERM");
    } catch { /* already gone */ }
  }
}

/** termWorkers, then SIGKILL to those still running after `graceMs`; waits for all. */
export async function stopWorkers(children: Deno.ChildProcess[], graceMs = WORKER_GRACE_MS): Promise<void> {
  termWorkers(children);
  const killer = setTimeout(() => {
    for (const c of children) {
      try {
        c.kill("SIGKILL");
      } catch { /* already gone */ }
    }
  }, graceMs);
  await Promise.all(children.map((c) => c.status));
  clearTimeout(killer);
}

/**
 * The worker's side: stdin read as lines. `line` resolves with the first line (all of stdin when it has
 * no newline). With `watchEnd`, stdin is read on after it and `ended` resolves at end of file; without,
 * stdin is let go after the first line and `ended` never resolves.
 */
export function readStdin(
  opts: { watchEnd?: boolean } = {},
): { line: Promise<string>; ended: Promise<void> } {
  const reader = Deno.stdin.readable.pipeThrough(new TextDecoderStream()).getReader();
  const next = () => reader.read().catch(() => ({ value: undefined, done: true as const }));
  const line = (async () => {
    let buf = "";
    for (;;) {
      const { value, done } = await next();
      if (done) return buf;
      buf += value;
      const i = buf.indexOf("\n");
      if (i >= 0) return buf.slice(0, i);
    }
  })();
  const ended = opts.watchEnd
    ? line.then(async () => {
      while (!(await next()).done) { /* the parent writes nothing more; wait for it to go */ }
    })
    : line.then(() => reader.cancel().catch(() => {})).then(() => new Promise<void>(() => {}));
  return { line, ended };
}
