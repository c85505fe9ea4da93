// Decode benchmark (issue 6): our prefill and decode tok/s at batch 1 on a Llama-3.2-1B-shaped model
// with random weights, greedy, 32-token prompt, 128 new tokens; one JSON line per weight type. Each line
// also has the prompt's teacher-forced logits error against the first weight type's (the float path when
// that is f16 or f32): worst row's max |error| / max |logit|, the fixtures' measure.
//   deno run -A scripts/bench/decode.ts [--dir DIR] [--shape llama-3.2-1b|demo] [--weights f16,f32,q8,q4]
//     [--prompt 32] [--new 128] [--room 0] [--runs 3] [--batch 16]
//     [--k 1,2,4,8,16] [--context 128,2048,8192] [--context-run] [--skip-decode]
//     [--gemv subgroup|team] [--dp4 on|off] [--multi on|off] [--multi-stage f32|f16|int8]
//     [--multi-pipeline on|off] [--multi-direct on|off] [--multi-unroll N] [--multi-rows N]
//     [--tunings '[{"multiUnroll":1}, ...]'] (each a gpu.tuning override: the k-steps, contexts and decode rerun)
//     [--rounds R] (the baseline and the --tunings settings timed in turn R times, each line tagged `round`)
//     [--defer-norm on|off] [--direct on|off] [--direct-pairs on|off] [--argmax-chunk N] [--kv f16,f32,q8]
//     [--attn-grouped on|off] [--marginal]
// --gemv .. --argmax-chunk, --attn-grouped (gpu.tuning.attentionGrouped: the decode attention's one
// workgroup per kv head) force kernel choices (gpu.tuning, kernels/gpu.ts) for A/B runs; --ab repeats --k
// without the multi-token GEMV and with each of its x stagings (multiStage: f32, f16 and, quantised
// weights, int8), each without and with pipelined weight loads (multiPipeline), then (f32 / f16 weights) with
// the direct multi-token GEMV (multiDirect: x read in place, K split over warps), --context without
// flash-decoding splits, and the decode under every combination of pairGateUp, prefetch and deferNorm,
// then with gpu.tuning.direct on (the one-row f32 / f16 GEMVs read x in place, K split over warps;
// pairGateUp, prefetch and deferNorm on, today's winners), then with the sampler's first pass at 4096 logits a workgroup (the old chunk; one "swactor-decode-ab"
// line each, with its GPU ms by kernel and dispatches a token), in the same process. --kv: the GQA KV
// cache types to sweep (gpu.tuning.kv; each weight type is loaded once per KV type; default: the model's
// default, f16 for f16 / q8 / q4 weights where the adapter has shader-f16). Every line says its KV type
// and KV bytes per token (all layers; a decode step at position p reads p times that).
// --room: the timed generates' requests hold that many positions more than they use, as an API chat request
// with an unused max_tokens does (its decode steps' programs follow the keys they attend to, not the cache's
// capacity: kernels/attention_decode.ts attentionLengthBucket).
// --k: GPU ms of a k-token step (Engine.verify's program: k rows of logits + their argmax) against the
// one-token decode step, at the mean decode position. --context: GPU ms (and tok/s) of one decode step
// after N tokens of context (the KV cache's contents do not change the work); with --context-run also
// the measured decode tok/s of a real N-token prompt (its prefill takes a while). --skip-decode: only
// those two (no 3-run generate). --marginal (with --k): what each kind of dispatch adds to the decode step
// ("decode") and to each k-step, the step timed without it (the rest read what they find; their work does
// not depend on the values), grouped by label, grid and largest buffer ("gemv_none_direct_i8@64 2.3MB":
// o_proj and down share a label and a grid): `k_marginal_ms`. They sum to ~5% over the step, and a small
// dispatch's figure overstates what leaving it out of the program saves (H200, 2026-12-03: the input pass,
// the sampler's two dispatches and the embedding at 5-15 us each, where fusing them away saved nothing).
// On the GPU machine scripts/device/h200.sh runs it next to transformers (scripts/bench/hf_decode.py)
// so the ratio comes from one run. On a software adapter the default shape is the demo model (a 1B model
// would take minutes a token there); `deno task bench` is then a smoke test (tests/scripts/bench/).
import { parseArgs } from "node:util";
import { countArg, scriptArgs, tuningsArg } from "../args.ts";
import { DECODE_WINDOW } from "./targets.ts";
import {
  argmaxRowsCalls,
  getGpu,
  isKvType,
  type KernelCall,
  type KernelTuning,
  KV_TYPES,
  type KvType,
  releaseCalls,
  writeStep,
} from "../../kernels/mod.ts";
import { cpuMs, gpuMs, gpuMsPerCall, marginalMs } from "../../kernels/timer.ts";
import { storageBuffer } from "../../kernels/gpu.ts";
import { Checkpoint } from "../../models/checkpoint.ts";
import { DEMO_CONFIG_JSON } from "../../models/demo.ts";
import { Engine, generate, wholeModel } from "../../models/engine.ts";
import { Model } from "../../models/model.ts";
import { worstRowError } from "../check_fixture.ts";
import { ensureRandomCheckpoint, LLAMA_3_2_1B } from "./random_checkpoint.ts";

