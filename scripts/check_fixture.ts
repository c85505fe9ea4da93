// Checks a model folder that holds reference outputs (reference.json + reference.safetensors, as made
// by ../shared/fixtures/make_fixtures.py) through the CLI: greedy continuation and teacher-forced logits.
//   deno run -A scripts/check_fixture.ts DIR... [--weights f32|f16|q8|q4] [--tolerance T]
//     [--local N [--experts local|spread]] [--kv f16|f32|q8]
// Prints one line per folder and exits 1 if any fails. The tests use checkFixture for the fixtures.
// With q8 / q4 the greedy tokens are reported but do not fail the check (quantisation may move a near
// tie: a flip's line gives the reference's margin there against the run's error on that row); the logits
// must be within the tolerance (defaults: FIXTURE_TOLERANCE). --kv f16|f32|q8 sets the KV cache's type
// (the CLI's --kv, given to both commands). With f16 weights an MoE model's logits are not continuous in its
// activations: the f16 KV cache's rounding can move a router score past a near tie, so another expert runs at
// that row (docs/CHECKPOINTS.md, "The held-out sweep"). Such a miss, tokens kept, is checked again with an
// f32 KV cache and passes, saying so, only if it is then within the tolerance.
import { join } from "node:path";
import { parseArgs } from "node:util";
import { scriptArgs } from "./args.ts";
import { readSafetensorsHeader, readTensorBytes } from "../models/safetensors.ts";
import { readModelConfig } from "../models/family.ts";
import { isKvType, KV_TYPES, type KvType } from "../kernels/kv.ts";

const MAIN = new URL("../main.ts", import.meta.url).pathname;

export async function cli(
  args: string[],
  env?: Record<string, string>,
): Promise<{ code: number; stdout: string; stderr: string }> {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", "--quiet", MAIN, ...args],
    stdin: "null",
    env,
  }).output();
  const dec = new TextDecoder();
  return { code: out.code, stdout: dec.decode(out.stdout), stderr: dec.decode(out.stderr) };
}

export async function readF32(path: string, name: string): Promise<{ data: Float32Array; shape: number[] }> {
  const info = (await readSafetensorsHeader(path)).get(name);
  if (!info) throw new Error(`${path} has no tensor ${name}`);
  return { data: new Float32Array((await readTensorBytes(info)).slice().buffer), shape: info.shape };
}

/** Row r's max |got - want| and max |want| (V values a row). */
function rowError(
  got: Float32Array,
  want: Float32Array,
  V: number,
  r: number,
): { err: number; scale: number } {
  let scale = 0, err = 0;
  for (let i = r * V; i < (r + 1) * V; i++) {
    scale = Math.max(scale, Math.abs(want[i]));
    err = Math.max(err, Math.abs(got[i] - want[i]));
  }
  return { err, scale };
}

/** max over rows of max |got - want| / max |want| (the fixtures' README measure). */
export function worstRowError(got: Float32Array, want: Float32Array, V: number): number {
  let worst = 0;
  for (let r = 0; r < want.length / V; r++) {
    const { err, scale } = rowError(got, want, V, r);
    worst = Math.max(worst, err / scale);
  }
  return worst;
}

export type FixtureWeights = "f32" | "f16" | "q8" | "q4";

/**
 * Default logits tolerance (worst row's max |error| / max |logit|) by weight storage. f32: exact up to
 * accumulation order. f16: ~2e-3 measured. q8 / q4 only catch gross errors, from what was measured on the
 * H200 (2026-11-30, random weights): dense models q8 1.8e-2 .. 5.4e-2 (qwen3-tiny), q4 3.1e-1 .. 8.2e-1;
 * MoE models move further because a quantised router input can flip an expert choice: mixtral-tiny q8
 * 2.7e-1 (the f32 engine on the same weights quantised and dequantised on the CPU gives 2.69e-1, so this is
 * the weights, not the kernels) and q4 1.34. q8 keeps the greedy tokens but at near ties narrower than its
 * error on the deciding row (FixtureCheck.flip, printed with the line: qwen2-tiny at step 11, a margin of 2.5% of
 * the row's max logit against a 3.6% error).
 * The quantised kernels are checked tightly against dequantised references (tests/kernels/) and whole
 * models against the fake-quantised weights (tests/scripts/quant_error_test.ts).
 */
