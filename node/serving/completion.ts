// One completion, whichever route asked for it and whether it streams: the prompt's token ids (text with the
// model's BOS, ids as given, or chat messages through the checkpoint's template), the stop conditions
// (the model's EOS, the template's end-of-turn, stop strings), admission (a slot and KV room), then the
// generation on the chain with the text decoded as tokens arrive. Streamed and whole answers are made by
// the same code: a whole answer is the concatenation of the deltas a stream would send.
import {
  type ChatMessage as TemplateMessage,
  TemplateEngineMissingError,
  TemplateRenderError,
} from "../../models/chat_template.ts";
import { StreamDecoder } from "../../models/tokenizer.ts";
import { PipelineError } from "../stage/mod.ts";
import type { Activity } from "./activity.ts";
import type { Admission } from "./admission.ts";
import { ApiError, badRequest } from "./errors.ts";
import type { CompletionJob } from "./openai_request.ts";
import type { ServingServices } from "./services.ts";
import { StopMatcher } from "./stop_strings.ts";

/** max_tokens when a completion request gives none (OpenAI's default for /v1/completions). */
export const DEFAULT_COMPLETION_TOKENS = 16;
/** The most tokens a chat request gets when it names no limit (within the context left). */
export const DEFAULT_CHAT_TOKENS = 1024;

/** A request checked against the model and ready to run. */
export interface PreparedJob {
  job: CompletionJob;
  ids: number[];
  maxTokens: number;
  eos: number[];
  stop: string[];
}

export interface CompletionResult {
  text: string;
  finish: "stop" | "length";
  promptTokens: number;
  completionTokens: number;
  /** Speculative decoding (extension): passes through the chain and generated tokens per pass. */
  speculation?: { trips: number; acceptedPerTrip: number };
}

/** The model a request names must be the one served: its id, or its folder. 404 otherwise. */
export function checkModel(s: ServingServices, name: string): void {
  if (name !== s.model.id && name !== s.model.dir) {
    throw new ApiError(
      404,
      `The model \`${name.slice(0, 200)}\` does not exist: this server serves \`${s.model.id}\``,
      {
        param: "model",
        code: "model_not_found",
      },
    );
  }
}

/** 503 with Retry-After while the chain is not ready. */
export function checkReady(s: ServingServices): void {
  const r = s.ready();
  if (!r.ready) {
    throw new ApiError(503, `${r.why}; retry shortly`, { code: "model_not_ready", retryAfterS: 5 });
  }
}

/** Turns the job into token ids and stop conditions; ApiError (400 / 404 / 500 / 503) when it cannot run. */
export async function prepare(s: ServingServices, job: CompletionJob): Promise<PreparedJob> {
  checkModel(s, job.model);
  checkReady(s);
  const m = s.model;
  let ids: number[];
  const eos = [...m.eos];
  const stop = [...job.stop];
  const tokenizer = m.tokenizer;
  if (!tokenizer && !("tokens" in job.prompt)) {
    throw badRequest(
      `the model \`${m.id}\` has no tokenizer: give the prompt as token ids (/v1/completions, "prompt": [1, 2, 3])`,
      job.kind === "chat" ? "messages" : "prompt",
    );
  }
  if ("text" in job.prompt) ids = tokenizer!.encode(job.prompt.text);
  else if ("tokens" in job.prompt) {
    ids = job.prompt.tokens;
    const bad = ids.findIndex((t) => t >= m.vocab);
    if (bad >= 0) {
      throw badRequest(
        `prompt[${bad}] = ${ids[bad]} is not a token id of this model (vocabulary ${m.vocab})`,
        "prompt",
      );
    }
  } else {
    if (!m.chat) {
      throw badRequest(
        `the model \`${m.id}\` has no chat template (tokenizer_config.json's chat_template or chat_template.jinja): ` +
          `use /v1/completions`,
        "messages",
        "no_chat_template",
      );
    }
    let text: string;
    let end: string;
    try {
      text = await m.chat.render(job.prompt.messages as TemplateMessage[], { addGenerationPrompt: true });
      end = await m.chat.endOfTurn();
    } catch (e) {
      if (e instanceof TemplateRenderError) throw badRequest(e.message, "messages");
      if (e instanceof TemplateEngineMissingError) {
        throw new ApiError(500, e.message, { code: "chat_template_unavailable" });
      }
      throw e;
    }
    ids = tokenizer!.encode(text, { special: false });
    if (end) {
      // One token (Llama 3's <|eot_id|>): stop on the id. Several: stop on the text.
      const endIds = tokenizer!.encode(end, { special: false });
      if (endIds.length === 1) eos.push(endIds[0]);
      else stop.push(end);
    }
  }
  if (ids.length === 0) {
    throw badRequest("the prompt is empty (no tokens)", job.kind === "chat" ? "messages" : "prompt");
  }
  const context = s.budget.tokens();
  const maxTokens = job.maxTokens ??
    (job.kind === "completion"
      ? DEFAULT_COMPLETION_TOKENS
      : Math.max(1, Math.min(DEFAULT_CHAT_TOKENS, context - ids.length)));
  return { job, ids, maxTokens, eos: [...new Set(eos)], stop };
}