const { values, tunings } = scriptArgs(import.meta.url, (args) => {
  const parsed = parseArgs({
    args,
    options: {
      dir: { type: "string" },
      shape: { type: "string" },
      weights: { type: "string", default: "f16,f32" },
      prompt: { type: "string", default: "32" },
      new: { type: "string", default: "128" },
      room: { type: "string", default: "0" },
      runs: { type: "string", default: "3" },
      batch: { type: "string", default: "16" },
      k: { type: "string" },
      context: { type: "string" },
      "context-run": { type: "boolean", default: false },
      "skip-decode": { type: "boolean", default: false },
      ab: { type: "boolean", default: false },
      gemv: { type: "string" },
      dp4: { type: "string" },
      multi: { type: "string" },
      "multi-stage": { type: "string" },
      "multi-pipeline": { type: "string" },
      "multi-direct": { type: "string" },
      "multi-unroll": { type: "string" },
      "multi-rows": { type: "string" },
      tunings: { type: "string" },
      rounds: { type: "string", default: "1" },
      splits: { type: "string" },
      prefetch: { type: "string" },
      pair: { type: "string" },
      "defer-norm": { type: "string" },
      direct: { type: "string" },
      "direct-pairs": { type: "string" },
      "attn-grouped": { type: "string" },
      "argmax-chunk": { type: "string" },
      kv: { type: "string" },
      marginal: { type: "boolean", default: false },
    },
  });
  countArg("rounds", parsed.values.rounds);
  /** --tunings: the k-steps, contexts and decode again under each of a JSON list of gpu.tuning overrides. */
  return { ...parsed, tunings: tuningsArg(parsed.values.tunings) };
});
/** --rounds: how many times the --tunings settings are timed in turn. */
const rounds = Number(values.rounds);
const shapes: Record<string, Record<string, unknown>> = {
  "llama-3.2-1b": LLAMA_3_2_1B,
  demo: DEMO_CONFIG_JSON,
};
/** The round a line belongs to under --rounds R > 1 (0 .. R - 1); absent otherwise. */
let round: number | undefined;

const gpu = await getGpu();
// The decode rate over the window every session measured: the first token handed out after the read-ahead
// batches (the engine now hands it out at once, which moves the start-up batches' encode into the window:
// ~5% of a 128-token Llama-1B run's wall time, none of its total; docs/BENCHMARKS.md, the fiftieth session).
gpu.tuning = { ...DECODE_WINDOW, ...tuningFlags() };
// --dir holding a checkpoint already (e.g. made by hf_moe.py) is benchmarked as it is.
const existing = values.dir !== undefined && values.shape === undefined &&
  await Deno.stat(`${values.dir}/config.json`).then(() => true, () => false);
