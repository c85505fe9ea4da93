// The OpenAI server through app.request() over fakes (fakes.ts): response and chunk shapes, stop
// conditions, usage, errors in OpenAI's body with their statuses, the API key, the queue, cancellation,
// /metrics and the dashboard's feed.
import assert from "node:assert/strict";
import { Activity, createServingApp, type ServingOptions } from "../../../node/serving/mod.ts";
import { parsePrometheus, sampleValue } from "../../support/prometheus_text.ts";
import { BOS, charTokenizer, EOS, EOT, fakeServices, sseData } from "./fakes.ts";
import { chatTemplate, TemplateEngineMissingError } from "../../../models/chat_template.ts";

function app(f = fakeServices(), opts: Partial<ServingOptions> = {}) {
  const activity = new Activity();
  return { f, activity, app: createServingApp(f.services, { loopback: true, activity, ...opts }) };
}

function post(body: unknown, headers: Record<string, string> = {}): RequestInit {
  return {
    method: "POST",
    headers: { "content-type": "application/json", ...headers },
    body: typeof body === "string" ? body : JSON.stringify(body),
  };
}

async function errorOf(res: Response, status: number) {
  assert.equal(res.status, status);
  const body = await res.json();
  assert.deepEqual(Object.keys(body), ["error"]);
  assert.deepEqual(Object.keys(body.error).sort(), ["code", "message", "param", "type"]);
  assert.equal(typeof body.error.message, "string");
  return body.error as { message: string; type: string; param: string | null; code: string | null };
}

Deno.test("models: the served model is listed and found by id; another id is a 404", async () => {
  const { app: a } = app();
  const list = await (await a.request("/v1/models")).json();
  assert.deepEqual(list, {
    object: "list",
    data: [{ id: "tiny", object: "model", created: 1_700_000_000, owned_by: "swactor" }],
  });
  assert.equal((await (await a.request("/v1/models/tiny")).json()).id, "tiny");
  const e = await errorOf(await a.request("/v1/models/gpt-4"), 404);
  assert.equal(e.code, "model_not_found");
});

Deno.test("completions: text, usage and finish_reason length; the prompt is tokenized with BOS", async () => {
  const { app: a, f } = app();
  const res = await a.request(
    "/v1/completions",
    post({ model: "tiny", prompt: "Hi", max_tokens: 5, temperature: 0, seed: 7 }),
  );
  assert.equal(res.status, 200);
  const body = await res.json();
  assert.equal(body.object, "text_completion");
  assert.match(body.id, /^cmpl-/);
  assert.equal(body.model, "tiny");
  assert.deepEqual(body.choices, [{ index: 0, text: "Hello", logprobs: null, finish_reason: "length" }]);
  assert.deepEqual(body.usage, { prompt_tokens: 3, completion_tokens: 5, total_tokens: 8 });
  assert.deepEqual(f.calls[0].prompt, charTokenizer.encode("Hi"));
  assert.equal(f.calls[0].opts.maxTokens, 5);
  assert.deepEqual(f.calls[0].opts.sampling, { temperature: 0, topP: 1, seed: 7 });
  assert.deepEqual(f.calls[0].opts.eos, [EOS]);
});

Deno.test("completions: the model's EOS ends with finish_reason stop; the EOS adds no text", async () => {
  const { app: a } = app(fakeServices({ reply: "ok" }));
  const body =
    await (await a.request("/v1/completions", post({ model: "tiny", prompt: "x", max_tokens: 50 }))).json();
  assert.equal(body.choices[0].text, "ok");
  assert.equal(body.choices[0].finish_reason, "stop");
  assert.equal(body.usage.completion_tokens, 3, "two characters and the EOS");
});

Deno.test("completions: a prompt of token ids, the model's folder as its name, the default of 16 tokens", async () => {
  const { app: a, f } = app();
  const res = await a.request("/v1/completions", post({ model: "/models/tiny", prompt: [BOS, 80, 81] }));
  assert.equal(res.status, 200);
  assert.deepEqual(f.calls[0].prompt, [BOS, 80, 81]);
  assert.equal(f.calls[0].opts.maxTokens, 16);
  assert.equal((await res.json()).choices[0].text, "Hello world. The");
});

