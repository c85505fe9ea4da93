// What the node processes of this machine record for `status`, `down` and `generate` to find them, in
// $SWACTOR_STATE_DIR, else $XDG_RUNTIME_DIR/swactor, else ~/.cache/swactor (a folder only its owner reads):
//   node.json         the cluster `up` leads here (one at a time: a second `up` is refused while it runs)
//   nodes/<pid>.json  every node process (up and join): its control API and the token its mutating routes need
//   measurement.json  the last `--local` leader's measurement of this machine's GPU, reused for a while
//                     (node/descriptor.ts selfMeasure's `reuse`)
//   handoff/<pid>-*   a `--local` or `up --peers` leader's measurement for the workers it starts
//                     (cli/workers.ts shareMeasurement); removed when the leader ends, or swept by the next
//                     leader once its process is gone
// The files are owner-only: the token opens the API's mutating routes and the ticket holds the cluster
// secret. A file whose process is gone (killed with SIGKILL, a crash) is stale: readers remove it.
import { join } from "node:path";

export interface NodeState {
  pid: number;
  /** Control API address, "host:port". */
  api: string;
  /** The bearer token the control API's mutating routes (POST) need. */
  token: string;
  id: string;
  startedAt: string;
  /** The cluster's ticket (node.json only). */
  ticket?: string;
}

export function stateDir(): string {
  const env = (k: string) => Deno.env.get(k);
  const explicit = env("SWACTOR_STATE_DIR");
  if (explicit) return explicit;
  const xdg = env("XDG_RUNTIME_DIR");
  if (xdg) return join(xdg, "swactor");
  return join(env("HOME") ?? ".", ".cache", "swactor");
}

/** node.json: the cluster `up` leads on this machine. */
export function statePath(): string {
  return join(stateDir(), "node.json");
}

function nodesDir(): string {
  return join(stateDir(), "nodes");
}

async function writeJson(path: string, value: unknown, opts: { createNew?: boolean } = {}): Promise<void> {
  await Deno.mkdir(join(path, ".."), { recursive: true, mode: 0o700 });
  await Deno.writeTextFile(path, JSON.stringify(value, null, 2) + "\n", { mode: 0o600, ...opts });
}

async function readJson(path: string): Promise<NodeState | undefined> {
  try {
    const v = JSON.parse(await Deno.readTextFile(path));
    return typeof v === "object" && v !== null && Number.isInteger(v.pid) ? v as NodeState : undefined;
  } catch {
    return undefined;
  }
}

/**
 * Whether process `pid` runs and is a swactor (on Linux its command line names swactor or main.ts, so a
 * recycled pid does not count; elsewhere any process with that pid counts).
 */
export function processRuns(pid: number): boolean {
  if (Deno.build.os === "linux") {
    try {
      const cmd = Deno.readTextFileSync(`/proc/${pid}/cmdline`);
      const stat = Deno.readTextFileSync(`/proc/${pid}/stat`);
      return stat.slice(stat.lastIndexOf(")") + 2)[0] !== "Z" && /swactor|main\.ts/.test(cmd);
    } catch {
      return false;
    }
  }
  try {
    Deno.kill(pid, "SIGCONT"); // no effect on a running process; fails when there is none
    return true;
  } catch (e) {
    return e instanceof Deno.errors.PermissionDenied;
  }
}

/** node.json as written (it may be stale: see liveState). */
export async function readState(): Promise<NodeState | undefined> {
  return await readJson(statePath());
}

/**
 * The cluster `up` leads here: `state` when its process runs; when node.json names a process that is
 * gone, the file is removed and returned as `stale`.
 */
export async function liveState(): Promise<{ state?: NodeState; stale?: NodeState }> {
  const s = await readState();
  if (!s) return {};
  if (processRuns(s.pid)) return { state: s };
  await clearState(s.pid);
  return { stale: s };
}