export const FIXTURE_TOLERANCE: Record<FixtureWeights, number> = { f32: 1e-4, f16: 2e-2, q8: 0.4, q4: 2 };

export interface FixtureCheck {
  tokensMatch: boolean;
  /**
   * Where the greedy tokens first differ: the step, and on the teacher-forced row that chose it how far the
   * reference preferred its token over ours (logit difference, and over the row's max |logit|) against
   * this run's largest |error| on that row (over the same max). A flip whose margin is below the row's
   * error is a near tie that the weights' rounding moved, not a wrong kernel.
   */
  flip?: { at: number; margin: number; marginRel: number; rowErrorRel: number };
  /** generate's --json object. */
  json: Record<string, unknown>;
  generated: number[];
  expected: number[];
  logitsError: number;
}

/**
 * Runs `generate --temperature 0` and `logits` on `dir` and compares with its reference; with `local: N`
 * both run on an ephemeral N-node chain (`--local N --wire f32`: exact hops for both).
 */
export async function checkFixture(
  dir: string,
  opts: { weights?: FixtureWeights; local?: number; experts?: "local" | "spread"; kv?: KvType } = {},
): Promise<FixtureCheck> {
  const weights = opts.weights ?? "f32";
  const kv = opts.kv ? ["--kv", opts.kv] : [];
  // Through a chain, activations cross the wire in f32 for both runs (generate's default is f16, logits'
  // f32): an exactness check must not round between stages, or a near tie in the greedy tokens flips where
  // the teacher-forced logits, which decide the explanation on a DIFFER line, were never rounded.
  const local = opts.local ? ["--local", String(opts.local), "--wire", "f32"] : [];
  if (opts.experts) local.push("--experts", opts.experts);
  const ref = JSON.parse(await Deno.readTextFile(join(dir, "reference.json")));
  const prompt: number[] = ref.tokens.slice(0, ref.prompt_length);
  // The reference's greedy loop runs past an eos; generation stops at it (as transformers' generate does).
  const config = JSON.parse(await Deno.readTextFile(join(dir, "config.json")));
  const eos: number[] = [config.eos_token_id ?? []].flat();
  let expected: number[] = ref.tokens.slice(ref.prompt_length);
  const stop = expected.findIndex((t) => eos.includes(t));
  if (stop >= 0) expected = expected.slice(0, stop + 1);
  const gen = await cli([
    "generate",
    "--model",
    dir,
    "--tokens",
    prompt.join(","),
    "--max-tokens",
    String(ref.generated),
    "--temperature",
    "0",
    "--weights",
    weights,
    "--json",
    ...kv,
    ...local,
  ]);
  if (gen.code !== 0) throw new Error(`generate on ${dir} exited ${gen.code}: ${gen.stderr}`);
  const json = JSON.parse(gen.stdout);
  const generated: number[] = json.tokens;
  const out = await Deno.makeTempFile({ suffix: ".safetensors" });
  try {
    const lg = await cli([
      "logits",
      "--model",
      dir,
      "--tokens",
      ref.tokens.join(","),
      "--out",
      out,
      "--weights",
      weights,
      ...kv,
      ...local,
    ]);
    if (lg.code !== 0) throw new Error(`logits on ${dir} exited ${lg.code}: ${lg.stderr}`);
    const got = await readF32(out, "logits");
    const want = await readF32(join(dir, "reference.safetensors"), "logits");
    if (got.shape.join() !== want.shape.join()) {
      throw new Error(`logits shape [${got.shape}] vs [${want.shape}]`);
    }
    const V = got.shape[1];
    const at = generated.findIndex((t, i) => t !== expected[i]);
    let flip: FixtureCheck["flip"];
    if (at >= 0 && at < expected.length) {
      // Row r's logits predict token r + 1; the step `at` token is ref.tokens[prompt + at].
      const r = prompt.length + at - 1;
      const { err, scale } = rowError(got.data, want.data, V, r);
      const margin = want.data[r * V + expected[at]] - want.data[r * V + generated[at]];
      flip = { at, margin, marginRel: margin / scale, rowErrorRel: err / scale };
    }
    return {
      tokensMatch: JSON.stringify(generated) === JSON.stringify(expected),
      flip,
      json,
      generated,
      expected,
      logitsError: worstRowError(got.data, want.data, V),
    };
  } finally {
    await Deno.remove(out);
  }
}

