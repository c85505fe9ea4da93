// Writing a file the user named with --out or --trace. A regular file (or a new one) is written atomically:
// a temporary file beside it, then a rename, so a reader never sees half of it; through a symlink, the
// file it points to is the one replaced. Anything else (/dev/stdout, /dev/null, a FIFO, a device) is
// written in place: a rename would replace the special file itself with a regular one. Every failure
// names the file.
import { dirname, join } from "node:path";
import { UsageError } from "./command.ts";

/**
 * Checks, before any work, that `path` can be written: its folder exists, and it is not a folder.
 * UsageError naming `flag` otherwise.
 */
export async function checkOutputPath(path: string, flag: string): Promise<void> {
  const info = await Deno.stat(path).catch(() => undefined);
  if (info?.isDirectory) throw new UsageError(`${flag} ${path} is a folder; give a file name`);
  if (info) return;
  const dir = await Deno.stat(dirname(path)).catch(() => undefined);
  if (!dir?.isDirectory) throw new UsageError(`${flag} ${path}: the folder ${dirname(path)} does not exist`);
}

/**
 * Writes an output file. `write(target)` writes the whole content at `target` (it may itself write
 * atomically); it is called with the real path for a regular or new file, with a temporary file otherwise
 * (then copied into `path` in place).
 */
export async function writeOutput(path: string, write: (target: string) => Promise<void>): Promise<void> {
  const real = await Deno.realPath(path).catch(() => undefined);
  const info = real ? await Deno.stat(real) : undefined;
  try {
    if (!info || info.isFile) return await write(real ?? path);
    const dir = await Deno.makeTempDir({ prefix: "swactor-out-" });
    try {
      const tmp = join(dir, "out");
      await write(tmp);
      const src = await Deno.open(tmp, { read: true });
      const dst = await Deno.open(real!, { write: true });
      await src.readable.pipeTo(dst.writable); // closes both, also on failure
    } finally {
      await Deno.remove(dir, { recursive: true }).catch(() => {});
    }
  } catch (e) {
    throw new Error(`cannot write ${path}: ${(e as Error).message}`);
  }
}

/** Writes `value` as JSON to an output file (see writeOutput). */
export async function writeJsonOutput(path: string, value: unknown): Promise<void> {
  await writeOutput(path, async (target) => {
    const tmp = `${target}.tmp-${Deno.pid}`;
    try {
      await Deno.writeTextFile(tmp, JSON.stringify(value));
      await Deno.rename(tmp, target);
    } catch (e) {
      await Deno.remove(tmp).catch(() => {});
      throw e;
    }
  });
}
