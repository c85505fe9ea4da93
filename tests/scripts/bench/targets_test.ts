// scripts/bench/targets.ts: the open speed targets judged from benchmark lines (A/B lines left out).
import assert from "node:assert/strict";
import { join } from "node:path";
import { jsonLines, judgeTargets } from "../../../scripts/bench/targets.ts";

const decode = (weights: string, tokS: number, tuning = {}) => ({
  bench: "swactor-decode",
  adapter: "NVIDIA H200",
  weights,
  tuning,
  decode_tok_s: tokS,
});
const kStep = (one: number, eight: number) => ({
  bench: "swactor-k-step",
  weights: "q4",
  tuning: {},
  k_step_ms: { "1": one, "8": eight },
});
const context = (keys: number, ms: number) => ({
  bench: "swactor-context",
  weights: "q4",
  tuning: {},
  context: keys,
  gpu_ms_per_token: ms,
});
const prefill = (prompt: number, tokS: number, math = "f16") => ({
  weights: "q4",
  math,
  prompt,
  ttftMs: 1,
  tokS,
});

Deno.test("judgeTargets: medians of the default-tuning figures against each bound", () => {
  const rows = judgeTargets([
    decode("q4", 1_600),
    decode("q4", 2_100),
    decode("q4", 2_050, { firstTokenAtOnce: false }), // the decode benchmarks' own setting: counted
    decode("q4", 9_999, { multi: false }), // an A/B line: not counted
    decode("q4", 9_999, { firstTokenAtOnce: false, multi: false }), // an A/B line of theirs: not counted
    decode("f16", 1_120),
    kStep(0.6, 0.93), // 1.55x
    context(128, 0.6),
    context(8192, 0.74), // 81%
    context(128, 0.6),
    context(8192, 0.8), // 75%
    context(128, 0.6),
    context(8192, 0.72), // 83%
    { bench: "swactor-moe-decode", shape: "qwen3-30b-a3b", weights: "q4", decode_tok_s: 465 },
    { bench: "swactor-moe-decode", shape: "deepseek-v2-lite", weights: "q4", decode_tok_s: 900 }, // another shape
    prefill(512, 15_500),
    prefill(512, 3_000, "f32"), // f32 GEMM math: not the default
    prefill(2048, 14_000),
  ]);
  const by = Object.fromEntries(rows.map((r) => [r.name, r]));
  assert.deepEqual(by["q4 decode, Llama-3.2-1B shape"].figures, [1_600, 2_100, 2_050]);
  assert.equal(by["q4 decode, Llama-3.2-1B shape"].median, 2_050);
  assert.equal(by["q4 decode, Llama-3.2-1B shape"].status, "met");
  assert.equal(by["f16 decode, Llama-3.2-1B shape"].status, "met");
  assert.equal(by["q4 k = 8 step / one-token step"].status, "missed");
  assert.ok(Math.abs(by["q4 k = 8 step / one-token step"].median - 1.55) < 1e-9);
  assert.deepEqual(by["q4 decode at 8,192 keys / at 128"].figures.map((v) => +v.toFixed(3)), [
    0.811,
    0.75,
    0.833,
  ]);
  assert.equal(by["q4 decode at 8,192 keys / at 128"].status, "met");
  assert.deepEqual(by["Qwen3-30B-A3B shape, q4 decode"].figures, [465]);
  assert.equal(by["Qwen3-30B-A3B shape, q4 decode"].status, "missed");
  assert.deepEqual(by["prefill pp512 (f16 and q4)"].figures, [15_500]);
  assert.equal(by["prefill pp2048 (f16 and q4)"].status, "missed");
});

Deno.test("judgeTargets: prefill lines with the engine's own GEMM math count over f16 ones where present", () => {
  const rows = judgeTargets([
    prefill(512, 15_500),
    prefill(512, 21_000, "default"),
    prefill(512, 3_000, "f32"),
  ]);
  assert.deepEqual(rows.find((r) => r.name.startsWith("prefill pp512"))!.figures, [21_000]);
});

Deno.test("judgeTargets: a target no line measured says so", () => {
  const rows = judgeTargets([decode("q4", 2_500)]);
  assert.equal(rows.find((r) => r.name.startsWith("q4 decode,"))!.status, "met");
  assert.equal(rows.find((r) => r.name.startsWith("Qwen3"))!.status, "no figure");
});

Deno.test("targets.ts reads JSON lines among other output and prints a row a target", async () => {
  assert.deepEqual(jsonLines('bench: ready\n{"a":1}\n{broken\n[1]\n{"b":2}'), [{ a: 1 }, { b: 2 }]);
  const dir = await Deno.makeTempDir();
  try {
    const file = join(dir, "lines.jsonl");
    await Deno.writeTextFile(file, `noise\n${JSON.stringify(decode("q4", 1_660))}\n`);
    const out = await new Deno.Command(Deno.execPath(), {
      args: ["run", "-A", new URL("../../../scripts/bench/targets.ts", import.meta.url).pathname, file],
    }).output();
    const text = new TextDecoder().decode(out.stdout);
    assert.equal(out.code, 0, new TextDecoder().decode(out.stderr));
    assert.match(text, /adapters: NVIDIA H200/);
    assert.match(text, /missed +q4 decode, Llama-3\.2-1B shape +>= 2,000 tok\/s +median 1660 of \[1660\]/);
    assert.match(text, /no figure +Qwen3-30B-A3B shape, q4 decode/);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