/**
 * checkFixture's verdict at `tolerance`: the tokens (not with q8 / q4) and the logits. An MoE model with f16
 * weights and the default (f16) KV cache that keeps the tokens but misses the logits is run again with an f32
 * KV cache, and passes if that run is within the tolerance; `note` then says so (docs/CHECKPOINTS.md).
 */
export async function fixtureVerdict(
  dir: string,
  opts: Parameters<typeof checkFixture>[1] & { weights: FixtureWeights },
  tolerance = FIXTURE_TOLERANCE[opts.weights],
): Promise<{ ok: boolean; r: FixtureCheck; note: string; kvF32Error?: number }> {
  const r = await checkFixture(dir, opts);
  const quantised = opts.weights === "q8" || opts.weights === "q4";
  const ok = (r.tokensMatch || quantised) && r.logitsError <= tolerance;
  if (ok || opts.weights !== "f16" || opts.kv !== undefined || !r.tokensMatch) return { ok, r, note: "" };
  // The family's own reading of the config (a Qwen3-MoE whose every layer is in mlp_only_layers has none).
  const config = await readModelConfig(dir);
  const moe = Array.from({ length: config.numLayers }, (_, i) => config.layer(i)).some((l) =>
    l.ffn.kind === "moe"
  );
  if (!moe) return { ok, r, note: "" };
  const f32 = await checkFixture(dir, { ...opts, kv: "f32" });
  const within = f32.tokensMatch && f32.logitsError <= tolerance;
  const note = ` (MoE: with an f32 KV cache ${f32.logitsError.toExponential(2)}${
    within ? ", so the f16 cache's rounding moved a router near tie" : ""
  })`;
  return { ok: within, r, note, kvF32Error: f32.logitsError };
}

function differ(r: FixtureCheck): string {
  const f = r.flip;
  if (!f) return `DIFFER (first at ${r.generated.findIndex((t, i) => t !== r.expected[i])})`;
  const pct = (v: number) => `${(100 * v).toPrecision(2)}%`;
  return `DIFFER (first at ${f.at}: reference margin ${f.margin.toPrecision(2)}, ${
    pct(f.marginRel)
  } of the ` +
    `row's max logit, ${f.marginRel < f.rowErrorRel ? "below" : "ABOVE"} its error there, ${
      pct(f.rowErrorRel)
    })`;
}

if (import.meta.main) {
  const { values, positionals } = scriptArgs(import.meta.url, (args) =>
    parseArgs({
      args,
      options: {
        weights: { type: "string", default: "f32" },
        tolerance: { type: "string" },
        local: { type: "string" },
        experts: { type: "string" },
        kv: { type: "string" },
      },
      allowPositionals: true,
    }));
  const weights = values.weights as FixtureWeights;
  if (!(weights in FIXTURE_TOLERANCE)) throw new TypeError(`--weights must be f32, f16, q8 or q4`);
  const tolerance = Number(values.tolerance ?? FIXTURE_TOLERANCE[weights]);
  const kv = values.kv;
  if (kv !== undefined && !isKvType(kv)) throw new TypeError(`--kv must be one of ${KV_TYPES.join(", ")}`);
  let failed = 0;
  for (const dir of positionals) {
    try {
      const { ok, r, note } = await fixtureVerdict(dir, {
        weights,
        local: values.local ? Number(values.local) : undefined,
        experts: values.experts as "local" | "spread" | undefined,
        kv,
      }, tolerance);
      if (!ok) failed++;
      console.log(
        `${ok ? "PASS" : "FAIL"} ${dir} weights=${weights}${kv ? ` kv=${kv}` : ""}${
          values.local ? ` local=${values.local}` : ""
        }${values.experts ? ` experts=${values.experts}` : ""} tokens=${
          r.tokensMatch ? "match" : differ(r)
        } ` +
          `logits_rel_err=${r.logitsError.toExponential(2)} (tolerance ${tolerance})${note}`,
      );
    } catch (e) {
      failed++;
      console.log(`FAIL ${dir}: ${(e as Error).message}`);
    }
  }
  console.log(`${positionals.length - failed} passed, ${failed} failed`);
  Deno.exit(failed ? 1 : 0);
}
