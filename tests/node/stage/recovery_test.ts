// Recovery (docs/RECOVERY.md) on whole nodes in one process: startNode over the in-memory network (real
// membership on the `test` timings, registry, actors), PipelineNodes with `recover` on the fake backend.
// A node of the chain is cut off mid-generation (MemoryNetwork.kill: kill -9 as the others see it; a
// partition: a hang), the leader re-plans, and the generation completes with the whole fake model's tokens.
import assert from "node:assert/strict";
import { SystemClock } from "../../../node/clock.ts";
import { local as timings, type MemberState } from "../../../node/membership/mod.ts";
import { startNode, type SwactorNode } from "../../../node/node.ts";
import {
  FakeBackend,
  fakeReference,
  PipelineClient,
  PipelineNode,
  publishPlan,
  StageActor,
  type StageLoader,
} from "../../../node/stage/mod.ts";
import {
  breaking,
  effectiveLeader,
  hasMajority,
  lostStage,
  withSpares,
} from "../../../node/stage/recovery.ts";
import { decodePipe, encodePipe, type PipeMessage } from "../../../node/stage/messages.ts";
import { MemoryNetwork } from "../../../node/transport/memory.ts";
import type { ActorContext, Behavior } from "../../../node/actors/mod.ts";
import { nodeServices } from "../../../node/api/mod.ts";
import { pipelineStatus } from "../../../node/api/pipeline_routes.ts";
import { tinyLlamaDir } from "../../support/tiny_llama.ts";

const LAYERS = 6;
/** The nodes' log lines: shown with SWACTOR_DEBUG=1. */
const log = (m: string) => Deno.env.get("SWACTOR_DEBUG") === "1" && console.error(m);
const PROMPT = [3, 8, 13, 18, 23, 28, 33, 38, 43, 48, 53];

const modelDir = () => tinyLlamaDir(LAYERS, 64);

/** `n` nodes (n0 leads), each with a recovering pipeline whose fake stages take `delayMs` a step. */
async function cluster(n: number, delayMs = 15) {
  const net = new MemoryNetwork(new SystemClock());
  const loads: string[] = [];
  const backends = new Map<string, FakeBackend>();
  const nodes: SwactorNode[] = [];
  const pipelines: PipelineNode[] = [];
  for (let i = 0; i < n; i++) {
    const node = await startNode({ transport: net.connect(`n${i}`), membership: timings, noGpu: true });
    const loader: StageLoader = (role) => {
      loads.push(`n${i}:${role.index}`);
      const b = new FakeBackend(role, { eosTokenIds: [], delayMs });
      backends.set(`n${i}:${role.index}`, b);
      return Promise.resolve(b);
    };
    nodes.push(node);
    pipelines.push(new PipelineNode(node, { loader, log, recover: true, resumeTimeoutMs: 30_000 }));
    if (i > 0) await node.join([nodes[0].transport.self]);
  }
  const killed = new Set<number>();
  return {
    net,
    nodes,
    pipelines,
    loads,
    backends,
    kill(i: number) {
      killed.add(i);
      net.kill(`n${i}`);
    },
    async close() {
      for (const [i, p] of pipelines.entries()) if (!killed.has(i)) await p.close();
      await Promise.all(nodes.map((node, i) => killed.has(i) ? node.actors.close() : node.leave()));
      for (const i of killed) await pipelines[i].close();
    },
  };
}

Deno.test("recovery: only a node that sees a strict majority alive re-plans (left members not counted)", () => {
  const m = (...states: MemberState[]) => states.map((state) => ({ state }));
  assert.equal(hasMajority(m("alive", "alive", "alive", "dead", "dead")), true);
  assert.equal(hasMajority(m("alive", "dead", "dead", "dead", "dead")), false, "cut off alone");
  assert.equal(hasMajority(m("alive", "alive", "dead", "dead")), false, "half is not a majority");
  assert.equal(hasMajority(m("alive", "alive", "suspect", "dead")), false, "a suspect is not counted alive");
  assert.equal(hasMajority(m("alive", "dead", "left", "left")), false);
  assert.equal(
    hasMajority(m("alive", "alive", "dead", "left", "left")),
    true,
    "those that left do not count",
  );
});

