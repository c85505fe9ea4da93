// memoSource (kernels/gpu.ts): a generated kernel's WGSL kept by its arguments, so that a request's program
// build neither regenerates it nor rehashes a copy of it to find its pipeline. No GPU needed.
import assert from "node:assert/strict";
import { memoSource } from "../../kernels/gpu.ts";

Deno.test("memoSource: the same arguments give the same string, built once; the memo is bounded", () => {
  let built = 0;
  const gen = (n: number, o: { a?: number }) => {
    built++;
    return `fn k${n}() {} // ${o.a ?? "none"} ${"x".repeat(64)}`;
  };
  const memo = memoSource(gen);
  const first = memo(1, { a: 2 });
  assert.equal(memo(1, { a: 2 }), first);
  assert.equal(built, 1);
  assert.equal(memo(1, {}), gen(1, {}));
  assert.equal(memo(1, { a: undefined }), memo(1, {}), "an absent field and an undefined one are one entry");
  assert.equal(built, 3);
  // Past its bound the memo starts over rather than growing: every entry is built again.
  for (let n = 2; n < 600; n++) memo(n, {});
  const before = built;
  memo(1, { a: 2 });
  assert.equal(built, before + 1);
});