Deno.test("stop strings: the text ends before the first stop string, which is left out, and generation stops", async () => {
  const { app: a, f } = app();
  const body = await (await a.request(
    "/v1/completions",
    post({ model: "tiny", prompt: "x", max_tokens: 50, stop: ["zzz", "d. T"] }),
  ))
    .json();
  assert.equal(body.choices[0].text, "Hello worl");
  assert.equal(body.choices[0].finish_reason, "stop");
  assert.equal(
    body.usage.completion_tokens,
    "Hello world. T".length,
    "tokens up to the one that completed the stop",
  );
  assert.equal(f.calls.length, 1);
  assert.equal(f.active(), 0, "the generation was stopped (the chain releases it)");
});

Deno.test("chat: the template renders the messages, end-of-turn is a stop token, the answer is a message", async () => {
  const { app: a, f } = app(fakeServices({ reply: "Sure." }));
  const res = await a.request(
    "/v1/chat/completions",
    post({
      model: "tiny",
      messages: [{ role: "developer", content: "Be brief." }, {
        role: "user",
        content: [{ type: "text", text: "Hi" }],
      }],
      max_completion_tokens: 30,
      user: "ignored",
    }),
  );
  assert.equal(res.status, 200);
  const body = await res.json();
  assert.equal(body.object, "chat.completion");
  assert.match(body.id, /^chatcmpl-/);
  assert.deepEqual(body.choices, [{
    index: 0,
    message: { role: "assistant", content: "Sure.", refusal: null },
    logprobs: null,
    finish_reason: "stop",
  }]);
  assert.deepEqual(
    f.calls[0].prompt,
    charTokenizer.encode("<bos>system: Be brief.<eot>user: Hi<eot>assistant: ", { special: false }),
    "rendered, with no second BOS",
  );
  assert.deepEqual(f.calls[0].opts.eos, [EOS, EOT]);
  assert.equal(f.calls[0].opts.maxTokens, 30);
  assert.deepEqual(body.usage, {
    prompt_tokens: f.calls[0].prompt.length,
    completion_tokens: 6,
    total_tokens: f.calls[0].prompt.length + 6,
  });
});

Deno.test("chat streaming: role first, then deltas that add up to the whole answer, finish, usage, [DONE]", async () => {
  const whole = await (await app().app.request(
    "/v1/chat/completions",
    post({ model: "tiny", messages: [{ role: "user", content: "Hi" }], max_tokens: 12 }),
  )).json();
  const res = await app().app.request(
    "/v1/chat/completions",
    post({
      model: "tiny",
      messages: [{ role: "user", content: "Hi" }],
      max_tokens: 12,
      stream: true,
      stream_options: { include_usage: true },
    }),
  );
  assert.equal(res.status, 200);
  assert.match(res.headers.get("content-type")!, /^text\/event-stream/);
  const data = await sseData(res.body!);
  assert.equal(data.at(-1), "[DONE]");
  const chunks = data.slice(0, -1).map((d) => JSON.parse(d));
  for (const c of chunks) {
    assert.equal(c.object, "chat.completion.chunk");
    assert.equal(c.id, chunks[0].id);
  }
  assert.deepEqual(chunks[0].choices[0].delta, { role: "assistant", content: "" });
  const usage = chunks.at(-1);
  assert.deepEqual(usage.choices, []);
  assert.deepEqual(usage.usage, whole.usage);
  const finish = chunks.at(-2);
  assert.deepEqual(finish.choices[0].delta, {});
  assert.equal(finish.choices[0].finish_reason, "length");
  const deltas = chunks.slice(1, -2);
  assert.ok(deltas.length > 1, "several deltas");
  for (const c of deltas) {
    assert.equal(c.choices[0].finish_reason, null);
    assert.equal(c.usage, null, "with include_usage, chunks before the last carry usage: null");
  }
  assert.equal(deltas.map((c) => c.choices[0].delta.content).join(""), whole.choices[0].message.content);
});

