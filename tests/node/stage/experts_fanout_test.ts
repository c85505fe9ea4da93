// The fan-out and the expert host actor end to end in one process (no transport): the stage sends one
// message per destination node per layer, the host replies with its sum and how long it computed, and the
// request's record (what the trace carries as `x`) says what went where.
import assert from "node:assert/strict";
import type { ActorContext } from "../../../node/actors/mod.ts";
import type { ExpertInput, ExpertService } from "../../../node/stage/backend.ts";
import {
  createFanout,
  decodeExpertReply,
  decodeExpertRequest,
  encodeExpertReply,
  encodeExpertRequest,
  expertHostBehavior,
  ExpertHostError,
  expertHostName,
  type FanoutRecord,
  fanoutTrace,
  HOST_DOWN_MS,
  NOT_SENT,
  routingCounts,
} from "../../../node/stage/experts.ts";

const H = 4;

/** A host that holds `ids` and answers sum_j w[t, j] * (expert id + 1) for the chosen ids it holds. */
function host(ids: number[], delayMs: number, layers = [1]): ExpertService {
  return {
    hidden: H,
    held: () => new Map(layers.map((l) => [l, ids])),
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

/** A plan whose layer 1 has experts 0-1 on the stage, 2-3 on "a" and on "b" (replicas), 4-5 on "b" only. */
const replicated = {
  expertMode: "spread",
  stages: [{ node: "stage", layers: [1, 2] as [number, number], experts: { "1": [0, 1] } }],
  expertHosts: [{ node: "a", experts: { "1": [2, 3] } }, { node: "b", experts: { "1": [2, 3, 4, 5] } }],
};

/** Hosts a and b as actors behind `call`; `failing` names hosts whose calls throw. */
function replicaHosts(failing: Set<string>) {
  const hosts = new Map([
    [expertHostName("a"), expertHostBehavior(host([2, 3], 0), H, () => {})],
    [expertHostName("b"), expertHostBehavior(host([2, 3, 4, 5], 0), H, () => {})],
  ]);
  const calls: { node: string; ids: number[] }[] = [];
  const call = async (name: string, body: Uint8Array, node: string) => {
    const sent = decodeExpertRequest(body, H).input;
    calls.push({ node, ids: [...sent.ids].filter((e) => e !== NOT_SENT) });
    if (failing.has(node)) throw new Error(`${node} is unreachable`);
    return await hosts.get(name)!.receive(body, {} as ActorContext) as Uint8Array;
  };
  return { calls, call };
}

/** One token choosing experts 0, 2, 4 with weights 1, 2, 4: y = 1 * 1 + 2 * 3 + 4 * 5 = 27. */
const step = (request = "r") => ({
  request,
  T: 1,
  xn: new Float32Array(H),
  ids: Uint32Array.from([0, 2, 4]),
  weights: Float32Array.from([1, 2, 4]),
});

Deno.test("fan-out with replicas: each expert runs once, on the cheapest live copy, one message per node", async () => {
  const failing = new Set<string>();
  const { calls, call } = replicaHosts(failing);
  const record = new Map<string, FanoutRecord>();
  const cost = new Map([["a", 1], ["b", 2]]);
  const fanout = createFanout({
    plan: replicated,
    self: "stage",
    local: host([0, 1], 0),
    call,
    record,
    cost: (n) => cost.get(n)!,
  });
  const y = await fanout(1, step());
  assert.deepEqual([...y], Array(H).fill(27), "expert 2 is counted once though two nodes hold it");
  assert.deepEqual(
    calls.sort((x, y) => x.node < y.node ? -1 : 1),
    [{ node: "a", ids: [2] }, { node: "b", ids: [4] }],
    "a (cheaper) runs expert 2; b only what it alone holds",
  );
  // The choice is kept while the host answers, though the costs change.
  cost.set("a", 5);
  calls.length = 0;
  await fanout(1, step());
  assert.deepEqual(calls.find((c) => c.node === "a")?.ids, [2]);
  // The router's picks, per request, as the trace carries them and as `plan --routing` reads them.
  const { xc } = fanoutTrace(record.get("r")!);
  assert.deepEqual(xc, { "1": [0, 2, 2, 2, 4, 2] });
  assert.deepEqual(routingCounts({ "1": { 0: 2, 2: 2, 4: 2 } }, () => 6), { "1": [2, 0, 2, 0, 2, 0] });
});

Deno.test("fan-out with replicas: a failed host's experts go to another replica in the same step", async () => {
  const failing = new Set(["a"]);
  const { calls, call } = replicaHosts(failing);
  let t = 0;
  const fanout = createFanout({
    plan: replicated,
    self: "stage",
    local: host([0, 1], 0),
    call,
    record: new Map(),
    cost: (n) => (n === "a" ? 1 : 2),
    now: () => t,
  });
  const y = await fanout(1, step());
  assert.deepEqual([...y], Array(H).fill(27), "the same sum: b ran expert 2 instead");
  assert.deepEqual(calls.map((c) => `${c.node}:${c.ids}`).sort(), ["a:2", "b:2", "b:4"]);
  // The next steps go to b at once (a is passed over for HOST_DOWN_MS, then tried again).
  calls.length = 0;
  await fanout(1, step());
  assert.deepEqual(calls.map((c) => `${c.node}:${c.ids}`), ["b:2,4"], "one message to b");
  failing.clear();
  t += HOST_DOWN_MS + 1;
  calls.length = 0;
  await fanout(1, step());
  assert.deepEqual(calls.map((c) => `${c.node}:${c.ids}`), ["b:2,4"], "kept on b while b answers");
});

Deno.test("fan-out with replicas: a host membership says is gone is not called; no live copy fails the step", async () => {
  const { calls, call } = replicaHosts(new Set(["b"]));
  const fanout = createFanout({
    plan: replicated,
    self: "stage",
    local: host([0, 1], 0),
    call,
    record: new Map(),
    alive: (n) => n !== "a",
  });
  // Expert 4 lives on b only, and b's call fails: the step fails, naming the host (the re-plan path).
  await assert.rejects(() => fanout(1, step()), (e: Error) => {
    assert.ok(e instanceof ExpertHostError && e.node === "b", e.message);
    return true;
  });
  assert.ok(calls.every((c) => c.node !== "a"), "a (gone) was not called");
});

Deno.test("fan-out with replicas: a host that does not answer is hedged to a replica; without one the step waits", async () => {
  // "a" is the cheaper copy of experts 2-3 and hangs until released; b holds 2-5.
  let release = () => {};
  const hung = new Promise<void>((r) => release = r);
  const { calls, call: answer } = replicaHosts(new Set());
  const call = async (name: string, body: Uint8Array, node: string) => {
    if (node === "a") {
      calls.push({ node, ids: [...decodeExpertRequest(body, H).input.ids].filter((e) => e !== NOT_SENT) });
      await hung;
      throw new Error("a never answered");
    }
    return await answer(name, body, node);
  };
  const fanout = createFanout({
    plan: replicated,
    self: "stage",
    local: host([0, 1], 0),
    call,
    record: new Map(),
    cost: (n) => (n === "a" ? 1 : 2),
    hedgeMs: 30,
  });
  const t0 = performance.now();
  // a never answers in this step (it is released at the end): only the hedge can finish it.
  let guard: ReturnType<typeof setTimeout> | undefined;
  const y = await Promise.race([
    fanout(1, step()),
    new Promise<never>((_, no) =>
      guard = setTimeout(() => no(new Error("a's experts were not hedged")), 10_000)
    ),
  ]);
  clearTimeout(guard);
  assert.deepEqual([...y], Array(H).fill(27), "the same sum: b ran expert 2 after a's hedge delay");
  assert.ok(performance.now() - t0 >= 30, "not before the hedge delay");
  assert.deepEqual(calls.map((c) => `${c.node}:${c.ids}`).sort(), ["a:2", "b:2", "b:4"]);
  // The next steps go to b (the route moved with the hedge), with nothing left waiting on a.
  calls.length = 0;
  await fanout(1, step());
  assert.deepEqual(calls.map((c) => `${c.node}:${c.ids}`), ["b:2,4"]);
  release();

  // b alone holds 4 and 5: a b that is slow is waited for, not hedged (no copy to hedge to).
  const slow = createFanout({
    plan: replicated,
    self: "stage",
    local: host([0, 1], 0),
    call: async (name, body, node) => {
      await new Promise((r) => setTimeout(r, 80));
      return await answer(name, body, node);
    },
    record: new Map(),
    alive: (n) => n !== "a",
    hedgeMs: 10,
  });
  calls.length = 0;
  assert.deepEqual([...await slow(1, step())], Array(H).fill(27));
  assert.deepEqual(calls.map((c) => `${c.node}:${c.ids}`), ["b:2,4"], "one call to b, waited for");
});

Deno.test("fan-out with replicas: a host outrun by its hedge is passed over in the other layers too", async () => {
  // Two MoE layers, a (cheaper) and b both holding 2-3 of each; a hangs (killed without a word, membership
  // not yet saying so). Layer 1 waits the hedge delay once; layer 2, and the next step, go to b at once.
  const plan = {
    expertMode: "spread",
    stages: [{ node: "stage", layers: [1, 3] as [number, number], experts: { "1": [0, 1], "2": [0, 1] } }],
    expertHosts: [
      { node: "a", experts: { "1": [2, 3], "2": [2, 3] } },
      { node: "b", experts: { "1": [2, 3, 4, 5], "2": [2, 3, 4, 5] } },
    ],
  };
  const b = expertHostBehavior(host([2, 3, 4, 5], 0, [1, 2]), H, () => {});
  let release = () => {};
  const hung = new Promise<void>((r) => release = r);
  const calls: string[] = [];
  const fanout = createFanout({
    plan,
    self: "stage",
    local: host([0, 1], 0, [1, 2]),
    call: async (_name, body, node) => {
      const sent = decodeExpertRequest(body, H);
      calls.push(`${sent.layer}:${node}:${[...sent.input.ids].filter((e) => e !== NOT_SENT)}`);
      if (node === "a") {
        await hung;
        throw new Error("a never answered");
      }
      return await b.receive(body, {} as ActorContext) as Uint8Array;
    },
    record: new Map(),
    cost: (n) => (n === "a" ? 1 : 2),
    hedgeMs: 200,
  });
  try {
    assert.deepEqual([...await fanout(1, step())], Array(H).fill(27));
    assert.deepEqual([...await fanout(2, step())], Array(H).fill(27));
    // Layer 2 sent nothing to a (before, it waited on a for the hedge delay again, then hedged).
    assert.deepEqual(calls.sort(), ["1:a:2", "1:b:2", "1:b:4", "2:b:2,4"]);
    calls.length = 0;
    await fanout(1, step());
    assert.deepEqual(calls, ["1:b:2,4"], "the next step: b only");
  } finally {
    release();
  }
});

Deno.test("fan-out messages carry the request's wire dtype: f16 halves the activations' bytes both ways", async () => {
  const Hs = 5, T = 3, k = 2; // T * H odd: the f16 activations need padding before the ids
  const input: ExpertInput = {
    request: "r1",
    T,
    xn: Float32Array.from({ length: T * Hs }, (_, i) => (i - 7) / 3),
    ids: Uint32Array.from([0, 1, 2, NOT_SENT, 1, 0]),
    weights: Float32Array.from([0.5, 0.25, 1, 0, 0.75, 0.125]),
  };
  const f32 = encodeExpertRequest(1, input);
  const f16 = encodeExpertRequest(1, input, "f16");
  // xn: 60 bytes in f32, 30 + 2 of padding in f16; the header names the dtype (12 bytes more once aligned).
  assert.equal(f32.length - f16.length, 60 - 32 - 12);
  const back = decodeExpertRequest(f16, Hs);
  assert.equal(back.dtype, "f16");
  assert.deepEqual([...back.input.ids], [...input.ids]);
  assert.deepEqual([...back.input.weights], [...input.weights]);
  back.input.xn.forEach((v, i) => assert.ok(Math.abs(v - input.xn[i]) <= 2 ** -11 * Math.abs(input.xn[i])));
  const exact = decodeExpertRequest(f32, Hs);
  assert.equal(exact.dtype, "f32");
  assert.deepEqual([...exact.input.xn], [...input.xn]);
  // A header naming another dtype, or a body sized for the other one, is refused by name.
  const bad = new TextEncoder().encode(JSON.stringify({ layer: 1, T, k, dtype: "bf16" }));
  const body = new Uint8Array(4 + bad.length);
  new DataView(body.buffer).setUint32(0, bad.length, true);
  body.set(bad, 4);
  assert.throws(() => decodeExpertRequest(body, Hs), /bad dtype "bf16"/);
  assert.throws(() => decodeExpertRequest(f16.subarray(0, f16.length - 4), Hs), /expected/);
  // The host answers in the request's dtype; the stage reads its sums and compute time back.
  const y = Float32Array.from({ length: T * Hs }, (_, i) => i * 0.1);
  const r16 = encodeExpertReply(y, 1.5, "f16");
  assert.equal(r16.length, 2 * T * Hs + 2 + 4);
  const got = decodeExpertReply(r16, T * Hs, "f16");
  assert.equal(got.hostMs, 1.5);
  got.y.forEach((v, i) => assert.ok(Math.abs(v - y[i]) <= 2 ** -11 * Math.abs(y[i])));
  assert.throws(() => decodeExpertReply(r16, T * Hs, "f32"), /replied 36 bytes; expected 64/);
  // End to end: the fan-out asks the request's wire of `wire`, and the host replies in it.
  const plan = {
    expertMode: "spread",
    stages: [{ node: "stage", layers: [1, 2] as [number, number], experts: { "1": [0] } }],
    expertHosts: [{ node: "far", experts: { "1": [2, 4] } }],
  };
  const far = expertHostBehavior(host([2, 4], 0), H, () => {});
  const sizes: Record<string, number> = {};
  for (const dtype of ["f32", "f16"] as const) {
    const record = new Map<string, FanoutRecord>();
    const fanout = createFanout({
      plan,
      self: "stage",
      local: host([0], 0),
      call: async (_name, body) => {
        assert.equal(decodeExpertRequest(body, H).dtype, dtype);
        return await far.receive(body, {} as ActorContext) as Uint8Array;
      },
      record,
      wire: (id) => (id === "r1" ? dtype : undefined),
    });
    const sum = await fanout(1, step("r1"));
    assert.deepEqual([...sum], Array(H).fill(27), `${dtype}: the sum of both shares`);
    sizes[dtype] = record.get("r1")!.get(1)!.nodes.get("far")!.bytes;
  }
  assert.ok(sizes.f16 < sizes.f32, `f16 ${sizes.f16} bytes against f32 ${sizes.f32}`);
});
