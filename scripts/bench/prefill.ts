// Prefill benchmark (issue 13): time to first token and prompt tok/s for 512- and 2048-token prompts,
// greedy, through the engine's own path (Engine.generate with one new token: every chunk of the prompt,
// the head and the sampler, and the readback). On a checkpoint dir, or a Llama-3.2-1B-shaped model with
// random weights written there first (fast: rows copied from one random pool; the numbers do not depend
// on the values). --kernels adds the GPU time of each kernel kind over one chunk (timestamps around each
// dispatch), so the total says where the time goes, and hostBuildMs the CPU ms of building a fresh request's
// programs (every request builds its own: ttft - total - hostBuildMs is the rest of the host's share).
// awaitedReads / primedStaging: readbacks in the timed runs that waited for Deno's map promise instead of
// reading early, and staging buffers primed (kernels/readback.ts): ~10 ms each; 0 is the healthy value.
// One JSON line per (weights, math, flash, overlap, prompt).
//   deno run -A scripts/bench/prefill.ts [--dir DIR] [--weights f16,q4] [--prompts 512,2048] [--runs 3]
//     [--warmup 1] [--warmup-ms 1000] [--chunk C] [--kernels] [--tiny] [--math default,f16,f32,int8]
//     [--flash blocked,lanes] [--overlap on,off]
//     [--gemm default,LARGE/SMALL[/WAVE],...] [--early on,off,N/N/...] [--tunings '[{}, {"flashHalf":false}]']
// --math: the GEMM's multiplies (gpu.tuning.gemmMath, kernels/gemm.ts: default (the engine's choice: int8 inputs
// for q4 layers, f16 for f16 / q8, f32 for f32 weights and MoE models), f16, f32 or int8) per run; --flash: the prefill flash
// attention variant (gpu.tuning.flash, kernels/flash_attention.ts); --overlap: the engine encodes the next
// prefill chunk while one runs (gpu.tuning.prefillOverlap, models/engine.ts); --gemm: the GEMM's two default
// tiles (gpu.tuning.gemmLarge / gemmSmall, kernels/gemm.ts), each entry `default` or two tile tags as
// scripts/bench/gemm.ts prints them, e.g. 128x128k8r22c/64x64k16r11c, and optionally the workgroups from which
// the large tile serves (gpu.tuning.gemmWave, e.g. 128x128k8r22c/64x64k16r11c/264); --early: a new request's first chunk
// is submitted a few layers at a time as its program is built (gpu.tuning.prefillEarlySubmit; a number N: the
// submits after the layers listed, e.g. 1/5/9/13, gpu.tuning.prefillEarlyLayers); --tunings: a JSON list of
// gpu.tuning overrides (kernels/gpu.ts), each a combination of its own (the line's `tuning`); --chunk: tokens a chunk of the prefill (SequenceOptions.prefillChunk), a list. Each line's
// `host` is the engine's prefillStats (models/engine.ts) averaged over the timed runs: preSubmitMs (host
// work before the GPU starts), encodeMs (building and encoding all chunks, mostly overlapping the GPU),
// submits and submitMs (inside queue.submit), afterMs (last submit to first token: the GPU's last chunk plus the readback). Every combination
// is run; with
// more than one, each line after the first also has the teacher-forced logits error of a 256-token prompt
// against the first (worst row's max |error| / max |logit|, the fixtures' measure).
// --tiny: a 2-layer, hidden-256 model of the same family (a smoke test on a software adapter). --warmup N and
// --warmup-ms MS: untimed requests before the timed ones at each prompt length, at least N (default 1: the first
// builds the pipelines) and for at least MS ms (default 1,000): a GPU left idle while the model loaded has
// dropped its clock (an H100: 345 MHz a second after its last work) and takes ~0.5 s of requests to reach it
// again, during which a 512-token prompt's first token takes 2-4x as long (docs/BENCHMARKS.md, the sixty-second
// session). Each line's `warmupMs` lists the untimed requests' times.
import { join } from "node:path";
import { parseArgs } from "node:util";
import { scriptArgs, tuningsArg } from "../args.ts";
import { type FlashVariant, getGpu, parseGemmTile, readbackStats, writeStep } from "../../kernels/mod.ts";
import { gpuMsPerCall } from "../../kernels/timer.ts";
import { Checkpoint } from "../../models/checkpoint.ts";
import { Engine, prefillStats, wholeModel } from "../../models/engine.ts";
import { parseModelConfig } from "../../models/family.ts";
import { Model, type WeightsOption } from "../../models/model.ts";
import { writeSafetensors } from "../../models/safetensors.ts";
import { tensorShapes } from "../../models/tensors.ts";
import { LLAMA_3_2_1B } from "./random_checkpoint.ts";
import { worstRowError } from "../check_fixture.ts";

