// Load on a running server's OpenAI API (`swactor up --model DIR`): waves of C concurrent streamed
// completions, each --tokens new tokens, greedy, after a prompt of --prompt words that differs from request to
// request, for each C of --concurrency in turn. What a server's users see as it fills: the aggregate tokens a
// second, each request's time to its first token and its own decode rate.
//   deno run -A scripts/bench/serve_load.ts [--url http://127.0.0.1:8080] [--concurrency 1,4,16]
//     [--tokens 64] [--prompt 32] [--rounds 2] [--api-key KEY]
// Waits (up to 5 min) for the server to answer a one-token completion first (it may still be loading), then
// prints one JSON line per (concurrency, round): the wave's wall ms, completion tokens, aggregate tok/s
// (completion tokens / wall), time to first token (median and worst, ms), each request's decode tok/s after
// its first token (median), and the requests that failed (with the first error).
import { parseArgs } from "node:util";
import { countArg, scriptArgs } from "../args.ts";
import { UsageError } from "../../cli/command.ts";
import { median } from "./stats.ts";

const { url, levels, tokens, words, rounds, key } = scriptArgs(import.meta.url, (args) => {
  const { values } = parseArgs({
    args,
    options: {
      url: { type: "string", default: "http://127.0.0.1:8080" },
      concurrency: { type: "string", default: "1,4,16" },
      tokens: { type: "string", default: "64" },
      prompt: { type: "string", default: "32" },
      rounds: { type: "string", default: "2" },
      "api-key": { type: "string" },
    },
  });
  if (!/^https?:\/\/[^/]+$/.test(values.url)) {
    throw new UsageError(`--url takes http://HOST:PORT, got "${values.url}"`);
  }
  return {
    url: values.url,
    levels: values.concurrency.split(",").map((c) => countArg("concurrency", c)),
    tokens: countArg("tokens", values.tokens),
    words: countArg("prompt", values.prompt),
    rounds: countArg("rounds", values.rounds),
    key: values["api-key"],
  };
});

const headers: Record<string, string> = { "content-type": "application/json" };
if (key) headers.authorization = `Bearer ${key}`;

interface Outcome {
  ok: boolean;
  error?: string;
  ttftMs: number;
  /** ms from the first token's chunk to the last chunk. */
  decodeMs: number;
  completionTokens: number;
}

/** One streamed completion, timed by its chunks. */
async function complete(model: string, prompt: string, maxTokens: number): Promise<Outcome> {
  const t0 = performance.now();
  const fail = (error: string): Outcome => ({
    ok: false,
    error,
    ttftMs: 0,
    decodeMs: 0,
    completionTokens: 0,
  });
  let res: Response;
  try {
    res = await fetch(`${url}/v1/completions`, {
      method: "POST",
      headers,
      body: JSON.stringify({
        model,
        prompt,
        max_tokens: maxTokens,
        temperature: 0,
        stream: true,
        stream_options: { include_usage: true },
      }),
    });
  } catch (e) {
    return fail((e as Error).message);
  }
  if (!res.ok || !res.body) return fail(`HTTP ${res.status}: ${(await res.text()).slice(0, 200)}`);
  let first = 0, last = 0, usage = 0, buffered = "";
  const decoder = new TextDecoder();
  for await (const bytes of res.body) {
    buffered += decoder.decode(bytes, { stream: true });
    let end: number;
    while ((end = buffered.indexOf("\n\n")) >= 0) {
      const event = buffered.slice(0, end);
      buffered = buffered.slice(end + 2);
      const data = event.split("\n").filter((l) => l.startsWith("data: ")).map((l) => l.slice(6)).join("");
      if (!data || data === "[DONE]") continue;
      const chunk = JSON.parse(data);
      if (chunk.error) return fail(chunk.error.message ?? JSON.stringify(chunk.error));
      if (chunk.usage) usage = chunk.usage.completion_tokens;
      if (chunk.choices?.[0]?.text) {
        last = performance.now();
        first ||= last;
      }
    }
  }
  if (!first) return fail("no tokens came");
  return { ok: true, ttftMs: first - t0, decodeMs: last - first, completionTokens: usage };
}

/** A prompt of about `n` words that no other request of the run shares from its start. */
function promptFor(i: number, n: number): string {
  const vocabulary = ["river", "stone", "light", "market", "winter", "signal", "garden", "engine", "paper"];
  const body = Array.from({ length: n }, (_, k) => vocabulary[(i * 7 + k * 3) % vocabulary.length]);
  return `Request ${i}: ${body.join(" ")}`;
}

async function waitForServer(): Promise<string> {
  const until = Date.now() + 5 * 60_000;
  let why = "";
  while (Date.now() < until) {
    try {
      const models = await (await fetch(`${url}/v1/models`, { headers })).json();
      const model = models?.data?.[0]?.id;
      if (typeof model === "string") {
        const r = await complete(model, "Hello", 1);
        if (r.ok) return model;
        why = r.error ?? "";
      }
    } catch (e) {
      why = (e as Error).message;
    }
    await new Promise((r) => setTimeout(r, 1000));
  }
  throw new Error(`${url} did not serve a completion within 5 minutes (${why})`);
}

const model = await waitForServer();
let n = 0;
for (const c of levels) {
  for (let round = 0; round < rounds; round++) {
    const t0 = performance.now();
    const outcomes = await Promise.all(
      Array.from({ length: c }, () => complete(model, promptFor(n++, words), tokens)),
    );
    const wallMs = performance.now() - t0;
    const ok = outcomes.filter((o) => o.ok);
    const completion = ok.reduce((s, o) => s + o.completionTokens, 0);
    const r = (x: number, d = 1) => Number(x.toFixed(d));
    console.log(JSON.stringify({
      bench: "swactor-serve-load",
      url,
      model,
      concurrency: c,
      round,
      prompt_words: words,
      max_tokens: tokens,
      wall_ms: r(wallMs),
      completion_tokens: completion,
      aggregate_tok_s: r((completion / wallMs) * 1000),
      ttft_ms_median: r(median(ok.map((o) => o.ttftMs))),
      ttft_ms_max: r(Math.max(...ok.map((o) => o.ttftMs))),
      request_decode_tok_s_median: r(
        median(ok.filter((o) => o.decodeMs > 0).map((o) => ((o.completionTokens - 1) / o.decodeMs) * 1000)),
      ),
      failed: outcomes.length - ok.length,
      first_error: outcomes.find((o) => !o.ok)?.error,
    }));
  }
}
