import assert from "node:assert/strict";
import { Awareness } from "../../../node/membership/awareness.ts";

Deno.test("awareness clamps to [0, max-1] and scales timeouts by score+1", () => {
  const a = new Awareness(8);
  a.applyDelta(-3);
  assert.equal(a.score, 0);
  assert.equal(a.scale(500), 500);
  a.applyDelta(3);
  assert.equal(a.scale(500), 2000);
  a.applyDelta(100);
  assert.equal(a.score, 7);
  const off = new Awareness(1);
  off.applyDelta(5);
  assert.equal(off.scale(500), 500);
  assert.throws(() => new Awareness(0), RangeError);
});