const { values, tunings } = scriptArgs(import.meta.url, (args) => {
  const parsed = parseArgs({
    args,
    options: {
      dir: { type: "string", default: `${Deno.env.get("TMPDIR") ?? "/tmp"}/swactor-bench-prefill-llama1b` },
      weights: { type: "string", default: "f16" },
      prompts: { type: "string", default: "512,2048" },
      runs: { type: "string", default: "3" },
      warmup: { type: "string", default: "1" },
      "warmup-ms": { type: "string", default: "1000" },
      chunk: { type: "string" },
      kernels: { type: "boolean", default: false },
      tiny: { type: "boolean", default: false },
      math: { type: "string", default: "default" },
      flash: { type: "string", default: "blocked" },
      overlap: { type: "string", default: "on" },
      gemm: { type: "string", default: "default" },
      early: { type: "string", default: "on" },
      tunings: { type: "string" },
    },
  });
  // --tunings: the runs again under each gpu.tuning override; none given, the defaults once.
  const given = tuningsArg(parsed.values.tunings);
  return { ...parsed, tunings: given.length ? given : [{}] };
});

/** Writes a Llama-3.2-1B-shaped checkpoint of bf16 weights ~U(-0.03, 0.03), norms 1, unless one is there. */
const CONFIG = values.tiny
  ? {
    ...LLAMA_3_2_1B,
    vocab_size: 1000,
    hidden_size: 256,
    intermediate_size: 512,
    num_hidden_layers: 2,
    num_attention_heads: 4,
    num_key_value_heads: 2,
    bos_token_id: 1,
    eos_token_id: [2],
  }
  : LLAMA_3_2_1B;

async function ensureCheckpoint(dir: string): Promise<void> {
  if (await Deno.stat(join(dir, "config.json")).then(() => true, () => false)) return;
  await Deno.mkdir(dir, { recursive: true });
  const config = parseModelConfig(CONFIG, "benchmark config");
  const pool = new Uint16Array(1 << 24);
  const f = new Float32Array(1);
  const bits = new Uint32Array(f.buffer);
  let s = 0x9e3779b9;
  for (let i = 0; i < pool.length; i++) {
    s ^= s << 13, s ^= s >>> 17, s ^= s << 5;
    f[0] = ((s >>> 0) / 2 ** 32 - 0.5) * 0.06; // bf16 of a uniform value in (-0.03, 0.03)
    pool[i] = bits[0] >>> 16;
  }
  const tensors = [...tensorShapes(config)].map(([name, shape]) => {
    const n = shape.reduce((a, b) => a * b, 1);
    const data = new Uint16Array(n);
    if (/norm/.test(name)) data.fill(0x3f80); // 1.0
    else for (let o = 0; o < n; o += pool.length) data.set(pool.subarray(0, Math.min(pool.length, n - o)), o);
    return { name, dtype: "BF16" as const, shape, data: new Uint8Array(data.buffer) };
  });
  await writeSafetensors(join(dir, "model.safetensors"), tensors, { format: "pt" });
  await Deno.writeTextFile(join(dir, "config.json"), JSON.stringify(CONFIG, null, 2));
}

