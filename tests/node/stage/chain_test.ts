// The chain logic on the fake backend over the in-memory network: N stages reproduce the whole model,
// requests interleave without mixing, duplicates are ignored, cancellation and failures free every stage.
import assert from "node:assert/strict";
import { FakeClock } from "../../../node/clock.ts";
import { MemoryNetwork, type MemoryTransport } from "../../../node/transport/memory.ts";
import { ActorSystem } from "../../../node/actors/mod.ts";
import type { PeerAddr } from "../../../node/transport/transport.ts";
import { FakeBackend, type FakeBackendOptions, fakeReference } from "../../../node/stage/fake_backend.ts";
import { StageActor, stageName } from "../../../node/stage/stage_actor.ts";
import { encodePipe } from "../../../node/stage/messages.ts";
import { type Chain, PipelineClient, PipelineError } from "../../../node/stage/client.ts";
import { splitLayers } from "../../../node/stage/roles.ts";
import { sendWithRetry } from "../../../node/stage/retry.ts";
import { advanceIdle, pumpUntil } from "../../support/fake_time.ts";

const LAYERS = 6;

function chain(
  stages: number,
  opts: FakeBackendOptions & { duplicate?: boolean; retry?: boolean; retryDelaysMs?: number[] } = {},
) {
  const clock = new FakeClock();
  const net = new MemoryNetwork(clock);
  const names = new Map<string, string>();
  const addrs = new Map<string, PeerAddr>();
  const transports: MemoryTransport[] = [];
  const n = stages + 1; // the last node is the client's
  const systems = Array.from({ length: n }, (_, i) => {
    const t = net.connect(`n${i}`);
    transports.push(t);
    addrs.set(t.self.id, t.self);
    const sys = new ActorSystem({
      transport: t,
      clock,
      resolver: { resolve: (name) => names.get(name) },
      peers: { addressOf: (id) => addrs.get(id) },
      registrar: { register: (name) => names.set(name, t.self.id), unregister: (name) => names.delete(name) },
    });
    t.onMessage((from, msg, ch) => sys.receive(from, msg, ch));
    return sys;
  });
  const roles = splitLayers(LAYERS, stages);
  const actors = roles.map((role, i) => {
    const backend = new FakeBackend(role, opts);
    const sys = systems[i];
    const actor = new StageActor({
      backend,
      planVersion: 1,
      log: () => {},
      send: async (name, body) => {
        const once = (n: string, b: Uint8Array) => sys.send(n, b, { channel: "data" });
        if (opts.retry) await sendWithRetry(once, name, body, { clock, delaysMs: opts.retryDelaysMs });
        else await once(name, body);
        if (opts.duplicate) await once(name, body);
      },
    });
    sys.spawn(stageName(i), actor);
    return actor;
  });
  const client = new PipelineClient(systems[n - 1], "n" + (n - 1), { stallMs: 5_000 });
  const c: Chain = { version: 1, nodes: roles.map((_, i) => `n${i}`) };
  /** Runs the fake network until `p` settles. */
  const pump = <T>(p: Promise<T>): Promise<T> => pumpUntil(clock, p);
  const settle = () => advanceIdle(clock);
  const close = async () => {
    await client.close();
    for (const s of systems) await s.close();
  };
  return { clock, net, transports, systems, actors, client, chain: c, pump, settle, close };
}

const PROMPT = Array.from({ length: 19 }, (_, i) => (i * 5 + 3) % 60); // 3 chunks of at most 8

for (const stages of [1, 2, 3, 5, 6]) {
  Deno.test(`stage chain: ${stages} stage(s) reproduce the whole fake model, prefill in chunks`, async () => {
    const t = chain(stages, { eosTokenIds: [] });
    try {
      const want = await fakeReference(PROMPT, { layers: LAYERS, maxTokens: 12, eosTokenIds: [] });
      const got = await t.pump(t.client.generate(t.chain, PROMPT, { maxTokens: 12 }));
      assert.deepEqual(got.tokens, want);
      assert.equal(got.stopReason, "max_tokens");
      const e = got.events[3];
      assert.equal(e.timings.computeMs.length, stages);
      assert.equal(e.timings.wireMs.length, stages);
      assert.equal(typeof e.timings.wireMs.at(-1), "number", "a decode step reports the way back to stage 0");
      assert.equal(got.events[0].timings.wireMs.at(-1), null);
      if (stages > 1) assert.equal(e.timings.bytes[0], 4 * 2, "one token's hidden state in f16");
      const prefill = got.events[0].prefill;
      assert.ok(prefill, "the first token carries the prefill's chunk traces");
      assert.equal(prefill.chunks, 3);
      assert.equal(prefill.computeMs.length, stages);
      assert.equal(prefill.waitMs.length, stages);
      assert.equal(prefill.wireMs.length, stages - 1);
      if (stages > 1) {
        assert.equal(prefill.bytes[0], Math.round((8 + 8 + 3) * 4 * 2 / 3 * 1000) / 1000, "mean chunk bytes");
      }
      await t.settle();
      for (const a of t.actors) assert.equal(a.backend.stats().active, 0, "released after completion");
    } finally {
      await t.close();
    }
  });
}