const shape = existing ? "checkpoint" : values.shape ?? (gpu.isSoftware ? "demo" : "llama-3.2-1b");
const configJson = existing ? undefined : shapes[shape];
if (!existing && !configJson) {
  throw new TypeError(`--shape must be one of ${Object.keys(shapes)}, got "${shape}"`);
}
if (gpu.isSoftware) {
  console.error(`bench: ${gpu.adapterName} is a software adapter: numbers are a smoke test`);
}
const dir = values.dir ?? `${Deno.env.get("TMPDIR") ?? "/tmp"}/swactor-bench-${shape}`;
const t0 = performance.now();
if (configJson) await ensureRandomCheckpoint(dir, configJson);
console.error(`bench: checkpoint ready in ${((performance.now() - t0) / 1000).toFixed(1)} s at ${dir}`);
const ckpt = await Checkpoint.open(dir);
const P = Number(values.prompt), N = Number(values.new), room = Number(values.room);
const greedy = { temperature: 0, topP: 1, seed: 0 };
const prompt = Array.from({ length: P }, (_, i) => (i * 7919 + 13) % ckpt.config.vocabSize);
let baseline: { weights: string; logits: Float32Array } | undefined;
const kvTypes: (KvType | undefined)[] = values.kv === undefined
  ? [undefined]
  : values.kv.split(",").map((k) => {
    if (!isKvType(k)) throw new TypeError(`--kv takes ${KV_TYPES.join(", ")}, got "${k}"`);
    return k;
  });
