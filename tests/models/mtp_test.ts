// `--draft mtp` (models/mtp.ts): the target's own multi-token-prediction module as a drafter. No
// transformers reference has one (transformers ignores these weights), so: a random module added to
// deepseek-v3-plain / kimi-k2-tiny (scripts/fixtures/make_mtp.ts); its first drafts against a CPU
// reference (with the decoder layer made the identity, the rest of the module is a few lines of CPU);
// its KV cache by position (a step over all rows = the same rows in pieces, as the loop feeds them); and
// speculative decoding with it gives plain decoding's tokens. f32 weights.
import assert from "node:assert/strict";
import { join } from "node:path";
import { fixtureDir } from "../fixtures.ts";
import { needs } from "../support/needs.ts";
import {
  argmaxRowsRef,
  getGpu,
  NoGpuError,
  readBack,
  rmsnormRef,
  writeBytes,
  writeStep,
} from "../../kernels/mod.ts";
import { type Engine, generate, loadEngine, submit } from "../../models/engine.ts";
import { Checkpoint } from "../../models/checkpoint.ts";
import { CheckpointError } from "../../models/errors.ts";
import type { Model } from "../../models/model.ts";
import { loadMtp, MtpDrafter } from "../../models/mtp.ts";
import { speculationJson, speculativeGenerate } from "../../models/speculative.ts";
import { makeMtpCheckpoint } from "../../scripts/fixtures/make_mtp.ts";

const gpu = await getGpu().catch((e) => {
  if (e instanceof NoGpuError) return null;
  throw e;
});
const greedy = { temperature: 0, topP: 1, seed: 0 };
const plainDir = fixtureDir("deepseek-v3-plain")!;
const k2Dir = fixtureDir("kimi-k2-tiny");

async function promptOf(dir: string): Promise<number[]> {
  const ref = JSON.parse(await Deno.readTextFile(join(dir, "reference.json")));
  return ref.tokens.slice(0, ref.prompt_length);
}

async function withMtp(dir: string, fn: (engine: Engine, module: Model, dir: string) => Promise<void>) {
  const engine = await loadEngine(dir, { gpu: gpu!, weights: "f32" });
  const module = await loadMtp(engine, dir);
  try {
    await fn(engine, module, dir);
  } finally {
    module.destroy();
    engine.close();
  }
}

/** Matrix [N, K] times vector [K]. */
function matvec(w: Float32Array, x: Float32Array, N: number, K: number): Float32Array {
  const y = new Float32Array(N);
  for (let n = 0; n < N; n++) {
    let s = 0;
    for (let k = 0; k < K; k++) s += w[n * K + k] * x[k];
    y[n] = s;
  }
  return y;
}

function assertClose(got: Float32Array, want: Float32Array, atol: number, rtol: number, what: string) {
  assert.equal(got.length, want.length, what);
  for (let i = 0; i < got.length; i++) {
    const d = Math.abs(got[i] - want[i]);
    assert.ok(d <= atol + Math.abs(want[i]) * rtol, `${what}[${i}]: ${got[i]} vs ${want[i]}`);
  }
}