/**
 * Claims node.json for process `pid` (a new `up`) before it starts anything: resolves with undefined and
 * the file created, or with the state of the `up` that runs already (nothing written). A stale file is
 * removed first and reported through `onStale`.
 */
export async function claimState(
  pid: number,
  onStale: (s: NodeState) => void = () => {},
): Promise<NodeState | undefined> {
  for (let attempt = 0; attempt < 3; attempt++) {
    try {
      await writeJson(statePath(), { pid, startedAt: new Date().toISOString() }, { createNew: true });
      return undefined;
    } catch (e) {
      if (!(e instanceof Deno.errors.AlreadyExists)) throw e;
    }
    const { state, stale } = await liveState();
    if (state) return state;
    if (stale) onStale(stale);
    else await Deno.remove(statePath()).catch(() => {}); // unreadable: not a node's record
  }
  throw new Error(`cannot create ${statePath()}: another process keeps writing it`);
}

/** Writes node.json (after claimState) with the leader's full record. */
export async function writeState(s: NodeState): Promise<void> {
  await writeJson(statePath(), s);
}

/** Removes node.json if it still describes process `pid`. */
export async function clearState(pid: number): Promise<void> {
  const s = await readState();
  if (s?.pid === pid) await Deno.remove(statePath()).catch(() => {});
}

/** Records a node process (nodes/<pid>.json). */
export async function writeNodeState(s: NodeState): Promise<void> {
  await writeJson(join(nodesDir(), `${s.pid}.json`), s);
}

/** Removes process `pid`'s record. */
export async function clearNodeState(pid: number): Promise<void> {
  await Deno.remove(join(nodesDir(), `${pid}.json`)).catch(() => {});
}

function handoffDir(): string {
  return join(stateDir(), "handoff");
}

/**
 * A fresh path (not yet made) for process `pid` to hand something to the processes it starts:
 * handoff/<pid>-<random>.json, in a folder only its owner enters. Files there of processes that are gone
 * (a leader killed with SIGKILL) are removed first.
 */
export async function handoffPath(pid: number): Promise<string> {
  const dir = handoffDir();
  await Deno.mkdir(dir, { recursive: true, mode: 0o700 });
  await sweepHandoffs(dir);
  return join(dir, `${pid}-${crypto.randomUUID().slice(0, 8)}.json`);
}

/** Removes handoff/ files whose process (the number their name starts with) no longer runs. */
async function sweepHandoffs(dir: string): Promise<void> {
  for await (const e of Deno.readDir(dir)) {
    const pid = Number(/^(\d+)-/.exec(e.name)?.[1]);
    if (Number.isInteger(pid) && !processRuns(pid)) await Deno.remove(join(dir, e.name)).catch(() => {});
  }
}

/**
 * Node processes of this machine that run now and started in [`fromMs`, `toMs`) (ms since the epoch), this
 * process left out (stale records met are removed).
 */
export async function nodesStartedBetween(fromMs: number, toMs: number): Promise<NodeState[]> {
  const found: NodeState[] = [];
  for (const s of await liveNodeStates()) {
    const t = Date.parse(s.startedAt);
    if (s.pid !== Deno.pid && t >= fromMs && t < toMs) found.push(s);
  }
  return found;
}

/** Every nodes/ record whose process runs (stale ones are removed). */
async function liveNodeStates(): Promise<NodeState[]> {
  let entries: Deno.DirEntry[];
  try {
    entries = [...Deno.readDirSync(nodesDir())];
  } catch {
    return [];
  }
  const live: NodeState[] = [];
  for (const e of entries) {
    const s = await readJson(join(nodesDir(), e.name));
    if (!s) continue;
    if (processRuns(s.pid)) live.push(s);
    else await clearNodeState(s.pid);
  }
  return live;
}

/** The record of the running node whose control API is at `api` (stale records met are removed). */
export async function nodeStateAt(api: string): Promise<NodeState | undefined> {
  return (await liveNodeStates()).find((s) => s.api === api);
}
