// selfCommand (cli/self.ts): workers and a cluster file's nodes are this program again: deno running main.ts
// under `deno run`, the binary alone when compiled (where "run -A main.ts" would be an unknown command).
import assert from "node:assert/strict";
import { selfCommand } from "../../cli/self.ts";

Deno.test("selfCommand: deno run main.ts from source, the binary itself when compiled", async () => {
  assert.deepEqual(selfCommand(["join", "-"], true), [Deno.execPath(), "join", "-"]);
  const [program, ...args] = selfCommand(["--version"], false);
  assert.equal(program, Deno.execPath());
  assert.deepEqual(args.slice(0, 3), ["run", "-A", "--quiet"]);
  assert.ok(args[3].endsWith("/main.ts") && Deno.statSync(args[3]).isFile, args[3]);
  assert.deepEqual(args.slice(4), ["--version"]);
  // From source, the command line runs: swactor --version answers.
  const out = await new Deno.Command(program, { args }).output();
  assert.equal(out.code, 0);
  assert.match(new TextDecoder().decode(out.stdout), /^\d+\.\d+\.\d+\n$/);
  assert.equal(selfCommand([])[0], Deno.execPath(), "the default: this process's own way");
});