for (const weights of values.weights!.split(",") as ("f16" | "f32" | "q8" | "q4")[]) {
  for (const kv of kvTypes) {
    if ((weights === "f16" || (kv !== undefined && kv !== "f32")) && !gpu.hasF16) {
      continue;
    }
    // The cache type is chosen at load (Model.kvType): one load per KV type.
    gpu.tuning = { ...gpu.tuning, kv };
    const model = await Model.load(gpu, ckpt, { weights });
    const kvInfo = { kv: model.kvType, kv_bytes_per_token: model.kvBytesPerToken() };
    const engine = new Engine(wholeModel(ckpt.config.numLayers), model);
    if (values.k) {
      await inRounds(async () => {
        await kSteps(model, weights);
        for (const t of tunings) await withTuning(t, () => kSteps(model, weights));
      });
      if (values.ab) {
        await withTuning({ multi: false }, () => kSteps(model, weights));
        const stages = weights === "q8" || weights === "q4"
          ? ["f32", "f16", "int8"] as const
          : ["f32", "f16"] as const;
        for (const multiStage of stages) {
          for (const multiPipeline of [false, true]) {
            await withTuning({ multi: true, multiStage, multiPipeline }, () => kSteps(model, weights));
          }
        }
        // Direct mode serves f32 / f16 matrices only (q8 / q4 keep the staged kernel).
        if (weights === "f16" || weights === "f32") {
          await withTuning({ multi: true, multiDirect: true }, () => kSteps(model, weights));
        }
      }
    }
    if (values.context) {
      await inRounds(async () => {
        await contexts(engine, model, weights);
        for (const t of tunings) await withTuning(t, () => contexts(engine, model, weights));
      });
      if (values.ab) await withTuning({ attentionSplits: 1 }, () => contexts(engine, model, weights));
    }
    if (values["skip-decode"]) {
      engine.close();
      continue;
    }
    const logits = await engine.logits(prompt);
    baseline ??= { weights, logits };
    const logitsError = worstRowError(logits, baseline.logits, ckpt.config.vocabSize);
    const results = [];
    for (let r = 0; r < Number(values.runs); r++) {
      const res = await generate(engine, prompt, {
        maxTokens: N,
        sampling: greedy,
        maxBatch: Number(values.batch),
        room,
      });
      results.push({ firstTokenMs: res.firstTokenMs, tokS: res.tokS, activationBytes: res.activationBytes });
    }
    const best = results.reduce((a, b) => (b.tokS > a.tokS ? b : a));
    // Where a token's time goes: GPU time of one decode step (timestamps), and CPU time to encode + submit it.
    // At the mean decode position (P + N / 2 keys), where attention costs what it costs on average.
    const seq = model.newSequence({ maxSeq: P + N, sampling: { temperature: 0, topP: 1, seed: 0 } });
    const decode = seq.program(1, "sample");
    const mid = P + Math.floor(N / 2);
    writeStep(gpu, seq.step, { pos0: mid, T: 1, tokOut: mid + 1 });
    const gpuStepMs = gpu.hasTimestamps ? (await gpuMs(gpu, decode, 2), await gpuMs(gpu, decode, 20)) : NaN;
    // The CPU's side of a step, by phase (kernels/timer.ts cpuMs); cpu_encode_ms_per_token is their sum.
    const cpu = await cpuMs(gpu, decode, 50);
    const cpuStepMs = cpu.record + cpu.finish + cpu.submit;
    // GPU ms per token by kernel kind, each dispatch timed in place in the step sequence, summed by label.
    const byKernel = gpu.hasTimestamps ? await msByKernel(decode) : {};
    seq.destroy();
    console.log(JSON.stringify({
      bench: "swactor-decode",
      adapter: gpu.adapterName,
      shape,
      weights,
      prompt: P,
      new_tokens: N,
      ...(room > 0 ? { room } : {}),
      decode_tok_s: Number(best.tokS.toFixed(1)),
      gemv: gpu.subgroupSize && gpu.tuning.gemv !== "team" ? `subgroup (${gpu.subgroupSize} lanes)` : "team",
      tuning: gpu.tuning,
      wall_ms_per_token: Number((1000 / best.tokS).toFixed(3)),
      first_token_ms: Number(best.firstTokenMs.toFixed(1)),
      // A request's GPU buffers beside its KV cache (activations sized by its prompt, logits, token ids).
      request_activation_bytes: best.activationBytes,
      runs: results.map((r) => Number(r.tokS.toFixed(1))),
      dispatches_per_token: decode.length,
      gpu_ms_per_token: Number(gpuStepMs.toFixed(3)),
      cpu_encode_ms_per_token: Number(cpuStepMs.toFixed(3)),
      cpu_ms_per_token: {
        record: Number(cpu.record.toFixed(3)),
        finish: Number(cpu.finish.toFixed(3)),
        submit: Number(cpu.submit.toFixed(3)),
      },
      gpu_ms_by_kernel: byKernel,
      weight_bytes: model.weightBytes,
      // What a decode step reads: every weight but the routed experts, and topK / E of those (KV not counted).
      read_bytes_per_token: readBytes(model),
      read_gb_s: Number((readBytes(model) / gpuStepMs / 1e6).toFixed(1)),
      layers: ckpt.config.numLayers,
      model_type: ckpt.config.modelType,
      ...kvInfo,
      // The KV cache the step at the mean position reads (beside read_bytes_per_token).
      kv_read_bytes_per_token: model.kvBytesPerToken() * (mid + 1),
      [`logits_rel_err_vs_${baseline.weights}`]: Number(logitsError.toExponential(2)),
    }));
    await inRounds(async () => {
      for (const t of tunings) await withTuning(t, () => decodeAb(engine, model, prompt, weights));
    });
    if (values.ab) {
      // The same decode with the MLP's gate/up pairing and the GEMVs' prologue variants flipped (each
      // generate builds its programs anew).
      for (const pairGateUp of [true, false]) {
        for (const prefetch of [false, true]) {
          for (const deferNorm of [false, true]) {
            await withTuning(
              { pairGateUp, prefetch, deferNorm },
              () => decodeAb(engine, model, prompt, weights),
            );
          }
        }
      }
      await withTuning(
        { pairGateUp: true, prefetch: true, deferNorm: true, direct: true },
        () => decodeAb(engine, model, prompt, weights),
      );
      await withTuning({ argmaxChunk: 4096 }, () => decodeAb(engine, model, prompt, weights));
    }
    engine.close();
  }
}

function onOff(name: string, v: string | undefined): boolean | undefined {
  if (v === undefined) return undefined;
  if (v !== "on" && v !== "off") throw new TypeError(`--${name} must be on or off, got "${v}"`);
  return v === "on";
}

