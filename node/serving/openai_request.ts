// The bodies of `POST /v1/chat/completions` and `POST /v1/completions`, checked with the schemas of
// schema.ts and turned into one CompletionJob. What the fields mean follows OpenAI's API reference:
// supported: model, messages / prompt, max_tokens / max_completion_tokens, temperature, top_p, seed, stop,
// stream, stream_options.include_usage, n = 1. Fields that would change the result and are not supported
// (n > 1, logprobs, tools, penalties, logit_bias, JSON mode, echo, suffix, best_of > 1, top_k, ...) are
// refused with a 400 that names them; fields that change nothing here (user, store, metadata, ...) are
// ignored; any other field is refused as unrecognized, as OpenAI does.
import { badRequest } from "./errors.ts";
import {
  array,
  boolean,
  type Infer,
  integer,
  literal,
  number,
  object,
  optional,
  type Schema,
  SchemaError,
  string,
  union,
} from "./schema.ts";

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
function onlyHarmless(harmless: (v: unknown) => boolean, why: string): Schema<undefined> {
  return {
    expects: why,
    optional: true,
    parse(v, path = "") {
      if (v === undefined || v === null || harmless(v)) return undefined;
      throw new SchemaError(`${path} is not supported: ${why}`, path);
    },
  };
}

const noTools = onlyHarmless((v) => Array.isArray(v) && v.length === 0, "this server does not call tools");
const zero = (why: string) => onlyHarmless((v) => v === 0, why);
const COMMON = {
  model: string({ minLength: 1, maxLength: 1000 }),
  max_tokens: optional(integer({ min: 1, max: U32 - 1 }), { nullable: true }),
  temperature: optional(number({ min: 0, max: 2 }), { nullable: true }),
  top_p: optional(number({ min: 0, max: 1, minExclusive: true }), { nullable: true }),
  seed: optional(integer(), { nullable: true }),
  stop: optional(
    union(
      string({ minLength: 1, maxLength: 1000 }),
      array(string({ minLength: 1, maxLength: 1000 }), { max: 4 }),
    ),
    { nullable: true },
  ),
  stream: optional(boolean(), { nullable: true }),
  stream_options: optional(object({ include_usage: optional(boolean()) }, { unknown: "ignore" }), {
    nullable: true,
  }),
  n: onlyHarmless((v) => v === 1, "one choice per request (n = 1)"),
  presence_penalty: zero("penalties are not implemented"),
  frequency_penalty: zero("penalties are not implemented"),
  logit_bias: onlyHarmless(
    (v) => typeof v === "object" && v !== null && Object.keys(v).length === 0,
    "logit_bias is not implemented",
  ),
  top_k: onlyHarmless(() => false, "sampling takes temperature, top_p and seed only"),
  min_p: onlyHarmless(() => false, "sampling takes temperature, top_p and seed only"),
  repetition_penalty: onlyHarmless((v) => v === 1, "penalties are not implemented"),
  // Harmless here: accepted and ignored.
  user: optional(string()),
  store: optional(boolean(), { nullable: true }),
  metadata: optional(object({}, { unknown: "ignore" }), { nullable: true }),
  service_tier: optional(string(), { nullable: true }),
  // Extension: speculative decoding (docs/SPECULATIVE.md).
  speculate: optional(integer({ min: 0, max: 16 }), { nullable: true }),
};

const textPart = object({ type: literal("text"), text: string() });
const content = union(
  string(),
  array(
    object({ type: string(), text: optional(string()) }, {
      unknown: "ignore",
    }),
  ),
);

const message = object({
  role: literal("system", "developer", "user", "assistant"),
  content: optional(content, { nullable: true }),
  name: optional(string()),
  tool_calls: noTools,
  refusal: optional(string(), { nullable: true }),
});

const chatBody = object({
  ...COMMON,
  messages: array(message, { min: 1 }),
  max_completion_tokens: optional(integer({ min: 1, max: U32 - 1 }), { nullable: true }),
  logprobs: onlyHarmless((v) => v === false, "logprobs are not returned"),
  top_logprobs: onlyHarmless(() => false, "logprobs are not returned"),
  tools: noTools,
  tool_choice: onlyHarmless((v) => v === "none", "this server does not call tools"),
  functions: noTools,
  function_call: onlyHarmless((v) => v === "none", "this server does not call tools"),
  parallel_tool_calls: optional(boolean(), { nullable: true }),
  response_format: onlyHarmless(
    (v) => (v as { type?: unknown })?.type === "text",
    "only plain text responses (no JSON mode or schema)",
  ),
  modalities: onlyHarmless((v) => Array.isArray(v) && v.length === 1 && v[0] === "text", "text only"),
  audio: onlyHarmless(() => false, "text only"),
  reasoning_effort: optional(string(), { nullable: true }),
});

const completionBody = object({
  ...COMMON,
  prompt: union(
    string(),
    array(string(), { min: 1, max: 1 }),
    array(integer({ min: 0, max: U32 - 1 }), { min: 1 }),
    array(array(integer({ min: 0, max: U32 - 1 }), { min: 1 }), { min: 1, max: 1 }),
  ),
  logprobs: onlyHarmless((v) => v === 0, "logprobs are not returned"),
  echo: onlyHarmless((v) => v === false, "the prompt is not echoed"),
  suffix: onlyHarmless((v) => v === "", "no insertion (suffix)"),
  best_of: onlyHarmless((v) => v === 1, "one choice per request (best_of = 1)"),
});

type Common = Infer<typeof chatBody> | Infer<typeof completionBody>;

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
    stop: b.stop === undefined ? [] : typeof b.stop === "string" ? [b.stop] : b.stop,
    stream: b.stream ?? false,
    includeUsage: b.stream_options?.include_usage ?? false,
    speculate: b.speculate ?? undefined,
  };
}

/** Parses a schema, turning its error into OpenAI's 400 naming the field. */
function parseBody<T>(s: Schema<T>, body: unknown): T {
  try {
    return s.parse(body);
  } catch (e) {
    if (e instanceof SchemaError) {
      const unknownField = e.message.startsWith("unknown field");
      throw badRequest(
        unknownField ? `Unrecognized request argument supplied: ${e.param}` : e.message,
        e.param || null,
        unknownField
          ? "unrecognized_argument"
          : e.message.includes("is not supported")
          ? "unsupported_parameter"
          : null,
      );
    }
    throw e;
  }
}

export function parseChatRequest(body: unknown): CompletionJob {
  const b = parseBody(chatBody, body);
  const messages = b.messages.map((m, i): ChatMessage => {
    const path = `messages[${i}].content`;
    let text: string;
    if (m.content === undefined) throw badRequest(`${path} is required (a string)`, path);
    if (typeof m.content === "string") text = m.content;
    else {
      text = m.content.map((p, j) => {
        try {
          return textPart.parse(p, `${path}[${j}]`).text;
        } catch {
          throw badRequest(
            `${path}[${j}] must be a text part ({"type": "text", "text": ...}): only text is supported`,
            `${path}[${j}]`,
          );
        }
      }).join("");
    }
    return { role: m.role === "developer" ? "system" : m.role, content: text };
  });
  return { kind: "chat", prompt: { messages }, ...common(b, b.max_completion_tokens ?? b.max_tokens) };
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
  return { kind: "completion", prompt, ...common(b, b.max_tokens) };
}
