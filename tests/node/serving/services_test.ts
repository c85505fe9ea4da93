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