Deno.test("completions streaming: text chunks, a stop string held back across chunks, [DONE]", async () => {
  const res = await app().app.request(
    "/v1/completions",
    post({ model: "tiny", prompt: "x", max_tokens: 40, stop: "world", stream: true }),
  );
  const data = await sseData(res.body!);
  assert.equal(data.at(-1), "[DONE]");
  const chunks = data.slice(0, -1).map((d) => JSON.parse(d));
  assert.equal(chunks.map((c) => c.choices[0].text).join(""), "Hello ");
  assert.ok(chunks.every((c) => !c.choices[0].text.includes("w")), "no part of the stop string was sent");
  assert.equal(chunks.at(-1).choices[0].finish_reason, "stop");
  assert.equal(chunks[0].object, "text_completion");
});

Deno.test("bad requests: 400 with OpenAI's error body naming the field", async (t) => {
  const { app: a, f } = app();
  const cases: [string, unknown, RegExp, string | null][] = [
    ["/v1/completions", "{not json", /parse the JSON body/, null],
    ["/v1/completions", [1, 2], /the body must be a JSON object/, null],
    ["/v1/completions", { prompt: "x" }, /model is required/, "model"],
    ["/v1/completions", { model: "tiny" }, /prompt is required/, "prompt"],
    [
      "/v1/completions",
      { model: "tiny", prompt: "x", max_tokens: 0 },
      /max_tokens must be an integer/,
      "max_tokens",
    ],
    [
      "/v1/completions",
      { model: "tiny", prompt: "x", temperature: 3 },
      /temperature must be a number in \[0, 2\]/,
      "temperature",
    ],
    ["/v1/completions", { model: "tiny", prompt: "x", top_p: 0 }, /top_p/, "top_p"],
    ["/v1/completions", { model: "tiny", prompt: "x", stop: ["a", "b", "c", "d", "e"] }, /stop/, "stop"],
    ["/v1/completions", { model: "tiny", prompt: "x", n: 2 }, /n is not supported: one choice/, "n"],
    ["/v1/completions", { model: "tiny", prompt: "x", logprobs: 3 }, /logprobs is not supported/, "logprobs"],
    ["/v1/completions", { model: "tiny", prompt: "x", echo: true }, /echo is not supported/, "echo"],
    ["/v1/completions", { model: "tiny", prompt: ["a", "b"] }, /one prompt per request/, "prompt"],
    [
      "/v1/completions",
      { model: "tiny", prompt: [1, 70000] },
      /prompt\[1\] = 70000 is not a token id/,
      "prompt",
    ],
    [
      "/v1/completions",
      { model: "tiny", prompt: "x", frobnicate: 1 },
      /Unrecognized request argument supplied: frobnicate/,
      "frobnicate",
    ],
    [
      "/v1/chat/completions",
      { model: "tiny", messages: [] },
      /messages must be an array with at least 1 item/,
      "messages",
    ],
    [
      "/v1/chat/completions",
      { model: "tiny", messages: [{ role: "tool", content: "x" }] },
      /messages\[0\]\.role must be one of/,
      "messages[0].role",
    ],
    [
      "/v1/chat/completions",
      { model: "tiny", messages: [{ role: "user", content: "x" }], tools: [{ type: "function" }] },
      /tools is not supported/,
      "tools",
    ],
    [
      "/v1/chat/completions",
      { model: "tiny", messages: [{ role: "user", content: "x" }], logprobs: true },
      /logprobs is not supported/,
      "logprobs",
    ],
    [
      "/v1/chat/completions",
      { model: "tiny", messages: [{ role: "user", content: "x" }], response_format: { type: "json_object" } },
      /response_format is not supported/,
      "response_format",
    ],
    [
      "/v1/chat/completions",
      { model: "tiny", messages: [{ role: "user", content: [{ type: "image_url", image_url: {} }] }] },
      /only text/,
      "messages[0].content[0]",
    ],
    [
      "/v1/chat/completions",
      { model: "tiny", messages: [{ role: "assistant", content: "x" }] },
      /refused the messages: the user speaks first/,
      "messages",
    ],
  ];
  for (const [path, body, message, param] of cases) {
    await t.step(`${path} ${JSON.stringify(body).slice(0, 70)}`, async () => {
      const e = await errorOf(await a.request(path, post(body)), 400);
      assert.match(e.message, message);
      assert.equal(e.param, param);
      assert.equal(e.type, "invalid_request_error");
    });
  }
  assert.equal(f.calls.length, 0, "nothing bad reached the chain");
});

