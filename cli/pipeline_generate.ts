// generate and logits on a chain: `--local N` (an ephemeral cluster) or the cluster a running `up` leads
// (through its control API). Prints what the single-node path prints, plus the chain and per-token timings.
import { resolve } from "node:path";
import { Checkpoint } from "../models/checkpoint.ts";
import { checkTokenIds } from "../models/engine.ts";
import type { ModelRef } from "../models/backend.ts";
import { checkWeights } from "../models/model.ts";
import { loadTokenizer, StreamDecoder, type TextTokenizer } from "../models/tokenizer.ts";
import { writeSafetensors } from "../models/safetensors.ts";
import {
  chromeTrace,
  type HopTrace,
  meanTimings,
  type PrefillTimings,
  recoveryNotes,
  type RecoveryRecord,
  type Sampling,
  type TokenEvent,
  type TokenTimings,
  type TraceStep,
} from "../node/stage/mod.ts";
import { apiError, apiFetch, type ApiTarget, readGenerateLines } from "../node/api/mod.ts";
import { startLocalCluster } from "./local_cluster.ts";
import { expertReport, routingCounts } from "../node/stage/experts.ts";
import type { Plan } from "../planner/mod.ts";
import {
  measuredMsPerToken,
  predictRequest,
  predictSpeculativeRequest,
  type RequestPrediction,
} from "./prediction.ts";
import { liveMembersAt } from "./plan_live.ts";
import { liveMembers } from "../node/stage/mod.ts";
import { UsageError } from "./command.ts";
import { onStopSignal } from "./signals.ts";
import { writeJsonOutput, writeOutput } from "./output_file.ts";
import { draftName, makeDrafter, type SpeculateFlags } from "./speculate_flags.ts";
import { speculationJson } from "../models/speculative.ts";
import type { GenerateOutcome, SpeculateOutcome } from "../node/stage/client.ts";

export interface ChainGenerateOptions {
  modelDir: string;
  weights: string;
  /** The KV cache the chain's stages hold (a chain started here; default auto: each node's). */
  kv?: string;
  prompt?: string;
  ids?: number[];
  maxTokens: number;
  sampling: Sampling;
  json: boolean;
  /** Activations between stages; absent: the chain's (`up --wire`; f16 for a chain started here). */
  wire?: "f16" | "f32";
  plan?: { stages: { node: string }[] } & Record<string, unknown>;
  /** Write the per-token, per-hop trace (Chrome trace-event JSON) here. */
  trace?: string;
  /** Where MoE experts live: on their layer's stage (default) or spread over the nodes. */
  experts?: "local" | "spread";
  /** Speculative decoding (the drafter runs in this process, beside stage 0). */
  speculate?: SpeculateFlags;
  /** Node id -> a name for it (the cluster file's), for the trace's tracks. */
  names?: Map<string, string>;
  /** Node processes in the cluster, for --json (default: the stages). */
  nodes?: number;
  /** Write the router's observed picks here, as the routing counts `plan --routing FILE` reads. */
  routingOut?: string;
}

/** A request checked against its model before any work (prepareRequest). */
export interface Prepared {
  /** The model's checkpoint, opened (headers read, config parsed); no weights loaded yet. */
  checkpoint: Checkpoint;
  ids: number[];
  tokenizer: TextTokenizer | null;
  eos: number[];
  vocab: number;
  /** Routed experts of a layer (0 for a dense one). */
  expertsOf: (layer: number) => number;
}

/**
 * Checks a request against the model before any work: token ids inside the vocabulary, and the prompt
 * plus the tokens to generate (`maxTokens`, 0 for logits) inside its positions. UsageError otherwise.
 */
