// Local workers' shared settings (cli/workers.ts).
import assert from "node:assert/strict";
import { join } from "node:path";
import { shareMeasurement, shareOneGpu } from "../../cli/workers.ts";
import { withStateDir } from "../support/state_dir.ts";

Deno.test("nodes sharing one GPU default to no keep-warm fillers, and keep a setting the user made", () => {
  const before = Deno.env.get("SWACTOR_KEEP_WARM");
  try {
    Deno.env.delete("SWACTOR_KEEP_WARM");
    shareOneGpu();
    assert.equal(Deno.env.get("SWACTOR_KEEP_WARM"), "0");
    Deno.env.set("SWACTOR_KEEP_WARM", "1");
    shareOneGpu();
    assert.equal(Deno.env.get("SWACTOR_KEEP_WARM"), "1");
  } finally {
    if (before === undefined) Deno.env.delete("SWACTOR_KEEP_WARM");
    else Deno.env.set("SWACTOR_KEEP_WARM", before);
  }
});

Deno.test("the leader's measurement goes to its workers through the state folder, and a dead leader's file is swept", async () => {
  await withStateDir(async (state, livePid) => {
    const dir = join(state, "handoff");
    await Deno.mkdir(dir, { recursive: true });
    const dead = join(dir, "999999999-0a1b2c3d.json"); // no such process
    const deadTmp = join(dir, "999999999-0a1b2c3d.json.999999999.tmp");
    const kept = join(dir, `${livePid}-0a1b2c3d.json`);
    for (const f of [dead, deadTmp, kept]) await Deno.writeTextFile(f, "{}");

    const shared = await shareMeasurement(Promise.resolve(undefined));
    const file = shared.env.SWACTOR_MEASUREMENT_FROM;
    assert.equal(join(file, ".."), dir);
    assert.match(file, new RegExp(`/${Deno.pid}-[0-9a-f]{8}\\.json$`));
    const names = async () => (await Array.fromAsync(Deno.readDir(dir))).map((e) => e.name).sort();
    for (let i = 0; i < 100 && !(await names()).includes(file.slice(dir.length + 1)); i++) {
      await new Promise((r) => setTimeout(r, 10));
    }
    assert.deepEqual(await names(), [file.slice(dir.length + 1), `${livePid}-0a1b2c3d.json`].sort());
    assert.deepEqual(JSON.parse(await Deno.readTextFile(file)), { measured: null });
    await shared.close();
    assert.deepEqual(await names(), [`${livePid}-0a1b2c3d.json`]);
  });
});
