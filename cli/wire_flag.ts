// `--wire f16|f32`: the activations between a chain's stages and to its expert hosts. `up --wire` sets the chain's (every request
// through the cluster that names none: the control API, the OpenAI API, `generate` on this machine);
// `generate` and `logits` set one request's.
import type { WireDtype } from "../node/stage/mod.ts";
import { UsageError } from "./command.ts";

export const WIRE_UP_HELP =
  `  --wire f16|f32       with --model: the chain's activations between stages and to expert hosts, for
                       every request that names none (default f16; f32 for exactness checks: a
                       request's own wire wins)`;

/** The flag's value, or undefined when absent; anything but f16 or f32 is a UsageError naming the flag. */
export function wireFlag(value: string | undefined): WireDtype | undefined {
  if (value === undefined || value === "f16" || value === "f32") return value;
  throw new UsageError(`--wire expects f16 or f32, got "${value}"`);
}
