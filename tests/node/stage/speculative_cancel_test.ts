// CANCEL (speculative decoding): a stage skips the verification steps of chunks the client dropped that it
// has not run yet, and passes them on uncomputed (void) so the next stage's step order holds; the steps
// after them run as usual. Driven message by message on one middle stage of fake backends.
import assert from "node:assert/strict";
import type { ActorContext } from "../../../node/actors/mod.ts";
import { FakeBackend } from "../../../node/stage/fake_backend.ts";
import { decodePipe, encodePipe, type OpenParams, type PipeMessage } from "../../../node/stage/messages.ts";
import { StageActor } from "../../../node/stage/stage_actor.ts";
import { packHidden } from "../../../node/stage/wire_dtype.ts";

const OPEN: OpenParams = {
  maxSeq: 64,
  sampling: { temperature: 0, topP: 1, seed: 0 },
  mode: "speculate",
  maxTokens: 16,
  prompt: 4,
  eos: [],
  client: "client-x",
  clientNode: "x",
  wire: "f32",
};

function forward(step: number, pos0: number, T: number, verify?: { chunk: number; tokens: number[] }) {
  return encodePipe({
    type: "forward",
    id: "r",
    step,
    pos0,
    T,
    last: true,
    open: step === 0 ? OPEN : undefined,
    verify,
    dtype: "f32",
    trace: [],
    hidden: packHidden(new Float32Array(T * 4).fill(3), "f32"),
  });
}

Deno.test("stage: a cancelled verification chunk is skipped and passed on void; the next one runs", async () => {
  const backend = new FakeBackend({ index: 1, stages: 3, layers: [2, 4], embeds: false, head: false });
  const sent: PipeMessage[] = [];
  const actor = new StageActor({
    backend,
    planVersion: 1,
    log: () => {},
    send: (_name, body) => {
      sent.push(decodePipe(body));
      return Promise.resolve();
    },
  });
  const ctx = { receivedAt: 0 } as unknown as ActorContext;
  actor.receive(forward(0, 0, 4), ctx); // the prefill (a verdict came back before any cancel)
  await actor.idle();
  actor.receive(forward(1, 4, 3, { chunk: 0, tokens: [5, 6, 7] }), ctx);
  actor.receive(forward(2, 7, 3, { chunk: 1, tokens: [8, 9, 10] }), ctx);
  actor.receive(encodePipe({ type: "cancel", id: "r", before: 2 }), ctx); // chunks 0 and 1: void
  actor.receive(forward(3, 5, 3, { chunk: 2, tokens: [6, 11, 12] }), ctx);
  await actor.idle();
  assert.deepEqual(backend.runs.map((r) => [r.pos0, r.T]), [[0, 4], [5, 3]], "chunks 0 and 1 not computed");
  assert.equal(actor.cancelledSteps, 2);
  const f = sent.filter((m): m is Extract<PipeMessage, { type: "forward" }> => m.type === "forward");
  assert.deepEqual(f.map((m) => [m.step, m.void ?? false, m.hidden.length]), [
    [0, false, 4 * 4 * 4],
    [1, true, 0],
    [2, true, 0],
    [3, false, 3 * 4 * 4],
  ]);
  assert.deepEqual(f[3].verify, { chunk: 2, tokens: [6, 11, 12] });
  await actor.onStop();
});

Deno.test("stage 0: a cancelled VERIFY that has not started is never run nor forwarded", async () => {
  const backend = new FakeBackend({ index: 0, stages: 2, layers: [0, 2], embeds: true, head: false });
  const sent: PipeMessage[] = [];
  const actor = new StageActor({
    backend,
    planVersion: 1,
    log: () => {},
    send: (_name, body) => {
      sent.push(decodePipe(body));
      return Promise.resolve();
    },
  });
  const ctx = { receivedAt: 0 } as unknown as ActorContext;
  actor.receive(encodePipe({ type: "start", id: "r", open: OPEN, prompt: Uint32Array.of(1, 2, 3, 4) }), ctx);
  await actor.idle();
  const verify = (chunk: number, pos0: number, tokens: number[]) =>
    encodePipe({ type: "verify", id: "r", chunk, pos0, tokens: Uint32Array.from(tokens) });
  actor.receive(verify(0, 4, [5, 6]), ctx);
  actor.receive(encodePipe({ type: "cancel", id: "r", before: 1 }), ctx);
  actor.receive(verify(1, 4, [7, 8]), ctx);
  await actor.idle();
  assert.deepEqual(backend.runs.map((r) => [r.pos0, r.T]), [[0, 4], [4, 2]]);
  const f = sent.filter((m): m is Extract<PipeMessage, { type: "forward" }> => m.type === "forward");
  assert.deepEqual(
    f.map((m) => [m.step, m.verify?.chunk]),
    [[0, undefined], [1, 1]],
    "step numbers stay dense",
  );
  assert.equal(actor.cancelledSteps, 1);
  await actor.onStop();
});