Deno.test("harmless fields are ignored: n = 1, penalties 0, empty tools, logprobs false, user, metadata", async () => {
  const { app: a } = app();
  const res = await a.request(
    "/v1/chat/completions",
    post({
      model: "tiny",
      messages: [{ role: "user", content: "x" }],
      n: 1,
      presence_penalty: 0,
      frequency_penalty: 0,
      tools: [],
      logprobs: false,
      user: "u",
      metadata: { a: "b" },
      stream: false,
      stop: null,
    }),
  );
  assert.equal(res.status, 200, await res.clone().text());
});

Deno.test("errors: unknown model 404, unknown route 404, no chat template 400, not ready 503 with Retry-After", async () => {
  const { app: a, f } = app();
  assert.equal(
    (await errorOf(await a.request("/v1/completions", post({ model: "gpt-4", prompt: "x" })), 404)).code,
    "model_not_found",
  );
  assert.match(
    (await errorOf(await a.request("/v1/embeddings", post({})), 404)).message,
    /Invalid URL \(POST \/v1\/embeddings\)/,
  );
  const noChat = app(fakeServices({ chat: false })).app;
  const e = await errorOf(
    await noChat.request(
      "/v1/chat/completions",
      post({ model: "tiny", messages: [{ role: "user", content: "x" }] }),
    ),
    400,
  );
  assert.match(e.message, /has no chat template/);
  assert.equal(
    (await noChat.request("/v1/completions", post({ model: "tiny", prompt: "x" }))).status,
    200,
    "completions still work",
  );
  f.setReady(false);
  const res = await a.request("/v1/completions", post({ model: "tiny", prompt: "x" }));
  assert.equal(res.headers.get("retry-after"), "5");
  assert.match((await errorOf(res, 503)).message, /loading/);
  assert.equal((await a.request("/health")).status, 503);
});

Deno.test("a model without a tokenizer: token-id prompts only (text prompts are a 400)", async () => {
  const { app: a } = app(fakeServices({ tokenizer: false }));
  assert.match(
    (await errorOf(await a.request("/v1/completions", post({ model: "tiny", prompt: "x" })), 400)).message,
    /no tokenizer/,
  );
  const body =
    await (await a.request("/v1/completions", post({ model: "tiny", prompt: [1, 2, 3], max_tokens: 3 })))
      .json();
  assert.equal(body.usage.completion_tokens, 3);
  assert.equal(body.choices[0].text, "");
});

Deno.test("413 for a body over the limit", async () => {
  const { app: a } = app(undefined, { bodyLimit: 100 });
  const e = await errorOf(
    await a.request("/v1/completions", post({ model: "tiny", prompt: "x".repeat(200) })),
    413,
  );
  assert.equal(e.code, "request_too_large");
});

