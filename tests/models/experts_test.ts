// Expert parallelism in the engine: a part whose MoE layers' routed experts are held by expert hosts
// (models/experts.ts) runs its steps in segments, asks the hosts at each such layer, and gives the whole
// model's tokens and logits; here the hosts are two in-process ExpertHosts splitting each layer's experts.
import assert from "node:assert/strict";
import { join } from "node:path";
import { fixtureDir } from "../fixtures.ts";
import { needs } from "../support/needs.ts";
import { getGpu, NoGpuError } from "../../kernels/mod.ts";
import { Checkpoint } from "../../models/checkpoint.ts";
import { generate, loadEngine } from "../../models/engine.ts";
import { ExpertHost } from "../../models/experts.ts";
import { readSafetensorsHeader, readTensorBytes } from "../../models/safetensors.ts";

const gpu = await getGpu().catch((e) => {
  if (e instanceof NoGpuError) return null;
  throw e;
});
const greedy = { temperature: 0, topP: 1, seed: 0 };

for (const name of ["kimi-k2-tiny", "mixtral-tiny", "qwen3-moe-norm"]) {
  Deno.test(
    needs(`${name}: experts split over two hosts give the reference tokens and logits`, {
      "a WebGPU adapter": gpu,
    }),
    async () => {
      const dir = fixtureDir(name)!;
      const ref = JSON.parse(await Deno.readTextFile(join(dir, "reference.json")));
      const prompt: number[] = ref.tokens.slice(0, ref.prompt_length);
      const want = new Float32Array(
        (await readTensorBytes(
          (await readSafetensorsHeader(join(dir, "reference.safetensors"))).get("logits")!,
        ))
          .slice().buffer,
      );
      const ckpt = await Checkpoint.open(dir);
      const c = ckpt.config;
      const moeLayers: number[] = [];
      const even = new Map<number, number[]>(), odd = new Map<number, number[]>();
      for (let l = 0; l < c.numLayers; l++) {
        const f = c.layer(l).ffn;
        if (f.kind !== "moe") continue;
        moeLayers.push(l);
        const all = Array.from({ length: f.routing.experts }, (_, e) => e);
        // Uneven, non-contiguous sets: every other expert, and a layer wholly on one host.
        even.set(l, all.filter((e) => e % 2 === 0 || l === moeLayers[0]));
        if (l !== moeLayers[0]) odd.set(l, all.filter((e) => e % 2 === 1));
      }
      const hosts = [
        await ExpertHost.load(gpu!, ckpt, even, { weights: "f32" }),
        await ExpertHost.load(gpu!, ckpt, odd, { weights: "f32" }),
      ];
      const calls: number[] = [];
      const engine = await loadEngine(dir, {
        gpu: gpu!,
        weights: "f32",
        remoteExperts: moeLayers,
        fanout: async (layer, input) => {
          calls.push(layer);
          const parts = await Promise.all(
            hosts.filter((h) => h.held().has(layer)).map((h) => h.compute(layer, input)),
          );
          const sum = new Float32Array(input.T * c.hiddenSize);
          for (const p of parts) for (let i = 0; i < sum.length; i++) sum[i] += p[i];
          return sum;
        },
      });
      try {
        const cont: number[] = ref.tokens.slice(ref.prompt_length);
        const eos = [c.eosTokenIds].flat();
        const stop = cont.findIndex((t) => eos.includes(t));
        const expected = stop >= 0 ? cont.slice(0, stop + 1) : cont;
        const r = await generate(engine, prompt, {
          maxTokens: cont.length,
          sampling: greedy,
          eosTokenIds: c.eosTokenIds,
        });
        assert.deepEqual(r.tokens, expected);
        const got = await engine.logits(ref.tokens);
        const V = c.vocabSize;
        let worst = 0;
        for (let row = 0; row < ref.tokens.length; row++) {
          let scale = 0, err = 0;
          for (let i = row * V; i < (row + 1) * V; i++) {
            scale = Math.max(scale, Math.abs(want[i]));
            err = Math.max(err, Math.abs(got[i] - want[i]));
          }
          worst = Math.max(worst, err / scale);
        }
        assert.ok(worst <= 1e-4, `logits error ${worst}`);
        assert.ok(
          calls.length > 0 && moeLayers.every((l) => calls.includes(l)),
          "every MoE layer went to the hosts",
        );
      } finally {
        engine.close();
        for (const h of hosts) h.close();
      }
    },
  );
}

