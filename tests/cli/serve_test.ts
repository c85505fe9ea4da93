// The OpenAI server of `up --peers 2 --model llama3-tiny --http 127.0.0.1:0` with real processes on
// loopback, through raw HTTP and through the official `openai` client (a dev dependency): the model is
// listed; a greedy
// completion gives the text `generate` gives and usage.completion_tokens == max_tokens; streamed deltas add
// up to the whole answer (completions, and chat when @huggingface/jinja is installed); a malformed request
// is a 400 in OpenAI's error body; a request cancelled mid-stream leaves 0 active requests and 0 KV bytes
// on every stage (status --json and /metrics); /metrics parses as Prometheus text; and the dashboard,
// loaded in headless Chromium (installed with apt-get when missing), shows the cluster and updates live.
import assert from "node:assert/strict";
import { fixtureDir } from "../fixtures.ts";
import { gpuAvailable, needs } from "../support/needs.ts";
import { parsePrometheus, sampleValue } from "../support/prometheus_text.ts";
import { chromiumPath, openPage } from "../support/chromium.ts";
import { runCli, spawnCli } from "./run.ts";
import { jinjaEngine } from "../../models/chat_template.ts";
import OpenAI from "openai";

const tiny = fixtureDir("llama3-tiny", { needs: "tokenizer.json" });
const hasGpu = await gpuAvailable();
const hasJinja = await jinjaEngine().then(() => true, () => false);
const NO_JINJA = hasJinja ? "" : " (skipped: needs the npm package @huggingface/jinja)";

async function post(base: string, path: string, body: unknown, signal?: AbortSignal): Promise<Response> {
  return await fetch(base + path, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: typeof body === "string" ? body : JSON.stringify(body),
    signal,
  });
}

/** The `data:` payloads of an SSE body, parsed (the last one, "[DONE]", checked and dropped). */
async function chunks(res: Response): Promise<Record<string, unknown>[]> {
  assert.equal(res.status, 200);
  assert.match(res.headers.get("content-type")!, /^text\/event-stream/);
  const data = (await res.text()).split("\n\n").filter((b) => b.trim()).map((b) => {
    assert.ok(b.startsWith("data: "), `an SSE event of data lines: ${b.slice(0, 80)}`);
    return b.slice(6);
  });
  assert.equal(data.at(-1), "[DONE]");
  return data.slice(0, -1).map((d) => JSON.parse(d));
}

interface Stage {
  index: number;
  active?: number;
  kvBytes?: number;
}

