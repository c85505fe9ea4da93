// The bodies of `POST /v1/chat/completions` and `POST /v1/completions`, checked with zod schemas and turned
// into one CompletionJob. What the fields mean follows OpenAI's API reference:
// supported: model, messages / prompt, max_tokens / max_completion_tokens, temperature, top_p, seed, stop,
// stream, stream_options.include_usage, n = 1. Fields that would change the result and are not supported
// (n > 1, logprobs, tools, penalties, logit_bias, JSON mode, echo, suffix, best_of > 1, top_k, ...) are
// refused with a 400 that names them; fields that change nothing here (user, store, metadata, ...) are
// ignored; any other field is refused as unrecognized, as OpenAI does.
import { z } from "zod";
import { badRequest } from "./errors.ts";

// Each schema below carries the words its error gives ("an integer in [1, 4]"), so that a 400 says what the
// field must be and names it by its path (`messages[2].content`), which OpenAI's error body carries as
// `param` (parseBody).
const says = (expects: string) => ({ error: expects });

function string(opts: { minLength?: number; maxLength?: number } = {}) {
  const expects = opts.minLength ? "a non-empty string" : "a string";
  let s = z.string(says(expects));
  if (opts.minLength) s = s.min(opts.minLength, says(expects));
  if (opts.maxLength) s = s.max(opts.maxLength, says(`a string of at most ${opts.maxLength} characters`));
  return s;
}

function number(min: number, max: number, opts: { minExclusive?: boolean } = {}) {
  const expects = `a number in ${opts.minExclusive ? "(" : "["}${min}, ${max}]`;
  const s = z.number(says(expects)).lte(max, says(expects));
  return opts.minExclusive ? s.gt(min, says(expects)) : s.gte(min, says(expects));
}

function integer(min = Number.MIN_SAFE_INTEGER, max = Number.MAX_SAFE_INTEGER) {
  const expects = min === Number.MIN_SAFE_INTEGER ? "an integer" : `an integer in [${min}, ${max}]`;
  return z.int(says(expects)).gte(min, says(expects)).lte(max, says(expects));
}

function array<T extends z.ZodType>(item: T, opts: { min?: number; max?: number } = {}) {
  const { min = 0, max = Infinity } = opts;
  const size = min > 0 && max < Infinity
    ? ` with ${min} to ${max} items`
    : min > 0
    ? ` with at least ${min} item${min > 1 ? "s" : ""}`
    : max < Infinity
    ? ` with at most ${max} items`
    : "";
  let s = z.array(item, says(`an array${size}`));
  if (min > 0) s = s.min(min, says(`an array${size}`));
  if (max < Infinity) s = s.max(max, says(`an array${size}`));
  return s;
}

const oneOf = <const T extends readonly [string, ...string[]]>(...values: T) =>
  z.enum(
    values,
    says(
      values.length === 1
        ? JSON.stringify(values[0])
        : `one of ${values.map((v) => JSON.stringify(v)).join(", ")}`,
    ),
  );

export interface ChatMessage {
  role: "system" | "user" | "assistant";
  content: string;
}

/** One request, whichever route it came by. */
export interface CompletionJob {
  kind: "chat" | "completion";
  /** The model the request names (checked against the served one by the route). */
  model: string;
  /** Text (tokenized with the model's BOS), token ids, or chat messages (rendered by the chat template). */
  prompt: { text: string } | { tokens: number[] } | { messages: ChatMessage[] };
  /** Most tokens to generate; undefined: the server's default for the route. */
  maxTokens?: number;
  sampling: { temperature: number; topP: number; seed: number };
  /** Generation stops before the first of these strings (which is left out of the text). */
  stop: string[];
  stream: boolean;
  /** stream_options.include_usage: a last chunk with the usage. */
  includeUsage: boolean;
  /**
   * Extension (docs/SPECULATIVE.md): drafted tokens per verification step; 0 turns speculation off;
   * undefined: the server's default (on with K when `up` was given --draft).
   */
  speculate?: number;
}

const U32 = 2 ** 32;

/** A field accepted only with a value that changes nothing; any other value is refused (400). */
function onlyHarmless(harmless: (v: unknown) => boolean, why: string) {
  return z.unknown().optional().superRefine((v, ctx) => {
    if (v !== undefined && v !== null && !harmless(v)) ctx.addIssue({ code: "custom", message: why });
  });
}

