// Runs the CLI as a user does (a separate `deno run main.ts` process) and captures what it prints.
import { fileURLToPath } from "node:url";

const MAIN = fileURLToPath(new URL("../../main.ts", import.meta.url));

export interface CliResult {
  code: number;
  stdout: string;
  stderr: string;
}

export async function runCli(
  args: string[],
  opts: { env?: Record<string, string> } = {},
): Promise<CliResult> {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", "--quiet", MAIN, ...args],
    env: opts.env,
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).output();
  const dec = new TextDecoder();
  return { code: out.code, stdout: dec.decode(out.stdout), stderr: dec.decode(out.stderr) };
}

/** A CLI process left running: its output so far, and waits on it. */
export interface CliProcess {
  child: Deno.ChildProcess;
  pid: number;
  stdout(): string;
  stderr(): string;
  /** Resolves with the first match of `re` in stderr (or stdout with `on: "stdout"`); throws after `ms`. */
  waitFor(re: RegExp, ms: number, on?: "stdout" | "stderr"): Promise<RegExpMatchArray>;
  /** The exit code once it ends (with its output read to the end, or for 1 s more). */
  code(): Promise<number>;
}

export function spawnCli(
  args: string[],
  opts: { env?: Record<string, string>; stdin?: "null" | "piped" } = {},
): CliProcess {
  const child = new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", "--quiet", MAIN, ...args],
    env: opts.env,
    stdin: opts.stdin ?? "null",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const text = { stdout: "", stderr: "" };
  const pump = async (s: ReadableStream<Uint8Array>, k: "stdout" | "stderr") => {
    for await (const t of s.pipeThrough(new TextDecoderStream())) text[k] += t;
  };
  const pumps = Promise.all([pump(child.stdout, "stdout"), pump(child.stderr, "stderr")]);
  return {
    child,
    pid: child.pid,
    stdout: () => text.stdout,
    stderr: () => text.stderr,
    async waitFor(re, ms, on = "stderr") {
      const end = Date.now() + ms;
      for (;;) {
        const m = text[on].match(re);
        if (m) return m;
        if (Date.now() > end) throw new Error(`no ${re} on ${on} after ${ms} ms:\n${text.stderr}`);
        await new Promise((r) => setTimeout(r, 100));
      }
    },
    async code() {
      const s = await child.status;
      // Its output ends with it, unless processes it started still hold the pipes: not for long then.
      await Promise.race([pumps, new Promise((r) => setTimeout(r, 1000))]);
      return s.code;
    },
  };
}

/** The process ids whose parent is `pid` (Linux: /proc). */
export function childrenOf(pid: number): number[] {
  const out: number[] = [];
  for (const e of Deno.readDirSync("/proc")) {
    if (!/^\d+$/.test(e.name)) continue;
    try {
      const stat = Deno.readTextFileSync(`/proc/${e.name}/stat`);
      // Field 4 (ppid) follows the command name in parentheses, which may hold spaces.
      if (Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]) === pid) out.push(Number(e.name));
    } catch { /* exited meanwhile */ }
  }
  return out;
}

/** Whether process `pid` still runs (a zombie counts as gone). */
export function alive(pid: number): boolean {
  try {
    const stat = Deno.readTextFileSync(`/proc/${pid}/stat`);
    return stat.slice(stat.lastIndexOf(")") + 2)[0] !== "Z";
  } catch {
    return false;
  }
}

/** Waits until none of `pids` runs; the milliseconds that took, or throws after `ms`. */
export async function allGone(pids: number[], ms: number): Promise<number> {
  const t0 = Date.now();
  while (pids.some(alive)) {
    if (Date.now() - t0 > ms) {
      throw new Error(`still running after ${ms} ms: ${pids.filter(alive).join(", ")}`);
    }
    await new Promise((r) => setTimeout(r, 50));
  }
  return Date.now() - t0;
}

/** A process's command line as one string (Linux: /proc). */
export function commandLine(pid: number): string {
  try {
    return Deno.readTextFileSync(`/proc/${pid}/cmdline`).replaceAll("\0", " ");
  } catch {
    return "";
  }
}
