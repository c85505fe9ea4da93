// Speculative vs plain decoding on a 5-stage chain with a fixed one-way delay per hop (issue 19, part 5).
//
//   deno run -A scripts/bench/speculative_wan.ts [--stages 5] [--delays 0,10,25] [--max-tokens 40] [--k 4]
//     [--json FILE]
//
// What it emulates: every stage is a real engine (a random 5-layer model with llama-micro's shapes and a
// 512-token vocabulary, one layer per stage, f32 weights and wire) on this machine's WebGPU adapter, and
// the stages' actors talk over the in-memory network on the real clock with `delay` ms one way on every
// link (stage i -> i + 1, and the head's answer back to stage 0's node, where the client and the drafter
// run). It is not scripts/bench/pipeline_wan.ts's emulation (network namespaces, relays, iroh): no root
// needed, no QUIC or TCP costs, so it isolates what speculation changes: trips per token. Acceptance is
// controlled: the target as its own draft (~1.0), the same with each drafted token replaced with
// probability 0.2 and 0.4 (~0.8 and ~0.6), and n-gram lookup on a repetitive prompt. Each row is printed
// next to the plain bound (1000 / (stages x delay) tok/s: one token per trip) and the cost model's
// prediction (planner/speculative.ts) from the measured plain trip time and the measured acceptance.
import { parseFlags } from "../../cli/command.ts";
import { SystemClock } from "../../node/clock.ts";
import { MemoryNetwork } from "../../node/transport/memory.ts";
import { ActorSystem } from "../../node/actors/mod.ts";
import type { PeerAddr } from "../../node/transport/transport.ts";
import { StageActor, stageName } from "../../node/stage/stage_actor.ts";
import { type Chain, PipelineClient } from "../../node/stage/client.ts";
import { splitLayers } from "../../node/stage/roles.ts";
import { getGpu } from "../../kernels/mod.ts";
import { loadEngine } from "../../models/engine.ts";
import {
  acceptanceRate,
  type Drafter,
  ModelDrafter,
  NgramDrafter,
  NoisyDrafter,
} from "../../models/speculative.ts";
import { predictSpeculative } from "../../planner/speculative.ts";
import { llamaMicroShapedCheckpoint } from "./random_checkpoint.ts";
import { scriptArgs } from "../args.ts";

const { values } = scriptArgs(import.meta.url, (args) =>
  parseFlags(args, {
    stages: { type: "string", default: "5" },
    delays: { type: "string", default: "0,10,25" },
    "max-tokens": { type: "string", default: "40" },
    k: { type: "string", default: "4" },
    json: { type: "string" },
  }));
const STAGES = Number(values.stages);
const MAX = Number(values["max-tokens"]);
const K = Number(values.k);
const delays = values.delays!.split(",").map(Number);

const dir = await llamaMicroShapedCheckpoint(STAGES);
const gpu = await getGpu();
const whole = await loadEngine(dir, { gpu, weights: "f32" });
const V = whole.model.vocab;

