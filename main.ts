// swactor: the command line. One program that is both orchestrator and worker.
// Each command lives in cli/<name>.ts; this file only dispatches and maps errors to exit codes
// (0 success, 1 runtime failure, 2 bad usage or bad input).
import { type Command, printable, UsageError } from "./cli/command.ts";
import { commands } from "./cli/mod.ts";
import { ensureRuntimeDir } from "./cli/runtime_dir.ts";
import { CheckpointError, RequestError } from "./models/errors.ts";
import { EnvError } from "./kernels/env.ts";

const VERSION = "0.1.0";

function topHelp(): string {
  const width = Math.max(...commands.map((c) => c.name.length));
  return [
    `swactor ${VERSION}: run large language models across many GPUs, peer to peer`,
    "",
    "Usage: swactor <command> [options]      (swactor <command> --help for details)",
    "",
    "Commands:",
    ...commands.map((c) => `  ${c.name.padEnd(width)}  ${c.summary}`),
  ].join("\n");
}

export async function main(argv: string[]): Promise<number> {
  const [name, ...rest] = argv;
  if (name === undefined || name === "--help" || name === "-h" || name === "help") {
    console.log(topHelp());
    return name === undefined ? 2 : 0;
  }
  if (name === "--version" || name === "-V") {
    console.log(VERSION);
    return 0;
  }
  const command: Command | undefined = commands.find((c) => c.name === name);
  if (!command) {
    console.error(`swactor: unknown command "${name}"\n\n${topHelp()}`);
    return 2;
  }
  if (rest.includes("--help") || rest.includes("-h")) {
    console.log(command.usage);
    return 0;
  }
  try {
    return await command.run(rest);
  } catch (e) {
    // Bad input is a UsageError (cli/command.ts), a CheckpointError (a model directory's contents), a
    // RequestError (a request the model cannot serve) or an EnvError (a SWACTOR_* variable); the message
    // names what was wrong. Anything else is a
    // runtime failure or a bug: exit 1, and SWACTOR_DEBUG=1 adds the stack for bug reports.
    if (
      e instanceof UsageError || e instanceof CheckpointError || e instanceof RequestError ||
      e instanceof EnvError
    ) {
      console.error(`swactor ${name}: ${printable(e.message)}`);
      return 2;
    }
    const debug = Deno.env.get("SWACTOR_DEBUG") === "1";
    const text = e instanceof Error ? ((debug && e.stack) || e.message) : String(e);
    console.error(`swactor ${name}: ${printable(text)}`);
    if (!debug && isLikelyBug(e)) {
      console.error("swactor: this looks like a bug in swactor; SWACTOR_DEBUG=1 shows where it happened");
    }
    // WebGPU's words when the driver dropped the device: on an H100 whose memory other processes held, the
    // new device was lost at once (2026-12-07). A model too large is a GpuMemoryError, which says so itself.
    if (/device is lost/i.test(text)) {
      console.error(
        "swactor: the GPU dropped this process's device: most often it is out of memory (other processes may " +
          "hold it; nvidia-smi lists them) or its driver was reset",
      );
    }
    return 1;
  }
}

function isLikelyBug(e: unknown): boolean {
  return e instanceof TypeError || e instanceof RangeError || e instanceof ReferenceError ||
    e instanceof SyntaxError;
}

if (import.meta.main) {
  ensureRuntimeDir();
  Deno.exit(await main(Deno.args));
}
