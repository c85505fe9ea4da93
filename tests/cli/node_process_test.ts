// runNodeProcess in this process (a real node on loopback): stopping is never held up by a start that
// does not finish, nor by a cleanup that does not end (issue 11, item 1: leaving is bounded in time).
import assert from "node:assert/strict";
import { runNodeProcess } from "../../cli/node_process.ts";
import { newSecret } from "../../node/ticket.ts";

const never = () => new Promise<void>(() => {});
const after = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));
const quiet = { sanitizeOps: false, sanitizeResources: false };

Deno.test(
  { name: "runNodeProcess: a stop during a start that never finishes leaves at once", ...quiet },
  async () => {
    const t0 = Date.now();
    let aborted = false;
    const code = await Promise.race([
      runNodeProcess({
        secret: newSecret(),
        noGpu: true,
        membership: "test",
        parentGone: after(300),
        ready: (_node, _api, signal) => {
          signal.addEventListener("abort", () => (aborted = true));
          return never();
        },
      }),
      after(10_000).then(() => "still running after 10 s"),
    ]);
    assert.equal(code, 0);
    assert.ok(aborted, "the start was told to stop");
    assert.ok(Date.now() - t0 < 5000, `took ${Date.now() - t0} ms`);
  },
);

Deno.test(
  { name: "runNodeProcess: a cleanup that never ends is cut off after its timeout", ...quiet },
  async () => {
    const t0 = Date.now();
    const code = await Promise.race([
      runNodeProcess({
        secret: newSecret(),
        noGpu: true,
        membership: "test",
        parentGone: after(100),
        ready: async () => {},
        cleanup: never,
        cleanupTimeoutMs: 500,
      }),
      after(10_000).then(() => "still running after 10 s"),
    ]);
    assert.equal(code, 0);
    assert.ok(Date.now() - t0 < 5000, `took ${Date.now() - t0} ms`);
  },
);