export function checkPrompt(
  ids: readonly number[],
  model: { vocabSize: number; maxPositionEmbeddings: number },
  maxTokens: number,
): void {
  try {
    checkTokenIds(ids, model.vocabSize);
  } catch (e) {
    throw new UsageError((e as Error).message); // checkTokenIds judges the ids only
  }
  if (ids.length + maxTokens > model.maxPositionEmbeddings) {
    throw new UsageError(
      maxTokens === 0
        ? `${ids.length} tokens exceed the model's ${model.maxPositionEmbeddings} positions`
        : `the prompt (${ids.length} tokens) plus --max-tokens ${maxTokens} exceeds the model's ` +
          `${model.maxPositionEmbeddings} positions: shorten the prompt or lower --max-tokens`,
    );
  }
}

/**
 * Opens the model (a missing directory, a config that does not read, a broken shard or weights that do not
 * match the config fail here: checkWeights), its tokenizer unless `tokenizer` is false, turns the prompt
 * into ids and checks them (checkPrompt): every UsageError a request can meet before a GPU opens, a node
 * starts or a weight loads.
 */
export async function prepareRequest(
  o: { modelDir: string; prompt?: string; ids?: number[]; tokenizer?: boolean; maxTokens?: number },
): Promise<Prepared> {
  const ckpt = await Checkpoint.open(o.modelDir);
  checkWeights(ckpt);
  const tokenizer = o.tokenizer === false ? null : await loadTokenizer(o.modelDir, ckpt.config);
  let ids = o.ids;
  if (ids === undefined) {
    if (!tokenizer) {
      throw new UsageError(`the model at ${o.modelDir} has no tokenizer: give the prompt with --tokens`);
    }
    ids = tokenizer.encode(o.prompt!);
  }
  checkPrompt(ids, ckpt.config, o.maxTokens ?? 0);
  const expertsOf = (l: number) => {
    const ffn = ckpt.config.layer(l).ffn;
    return ffn.kind === "moe" ? ffn.routing.experts : 0;
  };
  return {
    checkpoint: ckpt,
    ids,
    tokenizer,
    eos: ckpt.config.eosTokenIds,
    vocab: ckpt.config.vocabSize,
    expertsOf,
  };
}

function streamer(p: Prepared, json: boolean) {
  const stream = p.tokenizer ? new StreamDecoder(p.tokenizer) : null;
  const out = new TextEncoder();
  const write = (s: string) => s && Deno.stdout.writeSync(out.encode(s));
  return {
    token(id: number) {
      if (json) return;
      if (stream) write(stream.push(id));
      else write(`${id} `);
    },
    end() {
      if (!json) write((stream?.flush() ?? "") + "\n");
    },
  };
}

/**
 * `--routing-out FILE`: the request's routing counts, {"<layer>": [count per routed expert]}, summed over its
 * steps (prefill included). Only stages whose experts are spread read the router's choice back, so a chain
 * with every expert on its stage has none to write: an error says so.
 */
async function writeRouting(p: Prepared, o: ChainGenerateOptions, traces: (HopTrace[] | undefined)[]) {
  if (!o.routingOut) return;
  const picks = expertReport(traces)?.picks ?? {};
  if (Object.keys(picks).length === 0) {
    throw new Error(
      "no routing counts to write: only stages whose experts are spread (--experts spread) read the " +
        "router's choices back",
    );
  }
  await writeJsonOutput(o.routingOut, routingCounts(picks, p.expertsOf));
  console.error(`swactor: routing counts written to ${o.routingOut} (\`plan --routing ${o.routingOut}\`)`);
}

