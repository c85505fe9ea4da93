// The shape every CLI command has, and the error that means "bad usage or bad input" (exit code 2).
import { parseArgs, type ParseArgsConfig } from "node:util";

/** Thrown for bad usage or bad input: the CLI prints the message and exits with code 2. */
export class UsageError extends Error {
  override name = "UsageError";
}

export interface Command {
  /** The word after `swactor`. */
  name: string;
  /** One line for `swactor --help`. */
  summary: string;
  /** The full `--help` text. */
  usage: string;
  /** Runs the command; resolves to the process exit code. */
  run(argv: string[]): Promise<number>;
}

type Options = NonNullable<ParseArgsConfig["options"]>;

/**
 * Parses argv with node:util's parseArgs, turning its errors into UsageError so that a typo in a flag
 * exits with code 2 and a message naming the flag.
 */
export function parseFlags<T extends Options>(
  argv: string[],
  options: T,
  opts: { allowPositionals?: boolean } = {},
) {
  try {
    return parseArgs({ args: argv, options, allowPositionals: opts.allowPositionals ?? false, strict: true });
  } catch (e) {
    throw new UsageError((e as Error).message);
  }
}

/** Parses a flag's value as a number in [min, max]; `name` is used in the error message. */
export function numberFlag(
  value: string | undefined,
  name: string,
  opts: { min?: number; max?: number; integer?: boolean; fallback: number },
): number {
  if (value === undefined) return opts.fallback;
  const n = Number(value);
  if (value.trim() === "" || !Number.isFinite(n) || (opts.integer && !Number.isInteger(n))) {
    throw new UsageError(`--${name} expects ${opts.integer ? "an integer" : "a number"}, got "${value}"`);
  }
  if (opts.min !== undefined && n < opts.min) {
    throw new UsageError(`--${name} must be >= ${opts.min}, got ${n}`);
  }
  if (opts.max !== undefined && n > opts.max) {
    throw new UsageError(`--${name} must be <= ${opts.max}, got ${n}`);
  }
  return n;
}