Deno.test(
  needs("MTP module: first and chained drafts match a CPU reference (identity decoder layer)", {
    "a WebGPU adapter": gpu,
  }),
  async () => {
    const dir = join(await Deno.makeTempDir(), "mtp-identity");
    await makeMtpCheckpoint(plainDir, dir, { identity: true, seed: 3 });
    const prompt = await promptOf(plainDir);
    await withMtp(dir, async (engine, module) => {
      const P = prompt.length, H = engine.model.hidden, V = engine.model.vocab;
      const ckpt = await Checkpoint.open(dir);
      const eps = ckpt.config.rmsNormEps;
      const p = "model.layers.4.";
      const w = Object.fromEntries(
        await Promise.all(
          [
            "model.embed_tokens.weight",
            "model.norm.weight",
            "lm_head.weight",
            p + "enorm.weight",
            p + "hnorm.weight",
            p + "eh_proj.weight",
            p + "shared_head.norm.weight",
            p + "shared_head.head.weight",
          ].map(async (n) => [n.replace(p, "mtp."), await ckpt.readF32(n)] as const),
        ),
      );
      engine.open("r", { maxSeq: 32, sampling: greedy });
      const best = await engine.verify("r", 0, prompt);
      const first = best[P - 1];
      const h = new Float32Array(await readBack(gpu!, engine.hiddenStates("r").buffer, P * H * 4));
      // The rows are the last layer's output before the final norm: the target's own head gives its logits.
      const targetLogits = await engine.logits(prompt);
      for (let t = 0; t < P; t++) {
        const row = h.subarray(t * H, (t + 1) * H);
        const logits = matvec(w["lm_head.weight"], rmsnormRef(row, w["model.norm.weight"], H, eps), V, H);
        assertClose(logits, targetLogits.subarray(t * V, (t + 1) * V), 1e-4, 1e-4, `target row ${t}`);
      }
      // CPU: h' = eh_proj(concat(enorm(embed(next)), hnorm(h))); the layer adds nothing; shared head.
      const module1 = (token: number, hidden: Float32Array) => {
        const e = rmsnormRef(
          w["model.embed_tokens.weight"].subarray(token * H, (token + 1) * H),
          w["mtp.enorm.weight"],
          H,
          eps,
        );
        const cat = new Float32Array(2 * H);
        cat.set(e, 0);
        cat.set(rmsnormRef(hidden, w["mtp.hnorm.weight"], H, eps), H);
        const out = matvec(w["mtp.eh_proj.weight"], cat, H, 2 * H);
        const logits = matvec(
          w["mtp.shared_head.head.weight"],
          rmsnormRef(out, w["mtp.shared_head.norm.weight"], H, eps),
          V,
          H,
        );
        return { out, logits };
      };
      const next = [...prompt.slice(1), first];
      const want = next.map((tok, t) => module1(tok, h.subarray(t * H, (t + 1) * H)));
      // GPU: every row's logits from one step of the module over the prompt.
      const seq = module.newSequence({
        maxSeq: 32,
        sampling: greedy,
        hidden: engine.hiddenStates("r").buffer,
      });
      try {
        writeBytes(gpu!, seq.tokens, 0, Uint32Array.from(next));
        writeStep(gpu!, seq.step, { pos0: 0, T: P, tokOut: P });
        submit(gpu!, seq.program(P, "logits"));
        const got = new Float32Array(await readBack(gpu!, seq.logits!, P * V * 4));
        for (let t = 0; t < P; t++) {
          assertClose(got.subarray(t * V, (t + 1) * V), want[t].logits, 1e-4, 1e-4, `mtp row ${t}`);
        }
      } finally {
        seq.destroy();
      }
      // The drafter: draft 1 from the last row, draft 2 chained on its output and draft 1.
      const d1 = argmaxRowsRef(want[P - 1].logits, V)[0];
      const d2 = argmaxRowsRef(module1(d1, want[P - 1].out).logits, V)[0];
      const drafter = new MtpDrafter(engine, module, { maxSeq: 32 });
      try {
        await drafter.observe("r", 0, next);
        assert.deepEqual(await drafter.draft([...prompt, first], 2), [d1, d2]);
      } finally {
        drafter.close();
        engine.release("r");
      }
    });
  },
);

Deno.test(
  needs("MTP module: its KV cache follows positions (one step over all rows = the rows in pieces)", {
    "a WebGPU adapter": gpu,
  }),
  async () => {
    const dir = join(await Deno.makeTempDir(), "mtp-random");
    await makeMtpCheckpoint(plainDir, dir, { ownHead: false, seed: 4 });
    const prompt = await promptOf(plainDir);
    await withMtp(dir, async (engine, module) => {
      const P = prompt.length, V = engine.model.vocab;
      const run = async (pieces: number[]) => {
        engine.open("r", { maxSeq: 32, sampling: greedy });
        const seq = module.newSequence({
          maxSeq: 32,
          sampling: greedy,
          hidden: engine.hiddenStates("r").buffer,
        });
        const rows = new Float32Array(P * V);
        try {
          let pos0 = 0;
          for (const n of pieces) {
            const best = await engine.verify("r", pos0, prompt.slice(pos0, pos0 + n));
            const next = pos0 + n < P
              ? prompt.slice(pos0 + 1, pos0 + n + 1)
              : [...prompt.slice(pos0 + 1), best[n - 1]];
            writeBytes(gpu!, seq.tokens, pos0 * 4, Uint32Array.from(next));
            writeStep(gpu!, seq.step, { pos0, T: n, tokOut: pos0 + n });
            submit(gpu!, seq.program(n, "logits"));
            rows.set(new Float32Array(await readBack(gpu!, seq.logits!, n * V * 4)), pos0 * V);
            pos0 += n;
          }
          return rows;
        } finally {
          seq.destroy();
          engine.release("r");
        }
      };
      const whole = await run([P]);
      const pieces = await run([4, 1, 3, 1]);
      assertClose(pieces, whole, 1e-4, 1e-4, "logits");
    });
  },
);

