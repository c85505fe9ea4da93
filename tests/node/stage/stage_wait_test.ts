// A stage busy with a request's earlier prefill chunk: the next chunk's trace says when it arrived (`in`, the
// end of its hop's wire time) and how long it then waited before its compute (`w`), so that wait is not
// counted as wire time (node/stage/timings.ts) and the Chrome trace starts its compute at in + w.
import assert from "node:assert/strict";
import { Actor } from "../../../node/actors/actor.ts";
import { FakeBackend } from "../../../node/stage/fake_backend.ts";
import { decodePipe, encodePipe, type OpenParams, type PipeMessage } from "../../../node/stage/messages.ts";
import { splitLayers } from "../../../node/stage/roles.ts";
import { StageActor } from "../../../node/stage/stage_actor.ts";
import { packHidden } from "../../../node/stage/wire_dtype.ts";

Deno.test("stage: a chunk that waits behind the previous one records its arrival and its wait", async () => {
  const role = splitLayers(6, 3)[1]; // a middle stage: FORWARD in, FORWARD out
  const sent: PipeMessage[] = [];
  const stage = new StageActor({
    backend: new FakeBackend(role, { delayMs: 40 }),
    planVersion: 1,
    log: () => {},
    send: (_, body) => {
      sent.push(decodePipe(body));
      return Promise.resolve();
    },
  });
  const actor = new Actor("stage-1", stage);
  const open: OpenParams = {
    maxSeq: 64,
    sampling: { temperature: 0, topP: 1, seed: 1 },
    mode: "generate",
    maxTokens: 4,
    prompt: 16,
    eos: [],
    client: "client",
    clientNode: "n9",
    wire: "f32",
  };
  for (let step = 0; step < 2; step++) {
    const body = encodePipe({
      type: "forward",
      id: "r1",
      step,
      pos0: step * 8,
      T: 8,
      last: step === 1,
      open: step === 0 ? open : undefined,
      dtype: "f32",
      trace: [],
      hidden: packHidden(new Float32Array(8 * 4).fill(0.5), "f32"),
    });
    actor.deliver({ body, from: "n0", abort: new AbortController() });
  }
  const end = Date.now() + 5000;
  while (sent.length < 2 && Date.now() < end) await new Promise((r) => setTimeout(r, 5));
  assert.equal(sent.length, 2);
  const [first, second] = sent.map((m) => (m as Extract<PipeMessage, { type: "forward" }>).trace[0]);
  assert.ok(second.in - first.in < 20, `both arrived together: ${first.in} vs ${second.in}`);
  assert.ok((second.w ?? 0) >= 30, `the second waited for the first's 40 ms compute: w = ${second.w}`);
  assert.ok((first.w ?? 0) < 20, `the first did not wait: w = ${first.w}`);
  await actor.stop();
});
