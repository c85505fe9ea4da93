// The OpenAI server's services over a node's pipeline: ready only on a chain seen ready, generation on that
// chain through the pipeline's client, and a newer Plan's chain checked before it is served.
import assert from "node:assert/strict";
import { KvBudget } from "../../../node/api/kv_budget.ts";
import { pipelineServing } from "../../../node/serving/mod.ts";
import type { Chain, PipelineNode, RequestOptions } from "../../../node/stage/mod.ts";
import { fakeServices } from "./fakes.ts";

function fakePipeline() {
  let version = 1;
  let release: ((c: Chain) => void) | undefined;
  const generated: Chain[] = [];
  const p = {
    chain: () => ({ version, nodes: ["a", "b"] }),
    waitReady: () => new Promise<Chain>((r) => (release = r)),
    client: {
      generate: (c: Chain, _ids: number[], _o: RequestOptions) => {
        generated.push(c);
        return Promise.resolve({ tokens: [5], stopReason: "eos", events: [], firstTokenMs: 1, tokS: 0 });
      },
    },
    board: { current: undefined },
    stageReports: () => Promise.resolve([]),
  } as unknown as PipelineNode;
  return {
    p,
    generated,
    setVersion: (v: number) => (version = v),
    finishLoading: () => release?.({ version, nodes: ["a", "b"] }),
  };
}

Deno.test("pipeline services: not ready while loading; then generation runs on the ready chain", async () => {
  const f = fakePipeline();
  const seen: { readyVersion?: number } = {};
  const s = pipelineServing({
    model: fakeServices().services.model,
    pipeline: () => f.p,
    readyVersion: () => seen.readyVersion,
    budget: new KvBudget(() => 100),
    self: () => "a",
    members: () => [],
  });
  assert.deepEqual(s.ready(), { ready: false, why: "the model is loading" });
  await assert.rejects(s.generate([1], {}), /loading/);
  seen.readyVersion = 1;
  assert.deepEqual(s.ready(), { ready: true });
  await s.generate([1], {});
  assert.deepEqual(f.generated, [{ version: 1, nodes: ["a", "b"] }]);
  // A newer Plan: not served until its chain is seen ready.
  f.setVersion(2);
  assert.equal(s.ready().ready, false);
  assert.match((s.ready() as { why: string }).why, /plan v2/);
  f.finishLoading();
  await new Promise((r) => setTimeout(r, 0));
  assert.deepEqual(s.ready(), { ready: true });
  await s.generate([1], {});
  assert.equal(f.generated.at(-1)!.version, 2);
});

Deno.test("pipeline services: requests speculate with the server's drafter unless they say 0; 400 without one", async () => {
  const f = fakePipeline();
  const calls: { k: number; depth: number; auto?: boolean }[] = [];
  let closed = 0;
  (f.p.client as unknown as Record<string, unknown>).speculate = (
    _c: Chain,
    _ids: number[],
    o: { k: number; depth: number; auto?: boolean },
  ) => {
    calls.push({ k: o.k, depth: o.depth, auto: o.auto });
    return Promise.resolve({ tokens: [5], stopReason: "eos", events: [], firstTokenMs: 1, tokS: 0 });
  };
  const base = {
    model: fakeServices().services.model,
    pipeline: () => f.p,
    readyVersion: () => 1,
    budget: new KvBudget(() => 100),
    self: () => "a",
    members: () => [],
  };
  const drafter = () => ({ kind: "ngram", draft: () => Promise.resolve([]), close: () => void closed++ });
  const s = pipelineServing({
    ...base,
    speculation: { drafter, draft: "ngram", k: 4, depth: 2, auto: true },
  });
  await s.generate([1], {});
  await s.generate([1], { speculate: 6 });
  await s.generate([1], { speculate: 0 });
  assert.deepEqual(calls, [{ k: 4, depth: 2, auto: true }, { k: 6, depth: 2, auto: false }]);
  assert.equal(f.generated.length, 1, "speculate 0: plain generation");
  assert.equal(closed, 2, "each request's drafter is closed");
  const plain = pipelineServing(base);
  await plain.generate([1], {});
  await assert.rejects(plain.generate([1], { speculate: 4 }), /no drafter/);
});

Deno.test("the OpenAI extension field speculate: 0..16, absent means the server's default", async () => {
  const { parseCompletionRequest, parseChatRequest } = await import("../../../node/serving/mod.ts");
  assert.equal(parseCompletionRequest({ model: "m", prompt: "x", speculate: 3 }).speculate, 3);
  assert.equal(parseCompletionRequest({ model: "m", prompt: "x" }).speculate, undefined);
  assert.equal(
    parseChatRequest({ model: "m", messages: [{ role: "user", content: "x" }], speculate: 0 }).speculate,
    0,
  );
  assert.throws(() => parseCompletionRequest({ model: "m", prompt: "x", speculate: 17 }), /speculate/);
  assert.throws(() => parseCompletionRequest({ model: "m", prompt: "x", speculate: 1.5 }), /speculate/);
});
