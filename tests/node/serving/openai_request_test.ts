// The OpenAI request bodies through their zod schemas: parsed values, and 400s that say what a field must be
// and name it by its path, as OpenAI's error body carries it in `param`.
import assert from "node:assert/strict";
import { parseChatRequest, parseCompletionRequest } from "../../../node/serving/openai_request.ts";
import { ApiError } from "../../../node/serving/errors.ts";

function refusal(parse: (b: unknown) => unknown, body: unknown): ApiError {
  try {
    parse(body);
  } catch (e) {
    assert.ok(e instanceof ApiError, String(e));
    assert.equal(e.status, 400);
    return e;
  }
  throw new Error(`accepted ${JSON.stringify(body)}`);
}

Deno.test("openai request: values parse into one job; null optional fields read as absent", () => {
  const chat = parseChatRequest({
    model: "m",
    messages: [
      { role: "developer", content: "be brief" },
      { role: "user", content: [{ type: "text", text: "a" }, { type: "text", text: "b" }] },
    ],
    max_tokens: 5,
    max_completion_tokens: null,
    temperature: null,
    stop: "x",
    stream_options: null,
    seed: 2 ** 33 + 7,
  });
  assert.deepEqual(chat.prompt, {
    messages: [{ role: "system", content: "be brief" }, { role: "user", content: "ab" }],
  });
  assert.equal(chat.maxTokens, 5);
  assert.deepEqual(chat.stop, ["x"]);
  assert.equal(chat.sampling.temperature, 1);
  assert.equal(chat.sampling.seed, 7, "64-bit seeds taken mod 2^32");
  assert.equal(chat.includeUsage, false);
  const completion = parseCompletionRequest({ model: "m", prompt: [[1, 2]], n: 1, echo: false, stop: null });
  assert.deepEqual(completion.prompt, { tokens: [1, 2] });
  assert.deepEqual(completion.stop, []);
  assert.equal(completion.maxTokens, undefined);
});

Deno.test("openai request: a 400 says what the field must be and names it by its path", () => {
  const msg = [{ role: "user", content: "x" }];
  const cases: [(b: unknown) => unknown, unknown, string | null, RegExp][] = [
    [parseCompletionRequest, "x", null, /^the body must be a JSON object, got "x"$/],
    [parseCompletionRequest, { model: "", prompt: "x" }, "model", /model must be a non-empty string/],
    [
      parseCompletionRequest,
      { model: "m", prompt: "x", seed: 1.5 },
      "seed",
      /seed must be an integer, got 1.5/,
    ],
    [
      parseCompletionRequest,
      { model: "m", prompt: "x", stop: ["a", "b", "c", "d", "e"] },
      "stop",
      /stop must be a non-empty string, or an array with at most 4 items/,
    ],
    [
      parseChatRequest,
      { model: "m", messages: msg, stream_options: { include_usage: "yes" } },
      "stream_options.include_usage",
      /stream_options\.include_usage must be true or false, got "yes"/,
    ],
    [
      parseChatRequest,
      { model: "m", messages: [...msg, { role: "robot", content: "x" }] },
      "messages[1].role",
      /messages\[1\]\.role must be one of "system", "developer", "user", "assistant", got "robot"/,
    ],
    [
      parseChatRequest,
      { model: "m", messages: [{ role: "user", content: "x", mood: "glad" }] },
      "messages[0].mood",
      /Unrecognized request argument supplied: messages\[0\]\.mood/,
    ],
    [parseChatRequest, { model: "m", messages: [{ role: "user" }] }, "messages[0].content", /is required/],
    [parseChatRequest, { model: "m", messages: msg, top_k: 4 }, "top_k", /top_k is not supported: sampling/],
    [
      parseCompletionRequest,
      { model: "m", prompt: [1, -2] },
      "prompt[1]",
      /prompt\[1\] must be an integer in \[0, 4294967295\], got -2/,
    ],
    [parseCompletionRequest, { model: "m", prompt: "x", speculate: 17 }, "speculate", /in \[0, 16\], got 17/],
  ];
  for (const [parse, body, param, message] of cases) {
    const e = refusal(parse, body);
    assert.equal(e.body.error.param, param, JSON.stringify(body));
    assert.match(e.body.error.message, message);
  }
});