const gpu = await getGpu();
const t0 = performance.now();
await ensureCheckpoint(values.dir!);
console.error(
  `prefill: checkpoint ready in ${((performance.now() - t0) / 1000).toFixed(1)} s at ${values.dir}`,
);
const ckpt = await Checkpoint.open(values.dir!);
const prompts = values.prompts!.split(",").map(Number);
const runs = Number(values.runs);
const warmup = Number(values.warmup);
if (!(Number.isInteger(warmup) && warmup >= 1)) {
  throw new TypeError(`--warmup takes an integer >= 1, got ${values.warmup}`);
}
const warmupMs = Number(values["warmup-ms"]);
if (!(warmupMs >= 0)) throw new TypeError(`--warmup-ms takes ms >= 0, got ${values["warmup-ms"]}`);
const sampling = { temperature: 0, topP: 1, seed: 0 };
for (const weights of values.weights!.split(",") as WeightsOption[]) {
  if (weights === "f16" && !gpu.hasF16) continue;
  const t1 = performance.now();
  const model = await Model.load(gpu, ckpt, { weights });
  console.error(`prefill: ${weights} loaded in ${((performance.now() - t1) / 1000).toFixed(1)} s`);
  // No spares: every timed request builds its programs, as a new request's first does (scripts/bench/ttft.ts
  // times a server's requests that reuse a released sequence).
  const engine = new Engine(wholeModel(ckpt.config.numLayers), model, { spares: 0 });
  const probe = Array.from(
    { length: Math.min(256, ckpt.config.maxPositionEmbeddings) },
    (_, i) => (i * 104729 + 7) % ckpt.config.vocabSize,
  );
  let baseline: Float32Array | undefined;
  const chunks = values.chunk ? values.chunk.split(",").map(Number) : [undefined];
  for (const c of chunks) {
    if (c !== undefined && !(Number.isInteger(c) && c >= 1)) {
      throw new TypeError(`--chunk takes tokens a chunk (comma-separated), got ${values.chunk}`);
    }
  }
  const combos = tunings.flatMap((tuning) =>
    values.math!.split(",").flatMap((math) =>
      values.flash!.split(",").flatMap((flash) =>
        values.overlap!.split(",").flatMap((overlap) =>
          values.gemm!.split(",").flatMap((gemm) =>
            values.early!.split(",").map((early) => ({
              tuning,
              math,
              flash: flash as FlashVariant,
              overlap,
              gemm,
              early,
            }))
          )
        )
      )
    )
  );
  const base = { ...gpu.tuning };
  for (const { tuning, math, flash, overlap, gemm, early } of combos) {
    gpu.tuning = { ...base, ...tuning }; // read as each request's programs are built
    if (flash !== "blocked" && flash !== "lanes") {
      throw new TypeError(`--flash takes blocked or lanes, got ${flash}`);
    }
    if (overlap !== "on" && overlap !== "off") {
      throw new TypeError(`--overlap takes on or off, got ${overlap}`);
    }
    const marks = early.split("/").map(Number);
    if (early !== "on" && early !== "off" && !marks.every((n) => Number.isInteger(n) && n >= 1)) {
      throw new TypeError(
        `--early takes on, off or the layers after which to submit (e.g. 1/5/9), got ${early}`,
      );
    }
    gpu.tuning.prefillEarlySubmit = early !== "off"; // read by each prefill
    if (early === "on" || early === "off") delete gpu.tuning.prefillEarlyLayers;
    else gpu.tuning.prefillEarlyLayers = marks;
    // read as each GEMM call is built; "default" leaves the engine's choice (kernels/gemm.ts)
    if (!["default", "f16", "f32", "int8"].includes(math)) {
      throw new TypeError(`--math takes default, f16, f32 or int8, got ${math}`);
    }
    if (math === "default") delete gpu.tuning.gemmMath;
    else gpu.tuning.gemmMath = math as "f16" | "f32" | "int8";
    gpu.tuning.flash = flash; // read as each request's programs are built
    gpu.tuning.prefillOverlap = overlap === "on"; // read by each prefill
    delete gpu.tuning.gemmLarge;
    delete gpu.tuning.gemmSmall;
    delete gpu.tuning.gemmWave;
    if (gemm !== "default") {
      const [large, small, wave, extra] = gemm.split("/");
      if (!small || extra !== undefined || (wave !== undefined && !(Number(wave) >= 1))) {
        throw new TypeError(`--gemm takes default or LARGE/SMALL[/WAVE], got ${gemm}`);
      }
      gpu.tuning.gemmLarge = parseGemmTile(large); // read as each request's programs are built
      gpu.tuning.gemmSmall = parseGemmTile(small);
      if (wave !== undefined) gpu.tuning.gemmWave = Number(wave);
    }
    let logitsErr: number | undefined;
    if (combos.length > 1) {
      const logits = await engine.logits(probe);
      if (baseline) logitsErr = worstRowError(logits, baseline, ckpt.config.vocabSize);
      else baseline = logits;
    }
    for (const [P, prefillChunk] of prompts.flatMap((P) => chunks.map((c) => [P, c] as const))) {
      const prompt = Array.from({ length: P }, (_, i) => (i * 7919 + 13) % ckpt.config.vocabSize);
      const ttft: number[] = [];
      // Reads that waited for Deno's map promise and staging buffers primed in the timed runs (~10 ms each).
      let awaited = 0, primed = 0;
      const host = { prefills: 0, preSubmitMs: 0, encodeMs: 0, submits: 0, submitMs: 0, afterMs: 0 };
      let chunk = 0;
      /** One request of the prompt; timed ones add to the line's counts. Its first token's ms. */
      const request = async (id: string, timed: boolean): Promise<number> => {
        chunk = engine.open(id, { maxSeq: P + 1, sampling, prefillChunk }).prefillChunk;
        try {
          const [a0, p0] = [readbackStats.awaited, readbackStats.primed];
          const h0 = { ...prefillStats };
          const res = await engine.generate(id, prompt, { maxTokens: 1, eos: [] });
          if (timed) {
            awaited += readbackStats.awaited - a0;
            primed += readbackStats.primed - p0;
            for (const k of Object.keys(host) as (keyof typeof host)[]) host[k] += prefillStats[k] - h0[k];
          }
          return res.firstTokenMs;
        } finally {
          engine.release(id);
        }
      };
      // Untimed requests first: the first builds the pipelines, and the GPU's clock (idle while the model
      // loaded) comes up only under load, over a fraction of a second, so they go on for --warmup-ms too.
      const warm: number[] = [];
      const w0 = performance.now();
      while (warm.length < warmup || performance.now() - w0 < warmupMs) {
        warm.push(await request(`warmup-${P}-${warm.length}`, false));
      }
      for (let r = 1; r <= runs; r++) ttft.push(await request(`bench-${P}-${r}`, true));
      const ms = [...ttft].sort((a, b) => a - b)[Math.floor(ttft.length / 2)];
      const line: Record<string, unknown> = {
        adapter: gpu.adapterName,
        weights,
        ...(values.tunings ? { tuning } : {}),
        math,
        flash,
        overlap,
        gemm,
        early,
        ...(logitsErr === undefined ? {} : { logitsErr: +logitsErr.toExponential(2) }),
        prompt: P,
        chunk,
        ttftMs: +ms.toFixed(1),
        tokS: Math.round((P / ms) * 1000),
        runsMs: ttft.map((t) => +t.toFixed(1)), // in the order they ran
        warmupMs: warm.map((t) => +t.toFixed(1)), // the untimed requests' first tokens, in order
        awaitedReads: awaited,
        primedStaging: primed,
        host: {
          preSubmitMs: +(host.preSubmitMs / runs).toFixed(2),
          encodeMs: +(host.encodeMs / runs).toFixed(2),
          submits: host.submits / runs,
          submitMs: +(host.submitMs / runs).toFixed(2),
          afterMs: +(host.afterMs / runs).toFixed(2),
        },
      };
      if (values.kernels && gpu.hasTimestamps) {
        const { byKernel, buildMs } = await kernelTimes(model, P, chunk);
        line.gpuMsByKernel = byKernel;
        line.hostBuildMs = +buildMs.toFixed(2);
      }
      console.log(JSON.stringify(line));
    }
  }
  engine.close();
}