function report(
  p: Prepared,
  o: ChainGenerateOptions,
  r: {
    tokens: number[];
    events: { timings: TokenTimings; trace: HopTrace[]; atMs: number; prefill?: PrefillTimings }[];
    stopReason: string;
    tokS: number;
    firstTokenMs: number;
    recoveries?: RecoveryRecord[];
    /** What the chain ran the request with (absent from older nodes). */
    wire?: "f16" | "f32";
  },
  /** The chain's stages and nodes, and the model its Plan serves (its weights and KV cache, not the request's). */
  chain: { stages: unknown[]; nodes: number; model: ModelRef },
  predicted?: RequestPrediction,
  spec?: ReturnType<typeof specReport>,
): void {
  const mean = meanTimings(r.events.slice(1).map((e) => e.timings));
  const experts = expertReport(r.events.map((e) => e.trace));
  // The fan-out's parts over the decode steps only (as mean_decode: the first event is the prefill's).
  const decodeParts = expertReport(r.events.slice(1).map((e) => e.trace))?.parts ?? {};
  const measured = measuredMsPerToken(r.events);
  const routing = experts && routingCounts(experts.picks, p.expertsOf);
  if (o.json) {
    console.log(JSON.stringify({
      tokens: r.tokens,
      text: p.tokenizer ? p.tokenizer.decode(r.tokens) : "",
      prompt_tokens: p.ids.length,
      tok_s: Number(r.tokS.toFixed(2)),
      first_token_ms: Number(r.firstTokenMs.toFixed(1)),
      ms_per_token: measured ?? null,
      predicted_ms_per_token: predicted?.msPerToken ?? null,
      ...(predicted ? { predicted: { context: predicted.context, stages: predicted.stages } } : {}),
      stop_reason: r.stopReason,
      seed: o.sampling.seed,
      weights: chain.model.weights,
      kv: chain.model.kv ?? "auto",
      wire: r.wire ?? o.wire ?? "f16",
      nodes: chain.nodes,
      stages: chain.stages,
      ...(experts ? { expert_hosts: experts.hosts, fanout: experts.fanout, fanout_parts: decodeParts } : {}),
      // The router's picks per MoE layer whose experts were spread (`plan --routing` reads this form).
      ...(routing && Object.keys(routing).length ? { routing_counts: routing } : {}),
      ...spec,
      // Each lost stage the generation survived (docs/RECOVERY.md).
      recoveries: (r.recoveries ?? []).map((x) => ({
        stage: x.stage,
        node: x.node,
        reason: x.reason,
        ms: x.ms,
        gap_ms: x.gap_ms,
        at_token: x.at_token,
        plan: [x.from, x.to],
      })),
      timings: {
        mean_decode: { compute_ms: mean.computeMs, wire_ms: mean.wireMs, bytes: mean.bytes },
        prefill: prefillJson(r.events[0]?.prefill),
        per_token: r.events.map((e) => ({
          compute_ms: e.timings.computeMs,
          wire_ms: e.timings.wireMs,
          bytes: e.timings.bytes,
        })),
      },
    }));
  } else {
    for (const x of r.recoveries ?? []) {
      console.error(
        `swactor: recovered from stage ${x.stage ?? "?"} (node ${
          (x.node ?? "?").slice(0, 10)
        }) ${x.reason} ` +
          `at token ${x.at_token}: decoding went on ${x.ms} ms after the loss was seen (${x.gap_ms} ms without tokens)`,
      );
    }
    console.error(
      `swactor: ${r.tokens.length} tokens on ${chain.stages.length} stages, ${
        r.tokS.toFixed(1)
      } tok/s after a first ` +
        `token at ${r.firstTokenMs.toFixed(0)} ms (${r.stopReason}); per token: compute ms per stage ` +
        `[${mean.computeMs.join(", ")}], wire ms per hop [${mean.wireMs.join(", ")}]` +
        (measured !== undefined && predicted
          ? `; ${measured.toFixed(1)} ms per token after the first, predicted ${
            predicted.msPerToken.toFixed(1)
          }`
          : "") +
        (spec
          ? `; speculative: ${spec.trips} trips, ${spec.accepted_per_trip} tokens per trip, ` +
            `${spec.accepted_drafts}/${spec.drafted} drafts kept, ${spec.cancelled} chunks cancelled`
          : ""),
    );
  }
}

/** The prefill's per-chunk means, as --json reports them (absent for a one-stage chain). */
function prefillJson(p: PrefillTimings | undefined) {
  return p && {
    chunks: p.chunks,
    compute_ms: p.computeMs,
    wait_ms: p.waitMs,
    wire_ms: p.wireMs,
    bytes: p.bytes,
  };
}

