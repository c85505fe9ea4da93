// scripts/bench/smi_rounds.ts: each round's mean SM clock and power over its second half, from nvidia-smi's
// log (here a made-up one: 1,000 MHz / 100 W before 12:00:03, 1,900 MHz / 150 W from then).
import assert from "node:assert/strict";
import { join } from "node:path";
import { runScript } from "../../support/run_script.ts";

Deno.test("smi_rounds: a round's clock and power are the means over its last half", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const smi = Array.from({ length: 60 }, (_, i) => {
      const t = `2026/12/07 12:00:${String(Math.floor(i / 10)).padStart(2, "0")}.${i % 10}00`;
      return i < 30 ? `${t}, 1000 MHz, 3201 MHz, 100.00 W, 5 %` : `${t}, 1900 MHz, 3201 MHz, 150.00 W, 40 %`;
    });
    await Deno.writeTextFile(join(dir, "smi.csv"), ["garbage line", ...smi].join("\n") + "\n");
    const rounds = [
      { gap: 3, at: "2026-12-07T12:00:02.950Z" }, // 12:00:01.95-02.95: all 1,000 MHz
      { gap: 8, at: "2026-12-07T12:00:05.950Z" }, // 04.95-05.95: all 1,900 MHz
    ];
    await Deno.writeTextFile(join(dir, "r.jsonl"), rounds.map((r) => JSON.stringify(r)).join("\n") + "\n");
    const r = await runScript("bench/smi_rounds.ts", [
      "--smi",
      join(dir, "smi.csv"),
      "--seconds",
      "2",
      join(dir, "r.jsonl"),
    ]);
    assert.equal(r.code, 0, r.stderr);
    assert.deepEqual(r.json.map((l) => [l.gap, l.smMhz, l.watts, l.samples]), [[3, 1000, 100, 10], [
      8,
      1900,
      150,
      10,
    ]]);
    const bad = await runScript("bench/smi_rounds.ts", [join(dir, "r.jsonl")]);
    assert.equal(bad.code, 2);
    assert.match(bad.stderr, /--smi FILE is required/);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
