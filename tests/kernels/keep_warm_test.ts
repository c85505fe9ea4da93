// Keeping a stage's GPU clock up (kernels/keep_warm.ts): the controller's sizing on a fake clock (no filler
// before the rhythm is known, a fraction of the shortest recent gap, none over overlapping steps, none after
// a pause, smaller when steps run slow), SWACTOR_KEEP_WARM's parsing, and on a GPU: a stage and an expert
// host that queue fillers between their steps return exactly what ones that do not return.
import assert from "node:assert/strict";
import { EnvError, getGpu, KeepWarm, keepWarmFromEnv, WarmController } from "../../kernels/mod.ts";
import { loadEngine } from "../../models/engine.ts";
import { Checkpoint } from "../../models/checkpoint.ts";
import { ExpertHost } from "../../models/experts.ts";
import { fixtureDir } from "../fixtures.ts";
import { gpuAvailable, needs } from "../support/needs.ts";

/** Runs `steps` steps of `stepMs` each with `gapMs` between them; returns each step's filler (ms). */
function rhythm(c: WarmController, steps: number, stepMs: number, gapMs: number, t0 = 0): number[] {
  const fills: number[] = [];
  let t = t0;
  for (let i = 0; i < steps; i++) {
    c.start(t);
    t += stepMs;
    fills.push(c.end(t, "T1", stepMs));
    t += gapMs;
  }
  return fills;
}

Deno.test("WarmController: a fraction of the shortest recent gap, once `history` gaps are seen", () => {
  const c = new WarmController({ fraction: 0.3, history: 4 });
  const fills = rhythm(c, 6, 1, 4);
  // The first step has no gap before it; gaps 1..4 come before steps 2..5.
  assert.deepEqual(fills.slice(0, 4), [0, 0, 0, 0]);
  assert.ok(Math.abs(fills[4] - 1.2) < 1e-9, `fill ${fills[4]}`);
  // One short gap among long ones sizes the filler.
  c.start(100);
  c.end(101, "T1", 1); // gap 100 - 30 = 70 ms: a pause, history cleared
  // Four 8 ms gaps again (the first before the first of these steps) before the next filler.
  const after = rhythm(c, 4, 1, 8, 101 + 8);
  assert.deepEqual(after.slice(0, 3), [0, 0, 0]);
  assert.ok(Math.abs(after[3] - 2.4) < 1e-9, `fill ${after[3]}`);
  const d = new WarmController({ fraction: 0.5, history: 2 });
  rhythm(d, 2, 1, 6);
  d.start(20);
  assert.equal(d.end(21, "T1", 1), 0.5 * 6);
  d.start(23); // a 2 ms gap
  assert.equal(d.end(24, "T1", 1), 0.5 * 2);
});

Deno.test("WarmController: capped, skipped when tiny, none while another step runs", () => {
  const c = new WarmController({ fraction: 0.5, history: 1, maxFillMs: 2 });
  assert.deepEqual(rhythm(c, 3, 1, 20), [0, 2, 2]);
  const tiny = new WarmController({ fraction: 0.3, history: 1, minFillMs: 0.05 });
  assert.deepEqual(rhythm(tiny, 3, 1, 0.1), [0, 0, 0]);
  // Two requests' steps overlap: no gap counted between them, no filler while one still runs.
  const o = new WarmController({ fraction: 0.5, history: 1 });
  rhythm(o, 2, 1, 4);
  o.start(10);
  o.start(10.5);
  assert.equal(o.end(11, "T1", 1), 0, "the other step still runs");
  assert.ok(o.running);
  assert.equal(o.end(11.5, "T1", 1), 0.5 * (10 - 6));
  assert.ok(!o.running);
});

Deno.test("WarmController: slow steps (a low clock, or a filler in the way) shrink the filler", () => {
  const c = new WarmController({ fraction: 0.4, history: 2 });
  const fast = rhythm(c, 3, 1, 5).at(-1)!;
  assert.ok(Math.abs(fast - 2) < 1e-9);
  // Steps now take 3x the best: the filler falls towards a third.
  const slow = rhythm(c, 4, 3, 5, 100);
  assert.ok(slow.at(-1)! < fast / 2.5, `slow ${slow}`);
  // And grows back as they speed up.
  const back = rhythm(c, 6, 1, 5, 200);
  assert.ok(Math.abs(back.at(-1)! - fast) < 0.1, `back ${back}`);
});

