// `swactor plan` through main(): tables, JSON, and exit code 2 with file:line:col for bad input.
import assert from "node:assert/strict";
import { main } from "../../main.ts";

async function run(args: string[]): Promise<{ code: number; out: string; err: string }> {
  const out: string[] = [], err: string[] = [];
  const [log, error] = [console.log, console.error];
  console.log = (...a: unknown[]) => out.push(a.join(" "));
  console.error = (...a: unknown[]) => err.push(a.join(" "));
  try {
    return { code: await main(["plan", ...args]), out: out.join("\n"), err: err.join("\n") };
  } finally {
    [console.log, console.error] = [log, error];
  }
}

Deno.test("plan prints a table and --json a versioned Plan for the Kimi K2 fleet", async () => {
  const args = ["--model", "planner/examples/kimi-k2", "--cluster", "planner/examples/kimi_fleet.swl"];
  const t = await run(args);
  assert.equal(t.code, 0, t.err);
  assert.match(t.out, /predicted: [\d.]+ ms\/token = [\d.]+ tok\/s/);
  const j = await run([...args, "--json"]);
  const plan = JSON.parse(j.out);
  assert.equal(plan.version, 1);
  assert.equal(plan.model.layers, 61);
});

Deno.test("bad input exits 2 naming the file and line:col", async () => {
  const dir = await Deno.makeTempDir();
  try {
    await Deno.writeTextFile(`${dir}/bad.swl`, "cluster c {\n  node a { mem = 24 parsecs }\n}\n");
    const r = await run(["--model", "planner/examples/kimi-k2", "--cluster", `${dir}/bad.swl`]);
    assert.equal(r.code, 2);
    assert.ok(r.err.includes(`${dir}/bad.swl:2:21: unknown unit "parsecs"`), r.err);
    const missing = await run(["--model", dir, "--cluster", `${dir}/bad.swl`]);
    assert.equal(missing.code, 2);
    assert.ok(missing.err.includes(`${dir}/config.json`), missing.err);
    await Deno.writeTextFile(`${dir}/tiny.swl`, "cluster c {\n  node a { mem = 1 GiB }\n}\n");
    const nofit = await run(["--model", "planner/examples/kimi-k2", "--cluster", `${dir}/tiny.swl`]);
    assert.equal(nofit.code, 2);
    assert.match(nofit.err, /no placement fits \(memory of layer 0\)/);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("plan --spread wide and --routing counts; bad counts exit 2 naming the file and the layer", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const args = [
      "--model",
      "tests/fixtures/mixtral-tiny",
      "--cluster",
      "planner/examples/lan5.swl",
      "--json",
    ];
    const wide = await run([...args, "--experts", "spread", "--spread", "wide"]);
    assert.equal(wide.code, 0, wide.err);
    const plan = JSON.parse(wide.out);
    assert.equal(plan.expertMode, "spread");
    assert.ok(plan.expertHosts.length > 0);
    await Deno.writeTextFile(`${dir}/counts.json`, JSON.stringify({ "0": [9, 1, 1, 1, 1, 1, 1, 1] }));
    const hot = await run([...args, "--routing", `${dir}/counts.json`]);
    assert.equal(hot.code, 0, hot.err);
    await Deno.writeTextFile(`${dir}/short.json`, JSON.stringify({ "0": [1, 2] }));
    const bad = await run([...args, "--routing", `${dir}/short.json`]);
    assert.equal(bad.code, 2);
    assert.ok(bad.err.includes(`${dir}/short.json: routing counts for layer 0: expected 8 counts`), bad.err);
    const worse = await run([...args, "--spread", "far"]);
    assert.equal(worse.code, 2);
    assert.match(worse.err, /--spread expects compact or wide/);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
