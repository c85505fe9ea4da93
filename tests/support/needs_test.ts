import assert from "node:assert/strict";
import { needs } from "./needs.ts";

Deno.test("needs: runs when every requirement holds; otherwise ignored, naming what is missing", () => {
  assert.deepEqual(needs("t", { gpu: true, fixture: "/some/dir" }), { name: "t", ignore: false });
  assert.deepEqual(needs("t", { gpu: false, fixture: "/some/dir", root: null }), {
    name: "t (skipped: needs gpu, root)",
    ignore: true,
  });
});