Deno.test("WarmController and SWACTOR_KEEP_WARM: bad settings are refused", () => {
  assert.throws(() => new WarmController({ fraction: 1.5 }), RangeError);
  assert.throws(() => new WarmController({ history: 0 }), RangeError);
  assert.equal(keepWarmFromEnv(""), "auto");
  assert.equal(keepWarmFromEnv("auto"), "auto");
  assert.equal(keepWarmFromEnv("1"), true);
  assert.equal(keepWarmFromEnv("0"), false);
  assert.throws(() => keepWarmFromEnv("yes"), EnvError);
});

const hasGpu = await gpuAvailable();
const tiny = fixtureDir("llama3-tiny");

Deno.test(
  needs("keep-warm: a stage with fillers between its steps gives the same hidden states, and queues them", {
    "a WebGPU adapter": hasGpu,
    "tests/fixtures/llama3-tiny": tiny,
  }),
  async () => {
    const role = { index: 0, stages: 2, layers: [0, 2] as [number, number], embeds: true, head: false };
    const warm = await loadEngine(tiny!, { role, keepWarm: true });
    const plain = await loadEngine(tiny!, { role, gpu: warm.gpu });
    try {
      if (!warm.gpu.hasTimestamps) {
        console.log(`keep-warm is off on ${warm.gpu.adapterName}: it has no timestamp queries`);
        return;
      }
      const greedy = { temperature: 0, topP: 1, seed: 0 };
      const outs: Float32Array[][] = [];
      for (const e of [warm, plain]) {
        e.open("r", { maxSeq: 64, sampling: greedy });
        const hidden: Float32Array[] = [];
        for (let p = 0; p < 24; p++) {
          const T = p === 0 ? 8 : 1;
          const pos0 = p === 0 ? 0 : 7 + p;
          const tokens = Uint32Array.from({ length: T }, (_, i) => (pos0 + i) * 37 % 200);
          hidden.push((await e.run("r", { pos0, T, tokens, output: "hidden" })).hidden!);
          await new Promise((r) => setTimeout(r, 2)); // the gap a filler fills
        }
        e.release("r");
        outs.push(hidden);
      }
      assert.deepEqual(outs[0], outs[1]);
      const stats = warm.warmStats()!;
      assert.ok(stats.fills >= 10, `fillers queued: ${stats.fills}`);
      assert.ok(stats.fillMs > 0);
      assert.equal(plain.warmStats(), undefined);
    } finally {
      warm.close();
      plain.close();
    }
  },
);

const moe = fixtureDir("mixtral-tiny");

Deno.test(
  needs("keep-warm: an expert host with fillers between its calls gives the same sums, and queues them", {
    "a WebGPU adapter": hasGpu,
    "tests/fixtures/mixtral-tiny": moe,
  }),
  async () => {
    const gpu = await getGpu();
    const warm = await KeepWarm.create(gpu);
    if (!warm) {
      console.log(`keep-warm is off on ${gpu.adapterName}: it has no timestamp queries`);
      return;
    }
    const ckpt = await Checkpoint.open(moe!);
    const ffn = ckpt.config.layer(0).ffn;
    assert.equal(ffn.kind, "moe");
    const E = ffn.kind === "moe" ? ffn.routing.experts : 0, k = ffn.kind === "moe" ? ffn.routing.topK : 0;
    const hold = new Map([[0, Array.from({ length: E }, (_, e) => e)]]);
    const hosts = [
      await ExpertHost.load(gpu, ckpt, hold, { weights: "f32" }),
      await ExpertHost.load(gpu, ckpt, hold, { weights: "f32" }),
    ];
    hosts[0].keepWarm = warm;
    try {
      const H = ckpt.config.hiddenSize;
      const sums: Float32Array[][] = [[], []];
      for (let i = 0; i < 12; i++) {
        const input = {
          T: 1,
          xn: Float32Array.from({ length: H }, (_, j) => Math.sin(i * 31 + j)),
          ids: Uint32Array.from({ length: k }, (_, j) => (i + j * 3) % E),
          weights: Float32Array.from({ length: k }, (_, j) => 1 / (j + 2)),
        };
        for (const [h, host] of hosts.entries()) sums[h].push(await host.compute(0, input));
        await new Promise((r) => setTimeout(r, 2));
      }
      assert.deepEqual(sums[0], sums[1]);
      assert.ok(warm.stats.fills >= 4, `fillers queued: ${warm.stats.fills}`);
    } finally {
      for (const h of hosts) h.close();
      warm.destroy();
    }
  },
);
