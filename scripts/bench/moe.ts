// MoE decode benchmark (issue 12 item 4): tok/s at batch 1 on real-size MoE shapes with random weights
// made on the GPU from the config alone (models/random_weights.ts: no checkpoint on disk), greedy, 32-token
// prompt. One JSON line per (shape, weights) with: tok/s, GPU ms per token (timestamps), the bytes a decode
// step reads (every weight but the routed experts, plus top-k / E of those, one embedding row, and the KV
// cache up to the timed position) and the
// fraction of the H200's copy bandwidth (4.2 TB/s) that is, dispatches per token, GPU ms by kernel, and the
// per-dispatch cost of an empty kernel on this GPU.
//   deno run -A scripts/bench/moe.ts [--shape qwen3-30b-a3b,deepseek-v2-lite] [--layers N] [--weights f16,q4]
// --prompt P (32) and --new N (128): the timed generate's lengths; its step is timed at P + N / 2. --room R:
// every request and sequence holds R positions more than that, as an API request with an unused max_tokens
// does (decode programs follow the keys a step attends to: kernels/attention_decode.ts attentionLengthBucket).
// --layers cuts the depth (same widths; per-layer parts scale to the full depth: `full_depth_*`). --set
// key=value,... overrides config keys (e.g. a smoke test on a software adapter, whose buffers are small:
// --set vocab_size=4096,num_experts=16,n_routed_experts=16).
// transformers on the same shapes: scripts/bench/hf_moe.py.
// Kernel choices are gpu.tuning fields (kernels/gpu.ts KernelTuning: the MoE kernels' under `moe`,
// kernels/moe_ffn.ts MoeTuning); the process starts from SWACTOR_TUNING (a JSON object), which is how to
// compare the ones read at load (moe.fused, moe.fusedShared: they decide the down stack's layout) in
// processes of their own. The JSON line carries the process's starting tuning as `tuning`.
// --tunings '[{...}, ...]'
// likewise times the step under each gpu.tuning override (kernels/gpu.ts KernelTuning, e.g.
// {"attentionUnroll":32}): `tunings_gpu_ms`. Each setting's program is built on two sequences, in mirrored
// order (A B B A): the same setting on the sequences built one after the other reads 2.22-2.24 and 2.24-2.26
// ms alternately (H100, Qwen3-30B-A3B q4, four copies of the default; docs/BENCHMARKS.md, the forty-third
// session), so one sequence a setting biased the first one by ~1%. --rounds R times them all in turn R times
// (A B B A A B B A ...), so a process's drift shows in each setting's series (`tunings_gpu_ms_rounds`, both
// sequences' timings a round) and lands on every setting alike; `tunings_gpu_ms` is each series' median.
// --marginal: GPU ms each kernel (label) adds to the step, timed as the step without its dispatches:
// `marginal_ms_by_kernel`. `gpu_ms_by_kernel` times each dispatch in a pass of its own, which adds about a
// dependent dispatch's cost to each (its sum is ~1.4x the step); the marginal figures sum to about the step.
// --load DIR instead times loading a checkpoint on disk (e.g. one hf_moe.py wrote) with the conversion on
// the GPU and on the CPU (--convert gpu,cpu), per --weights: one JSON line each.
import { parseArgs } from "node:util";
import { configSetArg, countArg, scriptArgs, tuningsArg } from "../args.ts";
import { DECODE_WINDOW } from "./targets.ts";
import { getGpu, writeStep } from "../../kernels/mod.ts";
import { cpuMs, dispatchCostUs, gpuMs, gpuMsPerCall, marginalMs } from "../../kernels/timer.ts";
import { Engine, generate, wholeModel } from "../../models/engine.ts";
import { Model, type WeightsOption } from "../../models/model.ts";
import { RandomWeights } from "../../models/random_weights.ts";
import { Checkpoint } from "../../models/checkpoint.ts";
import type { ConvertOn } from "../../models/upload.ts";
import { median } from "./stats.ts";
import { MOE_SHAPES } from "./random_checkpoint.ts";

