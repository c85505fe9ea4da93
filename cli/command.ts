// The shape every CLI command has, the error that means "bad usage or bad input" (exit code 2), and the
// parsers of flag values that raise it.
import { parseArgs, type ParseArgsConfig } from "node:util";

/**
 * Bad usage or bad input: the CLI prints the message and exits with code 2. Throw it (or convert to it at
 * the call site) only where the user's input is what was wrong; any other error exits with code 1.
 */
export class UsageError extends Error {
  override name = "UsageError";
}

/**
 * Text made safe for a terminal: control characters (a NUL from a corrupt file, an escape sequence) are
 * written as \xNN, so the input behind an error message can neither garble nor drive the terminal.
 */
export function printable(text: string): string {
  return text.replace(
    // deno-lint-ignore no-control-regex
    /[\x00-\x08\x0b-\x1f\x7f-\x9f]/g,
    (c) => `\\x${c.charCodeAt(0).toString(16).padStart(2, "0")}`,
  );
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

const NEGATIVE_NUMBER = /^-(\d|\.\d)/;

/**
 * Parses argv with node:util's parseArgs, turning its errors into one-line UsageErrors so that a typo in a
 * flag exits with code 2 and a message naming the flag. A value that looks like a negative number
 * (`--max-tokens -5`) is taken as the flag's value, so the range check can say what is wrong with it.
 */
export function parseFlags<T extends Options>(
  argv: string[],
  options: T,
  opts: { allowPositionals?: boolean } = {},
) {
  const args: string[] = [];
  for (let i = 0; i < argv.length; i++) {
    const name = argv[i].startsWith("--") ? argv[i].slice(2) : undefined;
    if (name && options[name]?.type === "string" && NEGATIVE_NUMBER.test(argv[i + 1] ?? "")) {
      args.push(`${argv[i]}=${argv[++i]}`);
    } else args.push(argv[i]);
  }
  try {
    return parseArgs({ args, options, allowPositionals: opts.allowPositionals ?? false, strict: true });
  } catch (e) {
    const message = (e as Error).message;
    const flag = /Option '(-[^' ]+)/.exec(message)?.[1];
    if (flag && /ambiguous|missing/.test(message)) {
      throw new UsageError(`${flag} expects a value (for a value that starts with "-", write ${flag}=VALUE)`);
    }
    throw new UsageError(message.split("\n")[0]);
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

/** A socket address given on the command line. */
export interface Address {
  /** An IP literal (IPv6 without brackets) or "localhost". */
  host: string;
  port: number;
  /** "host:port" as a socket address is written ("[::1]:0" for IPv6). */
  text: string;
  /** Whether only this machine can reach it (127.0.0.0/8, ::1, localhost). */
  loopback: boolean;
}

const IPV4 = /^(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(\.(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)){3}$/;

/**
 * Parses `--name HOST:PORT`: HOST an IPv4 address, an IPv6 address in brackets or (with `localhost: true`)
 * the word localhost; PORT 0..65535 (0: any free port). No other host names: an address that resolves
 * through DNS could point anywhere. UsageError naming the flag otherwise.
 */
export function addressFlag(
  value: string,
  name: string,
  opts: { localhost?: boolean } = {},
): Address {
  const bad = (why: string) =>
    new UsageError(
      `--${name} expects IP:PORT (e.g. 127.0.0.1:0 or [::1]:0${
        opts.localhost ? " or localhost:8080" : ""
      }), got "${value}": ${why}`,
    );
  const m = /^(?:\[([^\]]*)\]|([^:\[\]]*)):(\d{1,5})$/.exec(value);
  if (!m) throw bad("not HOST:PORT");
  const port = Number(m[3]);
  if (port > 65535) throw bad(`port ${port} is above 65535`);
  const host = m[1] ?? m[2];
  if (m[1] !== undefined) {
    if (!isIpv6(host)) throw bad(`"${host}" is not an IPv6 address`);
    return { host, port, text: `[${host}]:${port}`, loopback: host === "::1" };
  }
  if (host === "localhost" && opts.localhost) return { host, port, text: value, loopback: true };
  if (!IPV4.test(host)) throw bad(`"${host}" is not an IPv4 address (IPv6 goes in brackets)`);
  return { host, port, text: value, loopback: host.startsWith("127.") };
}

function isIpv6(s: string): boolean {
  if (!/^[0-9a-fA-F:.]+$/.test(s) || s.split("::").length > 2) return false;
  try {
    return new URL(`http://[${s}]/`).hostname.length > 2;
  } catch {
    return false;
  }
}

/** `--experts local|spread` (needs --local N: where a chain's MoE experts live). */
export function expertsFlag(
  v: string | undefined,
  local: string | undefined,
): "local" | "spread" | undefined {
  if (v === undefined) return undefined;
  if (v !== "local" && v !== "spread") throw new UsageError(`--experts expects local or spread, got "${v}"`);
  if (local === undefined) {
    throw new UsageError("--experts needs --local N (experts are placed over a chain's nodes)");
  }
  return v;
}