const noTools = onlyHarmless((v) => Array.isArray(v) && v.length === 0, "this server does not call tools");
const zero = (why: string) => onlyHarmless((v) => v === 0, why);
const sampleOnly = "sampling takes temperature, top_p and seed only";
const COMMON = {
  model: string({ minLength: 1, maxLength: 1000 }),
  max_tokens: integer(1, U32 - 1).nullish(),
  temperature: number(0, 2).nullish(),
  top_p: number(0, 1, { minExclusive: true }).nullish(),
  seed: integer().nullish(),
  stop: z.union([
    string({ minLength: 1, maxLength: 1000 }),
    array(string({ minLength: 1, maxLength: 1000 }), { max: 4 }),
  ], says("a non-empty string, or an array with at most 4 items of non-empty strings")).nullish(),
  stream: z.boolean(says("true or false")).nullish(),
  stream_options: z.object(
    { include_usage: z.boolean(says("true or false")).optional() },
    says("a JSON object"),
  )
    .nullish(),
  n: onlyHarmless((v) => v === 1, "one choice per request (n = 1)"),
  presence_penalty: zero("penalties are not implemented"),
  frequency_penalty: zero("penalties are not implemented"),
  logit_bias: onlyHarmless(
    (v) => typeof v === "object" && v !== null && Object.keys(v).length === 0,
    "logit_bias is not implemented",
  ),
  top_k: onlyHarmless(() => false, sampleOnly),
  min_p: onlyHarmless(() => false, sampleOnly),
  repetition_penalty: onlyHarmless((v) => v === 1, "penalties are not implemented"),
  // Harmless here: accepted and ignored.
  user: string().optional(),
  store: z.boolean(says("true or false")).nullish(),
  metadata: z.object({}, says("a JSON object")).nullish(),
  service_tier: string().nullish(),
  // Extension: speculative decoding (docs/SPECULATIVE.md).
  speculate: integer(0, 16).nullish(),
};

const textPart = z.strictObject({ type: z.literal("text"), text: z.string() });
const content = z.union([
  string(),
  z.array(z.object({ type: string(), text: string().optional() }, says("a JSON object")), says("an array")),
], says("a string, or an array of content parts"));

const message = z.strictObject({
  role: oneOf("system", "developer", "user", "assistant"),
  content: content.nullish(),
  name: string().optional(),
  tool_calls: noTools,
  refusal: string().nullish(),
}, says("a JSON object"));

const chatBody = z.strictObject({
  ...COMMON,
  messages: array(message, { min: 1 }),
  max_completion_tokens: integer(1, U32 - 1).nullish(),
  logprobs: onlyHarmless((v) => v === false, "logprobs are not returned"),
  top_logprobs: onlyHarmless(() => false, "logprobs are not returned"),
  tools: noTools,
  tool_choice: onlyHarmless((v) => v === "none", "this server does not call tools"),
  functions: noTools,
  function_call: onlyHarmless((v) => v === "none", "this server does not call tools"),
  parallel_tool_calls: z.boolean(says("true or false")).nullish(),
  response_format: onlyHarmless(
    (v) => (v as { type?: unknown })?.type === "text",
    "only plain text responses (no JSON mode or schema)",
  ),
  modalities: onlyHarmless((v) => Array.isArray(v) && v.length === 1 && v[0] === "text", "text only"),
  audio: onlyHarmless(() => false, "text only"),
  reasoning_effort: string().nullish(),
}, says("a JSON object"));

const tokenId = integer(0, U32 - 1);
const completionBody = z.strictObject({
  ...COMMON,
  prompt: z.union(
    [
      string(),
      array(string(), { min: 1, max: 1 }),
      array(tokenId, { min: 1 }),
      array(array(tokenId, { min: 1 }), { min: 1, max: 1 }),
    ],
    says(
      "a string, or an array of one string, or an array of token ids, or an array of one array of token ids",
    ),
  ),
  logprobs: onlyHarmless((v) => v === 0, "logprobs are not returned"),
  echo: onlyHarmless((v) => v === false, "the prompt is not echoed"),
  suffix: onlyHarmless((v) => v === "", "no insertion (suffix)"),
  best_of: onlyHarmless((v) => v === 1, "one choice per request (best_of = 1)"),
}, says("a JSON object"));

