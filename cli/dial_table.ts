// The dial table, a test/bench hook: a JSON file {"peer ip:port": "ip:port to dial instead", ...} named by
// $SWACTOR_DIAL_TABLE, read by `up` and `join` at start. scripts/bench/pipeline_wan.ts uses it to send each
// node's traffic through the WAN-emulation relays (docs/WAN.md). Unset: no overrides (the default).
import { readFailure } from "./input_file.ts";

/** The environment variable that names a dial-table file. */
export const DIAL_TABLE_ENV = "SWACTOR_DIAL_TABLE";

const ADDR = /^(\[[0-9a-fA-F:.]+\]|[^\s:\[\]]+):(\d{1,5})$/;

/** Checks a parsed dial table; throws TypeError saying which entry is wrong and what was expected. */
export function parseDialTable(value: unknown, source = "dial table"): Map<string, string> {
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    throw new TypeError(`${source}: expected a JSON object {"ip:port": "ip:port", ...}`);
  }
  const table = new Map<string, string>();
  for (const [from, to] of Object.entries(value)) {
    for (const addr of [from, to]) {
      const m = typeof addr === "string" ? ADDR.exec(addr) : null;
      if (!m || Number(m[2]) > 65535) {
        throw new TypeError(`${source}: expected "host:port" addresses, got ${JSON.stringify(addr)}`);
      }
    }
    table.set(from, to as string);
  }
  return table;
}

/** The table named by $SWACTOR_DIAL_TABLE, or undefined when it is unset or empty. */
export async function dialTableFromEnv(): Promise<Map<string, string> | undefined> {
  const path = Deno.env.get(DIAL_TABLE_ENV);
  if (!path) return undefined;
  let text: string;
  try {
    text = await Deno.readTextFile(path);
  } catch (e) {
    throw new TypeError(`$${DIAL_TABLE_ENV}: cannot read ${path}: ${readFailure(e)}`);
  }
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch (e) {
    throw new TypeError(`$${DIAL_TABLE_ENV}: ${path} is not JSON: ${(e as Error).message}`);
  }
  return parseDialTable(json, `$${DIAL_TABLE_ENV} (${path})`);
}
