// The scripts' command lines: node:util's parseArgs with what a reader rerunning a benchmark expects: `--help`
// (or -h) prints the script's header comment, its one description and usage, and exits 0; a bad option or
// value prints one line naming it and exits 2, instead of a stack trace.
//   const { values } = scriptArgs(import.meta.url, (args) => parseArgs({ args, options: { ... } }));
import { fileURLToPath } from "node:url";
import { basename } from "node:path";
import { UsageError } from "../cli/command.ts";
import { type KernelTuning, tuningList } from "../kernels/gpu.ts";

/**
 * Parses `args` (default Deno.args) with `parse` (node:util's parseArgs, or cli/command.ts's parseFlags),
 * answering --help and bad options for the script at `url`.
 */
export function scriptArgs<R>(url: string, parse: (args: string[]) => R, args: string[] = Deno.args): R {
  const path = fileURLToPath(url);
  if (args.includes("--help") || args.includes("-h")) {
    console.log(headerComment(path));
    Deno.exit(0);
  }
  try {
    return parse(args);
  } catch (e) {
    const code = (e as { code?: unknown }).code;
    const bad = e instanceof UsageError || (typeof code === "string" && code.startsWith("ERR_PARSE_ARGS"));
    if (!bad) throw e;
    console.error(`${basename(path)}: ${(e as Error).message} (--help for the usage)`);
    Deno.exit(2);
  }
}

/** The comment lines a file starts with, without their `//`. */
export function headerComment(path: string): string {
  const lines: string[] = [];
  for (const line of Deno.readTextFileSync(path).split("\n")) {
    if (line.startsWith("#!")) continue;
    if (!line.startsWith("//")) break;
    lines.push(line.replace(/^\/\/ ?/, ""));
  }
  return lines.join("\n").trim();
}

/** An option's value as a whole number >= `min` (default 1), or a UsageError naming it (for scriptArgs's parse). */
export function countArg(name: string, value: string | undefined, min = 1): number {
  const n = Number(value);
  if (!Number.isInteger(n) || n < min) {
    throw new UsageError(`--${name} must be a whole number >= ${min}, got ${JSON.stringify(value)}`);
  }
  return n;
}

/**
 * --tunings: a JSON list of gpu.tuning overrides, each checked against KernelTuning (kernels/gpu.ts
 * tuningList: a misspelt setting is an error, not a second run of the default); absent: none. A bad list is
 * a UsageError naming the entry: called in scriptArgs's parse, it is a one-line exit 2.
 */
export function tuningsArg(value: string | undefined): KernelTuning[] {
  return value === undefined ? [] : tuningList(value, "--tunings", UsageError);
}

/** --set key=value,...: config keys overridden with numbers; anything else is a UsageError naming the entry. */
export function configSetArg(arg: string | undefined): Record<string, number> {
  const out: Record<string, number> = {};
  for (const kv of arg?.split(",") ?? []) {
    const m = /^([A-Za-z_][A-Za-z0-9_]*)=(-?[0-9.eE+-]+)$/.exec(kv.trim());
    if (!m || !Number.isFinite(Number(m[2]))) {
      throw new UsageError(`--set takes key=number entries separated by commas, got "${kv}"`);
    }
    out[m[1]] = Number(m[2]);
  }
  return out;
}
