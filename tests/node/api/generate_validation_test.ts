// POST /generate refuses what it cannot run before anything starts (issue 11, item 12): a body that is
// not an object, token ids outside the vocabulary or the wire's 32 bits, maxTokens 0, a bad eos or wire,
// unknown fields, a body over the size limit; and it admits requests against the node's KV budget (the
// Plan's context): one larger than the budget is 400, one that does not fit beside those in flight 503.
import assert from "node:assert/strict";
import { createApp, GENERATE_BODY_LIMIT, parseGenerateRequest } from "../../../node/api/mod.ts";
import type { Chain, PipelineNode, RequestOptions } from "../../../node/stage/mod.ts";

const CHAIN: Chain = { version: 1, nodes: ["aa"] };
const AUTH = { authorization: "Bearer t" };

/** A pipeline whose requests run until `finish()`; its Plan has `plan`'s fields. */
function fakePipeline(plan: Record<string, unknown> = {}) {
  const seen: { tokens: number[]; opts: RequestOptions }[] = [];
  const running: (() => void)[] = [];
  const p = {
    board: { current: { plan: { stages: [], ...plan } } },
    waitReady: () => Promise.resolve(CHAIN),
    client: {
      generate(_chain: Chain, tokens: number[], opts: RequestOptions) {
        seen.push({ tokens, opts });
        return new Promise((resolve) =>
          running.push(() =>
            resolve({ tokens: [], events: [], stopReason: "max_tokens", firstTokenMs: 1, tokS: 0 })
          )
        );
      },
    },
  } as unknown as PipelineNode;
  return { p, seen, finishAll: () => running.splice(0).forEach((f) => f()) };
}

function appOf(p: PipelineNode) {
  return createApp({
    self: () => "aa",
    members: () => [],
    registry: () => [],
    plan: () => null,
    down: () => {},
    pipeline: () => p,
  }, { token: "t" });
}

function post(body: string): RequestInit {
  return { method: "POST", headers: { "content-type": "application/json", ...AUTH }, body };
}

async function refused(body: string, status: number, error: RegExp, plan?: Record<string, unknown>) {
  const { p, seen } = fakePipeline(plan);
  const res = await appOf(p).request("/generate", post(body));
  assert.equal(res.status, status, body.slice(0, 80));
  assert.match((await res.json()).error, error);
  assert.equal(seen.length, 0, "nothing was started");
}

Deno.test("generate: a body that is not a request is 400 naming the field, and nothing starts", async () => {
  await refused("null", 400, /the body must be a JSON object, got null/);
  await refused("[1,2]", 400, /must be a JSON object/);
  await refused("{", 400, /must be JSON/);
  await refused('{"tokens":[]}', 400, /tokens must be a non-empty array/);
  await refused('{"tokens":[4294967297]}', 400, /tokens\[0\] must be an integer in \[0, 4294967295\]/);
  await refused('{"tokens":[1, 2.5]}', 400, /tokens\[1\]/);
  await refused('{"tokens":[600]}', 400, /tokens\[0\] must be an integer in \[0, 511\]/, {
    model: { vocab: 512 },
  });
  await refused('{"tokens":[1],"maxTokens":0}', 400, /maxTokens must be an integer in \[1,/);
  await refused('{"tokens":[1],"eos":"2"}', 400, /eos must be an array/);
  await refused('{"tokens":[1],"eos":[-1]}', 400, /eos\[0\]/);
  await refused('{"tokens":[1],"wire":"f8"}', 400, /wire must be "f16" or "f32"/);
  await refused('{"tokens":[1],"sampling":{"temperature":-1}}', 400, /sampling\.temperature/);
  await refused('{"tokens":[1],"sampling":{"topP":0}}', 400, /sampling\.topP/);
  await refused('{"tokens":[1],"sampling":{"tempreature":1}}', 400, /unknown field sampling\.tempreature/);
  await refused('{"tokens":[1],"max_tokens":5}', 400, /unknown field max_tokens/);
});

Deno.test("generate: a body over the limit is 413, not read whole", async () => {
  const big = `{"tokens":[${"1,".repeat(GENERATE_BODY_LIMIT / 2)}1]}`;
  await refused(big, 413, /larger than/);
});

Deno.test("generate: defaults and the checked values reach the chain", () => {
  assert.deepEqual(parseGenerateRequest({ tokens: [3] }, { vocab: 10 }), {
    tokens: [3],
    maxTokens: 64,
    sampling: { temperature: 0, topP: 1, seed: 0 },
    eos: [],
  }, "no wire: the chain's (`up --wire`) applies");
  assert.deepEqual(
    parseGenerateRequest({ tokens: [3], sampling: { temperature: 0.7 }, wire: "f32", eos: [2] }, {
      vocab: 10,
    })
      .sampling,
    { temperature: 0.7, topP: 1, seed: 0 },
  );
});

Deno.test("generate: requests are admitted against the KV budget (the Plan's context)", async () => {
  const { p, seen, finishAll } = fakePipeline({ context: 100 });
  const app = appOf(p);
  const ask = (tokens: number, maxTokens: number) =>
    app.request("/generate", post(JSON.stringify({ tokens: Array(tokens).fill(1), maxTokens })));
  // Larger than the whole budget: never runnable here.
  const huge = await ask(50, 60);
  assert.equal(huge.status, 400);
  assert.match((await huge.json()).error, /needs 110 KV positions; this node's budget is 100/);
  // Two that fit, then one that does not fit beside them: refused at once.
  const a = await ask(20, 40);
  const b = await ask(10, 20);
  assert.deepEqual([a.status, b.status], [200, 200]);
  const c = await ask(10, 20);
  assert.equal(c.status, 503);
  assert.match((await c.json()).error, /KV budget exhausted: 2 request\(s\) in flight hold 90 of 100/);
  assert.equal(seen.length, 2);
  // Once they end, their positions are free again.
  finishAll();
  await a.text();
  await b.text();
  const d = await ask(10, 20);
  assert.equal(d.status, 200);
  finishAll();
  await d.text();
});