function tuningFlags(): KernelTuning {
  const t: KernelTuning = {};
  if (values.gemv !== undefined) {
    if (values.gemv !== "team" && values.gemv !== "subgroup") {
      throw new TypeError(`--gemv must be team or subgroup, got "${values.gemv}"`);
    }
    t.gemv = values.gemv;
  }
  const dp4 = onOff("dp4", values.dp4), multi = onOff("multi", values.multi);
  const prefetch = onOff("prefetch", values.prefetch);
  if (prefetch !== undefined) t.prefetch = prefetch;
  const pair = onOff("pair", values.pair), deferNorm = onOff("defer-norm", values["defer-norm"]);
  if (pair !== undefined) t.pairGateUp = pair;
  if (deferNorm !== undefined) t.deferNorm = deferNorm;
  const direct = onOff("direct", values.direct);
  if (direct !== undefined) t.direct = direct;
  const directPairs = onOff("direct-pairs", values["direct-pairs"]);
  if (directPairs !== undefined) t.directPairs = directPairs;
  const grouped = onOff("attn-grouped", values["attn-grouped"]);
  if (grouped !== undefined) t.attentionGrouped = grouped;
  if (values["argmax-chunk"] !== undefined) t.argmaxChunk = Number(values["argmax-chunk"]);
  if (dp4 !== undefined) t.dp4 = dp4;
  if (multi !== undefined) t.multi = multi;
  const pipeline = onOff("multi-pipeline", values["multi-pipeline"]);
  if (pipeline !== undefined) t.multiPipeline = pipeline;
  const multiDirect = onOff("multi-direct", values["multi-direct"]);
  if (multiDirect !== undefined) t.multiDirect = multiDirect;
  if (values["multi-unroll"] !== undefined) t.multiUnroll = Number(values["multi-unroll"]);
  if (values["multi-rows"] !== undefined) t.multiRows = Number(values["multi-rows"]);
  const stage = values["multi-stage"];
  if (stage !== undefined) {
    if (stage !== "f32" && stage !== "f16" && stage !== "int8") {
      throw new TypeError(`--multi-stage must be f32, f16 or int8, got "${stage}"`);
    }
    t.multiStage = stage;
  }
  if (values.splits !== undefined) {
    const n = Number(values.splits);
    if (!(Number.isInteger(n) && n >= 1)) {
      throw new TypeError(`--splits must be an integer >= 1, got "${values.splits}"`);
    }
    t.attentionSplits = n;
  }
  return t;
}

/** --ab: decode tok/s (best of --runs) and GPU ms a step under the current gpu.tuning. */
async function decodeAb(engine: Engine, model: Model, prompt: number[], weights: string): Promise<void> {
  let best = 0;
  for (let r = 0; r < Number(values.runs); r++) {
    best = Math.max(best, (await generate(engine, prompt, { maxTokens: N, sampling: greedy, room })).tokS);
  }
  const seq = model.newSequence({ maxSeq: P + N, sampling: greedy });
  const mid = P + Math.floor(N / 2);
  writeStep(gpu, seq.step, { pos0: mid, T: 1, tokOut: mid + 1 });
  const program = seq.program(1, "sample");
  const ms = gpu.hasTimestamps ? await stepMs(program) : NaN;
  const byKernel = gpu.hasTimestamps ? await msByKernel(program) : {};
  seq.destroy();
  console.log(JSON.stringify({
    bench: "swactor-decode-ab",
    ...(round !== undefined ? { round } : {}),
    weights,
    ...(room > 0 ? { room } : {}),
    kv: model.kvType,
    tuning: gpu.tuning,
    decode_tok_s: Number(best.toFixed(1)),
    gpu_ms_per_token: Number(ms.toFixed(3)),
    dispatches_per_token: program.length,
    gpu_ms_by_kernel: byKernel,
  }));
}

/** GPU ms of a step's dispatches by kernel label, each timed in place in the step sequence, summed. */
async function msByKernel(calls: KernelCall[]): Promise<Record<string, number>> {
  const byKernel: Record<string, number> = {};
  const per = await gpuMsPerCall(gpu, calls, Math.max(1, Math.floor(2048 / calls.length / 2)));
  calls.forEach((call, i) => {
    const k = call.label ?? "?";
    byKernel[k] = Number(((byKernel[k] ?? 0) + per[i]).toFixed(4));
  });
  return byKernel;
}

/** What each kind of dispatch (label, grid, largest buffer) adds to a step, GPU ms (timer.ts marginalMs). */
async function stepMarginalMs(calls: KernelCall[]): Promise<Record<string, number>> {
  // The largest buffer bound (the weights, for a GEMV) tells o_proj from down.
  const key = (c: KernelCall) =>
    `${c.label ?? "?"}@${c.workgroups.join("x").replace(/(x1)+$/, "")} ${
      (Math.max(...c.buffers.map((b) => b.size)) / 2 ** 20).toFixed(1)
    }MB`;
  // A software adapter (a smoke test) times one round of one.
  const m = await marginalMs(gpu, calls, key, gpu.isSoftware ? 1 : 3, gpu.isSoftware ? 1 : 5);
  return Object.fromEntries([...m].map(([k, v]) => [`${k} x${v.calls}`, Number(v.ms.toFixed(4))]));
}