type Common = z.output<typeof chatBody> | z.output<typeof completionBody>;

function common(b: Common, maxTokens: number | undefined): Omit<CompletionJob, "kind" | "prompt"> {
  const seed = b.seed ?? Math.floor(Math.random() * U32);
  return {
    model: b.model,
    maxTokens,
    sampling: {
      temperature: b.temperature ?? 1,
      topP: b.top_p ?? 1,
      // OpenAI seeds are 64-bit integers; the sampler takes 32 bits.
      seed: ((seed % U32) + U32) % U32,
    },
    stop: b.stop == null ? [] : typeof b.stop === "string" ? [b.stop] : b.stop,
    stream: b.stream ?? false,
    includeUsage: b.stream_options?.include_usage ?? false,
    speculate: b.speculate ?? undefined,
  };
}

function show(v: unknown): string {
  const text = JSON.stringify(v) ?? String(v);
  return text.length > 40 ? text.slice(0, 40) + "..." : text;
}

/** A zod path as OpenAI's `param` names a field: `messages[2].content`. */
function pathOf(path: readonly PropertyKey[]): string {
  return path.map((k, i) => typeof k === "number" ? `[${k}]` : `${i ? "." : ""}${String(k)}`).join("");
}

/** Parses a body with its schema, turning the first problem into OpenAI's 400 naming the field. */
function parseBody<S extends z.ZodType>(s: S, body: unknown): z.output<S> {
  const r = s.safeParse(body, { reportInput: true });
  if (r.success) return r.data;
  const issue = r.error.issues[0];
  const param = pathOf(issue.path);
  if (issue.code === "unrecognized_keys") {
    const field = (param ? `${param}.${issue.keys[0]}` : issue.keys[0]).slice(0, 60);
    throw badRequest(`Unrecognized request argument supplied: ${field}`, field, "unrecognized_argument");
  }
  if (issue.code === "custom") {
    throw badRequest(`${param} is not supported: ${issue.message}`, param, "unsupported_parameter");
  }
  const where = param || "the body";
  const input = (issue as { input?: unknown }).input;
  throw badRequest(
    input === undefined
      ? `${where} is required (${issue.message})`
      : `${where} must be ${issue.message}, got ${show(input)}`,
    param || null,
  );
}

export function parseChatRequest(body: unknown): CompletionJob {
  const b = parseBody(chatBody, body);
  const messages = b.messages.map((m, i): ChatMessage => {
    const path = `messages[${i}].content`;
    let text: string;
    if (m.content == null) throw badRequest(`${path} is required (a string)`, path);
    if (typeof m.content === "string") text = m.content;
    else {
      text = m.content.map((p, j) => {
        const part = textPart.safeParse(p);
        if (part.success) return part.data.text;
        throw badRequest(
          `${path}[${j}] must be a text part ({"type": "text", "text": ...}): only text is supported`,
          `${path}[${j}]`,
        );
      }).join("");
    }
    return { role: m.role === "developer" ? "system" : m.role, content: text };
  });
  return {
    kind: "chat",
    prompt: { messages },
    ...common(b, b.max_completion_tokens ?? b.max_tokens ?? undefined),
  };
}

export function parseCompletionRequest(body: unknown): CompletionJob {
  const batch = (body as { prompt?: unknown } | null)?.prompt;
  if (Array.isArray(batch) && batch.length > 1 && typeof batch[0] !== "number") {
    throw badRequest(
      `prompt holds ${batch.length} prompts: this server takes one prompt per request`,
      "prompt",
      "unsupported_parameter",
    );
  }
  const b = parseBody(completionBody, body);
  const p = b.prompt;
  const prompt = typeof p === "string"
    ? { text: p }
    : typeof p[0] === "string"
    ? { text: p[0] }
    : typeof p[0] === "number"
    ? { tokens: p as number[] }
    : { tokens: (p as number[][])[0] };
  return { kind: "completion", prompt, ...common(b, b.max_tokens ?? undefined) };
}
