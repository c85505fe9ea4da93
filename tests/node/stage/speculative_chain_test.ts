// Speculative decoding through a chain of real engine stages (the tiny fixtures on this machine's WebGPU
// adapter) over the in-memory network: for every drafter and pipelining depth, greedy and seeded sampling
// give exactly the tokens plain decoding gives on the whole model; the target as its own draft keeps every
// draft; stale pipelined chunks are dropped; every stage frees the request at the end.
import assert from "node:assert/strict";
import { FakeClock } from "../../../node/clock.ts";
import { MemoryNetwork } from "../../../node/transport/memory.ts";
import { ActorSystem } from "../../../node/actors/mod.ts";
import type { PeerAddr } from "../../../node/transport/transport.ts";
import { StageActor, stageName } from "../../../node/stage/stage_actor.ts";
import { type Chain, PipelineClient } from "../../../node/stage/client.ts";
import { splitLayers } from "../../../node/stage/roles.ts";
import { getGpu, NoGpuError } from "../../../kernels/mod.ts";
import { type Engine, generate, loadEngine } from "../../../models/engine.ts";
import { type Drafter, ModelDrafter, NgramDrafter, NoisyDrafter } from "../../../models/speculative.ts";
import { fixtureDir } from "../../fixtures.ts";
import { needs } from "../../support/needs.ts";
import { advanceIdle, pumpUntil } from "../../support/fake_time.ts";

const gpu = await getGpu().catch((e) => {
  if (e instanceof NoGpuError) return null;
  throw e;
});

