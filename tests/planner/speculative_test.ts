// The cost model's speculative terms: tokens per trip and the predicted speedup.
import assert from "node:assert/strict";
import {
  chooseSpeculation,
  predictSpeculative,
  SpeculationTuner,
  tokensPerTrip,
} from "../../planner/speculative.ts";

Deno.test("tokens per trip: k + 1 when every draft is kept, 1 when none is, the geometric sum between", () => {
  assert.equal(tokensPerTrip(1, 4), 5);
  assert.equal(tokensPerTrip(0, 4), 1);
  assert.ok(Math.abs(tokensPerTrip(0.8, 4) - (1 + 0.8 + 0.64 + 0.512 + 0.4096)) < 1e-12);
  assert.throws(() => tokensPerTrip(1.5, 4), RangeError);
  assert.throws(() => tokensPerTrip(0.5, -1), RangeError);
});

Deno.test("predicted speculation: the trip's extra costs and pipelined chunks", () => {
  const p = predictSpeculative({ tripMs: 125, alpha: 0.8, k: 4 });
  assert.ok(
    Math.abs(p.speedup - tokensPerTrip(0.8, 4)) < 1e-12,
    "no extra cost: the speedup is tokens per trip",
  );
  const slow = predictSpeculative({ tripMs: 125, alpha: 0.8, k: 4, draftMs: 25 });
  assert.ok(Math.abs(slow.msPerToken - 150 / tokensPerTrip(0.8, 4)) < 1e-9);
  const deep = predictSpeculative({ tripMs: 125, alpha: 1, k: 4, depth: 3 });
  assert.equal(deep.tokensPerTrip, 15, "every chunk kept whole: depth chunks per trip");
  const cut = predictSpeculative({ tripMs: 125, alpha: 0, k: 4, depth: 3 });
  assert.equal(cut.tokensPerTrip, 1, "nothing kept: chunks behind are never useful");
});

Deno.test("choosing k and depth: long drafts when drafts are kept and cheap, short ones otherwise", () => {
  const sure = chooseSpeculation({ tripMs: 125, alpha: 0.99, draftMsPerToken: 0.5, stepMsPerToken: 0.5 });
  assert.equal(sure.k, 16);
  const shaky = chooseSpeculation({ tripMs: 125, alpha: 0.3, draftMsPerToken: 5, stepMsPerToken: 2 });
  assert.ok(shaky.k <= 3, `k ${shaky.k}`);
  const local = chooseSpeculation({ tripMs: 5, alpha: 0.8, draftMsPerToken: 4, stepMsPerToken: 1 });
  assert.ok(local.k <= 2, `a short trip does not pay for long drafts: k ${local.k}`);
  const deep = chooseSpeculation({
    tripMs: 125,
    alpha: 0.95,
    draftMsPerToken: 1,
    stepMsPerToken: 1,
    maxDepth: 4,
  });
  assert.ok(deep.depth > 1, "well-kept drafts pay for chunks in flight");
  assert.ok(deep.prediction.speedup > 1);
});

Deno.test("SpeculationTuner: fits a step's cost per token and chooses from what it saw", () => {
  const t = new SpeculationTuner({ maxDepth: 1 });
  // Steps cost 2 + 0.5 T ms of compute inside a 125 ms round trip (hops); every draft kept.
  for (const T of [5, 3, 5, 2, 5]) {
    t.verified({ T, computeMs: 2 + 0.5 * T, roundTripMs: 125 + 2 + 0.5 * T, kept: T - 1, rejected: false });
    t.drafted(T - 1, 0.2 * (T - 1));
  }
  assert.ok(Math.abs(t.stepMsPerToken - 0.5) < 1e-9, `${t.stepMsPerToken}`);
  assert.equal(t.choose().k, 16, "long trips, cheap drafts, all kept: the longest drafts");
  // The same costs, but every step rejects its first draft: the shortest drafts (k 1 or 2 tie within 1%).
  const bad = new SpeculationTuner({ maxDepth: 1 });
  for (let i = 0; i < 8; i++) {
    bad.verified({ T: 5, computeMs: 4.5, roundTripMs: 129.5, kept: 0, rejected: true });
    bad.drafted(4, 0.8);
  }
  assert.ok(bad.choose().k <= 2, `k ${bad.choose().k}`);
});
