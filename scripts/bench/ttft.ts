// Time to first token of a server's requests: each request opens a sequence, generates and releases it on one
// engine, as the API does. With the engine's default spares (models/engine.ts SPARES) a request whose shape a
// released sequence serves takes it, its programs built; with none each request builds its own (15-50 ms of
// host time before its first token). Both engines share one model of random weights at a real shape, and run
// in one process, alternating request by request.
//   deno run -A scripts/bench/ttft.ts [--shape llama-3.2-1b,qwen3-30b-a3b] [--weights q4] [--prompts 20,32,128]
//     [--tokens 64] [--room 0] [--runs 6] [--warmup-ms 1000] [--stream 20,45,100,...] [--tunings JSON] [--layers N]
//     [--set key=value,...]
// One JSON line per (shape, weights, prompt, tuning, spares): the first token's ms (median and every timed run;
// untimed rounds come first, at least one, which compiles the pipelines, and for at least --warmup-ms, which
// lets the GPU's clock come up), the host's ms before the prefill's first submit (mean: the programs' build,
// where a request builds them, and the first piece's encode), the whole request's ms (median: open to
// release), decode tok/s (median), the decode batches a request read and how many of their map calls waited
// for the GPU (mean; the others found it idle), and how many requests took a released sequence.
// --tunings: a JSON list of gpu.tuning overrides (kernels/gpu.ts), the runs going through each in turn.
// --room: positions each request holds past prompt + tokens (an API request's max_tokens left unused).
// --stream: then each run is one request of every prompt of this list in turn (a server's mixed traffic;
// `prompt` "stream"), its own sequence or a released one's as the shapes allow.
// --layers cuts the model's depth and --set overrides config numbers (a small shape on a software adapter).
import { parseArgs } from "node:util";
import { configSetArg, countArg, scriptArgs, tuningsArg } from "../args.ts";
import { UsageError } from "../../cli/command.ts";
import { getGpu } from "../../kernels/mod.ts";
import {
  decodeStats,
  Engine,
  generate,
  prefillStats,
  weightsOption,
  wholeModel,
} from "../../models/engine.ts";
import { Model } from "../../models/model.ts";
import { RandomWeights } from "../../models/random_weights.ts";
import { LLAMA_3_2_1B, MOE_SHAPES } from "./random_checkpoint.ts";
import { median } from "./stats.ts";

const SHAPES: Record<string, Record<string, unknown>> = { "llama-3.2-1b": LLAMA_3_2_1B, ...MOE_SHAPES };

const { values, prompts, stream, runs, warmupMs, tokens, room, overrides, tunings } = scriptArgs(
  import.meta.url,
  (args) => {
    const { values } = parseArgs({
      args,
      options: {
        shape: { type: "string", default: "llama-3.2-1b,qwen3-30b-a3b" },
        weights: { type: "string", default: "q4" },
        prompts: { type: "string", default: "20,32,128" },
        tokens: { type: "string", default: "64" },
        room: { type: "string", default: "0" },
        runs: { type: "string", default: "6" },
        "warmup-ms": { type: "string", default: "1000" },
        stream: { type: "string" },
        layers: { type: "string" },
        set: { type: "string" },
        tunings: { type: "string" },
      },
    });
    for (const s of values.shape.split(",")) {
      if (!SHAPES[s]) throw new UsageError(`--shape takes ${Object.keys(SHAPES).join(", ")}, got "${s}"`);
    }
    return {
      values,
      prompts: values.prompts.split(",").map((p) => countArg("prompts", p)),
      stream: values.stream?.split(",").map((p) => countArg("stream", p)),
      runs: countArg("runs", values.runs),
      warmupMs: countArg("warmup-ms", values["warmup-ms"], 0),
      tokens: countArg("tokens", values.tokens),
      room: countArg("room", values.room, 0),
      overrides: configSetArg(values.set),
      // --tunings: every run again under each gpu.tuning override; none given, the defaults once.
      tunings: values.tunings ? tuningsArg(values.tunings) : [{}],
    };
  },
);

