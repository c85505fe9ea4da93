import assert from "node:assert/strict";
import { lan, membershipConfig, presets } from "../../../node/membership/config.ts";

Deno.test("lan preset is memberlist's DefaultLANConfig, probing every 500 ms with suspicion multiplier 6", () => {
  assert.deepEqual(
    [
      lan.probeIntervalMs,
      lan.probeTimeoutMs,
      lan.suspicionMult,
      lan.suspicionMaxTimeoutMult,
      lan.retransmitMult,
    ],
    [500, 250, 6, 6, 4],
  );
  assert.deepEqual(
    [
      lan.indirectChecks,
      lan.pushPullIntervalMs,
      lan.gossipIntervalMs,
      lan.gossipNodes,
      lan.awarenessMaxMultiplier,
    ],
    [3, 30_000, 200, 3, 8],
  );
  for (const p of Object.values(presets)) membershipConfig({}, p);
});

Deno.test("membershipConfig rejects nonsense with RangeError/TypeError", () => {
  assert.throws(() => membershipConfig({ probeTimeoutMs: 2000 }), RangeError);
  assert.throws(() => membershipConfig({ gossipNodes: -1 }), RangeError);
  assert.throws(() => membershipConfig({ probeIntervalMs: NaN }), RangeError);
  assert.throws(() => membershipConfig({ lifeguard: 1 as unknown as boolean }), TypeError);
});