Deno.test("stage chain: a one-stage chain runs the backend's decode loop: same tokens, batches, eos", async () => {
  const ref = await fakeReference(PROMPT, { layers: LAYERS, maxTokens: 12, eosTokenIds: [] });
  const t = chain(1, { eosTokenIds: [], loopBatch: 4 });
  try {
    const got = await t.pump(t.client.generate(t.chain, PROMPT, { maxTokens: 12 }));
    assert.deepEqual(got.tokens, ref);
    assert.equal(got.stopReason, "max_tokens");
    const runs = (t.actors[0].backend as FakeBackend).runs;
    assert.equal(
      runs.filter((r) => r.T === 1).length,
      11,
      "one step per token after the prefill, no messages",
    );
    const eos = ref[6];
    const e = await t.pump(t.client.generate(t.chain, PROMPT, { maxTokens: 12, eos: [eos] }));
    assert.deepEqual(e.tokens, ref.slice(0, ref.indexOf(eos) + 1));
    assert.equal(e.stopReason, "eos");
    await t.settle();
    assert.equal(t.actors[0].backend.stats().active, 0, "released after completion");
  } finally {
    await t.close();
  }
});

Deno.test("stage chain: cancelling a one-stage decode loop stops it and frees the request", async () => {
  const t = chain(1, { eosTokenIds: [], loopBatch: 2, delayMs: 1 });
  try {
    const abort = new AbortController();
    let seen = 0;
    const p = t.client.generate(t.chain, PROMPT, {
      maxTokens: 1000,
      signal: abort.signal,
      onToken: () => ++seen === 5 && abort.abort(new Error("cancelled by the test")),
    });
    await assert.rejects(t.pump(p), /cancelled by the test/);
    await t.settle();
    const b = t.actors[0].backend as FakeBackend;
    assert.deepEqual(b.stats(), { active: 0, kvBytes: 0, weightBytes: 0 });
    const steps = b.runs.length;
    await t.settle();
    assert.equal(b.runs.length, steps, "the loop stopped");
    assert.ok(steps < 100, `the loop ran ${steps} steps after a cancel at token 5`);
  } finally {
    await t.close();
  }
});

Deno.test("stage chain: a stage answers STATS while a long prefill's steps are still running", async () => {
  // Every step takes 50 ms: a 19-token prompt in chunks of 8 keeps stage 0 busy for 150 ms.
  const t = chain(2, { eosTokenIds: [], delayMs: 50 });
  try {
    const p = t.client.generate(t.chain, PROMPT, { maxTokens: 2 });
    await t.settle(); // the START is in stage 0's hands
    const stats = t.systems[2].call(stageName(0), encodePipe({ type: "stats" }), { timeoutMs: 1000 });
    let answered = false;
    stats.then(() => (answered = true), () => {});
    // A few simulated ms of network, far less real time than the prefill's 150 ms of steps.
    for (let i = 0; i < 20 && !answered; i++) {
      t.clock.advance(1);
      await new Promise((r) => setTimeout(r, 0));
    }
    assert.ok(answered, "STATS waited behind the prefill's steps");
    const report = JSON.parse(new TextDecoder().decode(await stats));
    assert.equal(report.active, 1, "the request is open mid-prefill");
    await t.pump(p);
  } finally {
    await t.close();
  }
});

Deno.test("stage chain: f32 on the wire gives the same tokens and twice the bytes", async () => {
  const t = chain(3, { eosTokenIds: [] });
  try {
    const got = await t.pump(t.client.generate(t.chain, PROMPT, { maxTokens: 5, wire: "f32" }));
    assert.deepEqual(
      got.tokens,
      await fakeReference(PROMPT, { layers: LAYERS, maxTokens: 5, eosTokenIds: [] }),
    );
    assert.equal(got.events[1].timings.bytes[0], 4 * 4);
  } finally {
    await t.close();
  }
});

