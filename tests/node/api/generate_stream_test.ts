// POST /generate's NDJSON stream, written by the route and read back by the client's reader
// (readGenerateLines over readNdjson), through app.request() with a fake pipeline.
import assert from "node:assert/strict";
import {
  type ApiServices,
  createApp,
  type GenerateLine,
  readGenerateLines,
  readNdjson,
} from "../../../node/api/mod.ts";
import type { Chain, PipelineNode, RequestOptions, TokenEvent } from "../../../node/stage/mod.ts";

const CHAIN: Chain = { version: 1, nodes: ["aa", "bb"] };

function event(index: number): TokenEvent {
  return {
    index,
    token: 40 + index,
    atMs: 10 * (index + 1),
    timings: { computeMs: [1.5, 2], wireMs: [0.25, index === 0 ? null : 0.5], bytes: [8, 4] },
    trace: [{ s: 0, in: 1000 + index, c: 1.5, out: 1002 + index, b: 8 }, {
      s: 1,
      in: 1003,
      c: 2,
      out: 1005,
      b: 4,
    }],
  };
}

/** A pipeline whose client plays `script` for each request; records the options it was given. */
function fakePipeline(script: (o: RequestOptions) => Promise<{ tokens: number[]; events: TokenEvent[] }>) {
  const seen: { tokens: number[]; opts: RequestOptions }[] = [];
  const p = {
    board: { current: undefined },
    waitReady: () => Promise.resolve(CHAIN),
    client: {
      async generate(chain: Chain, tokens: number[], opts: RequestOptions) {
        assert.equal(chain, CHAIN);
        seen.push({ tokens, opts });
        const r = await script(opts);
        return { ...r, stopReason: "max_tokens" as const, firstTokenMs: 12.5, tokS: 99.5 };
      },
    },
  } as unknown as PipelineNode;
  return { p, seen };
}

function app(p: PipelineNode) {
  const services: ApiServices = {
    self: () => "aa",
    members: () => [],
    registry: () => [],
    plan: () => null,
    down: () => {},
    pipeline: () => p,
  };
  return createApp(services, { token: "t0k3n" });
}

function post(body: unknown): RequestInit {
  return {
    method: "POST",
    headers: { "content-type": "application/json", authorization: "Bearer t0k3n" },
    body: JSON.stringify(body),
  };
}

async function collect(body: ReadableStream<Uint8Array>): Promise<GenerateLine[]> {
  const out = [];
  for await (const m of readGenerateLines(body)) out.push(m);
  return out;
}

Deno.test("generate stream: what the route writes, the reader gives back line for line", async () => {
  const events = [0, 1, 2].map(event);
  const { p, seen } = fakePipeline((o) => {
    for (const e of events) o.onToken?.(e);
    return Promise.resolve({ tokens: events.map((e) => e.token), events });
  });
  const res = await app(p).request(
    "/generate",
    post({ tokens: [1, 2, 3], maxTokens: 3, wire: "f32", eos: [7], sampling: { temperature: 0 } }),
  );
  assert.equal(res.status, 200);
  assert.equal(res.headers.get("content-type"), "application/x-ndjson");
  assert.deepEqual(await collect(res.body!), [
    ...events,
    { done: { stopReason: "max_tokens", firstTokenMs: 12.5, tokS: 99.5, stages: 2 } },
  ]);
  assert.deepEqual(seen[0].tokens, [1, 2, 3]);
  assert.equal(seen[0].opts.maxTokens, 3);
  assert.equal(seen[0].opts.wire, "f32");
  assert.deepEqual(seen[0].opts.eos, [7]);
});

Deno.test("generate stream: a failing chain ends the stream with an error line after its tokens", async () => {
  const { p } = fakePipeline((o) => {
    o.onToken?.(event(0));
    return Promise.reject(new Error("stage 1's node died"));
  });
  const res = await app(p).request("/generate", post({ tokens: [5] }));
  assert.deepEqual(await collect(res.body!), [event(0), { error: "stage 1's node died" }]);
});

Deno.test("generate stream: a reader that stops early cancels the request", async () => {
  let aborted: unknown;
  const { p } = fakePipeline((o) =>
    new Promise((_, reject) => {
      o.onToken?.(event(0));
      o.signal!.addEventListener("abort", () => {
        aborted = o.signal!.reason;
        reject(o.signal!.reason);
      });
    })
  );
  const res = await app(p).request("/generate", post({ tokens: [5] }));
  for await (const m of readGenerateLines(res.body!)) {
    assert.deepEqual(m, event(0));
    break;
  }
  await new Promise((r) => setTimeout(r, 0));
  assert.ok(aborted instanceof Error, "the route's request was aborted");
  assert.match((aborted as Error).message, /went away/);
});

Deno.test("generate stream: the reader refuses a line that is no token, outcome or error", async () => {
  await assert.rejects(collect(stream(['{"token":1}\n', '{"tok":2}\n'])), /unexpected line \{"tok":2\}/);
});

/** A body that arrives in exactly these pieces. */
function stream(pieces: (string | Uint8Array)[]): ReadableStream<Uint8Array> {
  const enc = new TextEncoder();
  return ReadableStream.from(pieces.map((p) => typeof p === "string" ? enc.encode(p) : p));
}

async function values(body: ReadableStream<Uint8Array>): Promise<unknown[]> {
  const out = [];
  for await (const v of readNdjson(body)) out.push(v);
  return out;
}

Deno.test("ndjson: lines split anywhere, even inside a character, come back whole", async () => {
  const bytes = new TextEncoder().encode('{"text":"héllo"}\n[1,2]\n');
  const cut = bytes.indexOf(0xc3) + 1; // between the two bytes of "é"
  assert.deepEqual(
    await values(stream([bytes.slice(0, 3), bytes.slice(3, cut), bytes.slice(cut)])),
    [{ text: "héllo" }, [1, 2]],
  );
  assert.deepEqual(await values(stream(['{"a":', '1}\n\n{"b"', ":2}\n"])), [{ a: 1 }, { b: 2 }]);
});

Deno.test("ndjson: a last line without its newline counts; a cut one is an error naming the line", async () => {
  assert.deepEqual(await values(stream(['{"a":1}\n{"b":2}'])), [{ a: 1 }, { b: 2 }]);
  await assert.rejects(
    values(stream(['{"a":1}\n{"b":'])),
    /NDJSON: line 2 is not JSON \(the stream ended inside it/,
  );
  await assert.rejects(values(stream(['{"a":1}\nnot json\n{"c":3}\n'])), /NDJSON: line 2 is not JSON/);
});