Deno.test({
  ...needs("up --model serves the OpenAI API, /metrics and the dashboard on its --http address", {
    "a WebGPU adapter": hasGpu,
    "../shared/fixtures/llama3-tiny (with tokenizer.json)": tiny,
  }),
  sanitizeResources: false,
  sanitizeOps: false,
  async fn(t) {
    const env = { SWACTOR_STATE_DIR: await Deno.makeTempDir() };
    const up = spawnCli(
      ["up", "--peers", "2", "--membership", "test", "--model", tiny!, "--http", "127.0.0.1:0"],
      { env },
    );
    try {
      const base = (await up.waitFor(/http: (http:\/\/127\.0\.0\.1:\d+)/, 60_000))[1];
      // The server answers before the chain is ready: 503 with Retry-After (unless loading already ended).
      const early = await post(base, "/v1/completions", { model: "llama3-tiny", prompt: "x", max_tokens: 1 });
      if (early.status === 503) assert.ok(Number(early.headers.get("retry-after")) > 0);
      await early.body?.cancel();
      await up.waitFor(/chain ready: 2 stage/, 120_000);
      const prompt = "The capital of France is";

      await t.step("GET /v1/models lists the model", async () => {
        const body = await (await fetch(`${base}/v1/models`)).json();
        assert.equal(body.object, "list");
        assert.deepEqual(body.data.map((m: { id: string }) => m.id), ["llama3-tiny"]);
      });

      let whole = "";
      await t.step("a greedy completion gives generate's text, and max_tokens tokens", async () => {
        const res = await post(base, "/v1/completions", {
          model: "llama3-tiny",
          prompt,
          max_tokens: 12,
          temperature: 0,
        });
        assert.equal(res.status, 200);
        const body = await res.json();
        assert.equal(body.object, "text_completion");
        assert.equal(body.usage.completion_tokens, 12);
        assert.equal(body.choices[0].finish_reason, "length");
        whole = body.choices[0].text;
        const gen = await runCli(
          ["generate", prompt, "--model", tiny!, "--max-tokens", "12", "--temperature", "0", "--json"],
          { env },
        );
        assert.equal(gen.code, 0, gen.stderr);
        const out = JSON.parse(gen.stdout.trim().split("\n").at(-1)!);
        assert.equal(whole, out.text);
        assert.equal(body.usage.prompt_tokens, out.prompt_tokens);
      });

      await t.step("the official openai client lists the model and gets the same greedy text", async () => {
        const client = new OpenAI({ baseURL: base + "/v1", apiKey: "unused-on-loopback" });
        const models = await client.models.list();
        assert.deepEqual(models.data.map((m) => m.id), ["llama3-tiny"]);
        const c = await client.completions.create({
          model: "llama3-tiny",
          prompt,
          max_tokens: 12,
          temperature: 0,
        });
        assert.equal(c.choices[0].text, whole);
        assert.equal(c.usage?.completion_tokens, 12);
        let streamed = "";
        const stream = await client.completions.create({
          model: "llama3-tiny",
          prompt,
          max_tokens: 12,
          temperature: 0,
          stream: true,
        });
        for await (const chunk of stream) streamed += chunk.choices[0]?.text ?? "";
        assert.equal(streamed, whole);
        await assert.rejects(
          client.completions.create({ model: "llama3-tiny", prompt, max_tokens: 12, n: 2 }),
          (e) => e instanceof OpenAI.BadRequestError && /\bn\b/.test(e.message),
        );
      });

      await t.step("a streamed completion's deltas add up to the whole answer", async () => {
        const res = await post(base, "/v1/completions", {
          model: "llama3-tiny",
          prompt,
          max_tokens: 12,
          temperature: 0,
          stream: true,
          stream_options: { include_usage: true },
        });
        const cs = await chunks(res);
        const text = cs.flatMap((c) => (c.choices as { text: string }[]).map((x) => x.text)).join("");
        assert.equal(text, whole);
        assert.deepEqual((cs.at(-1)!.usage as { completion_tokens: number }).completion_tokens, 12);
      });

      await t.step({
        name: `a streamed chat completion's deltas add up to the non-streamed answer${NO_JINJA}`,
        ignore: !hasJinja,
        fn: async () => {
          const req = {
            model: "llama3-tiny",
            messages: [{ role: "user", content: "Hi!" }],
            max_tokens: 10,
            temperature: 0,
          };
          const body = await (await post(base, "/v1/chat/completions", req)).json();
          assert.equal(body.object, "chat.completion");
          const cs = await chunks(await post(base, "/v1/chat/completions", { ...req, stream: true }));
          const text = cs.map((c) => (c.choices as { delta: { content?: string } }[])[0].delta.content ?? "")
            .join("");
          assert.equal(text, body.choices[0].message.content);
          assert.equal(
            (cs.at(-1)!.choices as { finish_reason: string }[])[0].finish_reason,
            body.choices[0].finish_reason,
          );
        },
      });

      await t.step("a malformed request is a 400 in OpenAI's error body", async () => {
        for (const bad of ["{oops", { model: "llama3-tiny", prompt: "x", max_tokens: -1 }]) {
          const res = await post(base, "/v1/completions", bad);
          assert.equal(res.status, 400);
          const body = await res.json();
          assert.deepEqual(Object.keys(body.error).sort(), ["code", "message", "param", "type"]);
          assert.equal(body.error.type, "invalid_request_error");
        }
        const res = await post(base, "/v1/completions", { model: "gpt-4", prompt: "x" });
        assert.equal(res.status, 404);
        assert.equal((await res.json()).error.code, "model_not_found");
      });

      await t.step(
        "a request cancelled mid-stream leaves 0 active requests and 0 KV bytes on every stage",
        async () => {
          const abort = new AbortController();
          const res = await post(
            base,
            "/v1/completions",
            { model: "llama3-tiny", prompt, max_tokens: 3000, stream: true },
            abort.signal,
          );
          const reader = res.body!.getReader();
          for (let got = ""; (got.match(/data: /g) ?? []).length < 4;) {
            got += new TextDecoder().decode((await reader.read()).value);
          }
          const during = parsePrometheus(await (await fetch(`${base}/metrics`)).text());
          assert.equal(
            sampleValue(during, "swactor_stage_active_requests", { stage: "1" }),
            1,
            "it runs on stage 1",
          );
          assert.ok(
            sampleValue(during, "swactor_stage_kv_bytes", { stage: "0" })! > 0,
            "it holds KV on stage 0",
          );
          abort.abort();
          await reader.cancel().catch(() => {});
          let stages: Stage[] = [];
          for (let i = 0; i < 50; i++) {
            const st = await runCli(["status", "--json"], { env });
            assert.equal(st.code, 0, st.stderr);
            stages = JSON.parse(st.stdout).pipeline.stages;
            if (stages.every((s) => s.active === 0 && s.kvBytes === 0)) break;
            await new Promise((r) => setTimeout(r, 200));
          }
          assert.equal(stages.length, 2);
          assert.deepEqual(stages.map((s) => [s.active, s.kvBytes]), [[0, 0], [0, 0]], "status --json");
          const m = parsePrometheus(await (await fetch(`${base}/metrics`)).text());
          for (const stage of ["0", "1"]) {
            assert.equal(
              sampleValue(m, "swactor_stage_active_requests", { stage }),
              0,
              `/metrics, stage ${stage}`,
            );
            assert.equal(sampleValue(m, "swactor_stage_kv_bytes", { stage }), 0, `/metrics, stage ${stage}`);
          }
          assert.equal(sampleValue(m, "swactor_requests_running"), 0);
          assert.equal(sampleValue(m, "swactor_kv_budget_positions", { kind: "held" }), 0);
        },
      );

      await t.step("/metrics parses as Prometheus text and counts what was served", async () => {
        const res = await fetch(`${base}/metrics`);
        assert.match(res.headers.get("content-type")!, /^text\/plain; version=0\.0\.4/);
        const m = parsePrometheus(await res.text());
        assert.ok(
          sampleValue(m, "swactor_requests_total", { route: "/v1/completions", status: "200" })! >= 3,
        );
        assert.ok(
          sampleValue(m, "swactor_requests_total", { route: "/v1/completions", status: "400" })! >= 2,
        );
        assert.ok(sampleValue(m, "swactor_generation_tokens_total")! >= 24);
        assert.ok(sampleValue(m, "swactor_time_to_first_token_seconds_count")! >= 3);
        assert.ok(sampleValue(m, "swactor_hop_wire_seconds_count", { hop: "0->1" })! >= 24);
        assert.equal(sampleValue(m, "swactor_members", { state: "alive" }), 2);
        assert.equal(sampleValue(m, "swactor_model_ready"), 1);
      });

      const browser = await chromiumPath();
      await t.step({
        name: `the dashboard in headless Chromium shows the cluster and updates live${
          browser ? "" : " (skipped: chromium is missing and could not be installed)"
        }`,
        ignore: !browser,
        fn: async () => {
          const page = await openPage(browser!, `${base}/`, { width: 1280, height: 900 });
          try {
            await page.waitFor("document.querySelectorAll('#members tr').length === 2", 30_000);
            const members = await page.evaluate<string>("document.getElementById('members').innerText");
            assert.equal((members.match(/alive/g) ?? []).length, 2, members);
            assert.match(members, /leader/);
            assert.match(members, /stage-1/);
            assert.match(members, /\btls\b/, "the data path to the other node (status's DATA)");
            const stages = await page.evaluate<string>("document.getElementById('stages').innerText");
            assert.match(stages, /stage-0/);
            assert.match(stages, /stage-1/);
            assert.equal(await page.evaluate("document.getElementById('ready').textContent"), "ready");
            const before = await page.evaluate<number>("document.querySelectorAll('#recent tr').length");
            // A request made while the page is open shows up without a reload: the feed is live.
            await (await post(base, "/v1/completions", {
              model: "llama3-tiny",
              prompt,
              max_tokens: 16,
              temperature: 0,
            }))
              .json();
            await page.waitFor(`document.querySelectorAll('#recent tr').length > ${before}`, 10_000);
            const newest = await page.evaluate<string>("document.querySelector('#recent tr').innerText");
            assert.match(newest, /completion\s+\d+\s+16\s+length/);
            assert.ok(await page.evaluate<number>("document.querySelectorAll('#chart rect').length") >= 15);
            const shot = Deno.env.get("SWACTOR_DASHBOARD_SCREENSHOT");
            if (shot) await Deno.writeFile(shot, await page.screenshot());
          } finally {
            await page.close();
          }
        },
      });
    } finally {
      const down = await runCli(["down"], { env });
      if (down.code !== 0) up.child.kill("SIGKILL");
      await up.code();
      await Deno.remove(env.SWACTOR_STATE_DIR, { recursive: true }).catch(() => {});
    }
  },
});
