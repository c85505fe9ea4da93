// Runs one of scripts/ in a child deno, as a user would (`deno run -A --quiet scripts/<path> ...args`): the
// script smoke tests' one runner.
import { fileURLToPath } from "node:url";

export interface ScriptRun {
  code: number;
  stdout: string;
  stderr: string;
  /** The stdout lines that are JSON objects (a benchmark's results), parsed. */
  json: Record<string, unknown>[];
}

export async function runScript(path: string, args: string[] = []): Promise<ScriptRun> {
  const file = fileURLToPath(new URL(`../../scripts/${path}`, import.meta.url));
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", "--quiet", file, ...args],
    stdin: "null",
  }).output();
  const text = (b: Uint8Array) => new TextDecoder().decode(b);
  const stdout = text(out.stdout);
  const json = stdout.split("\n").filter((l) => l.startsWith("{")).map((l) => JSON.parse(l));
  return { code: out.code, stdout, stderr: text(out.stderr), json };
}
