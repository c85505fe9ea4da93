// POST /generate with speculation (docs/SPECULATIVE.md): the node's drafter runs the request through the
// client's speculate; a request for speculation without a drafter, with another drafter than the node's,
// or with bad values is 400 before anything starts; the outcome line carries the figures.
import assert from "node:assert/strict";
import { createApp, readGenerateLines } from "../../../node/api/mod.ts";
import type { Chain, PipelineNode } from "../../../node/stage/mod.ts";
import type { SpeculationSource } from "../../../node/stage/speculative.ts";

const CHAIN: Chain = { version: 1, nodes: ["aa"] };

function setup(speculation?: SpeculationSource) {
  const calls: { kind: string; k?: number; depth?: number; auto?: boolean }[] = [];
  const outcome = { tokens: [7, 8], events: [], stopReason: "max_tokens", firstTokenMs: 1, tokS: 0 };
  const p = {
    board: { current: { plan: { stages: [] } } },
    waitReady: () => Promise.resolve(CHAIN),
    client: {
      generate: () => {
        calls.push({ kind: "plain" });
        return Promise.resolve(outcome);
      },
      speculate: (_c: Chain, _t: number[], o: { k: number; depth: number; auto?: boolean }) => {
        calls.push({ kind: "speculate", k: o.k, depth: o.depth, auto: o.auto });
        return Promise.resolve({
          ...outcome,
          stats: { trips: 2, drafted: 4, acceptedDrafts: 3, rejections: 1, cancelled: 0 },
          trips: [{ drafted: 4 }, { drafted: 0 }],
        });
      },
    },
  } as unknown as PipelineNode;
  const app = createApp({
    self: () => "aa",
    members: () => [],
    registry: () => [],
    plan: () => null,
    down: () => {},
    pipeline: () => p,
  }, { token: "t", speculation });
  const post = (body: unknown) =>
    app.request("/generate", {
      method: "POST",
      headers: { "content-type": "application/json", authorization: "Bearer t" },
      body: JSON.stringify(body),
    });
  return { calls, post };
}

const source = (closed: { n: number }): SpeculationSource => ({
  drafter: () => ({ kind: "ngram", draft: () => Promise.resolve([]), close: () => void closed.n++ }),
  draft: "ngram",
  k: 4,
  depth: 2,
});

Deno.test("POST /generate speculate: the node's drafter, k and depth as asked, figures in the outcome", async () => {
  const closed = { n: 0 };
  const { calls, post } = setup(source(closed));
  const res = await post({ tokens: [1, 2], maxTokens: 2, speculate: 3, draft: "ngram" });
  assert.equal(res.status, 200);
  const lines = [];
  for await (const l of readGenerateLines(res.body!)) lines.push(l);
  const done = lines.at(-1) as { done: { speculation?: { trips: number; chosenK: number[] } } };
  assert.equal(done.done.speculation?.trips, 2);
  assert.deepEqual(done.done.speculation?.chosenK, [4, 0]);
  await (await post({ tokens: [1], speculate: "auto", speculateDepth: 3 })).text();
  await (await post({ tokens: [1] })).text();
  assert.deepEqual(calls, [
    { kind: "speculate", k: 3, depth: 2, auto: false },
    { kind: "speculate", k: 4, depth: 3, auto: true },
    { kind: "plain" },
  ]);
  assert.equal(closed.n, 2, "each request's drafter is closed");
});

Deno.test("POST /generate speculate: refused before anything starts", async () => {
  const refused = async (
    s: ReturnType<typeof setup>,
    body: Record<string, unknown>,
    error: RegExp,
  ) => {
    const res = await s.post({ tokens: [1], ...body });
    assert.equal(res.status, 400, JSON.stringify(body));
    assert.match((await res.json()).error, error);
    assert.equal(s.calls.length, 0);
  };
  const none = setup();
  await refused(none, { speculate: 4 }, /this node has no drafter/);
  const node = setup(source({ n: 0 }));
  await refused(node, { speculate: 4, draft: "/some/model" }, /drafts with ngram, not \/some\/model/);
  await refused(node, { speculate: 0 }, /speculate must be an integer in \[1, 16\]/);
  await refused(node, { speculate: 17 }, /speculate must be an integer/);
  await refused(node, { speculateDepth: 2 }, /need speculate/);
  await refused(node, { speculate: 2, speculateDepth: 0 }, /speculateDepth/);
});
