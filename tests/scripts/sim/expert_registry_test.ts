// The acceptance of the expert registry at scale (issue 16): Kimi K2's 60 MoE layers x 384 experts placed
// over 32 simulated nodes agree at every node within 30 simulated seconds of the Plan's publication, and
// every push-pull stays within the control channel's message limit. One entry per expert would not fit.
import assert from "node:assert/strict";
import { expertRegistrySim, type Layout } from "../../../scripts/sim/expert_registry.ts";

const runs: [Layout, number][] = [["spread", 0], ["compact", 0], ["spread", 0.1]];
for (const [layout, loss] of runs) {
  const what = `${layout}${loss ? `, ${loss * 100}% of messages lost` : ""}`;
  Deno.test(`Kimi K2 scale registry (${what}): 32 nodes agree within 30 s; push-pulls within the limit`, () => {
    const r = expertRegistrySim({
      nodes: 32,
      layout,
      seed: 1,
      verifyAll: loss === 0 && layout === "spread",
      loss,
    });
    assert.equal(r.expertNames, 60 * 384);
    assert.ok(r.agreeMs !== undefined && r.agreeMs <= 30_000, `agreed after ${r.agreeMs} ms`);
    assert.ok(r.pushPulls > 31, `${r.pushPulls} push-pulls measured`); // the leader's 31 pushes at least
    assert.ok(r.pushPullMaxBytes <= r.limitBytes, `largest push-pull ${r.pushPullMaxBytes} B`);
    // Gossip packets, and here also each host's direct set update (one part), fit a 1400-byte packet.
    assert.ok(r.otherMaxBytes <= 1400, `a message of ${r.otherMaxBytes} B`);
    assert.ok(r.largest.registryBytes < 64 * 1024, `registry state ${r.largest.registryBytes} B`);
    assert.ok(r.onePerExpertStateBytes > r.limitBytes, "one entry per expert would exceed the limit");
  });
}