Deno.test("recovery: withSpares moves each lost node's part to an idle member, or says it cannot", () => {
  const plan = {
    stages: [
      { node: "a", layers: [0, 2] as [number, number] },
      { node: "b", layers: [2, 4] as [number, number], experts: { "2": [0, 1] } },
    ],
    expertHosts: [{ node: "c", experts: { "3": [0, 1] } }],
    nodes: [{ id: "a", role: "stage" }, { id: "b", role: "stage" }, { id: "c", role: "experts" }, {
      id: "d",
      role: "idle",
    }],
  };
  const moved = withSpares(plan, ["b"], ["a", "b", "c", "d"])!;
  assert.deepEqual(moved.stages.map((s) => s.node), ["a", "d"]);
  assert.deepEqual(moved.stages[1].experts, { "2": [0, 1] }, "the stage's experts go with it");
  assert.deepEqual(moved.nodes!.map((n) => [n.id, n.role]), [
    ["a", "stage"],
    ["b", "idle"],
    ["c", "experts"],
    [
      "d",
      "stage",
    ],
  ]);
  assert.deepEqual(withSpares(plan, ["c"], ["a", "b", "d"])!.expertHosts!.map((h) => h.node), ["d"]);
  assert.equal(withSpares(plan, ["b", "c"], ["a", "d"]), undefined, "two lost, one spare");
  assert.equal(
    effectiveLeader({ leader: "b" }, [{ id: "b", state: "alive" }, { id: "a", state: "alive" }]),
    "b",
  );
  assert.equal(
    effectiveLeader({ leader: "b" }, [{ id: "b", state: "dead" }, { id: "c", state: "alive" }]),
    "c",
  );
});

Deno.test("recovery: an expert host whose experts all have live replicas does not break the Plan", () => {
  const plan = {
    stages: [{ node: "a", layers: [0, 2] as [number, number], experts: { "1": [0, 1] } }],
    expertHosts: [
      { node: "b", experts: { "1": [2, 3] } },
      { node: "c", experts: { "1": [2, 3, 4] } },
      { node: "d", experts: { "1": [4, 5] } },
    ],
  };
  assert.deepEqual(breaking(plan, ["b"]), [], "c holds 2 and 3 too");
  assert.deepEqual(breaking(plan, ["c"]), [], "b holds 2 and 3, d holds 4");
  assert.deepEqual(breaking(plan, ["b", "c"]), ["b", "c"], "2 and 3 have no copy left");
  assert.deepEqual(breaking(plan, ["d"]), ["d"], "5 lives on d only");
  assert.deepEqual(breaking(plan, ["a"]), ["a"], "a stage's node always breaks it");
});

Deno.test("recovery: lostStage names the lost stage even where this node's membership has not heard yet", () => {
  const old = ["a", "b", "c"];
  const states = (m: Record<string, string>) => (n: string) => m[n] ?? "alive";
  const at = (r?: { stage: number; reason: string }) => r && [r.stage, r.reason];
  // The leader's word first: it re-planned without b (all alive here yet), or without c, which left.
  assert.deepEqual(at(lostStage(old, ["a", "c"], states({}), {}, [{ node: "b", reason: "died" }])), [
    1,
    "died",
  ]);
  assert.deepEqual(at(lostStage(old, ["a", "b"], states({}), {}, [{ node: "c", reason: "left" }])), [
    2,
    "left",
  ]);
  assert.deepEqual(at(lostStage(old, ["a", "d", "c"], states({ b: "dead" }), {})), [1, "died"], "dead here");
  assert.deepEqual(
    at(lostStage(old, old, states({ c: "left" }), {})),
    [2, "left"],
    "left here, chain not redone",
  );
  assert.deepEqual(
    at(lostStage(old, ["a", "c"], states({ b: "suspect" }), {})),
    [1, "died"],
    "dropped, not alive",
  );
  // Alive here, but the loss named it and the new chain dropped it.
  assert.deepEqual(at(lostStage(old, ["a", "c"], states({}), { node: "b", stage: 1 })), [1, "died"]);
  assert.deepEqual(at(lostStage(old, ["a", "c"], states({}), { stage: 1 })), [1, "died"], "by stage alone");
  assert.equal(lostStage(old, ["a", "c"], states({}), {}), undefined, "nothing names it: not guessed");
  assert.equal(lostStage(old, old, states({}), { node: "b", stage: 1 }), undefined, "the chain kept b");
  assert.deepEqual(
    at(lostStage(old, ["c", "a"], states({}), { node: "b" })),
    [1, "died"],
    "the old chain's order",
  );
  assert.equal(lostStage(old, ["a", "b", "c"], states({}), {}, [{ node: "x", reason: "died" }]), undefined);
});

