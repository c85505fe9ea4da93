// Where `up` records the node it started, so `status` and `down` find it without flags:
// $SWACTOR_STATE_DIR, else $XDG_RUNTIME_DIR/swactor, else ~/.cache/swactor; file `node.json`.
import { join } from "node:path";

export interface NodeState {
  pid: number;
  /** Control API address, "host:port". */
  api: string;
  ticket: string;
  id: string;
  startedAt: string;
}

export function stateDir(): string {
  const env = (k: string) => Deno.env.get(k);
  const explicit = env("SWACTOR_STATE_DIR");
  if (explicit) return explicit;
  const xdg = env("XDG_RUNTIME_DIR");
  if (xdg) return join(xdg, "swactor");
  return join(env("HOME") ?? ".", ".cache", "swactor");
}

export function statePath(): string {
  return join(stateDir(), "node.json");
}

export async function writeState(s: NodeState): Promise<void> {
  await Deno.mkdir(stateDir(), { recursive: true, mode: 0o700 });
  // The ticket holds the cluster secret: owner-only.
  await Deno.writeTextFile(statePath(), JSON.stringify(s, null, 2) + "\n", { mode: 0o600 });
}

export async function readState(): Promise<NodeState | undefined> {
  try {
    return JSON.parse(await Deno.readTextFile(statePath())) as NodeState;
  } catch {
    return undefined;
  }
}

/** Removes the state file if it still describes process `pid`. */
export async function clearState(pid: number): Promise<void> {
  const s = await readState();
  if (s?.pid === pid) await Deno.remove(statePath()).catch(() => {});
}
