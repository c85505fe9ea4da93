// The leader's HTTP server for people and tools: the OpenAI-compatible API (`POST /v1/chat/completions`,
// `POST /v1/completions`, `GET /v1/models`), the dashboard (`GET /` and its live feed `GET /events`),
// `GET /metrics` (Prometheus text) and `GET /health`. Built by a factory over ServingServices, like the
// control API (node/api/app.ts): `up` serves it over the node's pipeline (services.ts), tests over fakes
// with app.request(). Errors are OpenAI's error bodies (errors.ts); streams are server-sent events in
// OpenAI's chunk format, written with hono's SSE helper.
import { Hono } from "hono";
import { bodyLimit } from "hono/body-limit";
import { streamSSE } from "hono/streaming";
import { Activity } from "./activity.ts";
import { Admission, type AdmissionOptions } from "./admission.ts";
import { admit, type CompletionResult, prepare, runCompletion } from "./completion.ts";
import { DASHBOARD_HTML } from "./dashboard_page.ts";
import { ApiError } from "./errors.ts";
import { type ServingGuard, servingGuard } from "./guard.ts";
import { type CompletionJob, parseChatRequest, parseCompletionRequest } from "./openai_request.ts";
import { PROMETHEUS_CONTENT_TYPE } from "./prometheus.ts";
import type { ServingServices } from "./services.ts";

/** The largest request body read (a long chat history is a few hundred KB of JSON). */
export const SERVING_BODY_LIMIT = 4 * 2 ** 20;

export interface ServingOptions extends ServingGuard, AdmissionOptions {
  /** Largest request body in bytes (default SERVING_BODY_LIMIT); beyond: 413. */
  bodyLimit?: number;
  /** Where requests are recorded (default a new one); tests read it. */
  activity?: Activity;
  /** The dashboard's snapshot interval, ms (default 1000). */
  snapshotMs?: number;
}

export function createServingApp(services: ServingServices, opts: ServingOptions): Hono {
  const activity = opts.activity ?? new Activity();
  const admission = new Admission(services.budget, opts);
  const limit = opts.bodyLimit ?? SERVING_BODY_LIMIT;
  const app = new Hono();

  app.onError((e, c) => {
    const err = e instanceof ApiError ? e : new ApiError(500, `internal error: ${e.message}`);
    if (c.req.path.startsWith("/v1/")) {
      activity.requests.inc({ route: c.req.path, status: err.status });
    }
    return err.response();
  });
  app.notFound((c) => {
    throw new ApiError(404, `Invalid URL (${c.req.method} ${c.req.path.slice(0, 200)})`, {
      code: "unknown_url",
    });
  });
  app.use(servingGuard(opts));

  const model = () => ({
    id: services.model.id,
    object: "model",
    created: services.model.created,
    owned_by: "swactor",
  });
  app.get("/v1/models", (c) => c.json({ object: "list", data: [model()] }));
  app.get("/v1/models/:id{.+}", (c) => {
    const id = c.req.param("id");
    if (id !== services.model.id) {
      throw new ApiError(404, `The model \`${id.slice(0, 200)}\` does not exist`, {
        param: "model",
        code: "model_not_found",
      });
    }
    return c.json(model());
  });

  const readBody = bodyLimit({
    maxSize: limit,
    onError: () => {
      throw new ApiError(413, `the request body is larger than ${limit} bytes`, {
        code: "request_too_large",
      });
    },
  });
  const json = async (req: Request): Promise<unknown> => {
    try {
      return await req.json();
    } catch {
      throw new ApiError(
        400,
        "We could not parse the JSON body of your request. The body must be JSON (Content-Type: application/json).",
        { code: "invalid_json" },
      );
    }
  };

  for (
    const [path, parse] of [
      ["/v1/chat/completions", parseChatRequest],
      ["/v1/completions", parseCompletionRequest],
    ] as const
  ) {
    app.post(path, readBody, async (c) => {
      const job = parse(await json(c.req.raw));
      const p = await prepare(services, job);
      const created = Math.floor(Date.now() / 1000);
      const id = `${job.kind === "chat" ? "chatcmpl" : "cmpl"}-${crypto.randomUUID().replaceAll("-", "")}`;
      const shape = shapes(job, { id, created, model: services.model.id });
      if (!job.stream) {
        const release = await admit(p, admission, c.req.raw.signal);
        const r = await runCompletion(services, p, { release, activity, signal: c.req.raw.signal });
        activity.requests.inc({ route: path, status: 200 });
        return c.json(shape.whole(r));
      }
      // Admitted before the stream starts, so that a refusal (429, 503, 400) is a plain error response.
      const gone = new AbortController();
      c.req.raw.signal.addEventListener("abort", () => gone.abort(new Error("the client went away")));
      const release = await admit(p, admission, gone.signal);
      activity.requests.inc({ route: path, status: 200 });
      return streamSSE(c, async (sse) => {
        sse.onAbort(() => gone.abort(new Error("the client went away")));
        let writing = sse.writeSSE({ data: JSON.stringify(shape.first()) });
        try {
          const r = await runCompletion(services, p, {
            release,
            activity,
            signal: gone.signal,
            onText: (t) => {
              writing = writing.then(() => sse.writeSSE({ data: JSON.stringify(shape.delta(t)) }));
            },
          });
          await writing;
          for (const chunk of shape.last(r)) await sse.writeSSE({ data: JSON.stringify(chunk) });
          await sse.writeSSE({ data: "[DONE]" });
        } catch (e) {
          await writing;
          if (gone.signal.aborted) return;
          const err = e instanceof ApiError
            ? e
            : new ApiError(500, `internal error: ${(e as Error).message}`);
          await sse.writeSSE({ data: JSON.stringify(err.body) });
        }
      });
    });
  }

  app.get("/", (c) => c.html(DASHBOARD_HTML));
  app.get("/health", (c) => {
    const r = services.ready();
    return r.ready
      ? c.json({ ready: true })
      : c.json({ ready: false, why: r.why }, 503, { "retry-after": "5" });
  });

  const snapshot = async () => {
    const cluster = await services.cluster();
    const r = services.ready();
    return {
      model: services.model.id,
      ready: r.ready,
      why: r.ready ? undefined : r.why,
      tokS: activity.tokS(),
      running: admission.running,
      waiting: admission.waiting,
      kv: { held: services.budget.held.tokens, budget: services.budget.tokens() },
      ...cluster,
      recent: activity.recent(),
    };
  };
  app.get("/events", (c) =>
    streamSSE(c, async (sse) => {
      let open = true;
      sse.onAbort(() => {
        open = false;
      });
      while (open) {
        await sse.writeSSE({ event: "snapshot", data: JSON.stringify(await snapshot()) });
        await sse.sleep(opts.snapshotMs ?? 1000);
      }
    }));

  app.get("/metrics", async (c) => {
    const cluster = await services.cluster();
    const g = activity.gauges;
    g.ready.set({}, services.ready().ready ? 1 : 0);
    g.running.set({}, admission.running);
    g.waiting.set({}, admission.waiting);
    g.members.clear();
    for (const state of ["alive", "suspect", "dead", "left"]) {
      g.members.set({ state }, cluster.members.filter((m) => m.state === state).length);
    }
    g.stageActive.clear();
    g.stageKv.clear();
    g.stageWeights.clear();
    g.stageSpare.clear();
    g.stageReused.clear();
    for (const s of cluster.stages) {
      if (s.error) continue;
      const labels = { stage: s.index, node: (s.node ?? "").slice(0, 16) };
      g.stageActive.set(labels, s.active ?? 0);
      g.stageKv.set(labels, s.kvBytes ?? 0);
      g.stageWeights.set(labels, s.weightBytes ?? 0);
      g.stageSpare.set(labels, s.spareBytes ?? 0);
      g.stageReused.set(labels, s.reuses ?? 0);
    }
    g.kvHeld.set({ kind: "held" }, services.budget.held.tokens);
    g.kvHeld.set({ kind: "total" }, services.budget.tokens());
    return c.body(activity.registry.render(), 200, { "content-type": PROMETHEUS_CONTENT_TYPE });
  });
  return app;
}

