// POST /logits: token ids in, float32 [T, vocab] out (what `logits --cluster` asks a running chain for).
import assert from "node:assert/strict";
import { type ApiServices, createApp } from "../../../node/api/mod.ts";
import type { Chain, PipelineNode } from "../../../node/stage/mod.ts";

const CHAIN: Chain = { version: 1, nodes: ["aa"] };
const V = 4;

function app() {
  const seen: { tokens: number[]; wire?: string }[] = [];
  const p = {
    board: { current: { plan: { model: { vocab: V }, context: 8 } } },
    waitReady: () => Promise.resolve(CHAIN),
    client: {
      logits(chain: Chain, tokens: number[], o: { vocab: number; wire?: string }) {
        assert.equal(chain, CHAIN);
        seen.push({ tokens, wire: o.wire });
        return Promise.resolve({
          logits: Float32Array.from({ length: tokens.length * o.vocab }, (_, i) => i / 2),
          traces: [],
        });
      },
    },
  } as unknown as PipelineNode;
  const services: ApiServices = {
    self: () => "aa",
    members: () => [],
    registry: () => [],
    plan: () => null,
    down: () => {},
    pipeline: () => p,
  };
  return { app: createApp(services, { token: "t0k3n" }), seen };
}

const post = (body: unknown): RequestInit => ({
  method: "POST",
  headers: { "content-type": "application/json", authorization: "Bearer t0k3n" },
  body: JSON.stringify(body),
});

Deno.test("POST /logits: the chain's logits as float32 bytes, their shape in a header", async () => {
  const { app: a, seen } = app();
  const res = await a.request("/logits", post({ tokens: [1, 3, 0], wire: "f32" }));
  assert.equal(res.status, 200);
  assert.equal(res.headers.get("x-swactor-shape"), "3,4");
  const got = new Float32Array(await res.arrayBuffer());
  assert.deepEqual([...got], Array.from({ length: 12 }, (_, i) => i / 2));
  assert.deepEqual(seen, [{ tokens: [1, 3, 0], wire: "f32" }]);
});

Deno.test("POST /logits: bad tokens, a bad wire, no token and more tokens than the Plan holds are refused", async () => {
  const { app: a, seen } = app();
  for (
    const [body, status, why] of [
      [{ tokens: [1, 4] }, 400, /token ids in \[0, 4\)/],
      [{ tokens: [] }, 400, /non-empty/],
      [{ tokens: [1], wire: "bf16" }, 400, /wire must be/],
      [{ tokens: [0, 0, 0, 0, 0, 0, 0, 0, 0] }, 400, /8/],
    ] as const
  ) {
    const res = await a.request("/logits", post(body));
    assert.equal(res.status, status, JSON.stringify(body));
    assert.match((await res.json()).error, why);
  }
  const anon = await a.request("/logits", { method: "POST", body: "{}" });
  assert.equal(anon.status, 401);
  assert.equal(seen.length, 0);
});
