// Errors point at the line and column of the problem and say what was expected.
import assert from "node:assert/strict";
import { LangError, parseCluster, parseModel } from "../../../planner/lang/mod.ts";

function errorAt(f: () => unknown, line: number, col: number, text: string) {
  assert.throws(f, (e) => {
    assert.ok(e instanceof LangError, String(e));
    assert.equal(`${e.line}:${e.col}`, `${line}:${col}`, e.message);
    assert.ok(e.message.includes(text), e.message);
    assert.ok(e.message.startsWith(`f.swl:${line}:${col}: `), e.message);
    return true;
  });
}

const parse = (t: string) => () => parseCluster(t, { file: "f.swl" });

Deno.test("syntax errors point at line:column", () => {
  errorAt(parse("cluster c {\n  node a {\n"), 3, 1, 'expected "}"');
  errorAt(parse("cluster c {\n  node a { mem = }\n}"), 2, 18, "expected a value");
  errorAt(parse('cluster c {\n  node "a\n}'), 2, 8, "unterminated string");
  errorAt(parse("cluster c {\n  node a @\n}"), 2, 10, "unexpected character");
  errorAt(parse("cluster c {\n  node a } }"), 2, 12, 'unexpected "}"');
  errorAt(parse("cluster c {\n  order [a b]\n}"), 2, 12, 'expected "," or "]"');
});

Deno.test("meaning errors point at the offending token", () => {
  errorAt(parse("cluster c {\n  node a { mem = 24 }\n}"), 2, 18, "needs a unit");
  errorAt(parse("cluster c {\n  node a { mem = 24 GB/s }\n}"), 2, 18, 'unknown unit "GB/s"');
  errorAt(parse("cluster c {\n  node a { colour = red }\n}"), 2, 12, 'unknown property "colour"');
  errorAt(parse("cluster c {\n  node a\n  node a\n}"), 3, 8, "declared twice");
  errorAt(parse("cluster c {\n  node a\n  exclude b\n}"), 3, 11, 'unknown node "b"');
  errorAt(parse("cluster c {\n  node a\n  pin layers 3..1 on a\n}"), 3, 14, "END > START");
  errorAt(parse("cluster c {\n  node a\n  pin 0..2 a\n}"), 3, 3, "expected `pin layers START..END on NODE`");
  errorAt(parse("cluster c {\n  node a\n  frobnicate\n}"), 3, 3, 'unknown statement "frobnicate"');
  errorAt(parse("cluster c {\n}"), 1, 1, "at least one node");
  errorAt(parse("model m { hidden = 1; vocab = 1 }"), 1, 1, "exactly one cluster");
  errorAt(
    () =>
      parseModel(
        "model m {\n  hidden = 4; vocab = 8\n  layers 0..2 { mlp { params = 3 } }\n  layer 1 { norm { params = 1 } }\n}",
        { file: "f.swl" },
      ),
    4,
    9,
    "layer 1 described twice",
  );
  errorAt(
    () =>
      parseModel("model m {\n  hidden = 4; vocab = 8\n  layers 0..1 { conv { params = 3 } }\n}", {
        file: "f.swl",
      }),
    3,
    17,
    'unknown operator "conv"',
  );
  errorAt(
    () => parseModel("model m {\n  vocab = 8\n  layers 0..1 { norm { params = 3 } }\n}", { file: "f.swl" }),
    1,
    1,
    'needs "hidden"',
  );
});

Deno.test("defaults apply to the nodes declared after them; units convert to base units", () => {
  const c = parseCluster(
    "cluster c {\n  defaults { mem = 8 GiB; up = 50 Mbit/s; overhead = 500 us }\n  node a\n  node b { mem = 12 GB }\n" +
      "  link default { latency = 20 ms }\n  quant { experts = 4.5 bits }\n}",
  );
  assert.deepEqual(c.nodes.map((n) => n.memBytes), [8 * 2 ** 30, 12e9]);
  assert.equal(c.nodes[0].up, 6.25e6);
  assert.equal(c.nodes[1].overhead, 500e-6);
  assert.equal(c.defaultLink.latency, 20e-3);
  assert.equal(c.quant.experts, 0.5625);
});
