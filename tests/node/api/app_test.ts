import assert from "node:assert/strict";
import { type ApiServices, createApp } from "../../../node/api/mod.ts";

const TOKEN = "s3cret-token";
const AUTH = { authorization: `Bearer ${TOKEN}` };

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

const app = (s = fake()) => createApp(s, { token: TOKEN });

Deno.test("api: GET /status lists members with state and roles, and the plan", async () => {
  const res = await app().request("/status");
  assert.equal(res.status, 200);
  assert.deepEqual(await res.json(), {
    self: "aa",
    members: [{ id: "aa", state: "alive", roles: ["leader"] }, { id: "bb", state: "left", roles: [] }],
    plan: null,
  });
});

Deno.test("api: GET /registry lists name -> owner", async () => {
  const res = await app().request("/registry");
  assert.deepEqual(await res.json(), { entries: [{ name: "leader", owner: "aa" }] });
});

Deno.test("api: POST /down with the token answers 202 and then starts the leave", async () => {
  const s = fake();
  const res = await app(s).request("/down", { method: "POST", headers: AUTH });
  assert.equal(res.status, 202);
  assert.equal(s.downs, 0);
  await new Promise((r) => setTimeout(r, 5));
  assert.equal(s.downs, 1);
  assert.equal((await app(s).request("/down")).status, 404);
});

Deno.test("api: a cross-site POST /down (a web page's form) is refused with 403", async () => {
  const s = fake();
  const res = await app(s).request("http://127.0.0.1:4000/down", {
    method: "POST",
    headers: { origin: "http://evil.example", "content-type": "text/plain" },
    body: "x",
  });
  assert.equal(res.status, 403);
  assert.match((await res.json()).error, /another origin/);
  // Even with the token (a page cannot have it, but the Origin check stands on its own).
  const withToken = await app(s).request("http://127.0.0.1:4000/down", {
    method: "POST",
    headers: { origin: "http://evil.example", ...AUTH },
  });
  assert.equal(withToken.status, 403);
  await new Promise((r) => setTimeout(r, 5));
  assert.equal(s.downs, 0);
});

Deno.test("api: a DNS name rebound to loopback is refused, reads included; IPs and localhost pass", async () => {
  const res = await app().request("http://rebind.evil.example:4000/status");
  assert.equal(res.status, 403);
  assert.match((await res.json()).error, /Host "rebind\.evil\.example:4000"/);
  for (const host of ["127.0.0.1:4000", "[::1]:4000", "localhost:4000", "192.168.1.5:4000"]) {
    assert.equal((await app().request(`http://${host}/status`)).status, 200, host);
  }
  const same = await app().request("http://127.0.0.1:4000/status", {
    headers: { origin: "http://127.0.0.1:4000" },
  });
  assert.equal(same.status, 200, "a page of the API's own origin");
});

Deno.test("api: POST routes need the node's token: none is 401, a wrong one 403", async () => {
  const s = fake();
  const none = await app(s).request("/down", { method: "POST" });
  assert.equal(none.status, 401);
  assert.match((await none.json()).error, /needs the node's token/);
  const wrong = await app(s).request("/down", { method: "POST", headers: { authorization: "Bearer nope" } });
  assert.equal(wrong.status, 403);
  await new Promise((r) => setTimeout(r, 5));
  assert.equal(s.downs, 0);
});
