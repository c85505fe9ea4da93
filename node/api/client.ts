// How a client (the CLI's `status`, `down`, `generate`) finds and calls a node's control API: an explicit
// address (--api), else the one in the state file that `up` wrote; with the node's token from the state
// files (node/state_file.ts) when this machine runs that node, for the routes that need it.
import { liveState, type NodeState, nodeStateAt, statePath } from "../state_file.ts";

/** A node's control API as a client calls it. */
export interface ApiTarget {
  /** "http://host:port". */
  base: string;
  /** The token for POST routes, when this machine runs the node. */
  token?: string;
  /** The node's process, when this machine runs it. */
  pid?: number;
}

/**
 * The API at `flag` ("host:port"), else the one of the cluster `up` leads on this machine. Throws an Error
 * saying what to do when there is none, or when the state file names a node that is gone (the stale
 * file is removed).
 */
export async function apiTarget(flag: string | undefined): Promise<ApiTarget> {
  if (flag) {
    const addr = flag.replace(/^localhost:/, "127.0.0.1:");
    const s = await nodeStateAt(addr);
    return { base: `http://${addr}`, token: s?.token, pid: s?.pid };
  }
  const { state, stale } = await liveState();
  if (stale) {
    throw new Error(
      `the node \`up\` started (pid ${stale.pid}, control API ${stale.api ?? "not yet served"}, since ` +
        `${stale.startedAt}) is no longer running; removed its stale state file ${statePath()}. Start a ` +
        `cluster with \`swactor up\`, or pass --api`,
    );
  }
  if (!state) {
    throw new Error(`no running node found (no ${statePath()}); start one with \`swactor up\` or pass --api`);
  }
  if (!state.api) throw new Error(`the node \`up\` started (pid ${state.pid}) is still starting; try again`);
  return targetOf(state);
}

/** The target for a node's recorded state. */
export function targetOf(s: NodeState): ApiTarget {
  return { base: `http://${s.api}`, token: s.token, pid: s.pid };
}

/** fetch on the target's API, with its token; an Error naming the address when it cannot be reached. */
export async function apiFetch(t: ApiTarget, path: string, init: RequestInit = {}): Promise<Response> {
  const headers = new Headers(init.headers);
  if (t.token) headers.set("authorization", `Bearer ${t.token}`);
  try {
    return await fetch(t.base + path, { ...init, headers });
  } catch (e) {
    const alive = t.pid === undefined ? "" : ` (its process ${t.pid} still runs: starting, or hung)`;
    throw new Error(`cannot reach the node's control API at ${t.base}${alive}: ${(e as Error).message}`);
  }
}

/** The error an API answered with ({"error": ...}), or its status. */
export async function apiError(res: Response): Promise<string> {
  const text = await res.text().catch(() => "");
  try {
    return JSON.parse(text).error ?? `HTTP ${res.status}`;
  } catch {
    return `HTTP ${res.status}${text ? `: ${text.slice(0, 200)}` : ""}`;
  }
}
