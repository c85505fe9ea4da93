// deno task compile: the single swactor binary. `deno compile` downloads the `denort` runtime from
// Deno's download host; where that host is unreachable (our build machines), point DENORT_BIN at a
// denort binary of the same version (not the full `deno`: that yields a binary that acts as plain deno).
//   deno task compile [--output PATH]
import { parseArgs } from "node:util";
import { scriptArgs } from "./args.ts";

const { values } = scriptArgs(import.meta.url, (args) =>
  parseArgs({
    args,
    options: { output: { type: "string", default: "dist/swactor" } },
  }));
// The GPU thread's module is started by URL (models/gpu_thread.ts), so it is named for the binary to hold.
const args = [
  "compile",
  "-A",
  "--frozen",
  "--include",
  "kernels",
  "--include",
  "models/gpu_worker.ts",
  "--output",
  values.output!,
  "main.ts",
];
const denort = Deno.env.get("DENORT_BIN");
console.error(`compile: deno ${args.join(" ")}${denort ? ` (DENORT_BIN=${denort})` : ""}`);
const { code } = await new Deno.Command(Deno.execPath(), { args, stdout: "inherit", stderr: "inherit" })
  .output();
if (code !== 0) {
  console.error(
    "compile: failed. Offline, deno compile cannot fetch denort: set DENORT_BIN to a denort " +
      `${Deno.version.deno} binary (see docs/ARCHITECTURE.md).`,
  );
}
Deno.exit(code);