Deno.test("recovery: a stage refuses a request of another Plan version and tells its client (fencing)", async () => {
  const sent: { name: string; body: Uint8Array }[] = [];
  const backend = new FakeBackend({ index: 0, stages: 2, layers: [0, 3], embeds: true, head: false });
  const actor = new StageActor({
    backend,
    planVersion: 7,
    log: () => {},
    send: (name, body) => {
      sent.push({ name, body });
      return Promise.resolve();
    },
  });
  const open = {
    maxSeq: 20,
    sampling: { temperature: 0, topP: 1, seed: 0 },
    mode: "generate" as const,
    maxTokens: 4,
    prompt: 3,
    eos: [],
    client: "client-x",
    clientNode: "x",
    wire: "f32" as const,
    version: 6,
  };
  const ctx = { from: "x", receivedAt: 0 } as unknown as Parameters<StageActor["receive"]>[1];
  actor.receive(encodePipe({ type: "start", id: "r1", open, prompt: Uint32Array.of(1, 2, 3) }), ctx);
  await actor.idle();
  assert.equal(backend.stats().active, 0, "no sequence was opened");
  assert.equal(sent.length, 1);
  const m = decodePipe(sent[0].body);
  assert.equal(sent[0].name, "client-x");
  assert.ok(m.type === "error" && m.stale === true && /serves Plan v7, not v6/.test(m.message));
  // The same version is served.
  actor.receive(
    encodePipe({ type: "start", id: "r2", open: { ...open, version: 7 }, prompt: Uint32Array.of(1, 2, 3) }),
    ctx,
  );
  await actor.idle();
  assert.equal(decodePipe(sent.at(-1)!.body).type, "forward");
  await actor.onStop();
});

