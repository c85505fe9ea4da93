// swactor generate: text (or token ids) in, generated text streamed out.
import { wireFlag } from "./wire_flag.ts";
import type { Command } from "./command.ts";
import { expertsFlag, numberFlag, parseFlags, UsageError } from "./command.ts";
import {
  KV_HELP,
  loadModel,
  modelDirOrDemo,
  parseKv,
  parseTokenList,
  parseWeights,
  WEIGHTS_HELP,
} from "./load_model.ts";
import { generate } from "../models/engine.ts";
import { readModelConfig } from "../models/family.ts";
import { StreamDecoder } from "../models/tokenizer.ts";
import { ensureDemoModel } from "../models/demo.ts";
import { liveState } from "../node/state_file.ts";
import { targetOf } from "../node/api/mod.ts";
import { clusterModel, generateLocal, generateOnCluster, prepareRequest } from "./pipeline_generate.ts";
import { onStopSignal } from "./signals.ts";
import { checkOutputPath, writeJsonOutput } from "./output_file.ts";
import { readPlanFile } from "./plan_file.ts";
import {
  makeDrafter,
  MTP_ONE_NODE,
  SPECULATE_FLAGS,
  SPECULATE_HELP,
  speculateFlags,
} from "./speculate_flags.ts";
import { speculationJson, speculativeGenerate } from "../models/speculative.ts";
import { clusterFlags, clusterHelp, generateCluster } from "./cluster_cli.ts";

const USAGE = `Usage: swactor generate [PROMPT] [options]

Generates text after PROMPT (or after --tokens) and streams it to stdout.

Options:
  --model DIR           Hugging Face checkpoint folder (config.json + safetensors [+ tokenizer.json]).
                        Default: the built-in demo model (random weights, Llama 3 vocabulary).
  --tokens 1,2,3        the prompt as token ids instead of text (for models without a tokenizer)
  --max-tokens N        most tokens to generate (default 64)
  --temperature T       0 is greedy decoding (default 0.8)
  --top-p P             nucleus sampling mass in (0, 1] (default 0.95)
  --seed S              seed for sampling (default: random)
  --json                print one JSON object {tokens, text, prompt_tokens, tok_s, ...} on stdout;
                        progress goes to stderr
${WEIGHTS_HELP}
${KV_HELP}
                        (through \`up\`'s chain: the chain's, \`up --weights\` and \`up --kv\`)
  --local N             run on an ephemeral cluster of N node processes on this machine (layers placed
                        by the planner), torn down afterwards; the GPU's measurement it plans with
                        serves the next --local runs for 10 minutes (docs/NODE.md). Without --local, a
                        cluster that \`up --model DIR\` leads on this machine serves the request (when it
                        runs the same model), else this process alone.
  --plan FILE           with --local: use this Plan JSON instead of planning (its stage nodes are
                        mapped onto the cluster's nodes in order)
  --wire f16|f32        activations between stages and to expert hosts (default f16; through
                        \`up\`'s chain, the chain's: \`up --wire\`)
  --experts local|spread  with --local: MoE experts on their layer's stage (local, the default) or
                        spread over the nodes (expert parallelism); --json then adds expert_hosts and
                        fanout (what went to each node per MoE layer) and routing_counts (the
                        router's picks per MoE layer)
  --routing-out FILE    with spread experts (--local N --experts spread, --cluster, or \`up\`'s chain
                        when it spreads them): write the router's observed picks as the routing counts
                        \`plan --routing FILE\` reads, {"<layer>": [count per routed expert]}
${SPECULATE_HELP}
${clusterHelp(24)}
  --trace FILE          write a trace (Chrome trace-event JSON; open it in Perfetto): with --local or
                        through \`up\`'s chain, every step's compute per stage and every hop on the wire;
                        on one node, the prefill and each decode batch
  -h, --help            this help

Exit codes: 0 success, 1 runtime failure, 2 bad usage or bad input.`;