const gpu = await getGpu();
const greedy = { temperature: 0, topP: 1, seed: 0 };
for (const shape of values.shape.split(",")) {
  const base = SHAPES[shape];
  const layers = values.layers ? countArg("layers", values.layers) : base.num_hidden_layers as number;
  const cfg: Record<string, unknown> = { ...base, ...overrides, num_hidden_layers: layers };
  for (const weights of values.weights.split(",")) {
    const model = await Model.load(gpu, new RandomWeights(cfg, 1, `random ${shape}`), {
      weights: weightsOption(weights),
    });
    const engines = [
      new Engine(wholeModel(layers), model),
      new Engine(wholeModel(layers), model, { spares: 0 }),
    ];
    // A group of prompts run in turn each run: each prompt alone, then the stream's; each run goes through
    // every (tuning, engine) in turn.
    const groups = [...prompts.map((P) => [P]), ...(stream ? [stream] : [])];
    const variants = tunings.flatMap((tuning) =>
      engines.map((engine, i) => ({ tuning, engine, spares: i === 0 ? "default" : 0 }))
    );
    const keys = new Set(tunings.flatMap((t) => Object.keys(t)));
    for (const group of groups) {
      const got = variants.map(() => ({
        first: [] as number[],
        request: [] as number[],
        tokS: [] as number[],
        batches: 0,
        blocked: 0,
        preSubmit: 0,
        reused: 0,
      }));
      // Untimed rounds first: the first compiles the pipelines, and the GPU's clock, dropped while the model
      // loaded, takes a fraction of a second of requests to come back (scripts/bench/prefill.ts), so they go on
      // for --warmup-ms.
      const w0 = performance.now();
      for (let round = 0, timed = 0; timed < runs; round++) {
        const warming = round === 0 || performance.now() - w0 < warmupMs;
        if (!warming) timed++;
        for (const [v, { tuning, engine }] of variants.entries()) {
          for (const k of keys) delete (gpu.tuning as Record<string, unknown>)[k];
          Object.assign(gpu.tuning, structuredClone(tuning));
          for (const P of group) {
            const prompt = Array.from({ length: P }, (_, j) => (j * 7919 + 13) % (cfg.vocab_size as number));
            const [reuses, pre, batches, blocked] = [
              engine.stats().reuses ?? 0,
              prefillStats.preSubmitMs,
              decodeStats.batches,
              decodeStats.blocked,
            ];
            const t0 = performance.now();
            const res = await generate(engine, prompt, { maxTokens: tokens, room, sampling: greedy });
            const ms = performance.now() - t0;
            if (warming) continue;
            got[v].first.push(res.firstTokenMs);
            got[v].request.push(ms);
            got[v].batches += decodeStats.batches - batches;
            got[v].blocked += decodeStats.blocked - blocked;
            got[v].tokS.push(res.tokS);
            got[v].preSubmit += prefillStats.preSubmitMs - pre;
            got[v].reused += (engine.stats().reuses ?? 0) - reuses;
          }
        }
      }
      for (const [v, { tuning, spares }] of variants.entries()) {
        const g = got[v];
        console.log(JSON.stringify({
          bench: "swactor-ttft",
          adapter: gpu.adapterName,
          shape,
          layers,
          weights,
          ...(values.tunings ? { tuning } : {}),
          prompt: group.length > 1 ? "stream" : group[0],
          ...(group.length > 1 ? { prompts: group } : {}),
          tokens,
          room,
          spares,
          firstTokenMs: +median(g.first).toFixed(2),
          runsMs: g.first.map((t) => +t.toFixed(1)),
          preSubmitMs: +(g.preSubmit / g.first.length).toFixed(2),
          requestMs: +median(g.request).toFixed(2),
          tokS: Math.round(median(g.tokS)),
          batches: +(g.batches / g.first.length).toFixed(1),
          blocked: +(g.blocked / g.first.length).toFixed(1),
          reused: g.reused,
          requests: g.first.length,
        }));
      }
    }
    engines[1].close(); // the model with it; the other engine holds nothing more than its spares
    engines[0].close();
  }
}
