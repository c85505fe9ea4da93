// How this program starts another process of itself (a worker node, a cluster file's node): the compiled
// binary (`deno task compile`) runs its commands directly; under `deno run` it is deno running main.ts.
import { fileURLToPath } from "node:url";

const MAIN = fileURLToPath(new URL("../main.ts", import.meta.url));

/** The command line that runs `swactor <args...>` as this process runs: [program, ...arguments]. */
export function selfCommand(args: string[], standalone = Deno.build.standalone): string[] {
  return standalone ? [Deno.execPath(), ...args] : [Deno.execPath(), "run", "-A", "--quiet", MAIN, ...args];
}