export const generateCommand: Command = {
  name: "generate",
  summary: "generate text from a prompt (streams to stdout)",
  usage: USAGE,
  async run(argv) {
    const { values, positionals } = parseFlags(argv, {
      model: { type: "string" },
      tokens: { type: "string" },
      "max-tokens": { type: "string" },
      temperature: { type: "string" },
      "top-p": { type: "string" },
      seed: { type: "string" },
      json: { type: "boolean" },
      weights: { type: "string" },
      kv: { type: "string" },
      local: { type: "string" },
      plan: { type: "string" },
      trace: { type: "string" },
      wire: { type: "string" },
      experts: { type: "string" },
      "routing-out": { type: "string" },
      ...SPECULATE_FLAGS,
      ...clusterFlags,
    }, { allowPositionals: true });
    const spec = speculateFlags(values);
    if (values.cluster !== undefined && values.plan !== undefined) {
      throw new UsageError("--cluster plans from the file: give it without --plan");
    }
    if (values.cluster === undefined) {
      for (const f of ["emulate-wan", "memory-scale", "context"] as const) {
        if (values[f] !== undefined) throw new UsageError(`--${f} needs --cluster FILE`);
      }
    }
    if (values["cluster-plan"] !== undefined) throw new UsageError("--cluster-plan is `up`'s (the leader's)");
    if (values.plan !== undefined && values.local === undefined) {
      throw new UsageError("--plan needs --local N (a running cluster takes its plan from `up --plan`)");
    }
    const wire = wireFlag(values.wire);
    if (positionals.length > 1) {
      throw new UsageError(`expected one PROMPT (quote it), got ${positionals.length} words`);
    }
    const prompt = positionals[0];
    if (prompt !== undefined && values.tokens !== undefined) {
      throw new UsageError("give PROMPT or --tokens, not both");
    }
    if (prompt === undefined && values.tokens === undefined) {
      throw new UsageError("give a PROMPT or --tokens");
    }
    const maxTokens = numberFlag(values["max-tokens"], "max-tokens", { min: 1, integer: true, fallback: 64 });
    const temperature = numberFlag(values.temperature, "temperature", { min: 0, fallback: 0.8 });
    const topP = numberFlag(values["top-p"], "top-p", { min: Number.MIN_VALUE, max: 1, fallback: 0.95 });
    const seed = numberFlag(values.seed, "seed", {
      min: 0,
      max: 2 ** 32 - 1,
      integer: true,
      fallback: (Math.random() * 2 ** 32) >>> 0,
    });
    const weights = parseWeights(values.weights);
    const kv = parseKv(values.kv);
    if (values.trace !== undefined) await checkOutputPath(values.trace, "--trace");
    const routingOut = values["routing-out"];
    if (routingOut !== undefined) {
      await checkOutputPath(routingOut, "--routing-out");
      if (values.local !== undefined && values.experts !== "spread") {
        throw new UsageError(
          "--routing-out needs --experts spread: only stages that send experts' tokens read the router's choices back",
        );
      }
    }
    const promptIds = values.tokens !== undefined ? parseTokenList(values.tokens) : undefined;
    const chainOpts = {
      weights,
      kv,
      prompt,
      ids: promptIds,
      maxTokens,
      sampling: { temperature, topP, seed },
      json: values.json ?? false,
      wire,
      speculate: spec,
      routingOut,
    };
    if (spec?.draft === "mtp" && (values.cluster !== undefined || values.local !== undefined)) {
      throw new UsageError(MTP_ONE_NODE);
    }
    if (values.cluster !== undefined) {
      return await generateCluster(
        values,
        { ...chainOpts, trace: values.trace },
        values.model ?? await ensureDemoModel(),
      );
    }
    if (values.local !== undefined) {
      const n = numberFlag(values.local, "local", { min: 1, max: 64, integer: true, fallback: 1 });
      const modelDir = values.model ?? await ensureDemoModel();
      const plan = values.plan === undefined
        ? undefined
        : await readPlanFile(values.plan, { modelDir, nodes: n });
      const experts = expertsFlag(values.experts, values.local);
      if (experts === "spread") await checkHasExperts(modelDir);
      return await generateLocal(n, {
        ...chainOpts,
        modelDir,
        plan,
        trace: values.trace,
        experts,
      });
    }
    const { state, stale } = await liveState();
    if (stale) {
      console.error(
        `swactor: the cluster \`up\` started (pid ${stale.pid}) is no longer running; removed its stale state`,
      );
    }
    if (state?.api) {
      const target = targetOf(state);
      const dir = await clusterModel(target.base, values.model);
      if (dir && spec?.draft === "mtp") throw new UsageError(MTP_ONE_NODE);
      // The chain holds its weights and KV cache as `up` loaded them: a request cannot change them.
      const own = (["weights", "kv"] as const).find((k) => values[k] !== undefined);
      if (dir && own) {
        throw new UsageError(
          `--${own} is the chain's: give it to \`up\` (this request goes to the cluster \`up\` started), or use --local N`,
        );
      }
      if (dir) {
        return await generateOnCluster(target, { ...chainOpts, modelDir: dir, trace: values.trace });
      }
    }

    if (routingOut !== undefined) {
      throw new UsageError(
        "--routing-out needs a chain: --local N --experts spread, --cluster FILE, or `up`",
      );
    }
    const dir = await modelDirOrDemo(values.model);
    const { checkpoint, ids, tokenizer } = await prepareRequest({
      modelDir: dir,
      prompt,
      ids: promptIds,
      maxTokens,
    });
    const { engine, load } = await loadModel(checkpoint, weights, kv);
    const drafter = spec &&
      await makeDrafter(spec, {
        modelDir: spec.draft === "mtp" ? dir : values.model ?? "",
        vocab: engine.model.vocab,
        maxSeq: ids.length + maxTokens + 1,
        seed,
        target: values.model === undefined && spec.draft !== "mtp" ? undefined : engine,
        weights,
      }).catch((e) => {
        engine.close();
        throw e;
      });
    const abort = new AbortController();
    let exitCode = 130;
    const removeSignals = onStopSignal((_, code) => {
      exitCode = code;
      abort.abort();
    });
    const stream = tokenizer ? new StreamDecoder(tokenizer) : null;
    const out = new TextEncoder();
    const write = (s: string) => s && Deno.stdout.writeSync(out.encode(s));
    const started = performance.now();
    const batches: { tokens: number; atMs: number }[] = [];
    try {
      const onTokens = (fresh: number[]) => {
        batches.push({ tokens: fresh.length, atMs: performance.now() - started });
        if (values.json) return;
        if (stream) { for (const id of fresh) write(stream.push(id)); }
        else write(fresh.join(" ") + " ");
      };
      const sampling = { temperature, topP, seed };
      const result = drafter
        ? await speculativeGenerate(engine, drafter, ids, {
          k: spec!.k,
          auto: spec!.auto,
          maxTokens,
          eos: engine.model.eosTokenIds,
          sampling,
          signal: abort.signal,
          onTokens,
        })
        : await generate(engine, ids, {
          maxTokens,
          sampling,
          eosTokenIds: engine.model.eosTokenIds,
          signal: abort.signal,
          onTokens,
        });
      const speculation = drafter && "trips" in result
        ? speculationJson(result, result.tokens.length, spec!.draft, spec!.auto ? "auto" : spec!.k)
        : undefined;
      const text = tokenizer ? tokenizer.decode(result.tokens) : "";
      const builds = "firstTokenBuilds" in result ? result.firstTokenBuilds : undefined;
      if (values.json) {
        console.log(JSON.stringify({
          tokens: result.tokens,
          text,
          prompt_tokens: result.promptTokens,
          tok_s: Number(result.tokS.toFixed(2)),
          first_token_ms: Number(result.firstTokenMs.toFixed(1)),
          ...builds && {
            first_token_builds: { pipelines: builds.count, ms: Number(builds.ms.toFixed(1)) },
          },
          stop_reason: result.stopReason,
          seed,
          load_ms: Math.round(load.ms),
          load_bytes: load.bytes,
          weights: engine.weights.weightType,
          kv: engine.weights.kvType,
          adapter: engine.gpu.adapterName,
          ...speculation,
        }));
      } else {
        write((stream?.flush() ?? "") + "\n");
        console.error(
          `swactor: ${result.tokens.length} tokens, ${result.tokS.toFixed(1)} tok/s after a first token at ` +
            `${result.firstTokenMs.toFixed(0)} ms` +
            (builds?.count
              ? `, ${builds.ms.toFixed(0)} ms of it building ${builds.count} GPU pipelines`
              : "") +
            ` (${result.stopReason}; seed ${seed})` +
            (speculation
              ? `; speculative: ${speculation.trips} trips, ${speculation.accepted_per_trip} tokens per trip, ` +
                `${speculation.accepted_drafts}/${speculation.drafted} drafts kept`
              : ""),
        );
      }
      if (values.trace) {
        await writeJsonOutput(values.trace, batchTrace(batches, ids.length, engine.gpu.adapterName));
        console.error(`swactor: trace written to ${values.trace} (open it in Perfetto or chrome://tracing)`);
      }
      return result.stopReason === "aborted" ? exitCode : 0;
    } finally {
      removeSignals();
      // The GPU idle first: freeing the engines right after a speculative run, then exiting, crashed the
      // process at exit on lavapipe (SIGSEGV / "corrupted double-linked list" after the output, 5 of 40
      // `--draft mtp` runs, 2026-12-08; none of 40 with this wait). Which GPU work or map was still pending
      // is not known: the speculative loop awaits its own steps.
      await engine.gpu.device.queue.onSubmittedWorkDone().catch(() => {}); // a lost device: close anyway
      drafter?.close();
      engine.close();
    }
  },
};

