// The small schema checker: parsed values, and errors that name the field by its path.
import assert from "node:assert/strict";
import {
  array,
  integer,
  literal,
  number,
  object,
  optional,
  SchemaError,
  string,
  union,
} from "../../../node/serving/schema.ts";

const s = object({
  name: string({ minLength: 1 }),
  n: optional(integer({ min: 1, max: 4 }), { nullable: true }),
  t: optional(number({ min: 0, max: 2 })),
  items: optional(
    array(object({ kind: literal("a", "b"), v: union(string(), array(integer())) }), { max: 2 }),
  ),
});

function err(v: unknown): SchemaError {
  try {
    s.parse(v);
  } catch (e) {
    assert.ok(e instanceof SchemaError);
    return e;
  }
  throw new Error("no error");
}

Deno.test("schema: values parse into their typed form; absent and null optional fields are left out", () => {
  assert.deepEqual(
    s.parse({ name: "x", n: null, items: [{ kind: "a", v: [1, 2] }, { kind: "b", v: "s" }] }),
    {
      name: "x",
      items: [{ kind: "a", v: [1, 2] }, { kind: "b", v: "s" }],
    },
  );
});

Deno.test("schema: errors say what was expected and name the field by its path", () => {
  const cases: [unknown, string, RegExp][] = [
    ["x", "", /the body must be a JSON object, got "x"/],
    [{}, "name", /name is required \(a non-empty string\)/],
    [{ name: "" }, "name", /name must be a non-empty string/],
    [{ name: "x", n: 1.5 }, "n", /n must be an integer in \[1, 4\], got 1.5/],
    [{ name: "x", t: "1" }, "t", /t must be a number in \[0, 2\]/],
    [{ name: "x", items: [{ kind: "c", v: "" }] }, "items[0].kind", /must be one of "a", "b"/],
    [{ name: "x", items: [{ kind: "a", v: [1, "2"] }] }, "items[0].v", /a string, or an array of an integer/],
    [{ name: "x", items: [1, 2, 3] }, "items", /an array with at most 2 items/],
    [{ name: "x", extra: 1 }, "extra", /unknown field extra/],
  ];
  for (const [v, param, message] of cases) {
    const e = err(v);
    assert.equal(e.param, param, JSON.stringify(v));
    assert.match(e.message, message);
  }
});