async function chain(dir: string, stages: number, layers: number) {
  const clock = new FakeClock();
  const net = new MemoryNetwork(clock);
  const names = new Map<string, string>();
  const addrs = new Map<string, PeerAddr>();
  const n = stages + 1; // the last node is the client's
  const systems = Array.from({ length: n }, (_, i) => {
    const t = net.connect(`n${i}`);
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
  const actors: StageActor[] = [];
  for (const role of splitLayers(layers, stages)) {
    const backend = await loadEngine(dir, { role, gpu: gpu!, weights: "f32" });
    const sys = systems[role.index];
    const actor = new StageActor({
      backend,
      planVersion: 1,
      log: (m) => console.error("LOG", m),
      send: (name, body) => sys.send(name, body, { channel: "data" }),
    });
    sys.spawn(stageName(role.index), actor);
    actors.push(actor);
  }
  const client = new PipelineClient(systems[n - 1], `n${n - 1}`, { stallMs: 60_000 });
  const c: Chain = { version: 1, nodes: actors.map((_, i) => `n${i}`) };
  /** Runs the fake network until `p` settles. */
  const pump = <T>(p: Promise<T>): Promise<T> => pumpUntil(clock, p, 200_000);
  const settle = () => advanceIdle(clock);
  const close = async () => {
    await client.close();
    for (const a of actors) await a.onStop();
    for (const s of systems) await s.close();
  };
  return { actors, client, chain: c, pump, settle, close };
}

const CASES = [
  { fixture: "llama-micro", layers: 2, stages: 2 },
  { fixture: "qwen3-tiny", layers: 3, stages: 3 },
];
const MAX = 24;

for (const { fixture, layers, stages } of CASES) {
  const dir = fixtureDir(fixture);
  Deno.test(
    needs(
      `speculative chain (${fixture}, ${stages} stages): every drafter and depth gives plain decoding's tokens`,
      {
        "a WebGPU adapter": gpu,
        [fixture]: dir,
      },
    ),
    async () => {
      const whole = await loadEngine(dir!, { gpu: gpu!, weights: "f32" });
      const ref = JSON.parse(await Deno.readTextFile(`${dir}/reference.json`));
      const prompt: number[] = ref.tokens.slice(0, ref.prompt_length);
      const t = await chain(dir!, stages, layers);
      try {
        const V = whole.model.vocab;
        const drafters: [string, () => Drafter][] = [
          ["target", () => new ModelDrafter(whole, { maxSeq: 256, vocab: V })],
          ["ngram", () => new NgramDrafter()],
          [
            "target+noise 0.4",
            () =>
              new NoisyDrafter(new ModelDrafter(whole, { maxSeq: 256, vocab: V }), 0.4, {
                vocab: V,
                seed: 3,
              }),
          ],
        ];
        for (
          const sampling of [{ temperature: 0, topP: 1, seed: 0 }, { temperature: 0.8, topP: 0.9, seed: 11 }]
        ) {
          const plain = await generate(whole, prompt, { maxTokens: MAX, sampling, eosTokenIds: [] });
          for (const [name, make] of drafters) {
            for (const depth of [1, 3]) {
              const drafter = make();
              try {
                const got = await t.pump(t.client.speculate(t.chain, prompt, {
                  maxTokens: MAX,
                  sampling,
                  wire: "f32",
                  drafter,
                  k: 4,
                  depth,
                }));
                const what = `${name}, depth ${depth}, temperature ${sampling.temperature}`;
                assert.deepEqual(got.tokens, plain.tokens, what);
                assert.equal(got.events.length, MAX);
                if (name === "target" && sampling.temperature === 0) {
                  assert.equal(got.stats.acceptedDrafts, got.stats.drafted, `${what}: every draft kept`);
                  assert.ok(got.stats.trips <= Math.ceil(MAX / 3) + 1, `${what}: ${got.stats.trips} trips`);
                  assert.ok(MAX / got.stats.trips >= 3, `${what}: ${MAX / got.stats.trips} per trip`);
                  assert.equal(got.stats.cancelled, 0);
                }
                if (name === "target+noise 0.4" && depth === 3) {
                  assert.ok(got.stats.cancelled > 0, `${what}: rejections cancel pipelined chunks`);
                }
              } finally {
                drafter.close();
              }
            }
          }
        }
        // auto: k and depth chosen per chunk from the request's measurements; the tokens stay plain's.
        const greedy = { temperature: 0, topP: 1, seed: 0 };
        const plain = await generate(whole, prompt, { maxTokens: 40, sampling: greedy, eosTokenIds: [] });
        const drafter = new ModelDrafter(whole, { maxSeq: 256, vocab: V });
        const got = await t.pump(t.client.speculate(t.chain, prompt, {
          maxTokens: 40,
          sampling: greedy,
          wire: "f32",
          drafter,
          k: 2,
          depth: 3,
          auto: true,
        }));
        drafter.close();
        assert.deepEqual(got.tokens, plain.tokens, "auto");
        assert.equal(got.trips[0].drafted, 2, "the first chunk drafts the given k");
        // (Which k it chooses depends on this machine's timings: SpeculationTuner's own test checks that.)
        assert.ok(got.trips.every((x) => x.drafted >= 0 && x.drafted <= 16 && x.depth >= 1 && x.depth <= 3));
        await t.settle();
        for (const a of t.actors) assert.equal(a.backend.stats().active, 0, "released after completion");
        assert.equal(whole.stats().active, 0, "the drafters' sequences are freed");
      } finally {
        await t.close();
        whole.close();
      }
    },
  );
}

Deno.test(
  needs("speculative chain: a one-stage chain verifies on its only stage", {
    "a WebGPU adapter": gpu,
    "llama-micro": fixtureDir("llama-micro"),
  }),
  async () => {
    const dir = fixtureDir("llama-micro")!;
    const whole: Engine = await loadEngine(dir, { gpu: gpu!, weights: "f32" });
    const t = await chain(dir, 1, 2);
    try {
      const prompt = [1, 5, 9, 5, 9, 5, 9];
      const sampling = { temperature: 0, topP: 1, seed: 0 };
      const plain = await generate(whole, prompt, { maxTokens: 16, sampling, eosTokenIds: [] });
      const got = await t.pump(
        t.client.speculate(t.chain, prompt, { maxTokens: 16, sampling, drafter: new NgramDrafter(), k: 3 }),
      );
      assert.deepEqual(got.tokens, plain.tokens);
      assert.equal(got.stopReason, "max_tokens");
      // An eos id inside a chunk of kept drafts ends the output right after it.
      const eos = plain.tokens[5];
      const drafter = new ModelDrafter(whole, { maxSeq: 64, vocab: whole.model.vocab });
      const stopped = await t.pump(
        t.client.speculate(t.chain, prompt, { maxTokens: 16, sampling, eos: [eos], drafter, k: 4, depth: 2 }),
      );
      drafter.close();
      assert.deepEqual(stopped.tokens, plain.tokens.slice(0, plain.tokens.indexOf(eos) + 1));
      assert.equal(stopped.stopReason, "eos");
      // Cancelled mid-way: the request fails with the signal's reason and every stage frees it.
      const abort = new AbortController();
      const cancelled = t.client.speculate(t.chain, prompt, {
        maxTokens: 16,
        sampling,
        drafter: new NgramDrafter(),
        k: 2,
        signal: abort.signal,
        onToken: (e) => e.index === 2 && abort.abort(new Error("stop here")),
      });
      await assert.rejects(t.pump(cancelled), /stop here/);
      await t.settle();
      for (const a of t.actors) assert.equal(a.backend.stats().active, 0, "freed after a cancel");
    } finally {
      await t.close();
      whole.close();
    }
  },
);