/**
 * --rounds: `f` (a baseline and each --tunings setting in turn) R times, so a process's drift lands on every
 * setting alike and shows in each one's lines (tagged `round`) instead of deciding the comparison.
 */
async function inRounds(f: () => Promise<void>): Promise<void> {
  for (let r = 0; r < rounds; r++) {
    round = rounds > 1 ? r : undefined;
    await f();
  }
  round = undefined;
}

/** Runs f with gpu.tuning overridden by t (programs built inside see it). */
async function withTuning(t: KernelTuning, f: () => Promise<void>): Promise<void> {
  const saved = gpu.tuning;
  gpu.tuning = { ...saved, ...t };
  try {
    await f();
  } finally {
    gpu.tuning = saved;
  }
}

/** GPU ms of one pass of `calls` (warmed up; best of three timings of 10 repeats). */
async function stepMs(calls: KernelCall[]): Promise<number> {
  await gpuMs(gpu, calls, 5);
  let best = Infinity;
  for (let i = 0; i < 3; i++) best = Math.min(best, await gpuMs(gpu, calls, 10));
  return best;
}

/** --k: a k-token verify step's GPU time against the one-token decode step. */
async function kSteps(model: Model, weights: string): Promise<void> {
  if (!gpu.hasTimestamps) throw new Error("--k needs timestamp queries");
  const ks = values.k!.split(",").map(Number);
  const maxK = Math.max(...ks);
  const seq = model.newSequence({ maxSeq: P + N + maxK, sampling: greedy, maxChunk: Math.max(16, maxK) });
  const out = storageBuffer(gpu, maxK * 4);
  const mid = P + Math.floor(N / 2);
  writeStep(gpu, seq.step, { pos0: mid, T: 1, tokOut: mid + 1 });
  // The H200 idles at 345 MHz and ramps up under load: ~0.5 s of decode steps first.
  for (let spent = 0; spent < 500 && !gpu.isSoftware;) {
    spent += await gpuMs(gpu, seq.program(1, "sample"), 20) * 20;
  }
  const one = await stepMs(seq.program(1, "sample"));
  const rows: Record<string, number> = {};
  const byKernel: Record<string, Record<string, number>> = {};
  const dispatches: Record<string, number> = {};
  // Two rounds over the ks, the faster of each kept: a first pass in a process sometimes timed k = 8 at
  // 2-3x its later runs on the H200 (2026-12-01).
  for (let round = 0; round < 2; round++) {
    for (const k of ks) {
      const tail = argmaxRowsCalls(gpu, { logits: seq.logits!, out }, { vocab: ckpt.config.vocabSize, T: k });
      writeStep(gpu, seq.step, { pos0: mid, T: k, tokOut: mid + k });
      const program = [...seq.program(k, "logits"), ...tail];
      dispatches[k] = program.length;
      const ms = Number((await stepMs(program)).toFixed(3));
      if (!(ms >= rows[k])) {
        rows[k] = ms;
        byKernel[k] = await msByKernel(program);
      }
      releaseCalls(tail);
    }
  }
  const marginal: Record<string, Record<string, number>> = {};
  if (values.marginal) {
    writeStep(gpu, seq.step, { pos0: mid, T: 1, tokOut: mid + 1 });
    marginal.decode = await stepMarginalMs(seq.program(1, "sample"));
  }
  for (const k of values.marginal ? ks : []) {
    const tail = argmaxRowsCalls(gpu, { logits: seq.logits!, out }, { vocab: ckpt.config.vocabSize, T: k });
    writeStep(gpu, seq.step, { pos0: mid, T: k, tokOut: mid + k });
    marginal[k] = await stepMarginalMs([...seq.program(k, "logits"), ...tail]);
    releaseCalls(tail);
  }
  writeStep(gpu, seq.step, { pos0: mid, T: 1, tokOut: mid + 1 });
  const oneAgain = await stepMs(seq.program(1, "sample"));
  seq.destroy();
  out.destroy();
  console.log(JSON.stringify({
    bench: "swactor-k-step",
    ...(round !== undefined ? { round } : {}),
    adapter: gpu.adapterName,
    weights,
    kv: model.kvType,
    position: mid,
    tuning: gpu.tuning,
    decode_step_ms: Number(Math.min(one, oneAgain).toFixed(3)),
    k_step_ms: rows,
    ratio_vs_decode: Object.fromEntries(
      Object.entries(rows).map(([k, ms]) => [k, Number((ms / Math.min(one, oneAgain)).toFixed(2))]),
    ),
    // Dispatches of each k-step (the argmax's included).
    k_dispatches: dispatches,
    // Each dispatch timed in place (a few us of timestamp overhead each), summed by kernel label.
    k_ms_by_kernel: byKernel,
    ...(values.marginal ? { k_marginal_ms: marginal } : {}),
  }));
}

