// sendWithRetry: transient errors are retried after the given waits, other errors and known-gone targets
// are not, and the last error comes back when the waits run out.
import assert from "node:assert/strict";
import { FakeClock } from "../../../node/clock.ts";
import { ActorFailedError, PeerUnreachableError } from "../../../node/actors/mod.ts";
import { sendWithRetry } from "../../../node/stage/retry.ts";

async function run(p: Promise<void>, clock: FakeClock): Promise<unknown> {
  let out: unknown = "pending";
  p.then(() => (out = "ok"), (e) => (out = e));
  for (let i = 0; i < 5000 && out === "pending"; i++) {
    clock.advance(1);
    await new Promise((r) => setTimeout(r, 0));
  }
  return out;
}

const body = new Uint8Array([1]);

Deno.test("sendWithRetry: a send that fails twice then works is sent three times, after the waits", async () => {
  const clock = new FakeClock();
  const at: number[] = [];
  const send = () => {
    at.push(clock.now());
    return at.length < 3 ? Promise.reject(new PeerUnreachableError("down")) : Promise.resolve();
  };
  assert.equal(await run(sendWithRetry(send, "stage-1", body, { clock, delaysMs: [50, 100] }), clock), "ok");
  const gaps = [at[1] - at[0], at[2] - at[1]];
  assert.ok(gaps[0] >= 50 && gaps[0] <= 52 && gaps[1] >= 100 && gaps[1] <= 102, `gaps ${gaps}`);
});

Deno.test("sendWithRetry: gives up with the last error when the waits run out", async () => {
  const clock = new FakeClock();
  let n = 0;
  const send = () => Promise.reject(new PeerUnreachableError(`down ${++n}`));
  const e = await run(sendWithRetry(send, "stage-1", body, { clock, delaysMs: [10, 10, 10] }), clock);
  assert.ok(e instanceof PeerUnreachableError && e.message === "down 4", String(e));
});

Deno.test("sendWithRetry: no retry for a target membership calls gone, a closed sender, or a non-transient error", async () => {
  for (
    const [opts, err] of [
      [{ gone: () => true }, new PeerUnreachableError("gone")],
      [{ closed: () => true }, new PeerUnreachableError("closing")],
      [{}, new ActorFailedError("the handler threw")],
    ] as const
  ) {
    const clock = new FakeClock();
    let n = 0;
    const send = () => (n++, Promise.reject(err));
    const e = await run(sendWithRetry(send, "stage-2", body, { clock, ...opts }), clock);
    assert.equal(e, err);
    assert.equal(n, 1, `${err.message}: sent once`);
  }
});