// Quantised experts on hosts: a prefill chunk's slots grouped by expert (kernels/moe_ffn.ts moeRoutedCalls,
// int8 inputs where the adapter has packed dots) over the slots each host holds, the rest skipped, give the
// logits the stage's own experts give with the same weights: the same kernels, only the order the sums meet
// in differs (~3e-7 of a row's largest logit). kimi-k2-tiny's grouped routing has near ties that this order
// can flip at one row (6.2e-3 at q4, 6.9e-4 at q8, every other row ~3e-7), so one row may be off by a flip;
// a slot summed twice, dropped or misplaced would move every row.
for (
  const [name, weights] of [["mixtral-tiny", "q4"], ["kimi-k2-tiny", "q4"], ["qwen3-moe-norm", "q8"]] as const
) {
  Deno.test(
    needs(`${name} ${weights}: experts on two hosts give the stage's own teacher-forced logits`, {
      "a WebGPU adapter": gpu,
    }),
    async () => {
      const dir = fixtureDir(name)!;
      const ref = JSON.parse(await Deno.readTextFile(join(dir, "reference.json")));
      const tokens: number[] = ref.tokens;
      const ckpt = await Checkpoint.open(dir);
      const c = ckpt.config;
      const moeLayers: number[] = [];
      const halves = [new Map<number, number[]>(), new Map<number, number[]>()];
      for (let l = 0; l < c.numLayers; l++) {
        const f = c.layer(l).ffn;
        if (f.kind !== "moe") continue;
        moeLayers.push(l);
        const all = Array.from({ length: f.routing.experts }, (_, e) => e);
        halves[0].set(l, all.filter((e) => e % 3 !== 0));
        halves[1].set(l, all.filter((e) => e % 3 === 0));
      }
      const hosts = await Promise.all(halves.map((h) => ExpertHost.load(gpu!, ckpt, h, { weights })));
      const grouped: number[] = [];
      const split = await loadEngine(dir, {
        gpu: gpu!,
        weights,
        remoteExperts: moeLayers,
        fanout: async (layer, input) => {
          if (input.T > 4) grouped.push(input.T);
          const parts = await Promise.all(hosts.map((h) => h.compute(layer, input)));
          return parts.reduce((a, p) => a.map((v, i) => v + p[i]));
        },
      });
      const whole = await loadEngine(dir, { gpu: gpu!, weights });
      try {
        const want = await whole.logits(tokens);
        const got = await split.logits(tokens);
        assert.ok(grouped.length > 0 && tokens.length > 4, "the hosts ran a grouped step");
        const V = c.vocabSize;
        const rows: number[] = [];
        for (let row = 0; row < tokens.length; row++) {
          let scale = 0, err = 0;
          for (let i = row * V; i < (row + 1) * V; i++) {
            scale = Math.max(scale, Math.abs(want[i]));
            err = Math.max(err, Math.abs(got[i] - want[i]));
          }
          rows.push(err / scale);
        }
        const off = rows.filter((e) => !(e <= 1e-5));
        assert.ok(
          off.length <= 1 && off.every((e) => e <= 2e-2),
          `rows off the stage's own logits: ${off.map((e) => e.toExponential(1))}`,
        );
      } finally {
        split.close();
        whole.close();
        for (const h of hosts) h.close();
      }
    },
  );
}

Deno.test(
  needs("an expert host refuses a layer or expert it cannot hold, naming it", { "a WebGPU adapter": gpu }),
  async () => {
    const ckpt = await Checkpoint.open(fixtureDir("kimi-k2-tiny")!);
    await assert.rejects(ExpertHost.load(gpu!, ckpt, new Map([[0, [1]]])), /layer 0 has no experts/);
    await assert.rejects(
      ExpertHost.load(gpu!, ckpt, new Map([[1, [16]]])),
      /experts 0\.\.15; asked to hold 16/,
    );
    const h = await ExpertHost.load(gpu!, ckpt, new Map([[1, [3, 1]]]), { weights: "f32" });
    try {
      assert.deepEqual(h.held(), new Map([[1, [1, 3]]]));
      await assert.rejects(
        h.compute(2, {
          T: 1,
          xn: new Float32Array(64),
          ids: new Uint32Array(4),
          weights: new Float32Array(4),
        }),
        /holds no experts of layer 2/,
      );
    } finally {
      h.close();
    }
  },
);