/** --context: the decode step after N tokens of context. */
async function contexts(engine: Engine, model: Model, weights: string): Promise<void> {
  for (const ctx of values.context!.split(",").map(Number)) {
    const seq = model.newSequence({ maxSeq: ctx + 64, sampling: greedy });
    const decode = seq.program(1, "sample");
    writeStep(gpu, seq.step, { pos0: ctx, T: 1, tokOut: ctx + 1 });
    // The H200 idles at 345 MHz and ramps up under load (q4 steps timed cold read 1.5-3.9x): ~0.3 s of steps.
    for (let spent = 0; spent < 300 && gpu.hasTimestamps && !gpu.isSoftware;) {
      spent += await gpuMs(gpu, decode, 20) * 20;
    }
    const ms = gpu.hasTimestamps ? await stepMs(decode) : NaN;
    let attention = NaN, combine = NaN;
    if (gpu.hasTimestamps) {
      const per = await gpuMsPerCall(gpu, decode, 4);
      const sum = (label: string) => per.reduce((a, m, i) => a + (decode[i].label === label ? m : 0), 0);
      // The decode attention: with flash-decoding splits the split kernel and its combine (o_proj folded in
      // where it fits), whose part is also reported on its own.
      combine = sum("attention_combine");
      attention = sum("attention") + combine;
    }
    seq.destroy();
    let tokS: number | undefined;
    if (values["context-run"]) {
      const prompt = Array.from({ length: ctx }, (_, i) => (i * 7919 + 13) % ckpt.config.vocabSize);
      const res = await generate(engine, prompt, { maxTokens: 64, sampling: greedy });
      tokS = Number(res.tokS.toFixed(1));
    }
    console.log(JSON.stringify({
      bench: "swactor-context",
      ...(round !== undefined ? { round } : {}),
      adapter: gpu.adapterName,
      weights,
      context: ctx,
      tuning: gpu.tuning,
      gpu_ms_per_token: Number(ms.toFixed(3)),
      gpu_tok_s: Number((1000 / ms).toFixed(1)),
      attention_ms: Number(attention.toFixed(3)),
      ...(combine > 0 ? { attention_combine_ms: Number(combine.toFixed(3)) } : {}),
      kv: model.kvType,
      kv_bytes_per_token: model.kvBytesPerToken(),
      // The cache the step's attention reads (ctx positions, all layers) over its GPU time.
      attention_kv_gb_s: Number((model.kvBytesPerToken() * ctx / attention / 1e6).toFixed(1)),
      ...(tokS !== undefined ? { decode_tok_s: tokS } : {}),
    }));
  }
}

/** Weight bytes one decode step reads: the routed experts count topK / experts of their stacks. */
function readBytes(model: Model): number {
  let bytes = model.weightBytes;
  model.layers.forEach((l, i) => {
    const f = model.config.layer(model.part.layers[0] + i).ffn;
    if (f.kind !== "moe" || l.ffn.kind !== "moe" || !l.ffn.w.gateUp || !l.ffn.w.down) return;
    const stacks = l.ffn.w.gateUp.size + l.ffn.w.down.size;
    bytes -= stacks * (1 - f.routing.topK / f.routing.experts);
  });
  return Math.round(bytes);
}
