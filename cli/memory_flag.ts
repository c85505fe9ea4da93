// `--memory SIZE` (up, join): the most memory this node offers the cluster. The node measures what its
// adapter lets it allocate up to this cap (node/measure.ts), and the planner places no more than that on it.
import { parseQuantity } from "../planner/units.ts";
import { UsageError } from "./command.ts";

export const MEMORY_HELP =
  `  --memory SIZE        the most GPU memory this node offers (e.g. 8GiB, 512MiB; default: what the adapter
                       lets it allocate, measured at start)`;

/** The cap in bytes, or undefined when the flag is absent; a bad size is a UsageError naming the flag. */
export function memoryFlag(value: string | undefined): number | undefined {
  if (value === undefined) return undefined;
  let bytes: number;
  try {
    bytes = parseQuantity("bytes", value);
  } catch (e) {
    throw new UsageError(`--memory: ${(e as Error).message}`);
  }
  if (!(bytes >= 64 << 10) || !Number.isSafeInteger(Math.floor(bytes))) {
    throw new UsageError(`--memory must be at least 64KiB, got "${value}"`);
  }
  return Math.floor(bytes);
}