Deno.test("API key: none 401, wrong 401, right 200; the dashboard's page is open, its feed is not", async () => {
  const { app: a } = app(undefined, { apiKey: "sekrit-key" });
  const body = { model: "tiny", prompt: "x", max_tokens: 1 };
  assert.equal((await errorOf(await a.request("/v1/completions", post(body)), 401)).code, "missing_api_key");
  assert.equal(
    (await errorOf(await a.request("/v1/completions", post(body, { authorization: "Bearer nope" })), 401))
      .code,
    "invalid_api_key",
  );
  assert.equal(
    (await a.request("/v1/completions", post(body, { authorization: "Bearer sekrit-key" }))).status,
    200,
  );
  assert.equal((await a.request("/v1/models")).status, 401);
  assert.equal((await a.request("/metrics")).status, 401);
  assert.equal((await a.request("/events")).status, 401);
  assert.equal((await a.request("/")).status, 200);
});

Deno.test("guard: a rebound Host on loopback and another site's Origin are refused", async () => {
  const { app: a } = app();
  assert.equal((await a.request("http://evil.example/v1/models")).status, 403);
  assert.equal(
    (await a.request("http://127.0.0.1/v1/models", { headers: { origin: "http://evil.example" } })).status,
    403,
  );
  assert.equal(
    (await a.request("http://127.0.0.1/v1/models", { headers: { origin: "http://127.0.0.1" } })).status,
    200,
  );
  const open = app(undefined, { loopback: false, apiKey: "sekrit-key" }).app;
  const res = await open.request("http://my.host.example/v1/models", {
    headers: { authorization: "Bearer sekrit-key" },
  });
  assert.equal(res.status, 200, "off loopback, any Host (the key guards it)");
});

Deno.test("queue: requests beyond the slots wait; beyond the queue: 429 with Retry-After; larger than the context: 400", async () => {
  const f = fakeServices({ gapMs: 20 });
  const { app: a } = app(f, { concurrency: 1, queue: 1 });
  const req = () => a.request("/v1/completions", post({ model: "tiny", prompt: "x", max_tokens: 3 }));
  const first = req();
  const second = req();
  await new Promise((r) => setTimeout(r, 5));
  const third = await req();
  assert.equal(third.headers.get("retry-after"), "1");
  assert.equal((await errorOf(third, 429)).code, "queue_full");
  assert.equal((await first).status, 200);
  assert.equal((await second).status, 200, "the waiting request ran once the first finished");
  const big = await a.request("/v1/completions", post({ model: "tiny", prompt: "x", max_tokens: 5000 }));
  assert.equal((await errorOf(big, 400)).code, "context_length_exceeded");
});

Deno.test("cancel: a client that stops reading mid-stream aborts the generation and frees its slot", async () => {
  const f = fakeServices({ gapMs: 5, hold: true });
  const { app: a, activity } = app(f, { concurrency: 1 });
  const res = await a.request(
    "/v1/completions",
    post({ model: "tiny", prompt: "x", max_tokens: 50, stream: true }),
  );
  const reader = res.body!.getReader();
  await reader.read();
  await reader.read();
  assert.equal(f.active(), 1);
  await reader.cancel();
  for (let i = 0; i < 50 && f.active() > 0; i++) await new Promise((r) => setTimeout(r, 10));
  assert.equal(f.active(), 0, "the generation was aborted");
  assert.match(String((f.aborted[0] as Error).message), /went away/);
  assert.equal(f.services.budget.held.tokens, 0, "its KV reservation is released");
  assert.equal(activity.recent()[0].finish, "cancelled");
  const m = parsePrometheus(await (await a.request("/metrics")).text());
  assert.equal(sampleValue(m, "swactor_requests_running"), 0, "the slot is free again");
});