/**
 * GPU ms by kernel label over the prompt's chunks, and the host ms of building a fresh request's programs
 * (the pipelines are cached by then; every request builds its own programs before its first submit).
 */
async function kernelTimes(
  model: Model,
  P: number,
  chunk: number,
): Promise<{ byKernel: Record<string, number>; buildMs: number }> {
  const seq = model.newSequence({ maxSeq: P + 1, sampling, prefillChunk: chunk });
  try {
    const byLabel: Record<string, number> = {};
    let total = 0, buildMs = 0;
    for (let pos0 = 0; pos0 < P; pos0 += chunk) {
      const T = Math.min(chunk, P - pos0);
      writeStep(gpu, seq.step, { pos0, T, tokOut: P });
      const t = performance.now();
      const calls = seq.program(T, pos0 + T >= P ? "sample" : "hidden");
      buildMs += performance.now() - t;
      const ms = await gpuMsPerCall(gpu, calls, 1);
      calls.forEach((c, i) => {
        const k = c.label ?? "?";
        byLabel[k] = (byLabel[k] ?? 0) + ms[i];
        total += ms[i];
      });
    }
    const out: Record<string, number> = { total: +total.toFixed(2) };
    for (const [k, v] of Object.entries(byLabel).sort((a, b) => b[1] - a[1])) out[k] = +v.toFixed(2);
    return { byKernel: out, buildMs };
  } finally {
    seq.destroy();
  }
}
