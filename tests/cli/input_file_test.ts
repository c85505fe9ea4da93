// cli/input_file.ts: a file the user named that cannot be read is a UsageError naming the flag, the file and
// why in words.
import assert from "node:assert/strict";
import { join } from "node:path";
import { readInputFile } from "../../cli/input_file.ts";
import { UsageError } from "../../cli/command.ts";

Deno.test("readInputFile: the text, or a UsageError saying why in words", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const file = join(dir, "plan.json");
    await Deno.writeTextFile(file, "{}");
    assert.equal(await readInputFile(file, "--plan"), "{}");
    await assert.rejects(readInputFile(join(dir, "nope.json"), "--plan"), (e) => {
      assert.ok(e instanceof UsageError);
      assert.equal(e.message, `--plan ${dir}/nope.json: no such file`);
      return true;
    });
    await assert.rejects(
      readInputFile(dir, "--cluster"),
      new UsageError(`--cluster ${dir}: a folder, not a file`),
    );
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