Deno.test("stage chain: a chain's wire (`up --wire`) applies to requests that name none; a request's own wins", async () => {
  const t = chain(3, { eosTokenIds: [] });
  try {
    const f32 = { ...t.chain, wire: "f32" as const };
    const plain = await t.pump(t.client.generate(f32, PROMPT, { maxTokens: 3 }));
    assert.equal(plain.wire, "f32");
    assert.equal(plain.events[1].timings.bytes[0], 4 * 4, "f32 on the wire: the chain's");
    const own = await t.pump(t.client.generate(f32, PROMPT, { maxTokens: 3, wire: "f16" }));
    assert.equal(own.wire, "f16");
    assert.equal(own.events[1].timings.bytes[0], 4 * 2, "the request's own f16");
    const none = await t.pump(t.client.generate(t.chain, PROMPT, { maxTokens: 3 }));
    assert.equal(none.wire, "f16", "a chain that names no wire: f16");
  } finally {
    await t.close();
  }
});

Deno.test("stage chain: generation stops at eos, which the last stage detects", async () => {
  const ref = await fakeReference(PROMPT, { layers: LAYERS, maxTokens: 12, eosTokenIds: [] });
  const eos = ref[4];
  const t = chain(3, { eosTokenIds: [eos] });
  try {
    const got = await t.pump(t.client.generate(t.chain, PROMPT, { maxTokens: 12, eos: [eos] }));
    assert.deepEqual(got.tokens, ref.slice(0, ref.indexOf(eos) + 1));
    assert.equal(got.stopReason, "eos");
  } finally {
    await t.close();
  }
});

Deno.test("stage chain: three concurrent requests each get the tokens they get alone", async () => {
  const t = chain(4, { eosTokenIds: [], delayMs: 1 });
  try {
    const prompts = [PROMPT, PROMPT.slice(3, 9), [7, 7, 7, 1, 2]];
    const sampling = [undefined, { temperature: 0.7, topP: 0.9, seed: 11 }, undefined];
    const alone = [];
    for (let i = 0; i < 3; i++) {
      alone.push(
        await fakeReference(prompts[i], {
          layers: LAYERS,
          maxTokens: 10,
          eosTokenIds: [],
          sampling: sampling[i],
        }),
      );
    }
    const runs = await t.pump(
      Promise.all(
        prompts.map((p, i) => t.client.generate(t.chain, p, { maxTokens: 10, sampling: sampling[i] })),
      ),
    );
    assert.deepEqual(runs.map((r) => r.tokens), alone);
    // they really interleaved: stage 1 saw steps of different requests alternate
    const ids = t.actors[1].backend instanceof FakeBackend ? t.actors[1].backend.runs.map((r) => r.id) : [];
    const switches = ids.filter((id, i) => i > 0 && id !== ids[i - 1]).length;
    assert.ok(switches > 3, `requests interleaved (${switches} switches)`);
  } finally {
    await t.close();
  }
});

Deno.test("stage chain: every message delivered twice changes nothing (idempotent receivers)", async () => {
  const t = chain(3, { eosTokenIds: [], duplicate: true });
  try {
    const got = await t.pump(t.client.generate(t.chain, PROMPT, { maxTokens: 8 }));
    assert.deepEqual(
      got.tokens,
      await fakeReference(PROMPT, { layers: LAYERS, maxTokens: 8, eosTokenIds: [] }),
    );
    for (const a of t.actors) {
      const runs = (a.backend as FakeBackend).runs;
      assert.equal(runs.length, 3 + 7, `stage ${a.backend.role.index} ran each step once`);
    }
  } finally {
    await t.close();
  }
});

Deno.test("stage chain: cancelling mid-generation releases the request on every stage", async () => {
  const t = chain(3, { eosTokenIds: [], delayMs: 1 });
  try {
    const abort = new AbortController();
    let seen = 0;
    const p = t.client.generate(t.chain, PROMPT, {
      maxTokens: 1000,
      signal: abort.signal,
      onToken: () => ++seen === 5 && abort.abort(new Error("cancelled by the test")),
    });
    await assert.rejects(t.pump(p), /cancelled by the test/);
    await t.settle();
    for (const a of t.actors) {
      assert.deepEqual(a.backend.stats(), { active: 0, kvBytes: 0, weightBytes: 0 });
    }
    assert.equal(t.client.active, 0);
  } finally {
    await t.close();
  }
});

