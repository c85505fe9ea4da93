// Local workers' shared settings (cli/workers.ts).
import assert from "node:assert/strict";
import { shareOneGpu } from "../../cli/workers.ts";

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