/** Speculation's figures for --json. */
function specReport(r: SpeculateOutcome, f: SpeculateFlags) {
  return {
    ...speculationJson(r.stats, r.tokens.length, f.noise > 0 ? `${f.draft}+noise ${f.noise}` : f.draft, f.k),
    ...(f.auto ? { speculate: "auto", chosen_k: r.trips.map((t) => t.drafted) } : {}),
    depth: f.depth,
    cancelled: r.stats.cancelled,
  };
}

/**
 * A speculative generation's trace: the prefill, then one step per verification chunk, named after what
 * happened to it (drafted / kept, or cancelled), each with its drafting time on stage 0's track.
 */
function tripSteps(r: SpeculateOutcome): TraceStep[] {
  const steps: TraceStep[] = [
    { token: r.tokens[0], trace: r.events[0]?.trace ?? [], label: "prefill" },
  ];
  for (const t of r.trips) {
    if (!t.trace) continue;
    const label = t.accepted < 0
      ? `verify ${t.chunk}: cancelled (an earlier chunk was cut short)`
      : `verify ${t.chunk}: ${t.accepted}/${t.drafted} drafts kept${
        t.accepted < t.drafted ? " (rejection)" : ""
      }`;
    steps.push({ token: -1, trace: t.trace, label, draft: { at: t.draftAt, ms: t.draftMs } });
  }
  return steps;
}

/** Writes a chain's per-step records as a Chrome trace (a track per node; stage i on plan stage i's node). */
async function writeTrace(
  path: string,
  events: TraceStep[],
  planStages: { node: string }[],
  recoveries: RecoveryRecord[] = [],
  names?: Map<string, string>,
): Promise<void> {
  await writeJsonOutput(
    path,
    chromeTrace(events, planStages.map((s, index) => ({ index, node: s.node })), {
      names,
      notes: recoveryNotes(recoveries, planStages[0]?.node ?? "client"),
    }),
  );
  console.error(`swactor: trace written to ${path} (open it in Perfetto or chrome://tracing)`);
}

function stageSummary(
  stages: { index: number; node: string; layers: [number, number]; embeds: boolean; head: boolean }[],
) {
  return stages.map((s) => ({
    index: s.index,
    node: s.node,
    layers: s.layers,
    embeds: s.embeds,
    head: s.head,
  }));
}

/** generate --local N. Exit code as the CLI returns it. */
export async function generateLocal(n: number, o: ChainGenerateOptions): Promise<number> {
  const p = await prepareRequest(o);
  const abort = new AbortController();
  let exitCode = 130;
  const removeSignals = onStopSignal((signal, code) => {
    exitCode = code;
    abort.abort(new Error(`interrupted (${signal})`));
  });
  const out = streamer(p, o.json);
  try {
    const cluster = await startLocalCluster(n, {
      modelDir: o.modelDir,
      weights: o.weights,
      kv: o.kv,
      plan: o.plan,
      experts: o.experts,
      signal: abort.signal,
    });
    const drafter = o.speculate &&
      await makeDrafter(o.speculate, {
        modelDir: o.modelDir,
        vocab: p.vocab,
        maxSeq: p.ids.length + o.maxTokens + 1,
        seed: o.sampling.seed,
        weights: o.weights,
      }).catch(async (e) => {
        await cluster.close();
        throw e;
      });
    try {
      const request = {
        maxTokens: o.maxTokens,
        sampling: o.sampling,
        eos: p.eos,
        wire: o.wire,
        signal: abort.signal,
        onToken: (e: TokenEvent) => out.token(e.token),
      };
      const r: GenerateOutcome & Partial<SpeculateOutcome> = drafter
        ? await cluster.pipeline.client.speculate(cluster.chain, p.ids, {
          ...request,
          drafter,
          k: o.speculate!.k,
          depth: o.speculate!.depth,
          auto: o.speculate!.auto,
        })
        : await cluster.pipeline.client.generate(cluster.chain, p.ids, request);
      let spec = r.stats && r.trips ? specReport(r as SpeculateOutcome, o.speculate!) : undefined;
      out.end();
      const plan = cluster.assignment.plan as unknown as Plan;
      // The stages' nodes and the expert hosts: a spread Plan is predicted with its fan-out to them.
      const inPlan = new Set([
        ...plan.stages.map((s) => s.node),
        ...(plan.expertHosts ?? []).map((h) => h.node),
      ]);
      const alive = cluster.node.membership.members().filter((m) => inPlan.has(m.id));
      const predicted = await predictRequest(o.modelDir, plan, liveMembers(cluster.node, alive), {
        promptTokens: p.ids.length,
        generated: r.tokens.length,
      });
      if (spec) {
        // The cost model's speedup for this chain at the acceptance this request measured (drafting and
        // the wider step's compute left out: docs/SPECULATIVE.md).
        const s = predictSpeculativeRequest(predicted, {
          alpha: spec.acceptance,
          // auto: the mean k it chose
          k: o.speculate!.auto
            ? Math.max(1, Math.round(r.trips!.reduce((a, t) => a + t.drafted, 0) / r.trips!.length))
            : o.speculate!.k,
          depth: o.speculate!.depth,
        });
        spec = { ...spec, ...(s ? { predicted_speculative: s } : {}) };
      }
      report(
        p,
        o,
        r,
        { stages: stageSummary(cluster.assignment.plan.stages), nodes: n, model: cluster.assignment.model },
        predicted,
        spec,
      );
      await writeRouting(p, o, r.events.map((e) => e.trace));
      if (o.trace) {
        await writeTrace(
          o.trace,
          r.trips ? tripSteps(r as SpeculateOutcome) : r.events,
          cluster.assignment.plan.stages,
          r.recoveries,
        );
      }
      return 0;
    } finally {
      drafter?.close();
      await cluster.close();
    }
  } catch (e) {
    if (abort.signal.aborted) {
      out.end();
      console.error("swactor: interrupted; the cluster is torn down");
      return exitCode;
    }
    throw e;
  } finally {
    removeSignals();
  }
}

