// The dial-table file behind $SWACTOR_DIAL_TABLE: accepted shapes, and errors that say what was wrong.
import assert from "node:assert/strict";
import { DIAL_TABLE_ENV, dialTableFromEnv, parseDialTable } from "../../cli/dial_table.ts";

Deno.test("dial table: parses addresses, IPv6 in brackets, an empty table", () => {
  const t = parseDialTable({ "10.213.0.2:7400": "10.213.0.1:40001", "[fd00::2]:7400": "[fd00::1]:1" });
  assert.deepEqual([...t], [["10.213.0.2:7400", "10.213.0.1:40001"], ["[fd00::2]:7400", "[fd00::1]:1"]]);
  assert.equal(parseDialTable({}).size, 0);
});

Deno.test("dial table: bad shapes and addresses throw TypeError naming the entry", () => {
  assert.throws(() => parseDialTable([]), /expected a JSON object/);
  assert.throws(() => parseDialTable(null), /expected a JSON object/);
  assert.throws(() => parseDialTable({ "10.0.0.1": "10.0.0.2:1" }), /"10\.0\.0\.1"/);
  assert.throws(() => parseDialTable({ "10.0.0.1:1": 5 }), TypeError);
  assert.throws(() => parseDialTable({ "10.0.0.1:1": "10.0.0.2:70000" }), /70000/);
});

Deno.test("dial table: read from the file $SWACTOR_DIAL_TABLE names; unset means none", async () => {
  const before = Deno.env.get(DIAL_TABLE_ENV);
  const file = await Deno.makeTempFile({ suffix: ".json" });
  try {
    Deno.env.delete(DIAL_TABLE_ENV);
    assert.equal(await dialTableFromEnv(), undefined);
    await Deno.writeTextFile(file, JSON.stringify({ "10.1.0.2:7400": "10.1.0.1:5000" }));
    Deno.env.set(DIAL_TABLE_ENV, file);
    assert.deepEqual([...(await dialTableFromEnv())!], [["10.1.0.2:7400", "10.1.0.1:5000"]]);
    await Deno.writeTextFile(file, "{not json");
    await assert.rejects(dialTableFromEnv(), /is not JSON/);
    Deno.env.set(DIAL_TABLE_ENV, file + ".missing");
    await assert.rejects(dialTableFromEnv(), /cannot read/);
  } finally {
    if (before === undefined) Deno.env.delete(DIAL_TABLE_ENV);
    else Deno.env.set(DIAL_TABLE_ENV, before);
    await Deno.remove(file);
  }
});