/** The H200's device-to-device copy bandwidth (FACTS.md). */
const COPY_BW = 4.2e12;

const { values, configOverrides, tuningOverrides } = scriptArgs(import.meta.url, (args) => {
  const parsed = parseArgs({
    args,
    options: {
      shape: { type: "string", default: "qwen3-30b-a3b,deepseek-v2-lite" },
      layers: { type: "string" },
      weights: { type: "string", default: "f16,q4" },
      prompt: { type: "string", default: "32" },
      new: { type: "string", default: "128" },
      room: { type: "string", default: "0" },
      runs: { type: "string", default: "2" },
      set: { type: "string" },
      load: { type: "string" },
      convert: { type: "string", default: "gpu,cpu" },
      tunings: { type: "string" },
      rounds: { type: "string", default: "1" },
      marginal: { type: "boolean", default: false },
    },
  });
  countArg("rounds", parsed.values.rounds);
  return {
    ...parsed,
    configOverrides: configSetArg(parsed.values.set),
    tuningOverrides: tuningsArg(parsed.values.tunings),
  };
});
/** --rounds: how many times the --tunings settings are timed in turn. */
const rounds = Number(values.rounds);

const gpu = await getGpu();
// The decode rate over the window every session measured (scripts/bench/decode.ts says why).
Object.assign(gpu.tuning, DECODE_WINDOW);
if (gpu.isSoftware) {
  console.error(`bench: ${gpu.adapterName} is a software adapter: numbers are a smoke test`);
}
// The floor under every kernel (kernels/timer.ts): dispatches ordered by a buffer they share, and by data.
const sharedUs = gpu.hasTimestamps ? await dispatchCostUs(gpu, "shared", { n: 2000 }) : NaN;
const chainUs = gpu.hasTimestamps ? await dispatchCostUs(gpu, "chain", { n: 2000 }) : NaN;
const P = Number(values.prompt), N = Number(values.new), room = Number(values.room);
if (values.load) {
  const ckpt = await Checkpoint.open(values.load);
  for (const weights of values.weights!.split(",") as WeightsOption[]) {
    for (const convert of values.convert!.split(",") as ConvertOn[]) {
      const t0 = performance.now();
      const model = await Model.load(gpu, ckpt, { weights, convert });
      await gpu.device.queue.onSubmittedWorkDone();
      const s = (performance.now() - t0) / 1000;
      console.log(JSON.stringify({
        bench: "swactor-load",
        dir: values.load,
        weights,
        convert,
        load_s: Number(s.toFixed(2)),
        weight_bytes: model.weightBytes,
        checkpoint_gb_s: Number((ckpt.files.length ? fileBytes(ckpt) / s / 1e9 : 0).toFixed(2)),
      }));
      model.destroy();
    }
  }
  Deno.exit(0);
}
for (const shape of values.shape!.split(",")) {
  const base = MOE_SHAPES[shape];
  if (!base) throw new TypeError(`--shape must be among ${Object.keys(MOE_SHAPES)}, got "${shape}"`);
  const fullLayers = base.num_hidden_layers as number;
  const L = values.layers ? Math.min(Number(values.layers), fullLayers) : fullLayers;
  const src = new RandomWeights({ ...base, ...configOverrides, num_hidden_layers: L }, 1, `random ${shape}`);
  const c = src.config;
  const prompt = Array.from({ length: P }, (_, i) => (i * 7919 + 13) % c.vocabSize);
  for (const weights of values.weights!.split(",") as WeightsOption[]) {
    if (weights === "f16" && !gpu.hasF16) continue;
    const t0 = performance.now();
    const model = await Model.load(gpu, src, { weights });
    await gpu.device.queue.onSubmittedWorkDone();
    const loadS = (performance.now() - t0) / 1000;
    const engine = new Engine(wholeModel(L), model);
    const runs: number[] = [];
    for (let r = 0; r < Number(values.runs); r++) {
      const res = await generate(engine, prompt, {
        maxTokens: N,
        sampling: { temperature: 0, topP: 1, seed: 0 },
        room,
      });
      runs.push(res.tokS);
    }
    const seq = model.newSequence({ maxSeq: P + N + room, sampling: { temperature: 0, topP: 1, seed: 0 } });
    const mid = P + Math.floor(N / 2);
    // The step at position mid attends to mid + 1 keys (its program may depend on that: StepOptions.keys).
    const decode = seq.program(1, "sample", { keys: mid + 1 });
    writeStep(gpu, seq.step, { pos0: mid, T: 1, tokOut: mid + 1 });
    const gpuStepMs = gpu.hasTimestamps ? (await gpuMs(gpu, decode, 2), await gpuMs(gpu, decode, 10)) : NaN;
    // The CPU's side of a step, by phase (kernels/timer.ts cpuMs); cpu_encode_ms_per_token is their sum.
    const cpu = await cpuMs(gpu, decode, 20);
    const cpuStepMs = cpu.record + cpu.finish + cpu.submit;
    const byKernel: Record<string, number> = {};
    const perCall = gpu.hasTimestamps
      ? await gpuMsPerCall(gpu, decode, Math.max(1, Math.floor(2000 / decode.length / 2)))
      : [];
    if (gpu.hasTimestamps) {
      decode.forEach((call, i) => {
        const k = call.label ?? "?";
        byKernel[k] = (byKernel[k] ?? 0) + perCall[i];
      });
      for (const k in byKernel) byKernel[k] = Number(byKernel[k].toFixed(4));
    }
    // --marginal: what each kernel adds to the whole step, the step timed without its dispatches (the rest
    // read what they find; their work does not depend on the values), alternating with the whole step.
    const marginal: Record<string, number> = {};
    if (gpu.hasTimestamps && values.marginal) {
      for (const [label, m] of await marginalMs(gpu, decode, (c) => c.label ?? "?")) {
        marginal[label] = Number(m.ms.toFixed(4));
      }
    }
    seq.destroy();
    // The step under each gpu.tuning override (read when the program is built): each setting's program built
    // on two sequences in mirrored order (A B B A; the build order alone moved a step ~1%), then all of them
    // timed in turn, --rounds times, so a process's drift shows in each setting's series instead of deciding
    // the comparison. GPU ms a token: the median of the setting's series.
    const settings = (gpu.hasTimestamps ? tuningOverrides : []).map((t, i) => ({ t, i }));
    const built = [...settings, ...settings.toReversed()].map(({ t, i }) => {
      const saved = gpu.tuning;
      gpu.tuning = { ...saved, ...t };
      try {
        const s2 = model.newSequence({
          maxSeq: P + N + room,
          sampling: { temperature: 0, topP: 1, seed: 0 },
        });
        writeStep(gpu, s2.step, { pos0: mid, T: 1, tokOut: mid + 1 });
        return {
          key: `${i} ${JSON.stringify(t)}`,
          seq: s2,
          prog: s2.program(1, "sample", { keys: mid + 1 }),
        };
      } finally {
        gpu.tuning = saved;
      }
    });
    const series: Record<string, number[]> = {};
    for (let r = 0; r < rounds; r++) {
      for (const b of built) {
        if (r === 0) await gpuMs(gpu, b.prog, 2);
        (series[b.key] ??= []).push(Number((await gpuMs(gpu, b.prog, 10)).toFixed(4)));
      }
    }
    for (const b of built) b.seq.destroy();
    const tunings = Object.fromEntries(Object.entries(series).map(([k, v]) => [k, median(v)]));
    // Weights read, plus the KV cache up to the timed position (every layer reads all its rows).
    const read = readBytes(model) + model.kvBytesPerToken() * (mid + 1);
    const best = Math.max(...runs);
    // Scaling a cut model to the full depth: per-layer work times full / cut layers, the rest as measured.
    const perLayer = (x: number, fixed: number) => fixed + (x - fixed) * fullLayers / L;
    const headBytes = (model.lmHead?.size ?? 0) + (model.finalNorm?.size ?? 0) + c.hiddenSize * 2;
    // The step's parts outside the layers: the embedding (first call) and the head from its norm on.
    const headAt = decode.findLastIndex((k) => /^(gemv_)?rmsnorm/.test(k.label ?? ""));
    const headMs = gpu.hasTimestamps ? perCall[0] + perCall.slice(headAt).reduce((s, v) => s + v, 0) : 0;
    console.log(JSON.stringify({
      bench: "swactor-moe-decode",
      adapter: gpu.adapterName,
      shape,
      layers: L,
      full_layers: fullLayers,
      weights,
      prompt: P,
      new_tokens: N,
      ...(room > 0 ? { room } : {}),
      tuning: gpu.tuning,
      load_s: Number(loadS.toFixed(1)),
      decode_tok_s: Number(best.toFixed(1)),
      runs: runs.map((r) => Number(r.toFixed(1))),
      gpu_ms_per_token: Number(gpuStepMs.toFixed(3)),
      cpu_encode_ms_per_token: Number(cpuStepMs.toFixed(3)),
      cpu_ms_per_token: {
        record: Number(cpu.record.toFixed(3)),
        finish: Number(cpu.finish.toFixed(3)),
        submit: Number(cpu.submit.toFixed(3)),
      },
      dispatches_per_token: decode.length,
      shared_dispatch_us: Number(sharedUs.toFixed(2)),
      dependent_dispatch_us: Number(chainUs.toFixed(2)),
      weight_bytes: model.weightBytes,
      read_bytes_per_token: read,
      read_tb_s: Number((read / gpuStepMs / 1e9).toFixed(3)),
      copy_bw_fraction: Number((read / gpuStepMs / 1e9 / (COPY_BW / 1e12)).toFixed(3)),
      full_depth_gpu_ms: Number(perLayer(gpuStepMs, headMs).toFixed(3)),
      full_depth_tok_s_gpu_bound: Number((1000 / perLayer(gpuStepMs, headMs)).toFixed(1)),
      full_depth_read_bytes: Math.round(perLayer(read, headBytes)),
      head_and_embed_ms: Number(headMs.toFixed(4)),
      ...(values.tunings ? { tunings_gpu_ms: tunings } : {}),
      ...(values.tunings && rounds > 1 ? { tunings_gpu_ms_rounds: series } : {}),
      ...(values.marginal ? { marginal_ms_by_kernel: marginal } : {}),
      gpu_ms_by_kernel: byKernel,
    }));
    engine.close();
  }
}

function fileBytes(ckpt: Checkpoint): number {
  let n = 0;
  for (const t of ckpt.tensors.values()) n += t.end - t.begin;
  return n;
}

/** Weight bytes one decode step reads: the routed experts count topK / experts of their stacks. */
function readBytes(model: Model): number {
  let bytes = model.weightBytes;
  // The embedding table: one row a token.
  if (model.embedTable && model.embedTable !== model.lmHead) {
    bytes -= model.embedTable.size * (1 - 1 / model.config.vocabSize);
  }
  model.layers.forEach((l, i) => {
    const f = model.config.layer(model.part.layers[0] + i).ffn;
    if (f.kind !== "moe" || l.ffn.kind !== "moe" || !l.ffn.w.gateUp || !l.ffn.w.down) return;
    const stacks = l.ffn.w.gateUp.size + l.ffn.w.down.size;
    bytes -= stacks * (1 - f.routing.topK / f.routing.experts);
  });
  return Math.round(bytes);
}
