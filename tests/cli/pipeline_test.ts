// Acceptance of the pipeline (issue 4) with real processes on loopback: the reference continuation and
// logits through `--local N` chains (N = 2, 3, 5, 8; llama3-tiny has 4 layers, so 5 and 8 split off the
// embedding and the head, and 8 leaves 2 nodes idle), and on one shared 5-node cluster: concurrent requests,
// cancellation (every stage frees its KV cache) and a stage killed with SIGKILL (a clear error in seconds).
import assert from "node:assert/strict";
import { join } from "node:path";
import { fixtureDir } from "../fixtures.ts";
import { gpuAvailable, needs } from "../support/needs.ts";
import { checkFixture } from "../../scripts/check_fixture.ts";
import { startLocalCluster } from "../../cli/local_cluster.ts";
import { runCli } from "./run.ts";

const GPU = "a WebGPU adapter";
const hasGpu = await gpuAvailable();
const tiny = fixtureDir("llama3-tiny", { needs: "reference.safetensors" });
const slow = { sanitizeOps: false, sanitizeResources: false };

async function check(dir: string, local: number) {
  const r = await checkFixture(dir, { local });
  assert.deepEqual(r.generated, r.expected, `--local ${local}: tokens`);
  assert.ok(r.logitsError <= 1e-4, `--local ${local}: logits error ${r.logitsError}`);
}

Deno.test({
  ...needs("pipeline: llama-micro on 3 nodes (one embeds only): reference tokens and logits", {
    [GPU]: hasGpu,
  }),
  ...slow,
}, async () => {
  await check(fixtureDir("llama-micro", { needs: "reference.safetensors" })!, 3);
});

Deno.test({
  ...needs(
    "pipeline: SWACTOR_GPU_THREAD=1, stages and expert hosts on their own thread: reference tokens and logits",
    {
      [GPU]: hasGpu,
    },
  ),
  ...slow,
}, async () => {
  // Inherited by the node processes `--local` starts (cli/pipeline_node.ts gpuThreadOn).
  Deno.env.set("SWACTOR_GPU_THREAD", "1");
  try {
    await check(fixtureDir("llama-micro", { needs: "reference.safetensors" })!, 3);
    // A MoE model with its experts spread over the nodes: stages call back for remote experts, hosts compute.
    const r = await checkFixture(fixtureDir("mixtral-tiny", { needs: "reference.safetensors" })!, {
      local: 3,
      experts: "spread",
    });
    assert.deepEqual(r.generated, r.expected, "mixtral-tiny --experts spread: tokens");
    assert.ok(r.logitsError <= 1e-4, `mixtral-tiny --experts spread: logits error ${r.logitsError}`);
  } finally {
    Deno.env.delete("SWACTOR_GPU_THREAD");
  }
});

Deno.test({
  ...needs("pipeline: --kv q8 reaches every stage through the Plan: the chain's logits are one node's", {
    [GPU]: hasGpu,
  }),
  ...slow,
}, async () => {
  // f32 weights keep an f32 KV cache by default (logits within 1e-6 of transformers'); a q8 cache's rows move
  // them by ~1e-3 of the largest. A stage that loaded without the Plan's kv would give the f32 cache's error.
  const dir = fixtureDir("llama-micro", { needs: "reference.safetensors" })!;
  const one = await checkFixture(dir, { kv: "q8" });
  const chain = await checkFixture(dir, { kv: "q8", local: 2 });
  assert.equal(one.json.kv, "q8");
  assert.equal(chain.json.kv, "q8");
  assert.ok(one.logitsError > 1e-4 && one.logitsError < 5e-2, `q8 cache, one node: ${one.logitsError}`);
  assert.ok(
    Math.abs(chain.logitsError - one.logitsError) <= 1e-6,
    `q8 cache: chain ${chain.logitsError} against one node ${one.logitsError}`,
  );
});

Deno.test({
  ...needs("pipeline: --trace writes every step's stage spans and wire hops (f16 wire: reference tokens)", {
    [GPU]: hasGpu,
  }),
  ...slow,
}, async () => {
  const dir = fixtureDir("llama-micro", { needs: "reference.json" })!;
  const ref = JSON.parse(await Deno.readTextFile(join(dir, "reference.json")));
  const file = await Deno.makeTempFile({ suffix: ".json" });
  try {
    const out = await new Deno.Command(Deno.execPath(), {
      args: [
        "run",
        "-A",
        "--quiet",
        new URL("../../main.ts", import.meta.url).pathname,
        "generate",
        "--local",
        "2",
        "--model",
        dir,
        "--tokens",
        ref.tokens.slice(0, ref.prompt_length).join(","),
        "--max-tokens",
        "4",
        "--temperature",
        "0",
        "--json",
        "--trace",
        file,
      ],
      stdin: "null",
    }).output();
    assert.equal(out.code, 0, new TextDecoder().decode(out.stderr));
    // generate's default wire is f16 (checkFixture's runs take f32): this fixture's margins are far above
    // its rounding, so the tokens are still the reference's.
    const { tokens } = JSON.parse(new TextDecoder().decode(out.stdout));
    assert.deepEqual(tokens, ref.tokens.slice(ref.prompt_length, ref.prompt_length + 4), "f16 wire: tokens");
    const { traceEvents } = JSON.parse(await Deno.readTextFile(file));
    const spans = traceEvents.filter((e: { ph: string }) => e.ph === "X");
    const names = new Set(spans.map((e: { name: string }) => e.name));
    for (const n of ["prefill", "token 1", "token 3"]) assert.ok(names.has(n), `no span ${n}`);
    assert.ok(spans.some((e: { name: string }) => e.name.includes("->")), "no wire hop");
    assert.ok(spans.every((e: { ts: number; dur: number }) => e.ts >= 0 && e.dur >= 0));
  } finally {
    await Deno.remove(file);
  }
});