/** Whether the node at `base` runs a ready chain for `modelDir` (any model when undefined); its model dir if so. */
export async function clusterModel(base: string, modelDir: string | undefined): Promise<string | undefined> {
  let body;
  try {
    const res = await fetch(base + "/pipeline", { signal: AbortSignal.timeout(3000) });
    if (!res.ok) return undefined;
    body = await res.json() as { assignment: { model: { dir: string } } | null };
  } catch {
    return undefined;
  }
  const dir = body.assignment?.model.dir;
  if (!dir) return undefined;
  if (modelDir !== undefined && resolve(modelDir) !== resolve(dir)) return undefined;
  return dir;
}

/** generate through the cluster that `up` on this machine leads (its control API at `target`). */
export async function generateOnCluster(target: ApiTarget, o: ChainGenerateOptions): Promise<number> {
  if (o.speculate && o.speculate.noise > 0) {
    throw new UsageError(
      "--draft-noise applies where the drafter runs: give it to `up` (the cluster drafts)",
    );
  }
  const p = await prepareRequest(o);
  const abort = new AbortController();
  let exitCode = 130;
  const removeSignals = onStopSignal((_, code) => {
    exitCode = code;
    abort.abort();
  });
  const out = streamer(p, o.json);
  try {
    const res = await apiFetch(target, "/generate", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({
        tokens: p.ids,
        maxTokens: o.maxTokens,
        sampling: o.sampling,
        eos: p.eos,
        wire: o.wire,
        // The cluster's leader drafts (`up --model DIR --draft ...`); it refuses another drafter than ours.
        ...(o.speculate
          ? {
            speculate: o.speculate.auto ? "auto" : o.speculate.k,
            speculateDepth: o.speculate.depth,
            draft: draftName(o.speculate.draft),
          }
          : {}),
      }),
      signal: abort.signal,
    });
    if (!res.ok) {
      const why = `the cluster refused the request: ${await apiError(res)}`;
      // 400: this request can never run there (bad input); 503 and the rest: not now.
      throw res.status === 400 ? new UsageError(why) : new Error(why);
    }
    const events: TokenEvent[] = [];
    const tokens: number[] = [];
    for await (const m of readGenerateLines(res.body!)) {
      if ("error" in m) throw new Error(m.error);
      if ("token" in m) {
        tokens.push(m.token);
        events.push(m);
        out.token(m.token);
      }
      if ("done" in m) {
        out.end();
        const status = await (await apiFetch(target, "/pipeline")).json();
        const predicted = await predictRequest(
          status.assignment.model.dir,
          status.assignment.plan,
          await liveMembersAt(target),
          {
            promptTokens: p.ids.length,
            generated: tokens.length,
          },
        );
        const sp = m.done.speculation;
        const spec = sp && o.speculate
          ? {
            ...speculationJson(sp, tokens.length, o.speculate.draft, o.speculate.k),
            depth: o.speculate.depth,
            cancelled: sp.cancelled,
            ...(o.speculate.auto ? { speculate: "auto", chosen_k: sp.chosenK } : {}),
          }
          : undefined;
        report(
          p,
          o,
          { tokens, events, ...m.done },
          {
            stages: stageSummary(status.assignment.plan.stages),
            nodes: o.nodes ?? m.done.stages,
            model: status.assignment.model,
          },
          predicted,
          spec,
        );
        await writeRouting(p, o, events.map((e) => Array.isArray(e.trace) ? e.trace : undefined));
        if (o.trace) {
          if (events.some((e) => !Array.isArray(e.trace))) {
            console.error(
              "swactor: the cluster's nodes send no per-step trace (an older version?): no trace written",
            );
          } else await writeTrace(o.trace, events, status.assignment.plan.stages, m.done.recoveries, o.names);
        }
        return 0;
      }
    }
    throw new Error("the cluster closed the stream before the end of the generation");
  } catch (e) {
    if (abort.signal.aborted) {
      out.end();
      return exitCode;
    }
    throw e;
  } finally {
    removeSignals();
  }
}