/**
 * The single-node trace: the prefill (up to the first token's readback) and each decode batch as spans on
 * one track, in Chrome trace-event JSON. Tokens decode in batches between readbacks, so this is the finest
 * timing one node observes without GPU timestamps.
 */
export function batchTrace(
  batches: { tokens: number; atMs: number }[],
  promptTokens: number,
  adapter: string,
) {
  const traceEvents: Record<string, unknown>[] = [
    { name: "process_name", ph: "M", pid: 0, tid: 0, args: { name: `one node (${adapter})` } },
  ];
  let from = 0, done = 0;
  for (const [i, b] of batches.entries()) {
    traceEvents.push({
      name: i === 0 ? `prefill (${promptTokens} tokens) + token 1` : `tokens ${done + 1}..${done + b.tokens}`,
      ph: "X",
      pid: 0,
      tid: 0,
      ts: Math.round(from * 1000),
      dur: Math.round((b.atMs - from) * 1000),
      args: { tokens: b.tokens },
    });
    from = b.atMs;
    done += b.tokens;
  }
  return { traceEvents, displayTimeUnit: "ms" };
}

/** `--experts spread` on a model without mixture-of-experts layers: say so before any node starts. */
async function checkHasExperts(modelDir: string): Promise<void> {
  const config = await readModelConfig(modelDir);
  for (let i = 0; i < config.numLayers; i++) if (config.layer(i).ffn.kind === "moe") return;
  throw new UsageError(
    `--experts spread: ${modelDir} has no mixture-of-experts layers (every layer's MLP is dense), so there are no experts to spread; leave --experts out`,
  );
}