async function chainWithDelay(delayMs: number) {
  const clock = new SystemClock();
  const net = new MemoryNetwork(clock, { link: { delayMs } });
  const names = new Map<string, string>();
  const addrs = new Map<string, PeerAddr>();
  const systems = Array.from({ length: STAGES }, (_, i) => {
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
  for (const role of splitLayers(STAGES, STAGES)) {
    const backend = await loadEngine(dir, { role, gpu, weights: "f32" });
    const sys = systems[role.index];
    const actor = new StageActor({
      backend,
      planVersion: 1,
      log: (m) => console.error(m),
      send: (name, body) => sys.send(name, body, { channel: "data" }),
    });
    sys.spawn(stageName(role.index), actor);
    actors.push(actor);
  }
  const client = new PipelineClient(systems[0], "n0", { stallMs: 120_000 }); // beside stage 0
  const chain: Chain = { version: 1, nodes: actors.map((_, i) => `n${i}`) };
  return {
    client,
    chain,
    close: async () => {
      await client.close();
      for (const a of actors) await a.onStop();
      for (const s of systems) await s.close();
    },
  };
}

const PROMPT = [1, 17, 99, 230, 5, 71, 402, 310, 12, 44];
const REPETITIVE = Array.from({ length: 40 }, (_, i) => [1, 17, 99, 230, 5][i % 5]);
const greedy = { temperature: 0, topP: 1, seed: 0 };
const rows: Record<string, unknown>[] = [];
const lines = [
  "| ms/hop | run | k, depth | tok/s | x plain | plain bound | trips | tokens/trip | acceptance | predicted tok/s |",
  "|---|---|---|---|---|---|---|---|---|---|",
];
for (const delay of delays) {
  const c = await chainWithDelay(delay);
  try {
    const bound = delay > 0 ? 1000 / (STAGES * delay) : Infinity;
    // Warm-up (builds the stages' GPU programs), then plain.
    await c.client.generate(c.chain, PROMPT, { maxTokens: 4, sampling: greedy, wire: "f32" });
    for (const prompt of [PROMPT, REPETITIVE]) { // and the verification steps' programs, the drafter's
      const d = new ModelDrafter(whole, { maxSeq: 256, vocab: V });
      await c.client.speculate(c.chain, prompt, {
        maxTokens: 12,
        sampling: greedy,
        wire: "f32",
        drafter: d,
        k: K,
      });
      d.close();
    }
    const plainRuns: Record<string, number> = {};
    let tripMs = 0;
    let plainComputeMs = 0;
    for (const [name, prompt] of [["plain", PROMPT], ["plain (repetitive prompt)", REPETITIVE]] as const) {
      const r = await c.client.generate(c.chain, [...prompt], {
        maxTokens: MAX,
        sampling: greedy,
        wire: "f32",
      });
      plainRuns[name] = r.tokS;
      if (name === "plain") {
        tripMs = 1000 / r.tokS;
        plainComputeMs = mean(r.events.slice(1).map((e) => sum(e.trace.map((h) => h.c))));
      }
      rows.push({ delay, run: name, tok_s: r.tokS, bound });
      lines.push(`| ${delay} | ${name} | | ${r.tokS.toFixed(1)} | 1.00 | ${fmt(bound)} | ${MAX} | 1 | | |`);
    }
    const runs: [string, () => Drafter, number[], number, boolean?][] = [
      ["target as draft", () => new ModelDrafter(whole, { maxSeq: 256, vocab: V }), PROMPT, 1],
      ["target + noise 0.2", () => noisy(0.2), PROMPT, 1],
      ["target + noise 0.2, depth 2", () => noisy(0.2), PROMPT, 2],
      ["target + noise 0.2, auto (depth <= 3)", () => noisy(0.2), PROMPT, 3, true],
      ["target + noise 0.4", () => noisy(0.4), PROMPT, 1],
      ["ngram, repetitive prompt", () => new NgramDrafter(), REPETITIVE, 1],
    ];
    for (const [name, make, prompt, depth, auto] of runs) {
      const d = make();
      try {
        const t0 = performance.now();
        const r = await c.client.speculate(c.chain, [...prompt], {
          maxTokens: MAX,
          sampling: greedy,
          wire: "f32",
          drafter: d,
          k: K,
          depth,
          auto,
        });
        const ms = performance.now() - t0;
        const alpha = acceptanceRate(r.stats) ?? 0;
        const draftMs = r.trips.reduce((a, t) => a + t.draftMs, 0) / Math.max(1, r.trips.length);
        const base = prompt === REPETITIVE ? 1000 / plainRuns["plain (repetitive prompt)"] : tripMs;
        // A verification step computes k + 1 tokens at every stage: what that adds to a trip, measured.
        const verifyComputeMs = mean(
          r.trips.filter((t) => t.trace).map((t) => sum(t.trace!.map((h) => h.c))),
        );
        const extraStepMs = Math.max(0, verifyComputeMs - plainComputeMs);
        // auto: predicted at the mean k and depth it chose
        const kUsed = auto ? Math.max(1, Math.round(mean(r.trips.map((t) => t.drafted)))) : K;
        const depthUsed = auto ? Math.max(1, Math.round(mean(r.trips.map((t) => t.depth)))) : depth;
        const p = predictSpeculative({
          tripMs: base,
          alpha,
          k: kUsed,
          depth: depthUsed,
          draftMs,
          extraStepMs,
        });
        const plainTokS = prompt === REPETITIVE ? plainRuns["plain (repetitive prompt)"] : plainRuns.plain;
        const perTrip = r.tokens.length / r.stats.trips;
        rows.push({
          delay,
          run: name,
          tok_s: r.tokS,
          x_plain: r.tokS / plainTokS,
          bound,
          trips: r.stats.trips,
          cancelled: r.stats.cancelled,
          accepted_per_trip: perTrip,
          acceptance: alpha,
          predicted_tok_s: 1000 / p.msPerToken,
          draft_ms: draftMs,
          k: kUsed,
          depth: depthUsed,
          extra_step_ms: extraStepMs,
          wall_ms: ms,
        });
        lines.push(
          `| ${delay} | ${name} | ${auto ? "~" : ""}${kUsed}, ${auto ? "~" : ""}${depthUsed} | ${
            r.tokS.toFixed(1)
          } | ${(r.tokS / plainTokS).toFixed(2)} | ${fmt(bound)} | ` +
            `${r.stats.trips}${r.stats.cancelled ? ` (+${r.stats.cancelled} cancelled)` : ""} | ` +
            `${perTrip.toFixed(2)} | ${alpha.toFixed(2)} | ${(1000 / p.msPerToken).toFixed(1)} |`,
        );
        console.error(lines.at(-1));
      } finally {
        d.close();
      }
    }
  } finally {
    await c.close();
  }
}
console.log(lines.join("\n"));
if (values.json) await Deno.writeTextFile(values.json, rows.map((r) => JSON.stringify(r)).join("\n") + "\n");
whole.close();

function noisy(p: number): Drafter {
  return new NoisyDrafter(new ModelDrafter(whole, { maxSeq: 256, vocab: V }), p, { vocab: V, seed: 7 });
}

function sum(xs: number[]): number {
  return xs.reduce((a, b) => a + b, 0);
}

function mean(xs: number[]): number {
  return xs.length ? sum(xs) / xs.length : 0;
}

function fmt(x: number): string {
  return Number.isFinite(x) ? x.toFixed(1) : "-";
}
