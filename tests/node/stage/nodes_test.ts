// The pipeline on whole nodes, in one process: nodes made by startNode over the in-memory network (real
// membership, registry and actors; no iroh, no GPU), each with a PipelineNode on the fake backend. The
// leader publishes the Plan (publishPlan), every node claims its stage from the Assignment board, the chain
// reports ready, and a generation through it equals the whole fake model's (fakeReference), on the leader
// and through the control API. What tests/node/stage/chain_test.ts checks on bare actors, with the
// assembly that `up` and `join` use around it.
import assert from "node:assert/strict";
import { join } from "node:path";
import { createApp, nodeServices, readGenerateLines } from "../../../node/api/mod.ts";
import { PeerUnreachableError } from "../../../node/actors/mod.ts";
import { SystemClock } from "../../../node/clock.ts";
import { local } from "../../../node/membership/mod.ts";
import { startNode, type SwactorNode } from "../../../node/node.ts";
import {
  FakeBackend,
  fakeReference,
  PipelineNode,
  publishPlan,
  type StageLoader,
} from "../../../node/stage/mod.ts";
import { MemoryNetwork } from "../../../node/transport/memory.ts";
import { tinyLlamaDir } from "../../support/tiny_llama.ts";

const LAYERS = 6;
const PROMPT = [3, 8, 13, 18, 23, 28, 33, 38, 43, 48, 53]; // two prefill chunks of the fake's 8

/** The model: a llama config.json the planner reads (the fake backend only uses the layer split). */
const modelDir = () => tinyLlamaDir(LAYERS, 64);

/** `n` nodes on one in-memory network (real time, 1 ms links), all joined to node 0, each with a pipeline. */
async function cluster(n: number) {
  const net = new MemoryNetwork(new SystemClock());
  const loads: string[] = [];
  const loader: StageLoader = (role, { model }) => {
    loads.push(model.dir);
    return Promise.resolve(new FakeBackend(role, { eosTokenIds: [] }));
  };
  const nodes: SwactorNode[] = [];
  const pipelines: PipelineNode[] = [];
  const close = async () => {
    for (const p of pipelines) await p.close();
    await Promise.all(nodes.map((node) => node.leave()));
  };
  try {
    for (let i = 0; i < n; i++) {
      const node = await startNode({ transport: net.connect(`n${i}`), membership: local, noGpu: true });
      nodes.push(node);
      pipelines.push(new PipelineNode(node, { loader, log: () => {} }));
      if (i > 0) await node.join([nodes[0].transport.self]);
    }
  } catch (e) {
    await close();
    throw e;
  }
  return { net, nodes, pipelines, loads, close };
}