Deno.test("recovery: a killed stage's part moves to the spare; the generation completes with the same tokens", async () => {
  const dir = await modelDir();
  const c = await cluster(4);
  try {
    const plan = {
      stages: [
        { index: 0, node: "a", layers: [0, 2], embeds: true, head: false },
        { index: 1, node: "b", layers: [2, 4], embeds: false, head: false },
        { index: 2, node: "c", layers: [4, 6], embeds: false, head: true },
      ],
    };
    const a = await publishPlan(c.nodes[0], c.pipelines[0], {
      modelDir: dir,
      weights: "f32",
      wire: "f32",
      members: 4,
      plan,
    });
    const chain = await c.pipelines[0].waitReady({ timeoutMs: 20_000 });
    assert.deepEqual(chain.nodes, ["n0", "n1", "n2"], "n3 is the spare");
    const sampling = { temperature: 0.8, topP: 0.9, seed: 11 };
    const want = await fakeReference(PROMPT, { layers: LAYERS, maxTokens: 40, eosTokenIds: [], sampling });
    const got = await c.pipelines[0].client.generate(chain, PROMPT, {
      maxTokens: 40,
      sampling,
      onToken: (e) => e.index === 8 && c.kill(2),
    });
    assert.deepEqual(
      got.tokens,
      want,
      "sampled output is the uninterrupted run's (each draw from seed and position)",
    );
    assert.equal(got.recoveries!.length, 1);
    const r = got.recoveries![0];
    // Stage 1's send to stage 2 may fail (its retries run out) before membership marks n2 dead.
    assert.deepEqual([r.stage, r.node, r.from], [2, "n2", a.version]);
    assert.match(r.reason, /^died/);
    assert.ok(r.to > a.version && r.at_token >= 9 && r.ms >= 0 && r.gap_ms >= r.ms);
    const now = c.pipelines[0].board.current!;
    assert.deepEqual(now.plan.stages.map((s) => s.node), ["n0", "n1", "n3"], "the spare took stage 2");
    assert.deepEqual(now.lost, [{ node: "n2", reason: "died" }], "the Assignment says what the re-plan lost");
    assert.equal(got.wire, "f32", "the chain's wire (`up --wire f32`), on the resumed attempt too");
    assert.equal(now.wire, "f32", "the re-plan keeps the chain's wire");
    assert.equal(c.pipelines[0].recovery!.replans.at(-1)!.how, "spare");
    assert.deepEqual(c.loads.sort(), ["n0:0", "n1:1", "n2:2", "n3:2"], "stages 0 and 1 kept their weights");
    // Stage 0 rebuilt the resumed request as it first ran: the prompt in the same chunks (the fake's 8),
    // then every token generated before the loss one per step, like the decode steps that made them.
    const resumed = c.backends.get("n0:0")!.runs.filter((x) => x.id.includes("~"));
    assert.deepEqual(resumed.slice(0, 2).map((x) => [x.pos0, x.T]), [[0, 8], [8, 3]]);
    assert.ok(resumed.slice(2).every((x, k) => x.T === 1 && x.pos0 === PROMPT.length + k));
    assert.ok(resumed.length > 2 + r.at_token);
    // What `status --json` shows: the chain ready, the re-plan, roles and (one machine) every member's pid.
    const status = await pipelineStatus(c.pipelines[0]) as {
      ready: boolean;
      replans: { from: number; to: number; how: string; lost: { node: string }[] }[];
    };
    assert.equal(status.ready, true);
    assert.deepEqual(
      status.replans.map((x) => [x.from, x.to, x.how, x.lost.map((l) => l.node)]),
      [[a.version, now.version, "spare", ["n2"]]],
    );
    const members = nodeServices(c.nodes[0], { down: () => {}, pipeline: () => c.pipelines[0] }).members();
    const alive = members.filter((m) => m.state === "alive");
    assert.deepEqual(alive.map((m) => [m.id, m.pid]), [["n0", Deno.pid], ["n1", Deno.pid], ["n3", Deno.pid]]);
    for (let i = 0; i < 50 && !alive.find((m) => m.id === "n3")!.roles.includes("stage-2"); i++) {
      await new Promise((r) => setTimeout(r, 100));
      alive.splice(
        0,
        alive.length,
        ...nodeServices(c.nodes[0], { down: () => {} }).members().filter((m) => m.state === "alive"),
      );
    }
    assert.deepEqual(alive.map((m) => m.roles.sort()), [["leader", "stage-0"], ["stage-1"], ["stage-2"]]);
    // A new request runs on the new chain.
    const again = await c.pipelines[1].client.generate(await c.pipelines[1].waitReady(), PROMPT, {
      maxTokens: 6,
    });
    assert.deepEqual(
      again.tokens,
      await fakeReference(PROMPT, { layers: LAYERS, maxTokens: 6, eosTokenIds: [] }),
    );
  } finally {
    await c.close();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("recovery: with no spare the survivors are re-planned; a cut-off stage that comes back is fenced", async () => {
  const dir = await modelDir();
  const c = await cluster(4);
  try {
    await publishPlan(c.nodes[0], c.pipelines[0], { modelDir: dir, weights: "f32", members: 4 });
    const chain = await c.pipelines[0].waitReady({ timeoutMs: 20_000 });
    assert.equal(chain.nodes.length, 4);
    const want = await fakeReference(PROMPT, { layers: LAYERS, maxTokens: 30, eosTokenIds: [] });
    // A partition (a hang, as the others see it) of stage 2's node at the 5th token.
    const got = await c.pipelines[1].client.generate(chain, PROMPT, {
      maxTokens: 30,
      onToken: (e) => e.index === 4 && c.net.partition([["n2"]]),
    });
    assert.deepEqual(got.tokens, want);
    assert.equal(got.recoveries![0].node, "n2");
    const now = c.pipelines[0].board.current!;
    assert.equal(now.plan.stages.length, 3, "re-planned over the 3 survivors");
    assert.ok(!now.plan.stages.some((s) => s.node === "n2"));
    assert.equal(c.pipelines[0].recovery!.replans.at(-1)!.how, "replan");
    // n2, alone, comes to see every other member dead; with no majority it neither leads nor re-plans (else
    // its Plan, the whole model on n2 and newer, would replace the majority's at the heal).
    const alone = performance.now() + 40_000;
    while (c.nodes[2].membership.members().filter((m) => m.state === "dead").length < 3) {
      assert.ok(performance.now() < alone, "n2 never saw the others dead");
      await new Promise((r) => setTimeout(r, 100));
    }
    await new Promise((r) => setTimeout(r, 500)); // past the re-plan's settle time
    assert.deepEqual(c.pipelines[2].recovery!.replans, [], "the minority side made no Plan");
    assert.ok(c.pipelines[2].board.current!.version <= now.version);
    // Heal: n2 comes back, learns the new Plan (it serves no stage in it), and the chain still gives the
    // whole model's tokens, still led by n0.
    c.net.heal();
    const deadline = performance.now() + 15_000;
    while (c.pipelines[2].board.current?.version !== now.version || c.pipelines[2].local !== undefined) {
      assert.ok(performance.now() < deadline, "n2 never adopted the new Plan");
      await new Promise((r) => setTimeout(r, 50));
    }
    const again = await c.pipelines[0].client.generate(await c.pipelines[0].waitReady(), PROMPT, {
      maxTokens: 30,
    });
    assert.deepEqual(again.tokens, want);
    // Both sides saw each other dead: while the merge settles (each side refutes the other's word that it
    // died), a hop may fail once and the request resume (seen in 1 of 3 runs).
    assert.ok(again.recoveries!.length <= 1, JSON.stringify(again.recoveries));
    assert.equal(c.pipelines[0].board.current!.leader, "n0", "the majority's leader still leads");
  } finally {
    await c.close();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("recovery: the leader dies; the lowest live id takes the lead, re-plans, and requests made elsewhere go on", async () => {
  const dir = await modelDir();
  const c = await cluster(4);
  try {
    await publishPlan(c.nodes[0], c.pipelines[0], { modelDir: dir, weights: "f32", members: 4 });
    const chain = await c.pipelines[2].waitReady({ timeoutMs: 20_000 });
    assert.equal(chain.nodes[0], "n0");
    const want = await fakeReference(PROMPT, { layers: LAYERS, maxTokens: 24, eosTokenIds: [] });
    const got = await c.pipelines[2].client.generate(chain, PROMPT, {
      maxTokens: 24,
      onToken: (e) => e.index === 3 && c.kill(0),
    });
    assert.deepEqual(got.tokens, want);
    const now = c.pipelines[2].board.current!;
    assert.equal(now.leader, "n1", "the lowest live id leads");
    assert.equal(c.pipelines[1].recovery!.replans.at(-1)!.tookLead, true);
    assert.equal(c.nodes[2].registry.resolve("leader"), "n1");
  } finally {
    await c.close();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("recovery: without `recover` a lost stage still fails the request with a clear error", async () => {
  const dir = await modelDir();
  const net = new MemoryNetwork(new SystemClock());
  const nodes: SwactorNode[] = [];
  const pipelines: PipelineNode[] = [];
  for (let i = 0; i < 3; i++) {
    const node = await startNode({ transport: net.connect(`n${i}`), membership: timings, noGpu: true });
    nodes.push(node);
    pipelines.push(
      new PipelineNode(node, {
        loader: (role) => Promise.resolve(new FakeBackend(role, { eosTokenIds: [], delayMs: 15 })),
        log: () => {},
      }),
    );
    if (i > 0) await node.join([nodes[0].transport.self]);
  }
  try {
    await publishPlan(nodes[0], pipelines[0], { modelDir: dir, weights: "f32", members: 3 });
    const chain = await pipelines[0].waitReady({ timeoutMs: 20_000 });
    await assert.rejects(
      pipelines[0].client.generate(chain, PROMPT, {
        maxTokens: 40,
        onToken: (e) => e.index === 2 && net.kill("n2"),
      }),
      /stage 2 \(node n2\) died .*the request is lost|stage 1 failed: cannot pass the result on/,
    );
  } finally {
    for (const p of pipelines.slice(0, 2)) await p.close();
    await Promise.all(nodes.slice(0, 2).map((n) => n.leave()));
    await pipelines[2].close();
    await nodes[2].actors.close();
    await Deno.remove(dir, { recursive: true });
  }
});

/**
 * A fake actor system for a lone PipelineClient: `deliver` hands its behaviour a message as if from node "b";
 * `onStart` sees each START the client sends, and its promise is that send's outcome.
 */
function fakeActors(onStart: (m: Extract<PipeMessage, { type: "start" }>) => Promise<void>) {
  let behavior: Behavior | undefined;
  const actors = {
    spawn: (_name: string, b: Behavior) => {
      behavior = b;
      return { stop: () => Promise.resolve() };
    },
    send: (_name: string, body: Uint8Array) => {
      const m = decodePipe(body);
      return m.type === "start" ? onStart(m) : Promise.resolve();
    },
  };
  const deliver = (body: Uint8Array) => {
    if (!behavior) throw new Error("the client has not spawned its actor yet");
    behavior.receive(body, { from: "b", receivedAt: 0 } as unknown as ActorContext);
  };
  return { actors, deliver };
}

Deno.test("recovery: a late failure of an earlier attempt does not end the attempt that replaced it", async () => {
  const starts: { id: string; prompt: number[] }[] = [];
  let failFirst: (e: Error) => void = () => {};
  const { actors, deliver } = fakeActors((m) => {
    starts.push({ id: m.id, prompt: [...m.prompt] });
    // The first START's send fails, but only after the request has resumed on a new chain.
    return starts.length === 1 ? new Promise<void>((_, reject) => (failFirst = reject)) : Promise.resolve();
  });
  const client = new PipelineClient(actors, "node-a", {
    resume: () => Promise.resolve({ chain: { version: 2, nodes: ["b"] } }),
  });
  try {
    const got = client.generate({ version: 1, nodes: ["a"] }, [1, 2, 3], { maxTokens: 2 });
    const token = (id: string, step: number, pos: number, t: number, done?: "max_tokens") =>
      deliver(encodePipe({ type: "token", id, step, pos, token: t, done, trace: [] }));
    token(starts[0].id, 0, 3, 40);
    deliver(encodePipe({ type: "error", id: starts[0].id, stage: 0, message: "lost" }));
    await new Promise((r) => setTimeout(r, 10));
    assert.equal(starts.length, 2);
    assert.deepEqual(starts[1].prompt, [1, 2, 3, 40], "the prompt and the token so far");
    failFirst(new Error("unreachable"));
    await new Promise((r) => setTimeout(r, 10));
    token(starts[1].id, 0, 4, 41, "max_tokens");
    const out = await got;
    assert.deepEqual(out.tokens, [40, 41]);
    assert.equal(starts.length, 2, "no third attempt");
    assert.deepEqual(out.recoveries!.map((r) => [r.reason, r.from, r.to, r.at_token]), [["error", 1, 2, 1]]);
  } finally {
    await client.close();
  }
});

Deno.test("recovery: a logits request on a re-planned chain runs again on the new one; its rows replace the old", async () => {
  const starts: { id: string; prompt: number[]; version: number | undefined }[] = [];
  const { actors, deliver } = fakeActors((m) => {
    starts.push({ id: m.id, prompt: [...m.prompt], version: m.open.version });
    return Promise.resolve();
  });
  const vocab = 2;
  const rows = (id: string, step: number, pos0: number, values: number[], done: boolean) =>
    deliver(encodePipe({
      type: "logits",
      id,
      step,
      pos0,
      T: values.length / vocab,
      done,
      trace: [],
      data: new Uint8Array(Float32Array.from(values).buffer),
    }));
  const withResume = new PipelineClient(actors, "node-a", {
    resume: () => Promise.resolve({ chain: { version: 2, nodes: ["b"] } }),
  });
  try {
    const got = withResume.logits({ version: 1, nodes: ["a"] }, [1, 2, 3], { vocab });
    rows(starts[0].id, 0, 0, [1, 1, 1, 1], false); // rows 0-1 from the first chain
    withResume.planChanged(2);
    await new Promise((r) => setTimeout(r, 10));
    assert.equal(starts.length, 2, "a second attempt");
    assert.deepEqual(starts[1].prompt, [1, 2, 3], "the same tokens, nothing replayed");
    assert.equal(starts[1].version, 2);
    rows(starts[0].id, 1, 2, [9, 9], true); // a late chunk of the first attempt: dropped
    rows(starts[1].id, 0, 0, [5, 6, 7, 8, 9, 10], true); // the new chain cuts the prompt differently
    const out = await got;
    assert.deepEqual([...out.logits], [5, 6, 7, 8, 9, 10]);
    assert.equal(out.traces.length, 1, "the traces of the attempt that answered");
  } finally {
    await withResume.close();
  }
  // Without a way to resume, the re-plan fails the request with the reason.
  starts.length = 0;
  const without = new PipelineClient(actors, "node-a");
  try {
    const got = without.logits({ version: 1, nodes: ["a"] }, [1, 2, 3], { vocab });
    without.planChanged(2);
    await assert.rejects(got, /the chain was re-planned \(Plan v2\)/);
    assert.equal(starts.length, 1);
  } finally {
    await without.close();
  }
});

Deno.test("recovery: a stage stops without waiting for a send to a hung node, but after its compute", async () => {
  const backend = new FakeBackend({ index: 0, stages: 2, layers: [0, 3], embeds: true, head: false }, {
    delayMs: 30,
  });
  let closed = false;
  const close = backend.close.bind(backend);
  backend.close = () => {
    closed = true;
    close();
  };
  const actor = new StageActor({
    backend,
    planVersion: 1,
    log: () => {},
    send: () => new Promise<void>(() => {}), // the next stage's node is stopped: the send never returns
  });
  const open = {
    maxSeq: 20,
    sampling: { temperature: 0, topP: 1, seed: 0 },
    mode: "generate" as const,
    maxTokens: 4,
    prompt: 3,
    eos: [],
    client: "client-x",
    clientNode: "x",
    wire: "f32" as const,
  };
  const ctx = { from: "x", receivedAt: 0 } as unknown as Parameters<StageActor["receive"]>[1];
  actor.receive(encodePipe({ type: "start", id: "r1", open, prompt: Uint32Array.of(1, 2, 3) }), ctx);
  await new Promise((r) => setTimeout(r, 60)); // computed, now stuck in the send
  actor.receive(encodePipe({ type: "start", id: "r2", open, prompt: Uint32Array.of(1, 2, 3) }), ctx);
  await new Promise((r) => setTimeout(r, 5)); // r2 computes
  const t0 = performance.now();
  let stopped = false;
  const stopping = actor.onStop().then(() => (stopped = true));
  await new Promise((r) => setTimeout(r, 0));
  assert.equal(closed, false, "not closed while r2 computes");
  await Promise.race([stopping, new Promise((r) => setTimeout(r, 2000))]);
  assert.ok(stopped, "stopped although a send never returns");
  assert.ok(closed && performance.now() - t0 < 1000);
  assert.equal(backend.stats().active, 0);
});