Deno.test({
  name: "pipeline: a --plan naming more nodes than the cluster has exits 2, naming both counts",
  ...slow,
}, async () => {
  const plan = await Deno.makeTempFile({ suffix: ".json" });
  try {
    const stage = (index: number, node: string, layers: number[]) => ({
      index,
      node,
      layers,
      embeds: index === 0,
      head: index === 2,
    });
    await Deno.writeTextFile(
      plan,
      JSON.stringify({
        version: 1,
        stages: [stage(0, "a", [0, 1]), stage(1, "b", [1, 2]), stage(2, "c", [2, 2])],
      }),
    );
    const micro = fixtureDir("llama-micro")!;
    const r = await runCli(
      ["generate", "--local", "2", "--model", micro, "--tokens", "1,2,3", "--plan", plan],
      { env: { SWACTOR_NO_GPU: "1" } },
    );
    assert.equal(r.code, 2, r.stderr);
    assert.match(r.stderr, /swactor generate: --plan \S+: the Plan names 3 nodes; the cluster has 2/);
  } finally {
    await Deno.remove(plan);
  }
});

for (const n of [5, 2, 8]) {
  Deno.test({
    ...needs(`pipeline: llama3-tiny on ${n} nodes: reference tokens and logits within 1e-4`, {
      [GPU]: hasGpu,
      "../shared/fixtures/llama3-tiny": tiny,
    }),
    ...slow,
  }, async () => {
    await check(tiny!, n);
  });
}

Deno.test(
  {
    ...needs("pipeline: one 5-node cluster: concurrency, cancellation, a stage killed", {
      [GPU]: hasGpu,
      "../shared/fixtures/llama3-tiny": tiny,
    }),
    ...slow,
  },
  async (t) => {
    const ref = JSON.parse(await Deno.readTextFile(join(tiny!, "reference.json")));
    const prompt: number[] = ref.tokens.slice(0, ref.prompt_length);
    const cluster = await startLocalCluster(5, { modelDir: tiny!, weights: "f32", log: () => {} });
    const { client } = cluster.pipeline;
    try {
      assert.equal(cluster.chain.nodes.length, 5);
      await t.step("three concurrent requests each get the tokens they get alone", async () => {
        const prompts = [prompt, prompt.slice(0, 5), [128000, 791, 1176, 315, 9822]];
        const sampling = [undefined, { temperature: 0.8, topP: 0.9, seed: 7 }, undefined];
        const alone = [];
        for (let i = 0; i < 3; i++) {
          alone.push(
            (await client.generate(cluster.chain, prompts[i], { maxTokens: 8, sampling: sampling[i] }))
              .tokens,
          );
        }
        assert.deepEqual(alone[0], ref.tokens.slice(ref.prompt_length, ref.prompt_length + 8));
        const together = await Promise.all(
          prompts.map((p, i) => client.generate(cluster.chain, p, { maxTokens: 8, sampling: sampling[i] })),
        );
        assert.deepEqual(together.map((r) => r.tokens), alone);
      });
      await t.step("cancel mid-generation: every stage releases its KV cache", async () => {
        const abort = new AbortController();
        let during: Awaited<ReturnType<typeof cluster.pipeline.stageReports>> = [];
        const p = client.generate(cluster.chain, prompt, {
          maxTokens: 200,
          signal: abort.signal,
          // Once a token came back every stage holds the request; look, then cancel.
          onToken: (e) =>
            e.index === 1 &&
            cluster.pipeline.stageReports().then((r) => (during = r), () => {}).finally(() =>
              abort.abort(new Error("cancelled"))
            ),
        });
        await assert.rejects(p, /cancelled/);
        assert.deepEqual(during.map((r) => r.active), [1, 1, 1, 1, 1], "every stage held the request");
        assert.ok(during.slice(1).every((r) => (r.kvBytes ?? 0) > 0), "stages with layers held KV memory");
        let after = await cluster.pipeline.stageReports();
        for (let i = 0; i < 20 && after.some((r) => r.active !== 0); i++) {
          await new Promise((r) => setTimeout(r, 100));
          after = await cluster.pipeline.stageReports();
        }
        for (const r of after) assert.deepEqual([r.index, r.active, r.kvBytes], [r.index, 0, 0]);
      });
      await t.step(
        "a stage killed mid-generation: re-planned over the survivors, the same tokens",
        async () => {
          const want = (await client.generate(cluster.chain, prompt, { maxTokens: 40 })).tokens;
          let killed = "";
          const r = await client.generate(cluster.chain, prompt, {
            maxTokens: 40,
            onToken: (e) => {
              if (e.index !== 2) return;
              const [id, pid] = [...cluster.workerIds].find(([id]) => cluster.chain.nodes.includes(id))!;
              killed = id;
              Deno.kill(pid, "SIGKILL");
            },
          });
          assert.deepEqual(r.tokens, want, "the resumed generation gives the uninterrupted run's tokens");
          assert.equal(r.recoveries?.length, 1);
          const rec = r.recoveries![0];
          assert.deepEqual([rec.node, rec.stage], [killed, cluster.chain.nodes.indexOf(killed)]);
          console.log(
            `stage killed: decoding went on ${rec.ms} ms after the loss was seen (${rec.gap_ms} ms gap)`,
          );
          // The new chain has no request left (the lost attempt was freed everywhere).
          const reports = await cluster.pipeline.stageReports();
          assert.ok(!reports.some((x) => x.node === killed));
          assert.deepEqual(reports.map((x) => x.active), reports.map(() => 0));
        },
      );
    } finally {
      await cluster.close();
    }
  },
);
