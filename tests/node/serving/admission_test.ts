// The OpenAI server's admission: slots, the shared KV budget, the bounded FIFO queue, waiting limits and
// clients that leave while waiting.
import assert from "node:assert/strict";
import { KvBudget } from "../../../node/api/kv_budget.ts";
import { Admission, ApiError } from "../../../node/serving/mod.ts";

const tick = () => new Promise((r) => setTimeout(r, 0));

Deno.test("admission: beyond the slots, requests wait in order and run as slots free", async () => {
  const a = new Admission(new KvBudget(() => 100), { concurrency: 2, queue: 5 });
  const r1 = await a.enter(10);
  const r2 = await a.enter(10);
  const order: number[] = [];
  const w3 = a.enter(10).then((r) => (order.push(3), r));
  const w4 = a.enter(10).then((r) => (order.push(4), r));
  await tick();
  assert.deepEqual([a.running, a.waiting, order.length], [2, 2, 0]);
  r2();
  r2(); // releasing twice frees one slot
  const r3 = await w3;
  await tick();
  assert.deepEqual([a.running, a.waiting, order], [2, 1, [3]]);
  r1();
  (await w4)();
  r3();
  assert.deepEqual([a.running, a.waiting], [0, 0]);
});

Deno.test("admission: KV room is waited for, including room freed by the control API's requests", async () => {
  const budget = new KvBudget(() => 100);
  const a = new Admission(budget, { concurrency: 8 });
  const outside = budget.admit(70); // POST /generate holds 70 positions
  assert.ok(outside.ok);
  const r1 = await a.enter(30);
  let ran = false;
  const w = a.enter(50).then((r) => ((ran = true), r));
  await tick();
  assert.equal(ran, false);
  r1();
  await tick();
  assert.equal(ran, false, "30 + 70 free is not enough for 50 beside 70");
  outside.release();
  (await w)();
  assert.equal(budget.held.tokens, 0);
});

Deno.test("admission: a full queue is a 429, a long wait a 503, more than the budget a 400", async () => {
  const a = new Admission(new KvBudget(() => 100), { concurrency: 1, queue: 1, waitMs: 30 });
  const r = await a.enter(10);
  const waiting = a.enter(10);
  await assert.rejects(
    a.enter(10),
    (e) => e instanceof ApiError && e.status === 429 && e.opts.retryAfterS === 1,
  );
  await assert.rejects(
    waiting,
    (e) => e instanceof ApiError && e.status === 503 && e.opts.code === "queue_timeout",
  );
  await assert.rejects(a.enter(101), (e) => e instanceof ApiError && e.status === 400);
  r();
});

Deno.test("admission: a client that leaves while waiting leaves the queue; the next one moves up", async () => {
  const a = new Admission(new KvBudget(() => 100), { concurrency: 1, queue: 4 });
  const r = await a.enter(10);
  const gone = new AbortController();
  const left = a.enter(10, gone.signal);
  const next = a.enter(10);
  gone.abort(new Error("went away"));
  await assert.rejects(left, /went away/);
  assert.equal(a.waiting, 1);
  r();
  (await next)();
  assert.equal(a.running, 0);
});