/** logits --local N: teacher-forced logits through an ephemeral chain. */
export async function logitsLocal(
  n: number,
  o: {
    modelDir: string;
    weights: string;
    kv?: string;
    ids: number[];
    out: string;
    wire: "f16" | "f32";
    plan?: ChainGenerateOptions["plan"];
    experts?: ChainGenerateOptions["experts"];
  },
): Promise<number> {
  const p = await prepareRequest({ modelDir: o.modelDir, ids: o.ids, tokenizer: false });
  const abort = new AbortController();
  let exitCode = 130;
  const removeSignals = onStopSignal((signal, code) => {
    exitCode = code;
    abort.abort(new Error(`interrupted (${signal})`));
  });
  try {
    const cluster = await startLocalCluster(n, {
      modelDir: o.modelDir,
      weights: o.weights,
      kv: o.kv,
      plan: o.plan,
      experts: o.experts,
      signal: abort.signal,
    });
    try {
      const { logits } = await cluster.pipeline.client.logits(cluster.chain, p.ids, {
        vocab: p.vocab,
        wire: o.wire,
        signal: abort.signal,
      });
      await writeLogits(o.out, p.ids, p.vocab, logits);
      console.error(
        `swactor: wrote logits [${p.ids.length}, ${p.vocab}] to ${o.out} (${cluster.assignment.plan.stages.length} stages)`,
      );
      return 0;
    } finally {
      await cluster.close();
    }
  } catch (e) {
    if (!abort.signal.aborted) throw e;
    console.error("swactor: interrupted; the cluster is torn down");
    return exitCode;
  } finally {
    removeSignals();
  }
}

/** Writes teacher-forced logits [T, vocab] and their tokens as safetensors to the file --out names. */
export async function writeLogits(path: string, ids: number[], vocab: number, logits: Float32Array) {
  await writeOutput(path, (target) =>
    writeSafetensors(target, [
      { name: "logits", dtype: "F32", shape: [ids.length, vocab], data: new Uint8Array(logits.buffer) },
      {
        name: "tokens",
        dtype: "I32",
        shape: [ids.length],
        data: new Uint8Array(Int32Array.from(ids).buffer),
      },
    ]));
}