Deno.test("nodes: 3 nodes on the in-memory network plan, load and serve a chain like the whole model", async () => {
  const dir = await modelDir();
  const c = await cluster(3);
  try {
    const a = await publishPlan(c.nodes[0], c.pipelines[0], { modelDir: dir, weights: "f32", members: 3 });
    assert.equal(a.leader, "n0");
    assert.equal(a.layers, LAYERS);
    assert.deepEqual(a.model, { dir, weights: "f32" });
    assert.deepEqual(a.plan.stages.map((s) => s.node), ["n0", "n1", "n2"], "the leader first, then by id");
    const chain = await c.pipelines[0].waitReady({ timeoutMs: 20_000 });
    assert.deepEqual(
      chain,
      { version: a.version, nodes: ["n0", "n1", "n2"], wire: "f16" },
      "the chain's wire: f16 by default",
    );
    c.pipelines.forEach((p, i) =>
      assert.deepEqual(p.local, { planVersion: a.version, index: i, state: "ready" }, `node n${i}`)
    );
    assert.deepEqual(c.loads, [dir, dir, dir]);

    const want = await fakeReference(PROMPT, { layers: LAYERS, maxTokens: 9, eosTokenIds: [] });
    const got = await c.pipelines[0].client.generate(chain, PROMPT, { maxTokens: 9 });
    assert.deepEqual(got.tokens, want);
    assert.equal(got.stopReason, "max_tokens");
    assert.equal(got.events[1].timings.computeMs.length, 3);

    // A request made on another node travels the same chain.
    const chain2 = await c.pipelines[2].waitReady({ timeoutMs: 20_000 });
    const sampling = { temperature: 0.8, topP: 0.9, seed: 5 };
    assert.deepEqual(
      (await c.pipelines[2].client.generate(chain2, PROMPT, { maxTokens: 6, sampling })).tokens,
      await fakeReference(PROMPT, { layers: LAYERS, maxTokens: 6, eosTokenIds: [], sampling }),
    );

    // The control API over the leader: roles in /status, and POST /generate streams the same tokens.
    const app = createApp(nodeServices(c.nodes[0], { down: () => {}, pipeline: () => c.pipelines[0] }), {
      token: "t",
    });
    const status = await (await app.request("/status")).json();
    assert.deepEqual(
      status.members.map((m: { id: string; roles: string[] }) => [m.id, m.roles]),
      [["n0", ["stage-0"]], ["n1", ["stage-1"]], ["n2", ["stage-2"]]],
    );
    assert.equal(status.pipeline.assignment.version, a.version);
    const res = await app.request("/generate", {
      method: "POST",
      headers: { "content-type": "application/json", authorization: "Bearer t" },
      body: JSON.stringify({ tokens: PROMPT, maxTokens: 9 }),
    });
    const tokens = [];
    let done;
    for await (const m of readGenerateLines(res.body!)) {
      if ("error" in m) assert.fail(m.error);
      if ("token" in m) tokens.push(m.token);
      if ("done" in m) done = m.done;
    }
    assert.deepEqual(tokens, want);
    assert.equal(done?.stages, 3);
  } finally {
    await c.close();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("nodes: a given Plan's stage nodes are mapped onto the members in order", async () => {
  const dir = await modelDir();
  const c = await cluster(2);
  try {
    const plan = {
      stages: [
        { index: 0, node: "a", layers: [0, 4], embeds: true, head: false },
        { index: 1, node: "b", layers: [4, 6], embeds: false, head: true },
      ],
    };
    const a = await publishPlan(c.nodes[0], c.pipelines[0], {
      modelDir: dir,
      weights: "f16",
      members: 2,
      plan,
    });
    assert.deepEqual(a.plan.stages.map((s) => [s.node, s.layers]), [["n0", [0, 4]], ["n1", [4, 6]]]);
    const chain = await c.pipelines[0].waitReady({ timeoutMs: 20_000 });
    assert.deepEqual(
      (await c.pipelines[0].client.generate(chain, PROMPT, { maxTokens: 4 })).tokens,
      await fakeReference(PROMPT, { layers: LAYERS, maxTokens: 4, eosTokenIds: [] }),
    );
  } finally {
    await c.close();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("nodes: publishPlan refuses bad input with TypeError / RangeError, and gives up waiting", async () => {
  const dir = await modelDir();
  const c = await cluster(1);
  try {
    const [node, pipeline] = [c.nodes[0], c.pipelines[0]];
    await assert.rejects(
      publishPlan(node, pipeline, { modelDir: join(dir, "nope"), weights: "f32", members: 1 }),
      (e) => e instanceof TypeError && /model .*nope: cannot read config\.json/.test(e.message),
    );
    const plan = { stages: [{ node: "a" }, { node: "b" }] };
    await assert.rejects(
      publishPlan(node, pipeline, { modelDir: dir, weights: "f32", members: 1, plan }),
      (e) => e instanceof RangeError && /the Plan names 2 nodes; the cluster has 1/.test(e.message),
    );
    await assert.rejects(
      publishPlan(node, pipeline, { modelDir: dir, weights: "f32", members: 2, timeoutMs: 300 }),
      /only 1 of 2 nodes joined within 0.3 s/,
    );
    assert.equal(pipeline.board.current, undefined, "nothing was published");
  } finally {
    await c.close();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("nodes: joining through a seed that is not on the network fails with PeerUnreachableError", async () => {
  const net = new MemoryNetwork(new SystemClock());
  const node = await startNode({ transport: net.connect("n0"), membership: local, noGpu: true });
  try {
    await assert.rejects(node.join([{ id: "ghost", addrs: ["mem:ghost"] }]), PeerUnreachableError);
  } finally {
    await node.leave();
  }
});
