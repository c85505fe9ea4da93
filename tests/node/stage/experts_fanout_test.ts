// The fan-out and the expert host actor end to end in one process (no transport): the stage sends one
// message per destination node per layer, the host replies with its sum and how long it computed, and the
// request's record (what the trace carries as `x`) says what went where.
import assert from "node:assert/strict";
import type { ActorContext } from "../../../node/actors/mod.ts";
import type { ExpertInput, ExpertService } from "../../../node/stage/backend.ts";
import {
  createFanout,
  expertHostBehavior,
  expertHostName,
  type FanoutRecord,
  fanoutTrace,
} from "../../../node/stage/experts.ts";

const H = 4;

/** A host that holds `ids` and answers sum_j w[t, j] * (expert id + 1) for the chosen ids it holds. */
function host(ids: number[], delayMs: number): ExpertService {
  return {
    hidden: H,
    held: () => new Map([[1, ids]]),
    async compute(_layer: number, input: ExpertInput) {
      await new Promise((r) => setTimeout(r, delayMs));
      const k = input.ids.length / input.T;
      const y = new Float32Array(input.T * H);
      for (let t = 0; t < input.T; t++) {
        for (let j = 0; j < k; j++) {
          const e = input.ids[t * k + j];
          if (ids.includes(e)) {
            for (let h = 0; h < H; h++) y[t * H + h] += input.weights[t * k + j] * (e + 1);
          }
        }
      }
      return y;
    },
    weightBytes: 0,
    close() {},
  };
}

Deno.test("fan-out: one call per destination, the sum of the replies, and each host's compute time", async () => {
  const plan = {
    expertMode: "spread",
    stages: [{ node: "stage", layers: [1, 2] as [number, number], experts: { "1": [0, 1] } }],
    expertHosts: [{ node: "far", experts: { "1": [2, 3] } }, { node: "idle", experts: { "1": [4, 5] } }],
  };
  const hosts = new Map([[expertHostName("far"), expertHostBehavior(host([2, 3], 30), H, () => {})]]);
  const calls: string[] = [];
  const record = new Map<string, FanoutRecord>();
  const fanout = createFanout({
    plan,
    self: "stage",
    local: host([0, 1], 0),
    call: (name, body) => {
      calls.push(name);
      return Promise.resolve(hosts.get(name)!.receive(body, {} as ActorContext) as Uint8Array);
    },
    record,
  });
  // Two tokens, top-2: token 0 picks experts 0 and 2, token 1 picks 3 and 1.
  const y = await fanout(1, {
    request: "r1",
    T: 2,
    xn: new Float32Array(2 * H),
    ids: Uint32Array.from([0, 2, 3, 1]),
    weights: Float32Array.from([0.5, 0.25, 1, 2]),
  });
  assert.deepEqual(calls, [expertHostName("far")], "no message to a node none of the tokens chose");
  assert.deepEqual([...y], [...Array(H).fill(0.5 * 1 + 0.25 * 3), ...Array(H).fill(1 * 4 + 2 * 2)]);
  const { x, xp } = fanoutTrace(record.get("r1")!);
  const [bytes, ms, experts, at, hostMs, calls1] = x["1"]["far"];
  assert.equal(calls1, 1);
  const [steps, readback, wait, combine] = xp["1"];
  assert.equal(steps, 1);
  assert.equal(readback, 0, "no readback time given with the input");
  assert.ok(wait >= hostMs && combine >= 0, `wait ${wait}, combine ${combine}`);
  assert.deepEqual(experts, [2, 3]);
  assert.ok(bytes > 2 * H * 4 * 2, `${bytes} bytes: the request and the reply`);
  assert.ok(hostMs >= 25 && hostMs <= ms, `host ${hostMs} ms of ${ms}`);
  assert.ok(Math.abs(at - Date.now()) < 5000, "the call's start in epoch ms");
  assert.deepEqual(x["1"]["stage"][2], [0, 1]);
  assert.equal(x["1"]["stage"][0], 0, "the stage's own experts cost no bytes");
});