/** OpenAI's response and chunk shapes for a job (chat.completion / text_completion). */
function shapes(job: CompletionJob, o: { id: string; created: number; model: string }) {
  const head = { id: o.id, created: o.created, model: o.model, system_fingerprint: "swactor" };
  const usage = (r: CompletionResult) => ({
    prompt_tokens: r.promptTokens,
    completion_tokens: r.completionTokens,
    total_tokens: r.promptTokens + r.completionTokens,
    // Extension: speculative decoding's passes through the chain (docs/SPECULATIVE.md).
    ...(r.speculation && { trips: r.speculation.trips, accepted_per_trip: r.speculation.acceptedPerTrip }),
  });
  const withUsage = job.includeUsage ? { usage: null } : {};
  if (job.kind === "chat") {
    const chunk = (delta: Record<string, unknown>, finish: string | null) => ({
      ...head,
      object: "chat.completion.chunk",
      choices: [{ index: 0, delta, logprobs: null, finish_reason: finish }],
      ...withUsage,
    });
    return {
      whole: (r: CompletionResult) => ({
        ...head,
        object: "chat.completion",
        choices: [{
          index: 0,
          message: { role: "assistant", content: r.text, refusal: null },
          logprobs: null,
          finish_reason: r.finish,
        }],
        usage: usage(r),
      }),
      first: () => chunk({ role: "assistant", content: "" }, null),
      delta: (text: string) => chunk({ content: text }, null),
      last: (r: CompletionResult) => [
        chunk({}, r.finish),
        ...(job.includeUsage
          ? [{ ...head, object: "chat.completion.chunk", choices: [], usage: usage(r) }]
          : []),
      ],
    };
  }
  const chunk = (text: string, finish: string | null) => ({
    ...head,
    object: "text_completion",
    choices: [{ index: 0, text, logprobs: null, finish_reason: finish }],
    ...withUsage,
  });
  return {
    whole: (r: CompletionResult) => ({
      ...head,
      object: "text_completion",
      choices: [{ index: 0, text: r.text, logprobs: null, finish_reason: r.finish }],
      usage: usage(r),
    }),
    first: () => chunk("", null),
    delta: (text: string) => chunk(text, null),
    last: (r: CompletionResult) => [
      chunk("", r.finish),
      ...(job.includeUsage ? [{ ...head, object: "text_completion", choices: [], usage: usage(r) }] : []),
    ],
  };
}
