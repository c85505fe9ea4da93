// Reading a file the user named (--cluster, --plan, --ticket-file, a model's config.json, ...): every failure
// names the flag and the file and says why in words (not found, a folder, not allowed), not as the system's
// "No such file or directory (os error 2): readfile '...'".
import { UsageError } from "./command.ts";

/** Why a read failed, in a few words: the cause for the common cases, else the system's message. */
export function readFailure(e: unknown): string {
  if (e instanceof Deno.errors.NotFound) return "no such file";
  if (e instanceof Deno.errors.IsADirectory) return "a folder, not a file";
  if (e instanceof Deno.errors.PermissionDenied) return "not allowed to read it";
  return (e as Error).message;
}

/** The text of `path`; a UsageError "`label` `path`: why" when it cannot be read. */
export async function readInputFile(path: string, label: string): Promise<string> {
  try {
    return await Deno.readTextFile(path);
  } catch (e) {
    throw new UsageError(`${label} ${path}: ${readFailure(e)}`);
  }
}
