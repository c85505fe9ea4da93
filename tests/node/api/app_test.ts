import assert from "node:assert/strict";
import { type ApiServices, createApp } from "../../../node/api/mod.ts";

function fake(): ApiServices & { downs: number } {
  const s = {
    downs: 0,
    self: () => "aa",
    members: () => [
      { id: "aa", state: "alive" as const, roles: ["leader"] },
      { id: "bb", state: "left" as const, roles: [] },
    ],
    registry: (): [string, string][] => [["leader", "aa"]],
    plan: () => null,
    down: () => void s.downs++,
  };
  return s;
}

Deno.test("api: GET /status lists members with state and roles, and the plan", async () => {
  const res = await createApp(fake()).request("/status");
  assert.equal(res.status, 200);
  assert.deepEqual(await res.json(), {
    self: "aa",
    members: [{ id: "aa", state: "alive", roles: ["leader"] }, { id: "bb", state: "left", roles: [] }],
    plan: null,
  });
});

Deno.test("api: GET /registry lists name -> owner", async () => {
  const res = await createApp(fake()).request("/registry");
  assert.deepEqual(await res.json(), { entries: [{ name: "leader", owner: "aa" }] });
});

Deno.test("api: POST /down answers 202 and then starts the leave", async () => {
  const s = fake();
  const res = await createApp(s).request("/down", { method: "POST" });
  assert.equal(res.status, 202);
  assert.equal(s.downs, 0);
  await new Promise((r) => setTimeout(r, 5));
  assert.equal(s.downs, 1);
  assert.equal((await createApp(s).request("/down")).status, 404);
});