Deno.test("metrics: Prometheus text with requests, tokens, latency histograms, hop wire time, members, KV", async () => {
  const { app: a } = app();
  await (await a.request("/v1/completions", post({ model: "tiny", prompt: "Hi", max_tokens: 4 }))).json();
  await a.request("/v1/completions", post({ model: "nope", prompt: "Hi" }));
  const res = await a.request("/metrics");
  assert.match(res.headers.get("content-type")!, /^text\/plain; version=0\.0\.4/);
  const m = parsePrometheus(await res.text());
  assert.equal(sampleValue(m, "swactor_requests_total", { route: "/v1/completions", status: "200" }), 1);
  assert.equal(sampleValue(m, "swactor_requests_total", { route: "/v1/completions", status: "404" }), 1);
  assert.equal(sampleValue(m, "swactor_prompt_tokens_total"), 3);
  assert.equal(sampleValue(m, "swactor_generation_tokens_total"), 4);
  assert.equal(sampleValue(m, "swactor_time_to_first_token_seconds_count"), 1);
  assert.equal(sampleValue(m, "swactor_time_per_output_token_seconds_count"), 3);
  assert.equal(sampleValue(m, "swactor_hop_wire_seconds_count", { hop: "0->1" }), 4);
  assert.equal(
    sampleValue(m, "swactor_hop_wire_seconds_count", { hop: "1->0" }),
    3,
    "the first token has no return hop",
  );
  assert.equal(sampleValue(m, "swactor_stage_compute_seconds_count", { stage: "1" }), 4);
  assert.equal(sampleValue(m, "swactor_members", { state: "alive" }), 2);
  assert.equal(sampleValue(m, "swactor_members", { state: "dead" }), 1);
  assert.equal(sampleValue(m, "swactor_stage_kv_bytes", { stage: "0" }), 0);
  assert.equal(sampleValue(m, "swactor_stage_spare_bytes", { stage: "0" }), 0);
  assert.equal(sampleValue(m, "swactor_stage_active_requests", { stage: "1" }), 0);
  assert.equal(sampleValue(m, "swactor_model_ready"), 1);
  assert.equal(m.get("swactor_time_to_first_token_seconds")!.type, "histogram");
});

Deno.test("dashboard: the page, and a feed of snapshots with members, stages, tok/s and recent requests", async () => {
  const { app: a } = app(undefined, { snapshotMs: 10 });
  const page = await a.request("/");
  assert.match(page.headers.get("content-type")!, /text\/html/);
  const html = await page.text();
  for (const id of ["members", "stages", "tok-s", "chart", "recent"]) {
    assert.ok(html.includes(`id="${id}"`), id);
  }
  await (await a.request("/v1/completions", post({ model: "tiny", prompt: "Hi", max_tokens: 4 }))).json();
  const res = await a.request("/events");
  assert.match(res.headers.get("content-type")!, /^text\/event-stream/);
  const reader = res.body!.pipeThrough(new TextDecoderStream()).getReader();
  let text = "";
  while (!text.includes("\n\n")) text += (await reader.read()).value;
  await reader.cancel();
  assert.match(text, /^event: snapshot\ndata: /);
  const snap = JSON.parse(text.split("\n")[1].slice(6));
  assert.equal(snap.model, "tiny");
  assert.equal(snap.ready, true);
  assert.deepEqual(snap.members.map((m: { id: string }) => m.id), ["node-a", "node-b", "node-c"]);
  assert.equal(snap.stages.length, 2);
  assert.equal(snap.recent[0].completionTokens, 4);
  assert.deepEqual(snap.recent[0].tokens[1], { computeMs: [0.5, 0.25], wireMs: [0.125, 0.0625] });
  assert.ok(snap.tokS > 0, "the tokens just generated count in the live rate");
});

Deno.test("chat without a template engine installed: 500 naming the package; completions unaffected", async () => {
  const f = fakeServices();
  f.services.model.chat = chatTemplate("x", {
    source: "test",
    bosToken: "",
    eosToken: "",
    engine: () =>
      Promise.reject(new TemplateEngineMissingError("rendering chat templates needs @huggingface/jinja")),
  });
  const { app: a } = app(f);
  const e = await errorOf(
    await a.request(
      "/v1/chat/completions",
      post({ model: "tiny", messages: [{ role: "user", content: "x" }] }),
    ),
    500,
  );
  assert.match(e.message, /@huggingface\/jinja/);
  assert.equal(e.type, "server_error");
  assert.equal((await a.request("/v1/completions", post({ model: "tiny", prompt: "x" }))).status, 200);
});
