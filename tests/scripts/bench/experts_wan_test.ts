// scripts/bench/experts_wan.ts: how a request's fan-out parts become one layer's costs.
import assert from "node:assert/strict";
import { layerSummary, type Parts, table } from "../../../scripts/bench/experts_wan.ts";

const part = (o: Partial<Parts>): Parts => ({
  steps: 10,
  readback_ms: 20,
  wait_ms: 30,
  combine_ms: 1,
  remote: { calls: 20, ms: 40, host_ms: 10 },
  own: { calls: 10, ms: 15 },
  ...o,
});

Deno.test("experts_wan: per layer and step, wire = round trip - host compute, means over layers", () => {
  const s = layerSummary({
    "1": part({}),
    "2": part({ readback_ms: 40, remote: { calls: 10, ms: 40, host_ms: 20 } }),
  });
  assert.equal(s.layers, 2);
  assert.equal(s.readback, 3); // (2 + 4) / 2
  assert.equal(s.wait, 3);
  assert.equal(s.messages, 1.5); // (2 + 1) / 2 per step
  assert.equal(s.roundTrip, 3); // (40/20 + 40/10) / 2
  assert.equal(s.host, 1.25); // (10/20 + 20/10) / 2
  assert.equal(s.wire, 1.75); // (30/20 + 20/10) / 2
  assert.equal(s.own, 1.5);
  assert.equal(s.total, (5.1 + 7.1) / 2);
  // Layers that never fanned out in decode are left out.
  assert.equal(layerSummary({ "1": part({ steps: 0 }) }).layers, 0);
  const md = table([{
    model: "m",
    network: "loopback",
    tokS: 10,
    msPerToken: 100,
    predictedMs: 80,
    predictedFanoutMs: [6, 6],
    parts: { "1": part({}), "2": part({}) },
    correct: true,
  }]);
  assert.match(md, /\| m \| loopback \| 10\.0 \| 100\.0 \| 80\.0 \| 1\.25 \| 2 \| 5\.10 \(6\.00\) \|/);
});