Deno.test("stage chain: a stage that dies fails the request clearly; the others release it", async () => {
  const t = chain(3, { eosTokenIds: [], delayMs: 1 });
  try {
    let seen = 0;
    const p = t.client.generate(t.chain, PROMPT, {
      maxTokens: 1000,
      onToken: () => {
        if (++seen !== 3) return;
        t.systems[1].close(); // n1 goes away
        // what the node does when membership marks n1 dead
        t.client.peerGone("n1");
        for (const a of [t.actors[0], t.actors[2]]) a.releaseAll();
      },
    });
    await assert.rejects(
      t.pump(p),
      (e) => e instanceof PipelineError && /stage 1 \(node n1\) died/.test(e.message),
    );
    await t.settle();
    for (const i of [0, 2]) assert.equal(t.actors[i].backend.stats().active, 0);
  } finally {
    await t.close();
  }
});

Deno.test("stage chain: a stage that cannot reach the next reports an error to the client", async () => {
  const t = chain(3, { eosTokenIds: [] });
  try {
    await t.transports[2].close(); // stage 2's node goes away: stage 1's sends fail
    const p = t.client.generate(t.chain, PROMPT, { maxTokens: 4 });
    await assert.rejects(t.pump(p), (e) => e instanceof PipelineError && /stage 1 failed/.test(e.message));
    await t.settle();
    assert.equal(t.actors[0].backend.stats().active, 0);
    assert.equal(t.actors[1].backend.stats().active, 0);
  } finally {
    await t.close();
  }
});

Deno.test("stage chain: teacher-forced logits over the chain equal the whole model's", async () => {
  const t = chain(3, { vocab: 16 });
  try {
    const { logits } = await t.pump(t.client.logits(t.chain, PROMPT, { vocab: 16 }));
    const whole = new FakeBackend({ index: 0, stages: 1, layers: [0, LAYERS], embeds: true, head: true }, {
      vocab: 16,
    });
    whole.open("x", { maxSeq: PROMPT.length, sampling: { temperature: 0, topP: 1, seed: 0 } });
    const want = new Float32Array(PROMPT.length * 16);
    for (let p = 0; p < PROMPT.length; p += 8) {
      const T = Math.min(8, PROMPT.length - p);
      const r = await whole.run("x", {
        pos0: p,
        T,
        tokens: Uint32Array.from(PROMPT.slice(p, p + T)),
        output: "logits",
      });
      want.set(r.logits!, p * 16);
    }
    assert.deepEqual(logits, want);
  } finally {
    await t.close();
  }
});

Deno.test("stage chain: a hop cut for 400 ms mid-generation is retried with backoff; without retries it fails", async () => {
  const want = await fakeReference(PROMPT, { layers: LAYERS, maxTokens: 10, eosTokenIds: [] });
  for (const retry of [true, false]) {
    const t = chain(3, { eosTokenIds: [], retry });
    try {
      let seen = 0;
      const p = t.client.generate(t.chain, PROMPT, {
        maxTokens: 10,
        onToken: () => {
          if (++seen !== 3) return;
          t.net.partition([["n1"]]); // stage 1's node loses every link (the hops 0 -> 1 and 1 -> 2)
          t.clock.schedule(() => t.net.heal(), 400);
        },
      });
      if (retry) {
        const got = await t.pump(p);
        assert.deepEqual(got.tokens, want, "the same tokens as the whole model");
        await t.settle();
        for (const a of t.actors) assert.equal(a.backend.stats().active, 0);
      } else {
        await assert.rejects(t.pump(p), (e) => e instanceof PipelineError && /failed/.test(e.message));
      }
    } finally {
      await t.close();
    }
  }
});

Deno.test("stage chain: retries give up after the backoff when the next stage stays unreachable", async () => {
  // Short waits: the client's stall timer runs on the real clock while the test steps the fake one.
  const t = chain(3, { eosTokenIds: [], retry: true, retryDelaysMs: [10, 20, 40, 80] });
  try {
    await t.transports[2].close();
    const t0 = t.clock.now();
    const p = t.client.generate(t.chain, PROMPT, { maxTokens: 4 });
    await assert.rejects(t.pump(p), (e) => e instanceof PipelineError && /stage 1 failed/.test(e.message));
    assert.ok(
      t.clock.now() - t0 >= 150,
      `gave up after ${t.clock.now() - t0} ms, before the backoff ran out`,
    );
  } finally {
    await t.close();
  }
});