/** The reason a generation is aborted when a stop string was found (not a failure). */
const STOPPED = Symbol("stop string");

/** Waits for a slot and KV room for the job (admission.ts); its release ends the reservation. */
export function admit(p: PreparedJob, admission: Admission, signal: AbortSignal): Promise<() => void> {
  return admission.enter(p.ids.length + p.maxTokens, signal);
}

/**
 * Runs an admitted job (`release` is called when it ends, however it ends): `onText` gets each piece of
 * text as soon as it is known (never part of a stop string), `signal` is the client going away (the chain
 * then releases the request on every stage). ApiError for a failed chain (500 / 503); the signal's reason
 * when the client went away.
 */
export async function runCompletion(
  s: ServingServices,
  p: PreparedJob,
  o: { release: () => void; activity: Activity; signal: AbortSignal; onText?: (text: string) => void },
): Promise<CompletionResult> {
  const release = o.release;
  const run = o.activity.start(p.job.kind, p.ids.length);
  const t0 = performance.now();
  const abort = new AbortController();
  const onClientGone = () => abort.abort(o.signal.reason);
  o.signal.addEventListener("abort", onClientGone, { once: true });
  const decoder = s.model.tokenizer
    ? new StreamDecoder(s.model.tokenizer)
    : { push: () => "", flush: () => "" };
  const stops = new StopMatcher(p.stop);
  let text = "";
  const emit = (t: string) => {
    if (!t) return;
    text += t;
    o.onText?.(t);
  };
  let completionTokens = 0;
  let finish: CompletionResult["finish"] = "length";
  let outcome = "error";
  let speculation: CompletionResult["speculation"];
  try {
    try {
      const out = await s.generate(p.ids, {
        maxTokens: p.maxTokens,
        sampling: p.job.sampling,
        speculate: p.job.speculate,
        eos: p.eos,
        signal: abort.signal,
        onToken: (e) => {
          if (stops.stopped) return; // tokens of the batch that carried the stop string
          completionTokens++;
          run.token(e);
          const r = stops.push(decoder.push(e.token));
          emit(r.text);
          if (r.stopped) abort.abort(STOPPED);
        },
      });
      finish = out.stopReason === "eos" ? "stop" : "length";
      const stats = (out as { stats?: { trips: number } }).stats;
      if (stats && stats.trips > 0) {
        speculation = {
          trips: stats.trips,
          acceptedPerTrip: Math.round((out.tokens.length / stats.trips) * 1000) / 1000,
        };
      }
    } catch (e) {
      if (abort.signal.reason !== STOPPED || o.signal.aborted) throw e;
    }
    if (stops.stopped) finish = "stop";
    else emit(stops.push(decoder.flush()).text + stops.flush());
    if (stops.stopped) finish = "stop";
    outcome = finish;
    return {
      text,
      finish,
      promptTokens: p.ids.length,
      completionTokens,
      ...(speculation && { speculation }),
    };
  } catch (e) {
    if (o.signal.aborted) {
      outcome = "cancelled";
      throw e;
    }
    if (e instanceof ApiError) throw e;
    if (e instanceof PipelineError) {
      throw new ApiError(503, `the chain failed: ${e.message}`, { code: "chain_failed", retryAfterS: 5 });
    }
    throw new ApiError(500, `the generation failed: ${(e as Error).message}`, { code: "generation_failed" });
  } finally {
    o.signal.removeEventListener("abort", onClientGone);
    release();
    run.end(outcome, performance.now() - t0);
  }
}