const SPEC_FIXTURES: [string, string | null, boolean][] = [
  ["deepseek-v3-plain", plainDir, false],
  ["kimi-k2-tiny", k2Dir, true],
];
for (const [name, src, ownHead] of SPEC_FIXTURES) {
  Deno.test(
    needs(`speculative with --draft mtp (${name} + a random module): plain decoding's tokens`, {
      "a WebGPU adapter": gpu,
      [name]: src,
    }),
    async () => {
      const dir = join(await Deno.makeTempDir(), `${name}-mtp`);
      await makeMtpCheckpoint(src!, dir, { ownHead, seed: 5 });
      const prompt = await promptOf(src!);
      await withMtp(dir, async (engine, module) => {
        for (const sampling of [greedy, { temperature: 1, topP: 0.9, seed: 7 }]) {
          const plain = await generate(engine, prompt, { maxTokens: 20, sampling, eosTokenIds: [] });
          for (const k of [1, 4]) {
            const d = new MtpDrafter(engine, module, { maxSeq: prompt.length + 21 });
            try {
              const r = await speculativeGenerate(engine, d, prompt, { k, maxTokens: 20, eos: [], sampling });
              assert.deepEqual(r.tokens, plain.tokens, `k = ${k}, temperature ${sampling.temperature}`);
              assert.ok(
                r.trips >= 1 && r.drafted > 0,
                JSON.stringify(speculationJson(r, r.tokens.length, "mtp", k)),
              );
            } finally {
              d.close();
            }
          }
        }
      });
    },
  );
}

Deno.test(
  needs("loadMtp: a checkpoint without a module is a CheckpointError saying so", { "a WebGPU adapter": gpu }),
  async () => {
    const engine = await loadEngine(plainDir, { gpu: gpu!, weights: "f32" });
    try {
      await assert.rejects(
        loadMtp(engine, plainDir),
        (e) => e instanceof CheckpointError && /num_nextn_predict_layers is 0 or absent/.test(e.message),
      );
      // The config names a module the weights lack.
      const dir = join(await Deno.makeTempDir(), "no-weights");
      await Deno.mkdir(dir);
      const config = JSON.parse(await Deno.readTextFile(join(plainDir, "config.json")));
      await Deno.writeTextFile(
        join(dir, "config.json"),
        JSON.stringify({ ...config, num_nextn_predict_layers: 1 }),
      );
      await Deno.copyFile(join(plainDir, "model.safetensors"), join(dir, "model.safetensors"));
      await assert.rejects(
        loadMtp(engine, dir),
        (e) =>
          e instanceof CheckpointError &&
          /lack the module \(missing model\.layers\.4\.enorm\.weight/.test(e.message),
      );
    } finally {
      engine.close();
    }
  },
);

Deno.test(
  needs("an oracle MTP module (the target made a bigram model) has every draft kept", {
    "a WebGPU adapter": gpu,
  }),
  async () => {
    const dir = join(await Deno.makeTempDir(), "mtp-oracle");
    await makeMtpCheckpoint(plainDir, dir, { oracle: true });
    const prompt = await promptOf(plainDir);
    await withMtp(dir, async (engine, module) => {
      const plain = await generate(engine, prompt, { maxTokens: 20, sampling: greedy, eosTokenIds: [] });
      for (const k of [1, 4]) {
        const d = new MtpDrafter(engine, module, { maxSeq: prompt.length + 21 });
        try {
          const r = await speculativeGenerate(engine, d, prompt, {
            k,
            maxTokens: 20,
            eos: [],
            sampling: greedy,
          });
          assert.deepEqual(r.tokens, plain.tokens);
          assert.equal(r.rejections, 0);
          assert.equal(r.acceptedDrafts, r.drafted);
          // The prefill's token, then k + 1 tokens a trip.
          assert.equal(r.trips, 1 + Math.ceil(19 / (k + 1)), `k = ${k}`);
        } finally {
          d.close();
        }
      }
    });
  },
);
