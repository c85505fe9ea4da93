// How a client (the CLI's `status`, `down`, `generate`) finds and calls a node's control API: an explicit
// address (--api), else the one in the state file that `up` wrote.
import { readState, statePath } from "../state_file.ts";

export async function apiBase(flag: string | undefined): Promise<string> {
  if (flag) return `http://${flag}`;
  const s = await readState();
  if (!s) {
    throw new Error(`no running node found (no ${statePath()}); start one with \`swactor up\` or pass --api`);
  }
  return `http://${s.api}`;
}

export async function apiFetch(base: string, path: string, init?: RequestInit): Promise<Response> {
  try {
    return await fetch(base + path, init);
  } catch (e) {
    throw new Error(`cannot reach the node's control API at ${base}: ${(e as Error).message}`);
  }
}
