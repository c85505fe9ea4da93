// The pipeline's control API: `GET /pipeline` (the Assignment and every stage's report: active requests,
// KV bytes) and `POST /generate` (token ids in, NDJSON out: one line per token, then the outcome; closing
// the connection cancels the request, which every stage then releases). A client reads that stream with
// readGenerateLines. The body is bounded (GENERATE_BODY_LIMIT), checked field by field
// (generate_request.ts), and admitted against the node's KV budget (kv_budget.ts) before anything starts.
import type { Hono } from "hono";
import { bodyLimit } from "hono/body-limit";
import {
  type GenerateOutcome,
  type PipelineNode,
  requestWire,
  type TokenEvent,
  type WireDtype,
} from "../stage/mod.ts";
import { ndjsonLine, readNdjson } from "./ndjson.ts";
import { BadRequestError, parseGenerateRequest } from "./generate_request.ts";
import { KvBudget, planKvTokens } from "./kv_budget.ts";
import type { SpeculationSource } from "../stage/speculative.ts";
import type { SpeculateOutcome } from "../stage/client.ts";

/** One line of `POST /generate`'s body: a line per token, then either the outcome or an error. */
export type GenerateLine =
  | TokenEvent
  | {
    done: Pick<GenerateOutcome, "stopReason" | "firstTokenMs" | "tokS"> & {
      /** The activations between stages the request ran with (absent from older nodes). */
      wire?: GenerateOutcome["wire"];
      stages: number;
      /** A speculative request's figures (docs/SPECULATIVE.md). */
      speculation?: SpeculateOutcome["stats"] & { chosenK: number[] };
      /** Each lost stage the request survived (absent from older nodes). */
      recoveries?: GenerateOutcome["recoveries"];
    };
  }
  | { error: string };

/** Reads `POST /generate`'s body line by line; throws on a line that is none of GenerateLine's kinds. */
export async function* readGenerateLines(body: ReadableStream<Uint8Array>): AsyncGenerator<GenerateLine> {
  for await (const v of readNdjson(body)) {
    const m = v as Record<string, unknown> | null;
    const ok = typeof m === "object" && m !== null &&
      (typeof m.token === "number" || typeof m.done === "object" && m.done !== null ||
        typeof m.error === "string");
    if (!ok) throw new Error(`POST /generate: unexpected line ${JSON.stringify(v).slice(0, 80)}`);
    yield m as GenerateLine;
  }
}

export async function pipelineStatus(p: PipelineNode): Promise<unknown> {
  const a = p.board.current;
  if (!a) return { assignment: null, local: p.local ?? null, stages: [], ready: false };
  const stages = await p.stageReports();
  return {
    assignment: {
      version: a.version,
      leader: a.leader,
      model: a.model,
      layers: a.layers,
      // What requests that name no wire send (`up --wire`).
      wire: requestWire(a),
      plan: a.plan,
    },
    local: p.local ?? null,
    stages,
    // Every stage of the current Plan answers with that version from the Plan's node.
    ready: stages.length > 0 &&
      stages.every((r, i) =>
        !r.error && r.planVersion === a.version && r.node === a.plan.stages[i].node && r.routes !== false
      ),
    replans: p.recovery?.replans ?? [],
  };
}

/** The largest `POST /generate` body read (a 100k-token prompt is about 700 KB of JSON). */
export const GENERATE_BODY_LIMIT = 4 * 2 ** 20;

export interface PipelineRouteOptions {
  /** The KV budget in positions (default: the current Plan's context; see kv_budget.ts). */
  kvTokens?: number;
  /** The node's KV budget, when other routes admit against it too (the OpenAI server does); else one of its own. */
  budget?: KvBudget;
  /** The node's drafters (`up --model DIR --draft ...`), for requests that ask to speculate. */
  speculation?: SpeculationSource;
}

export function pipelineRoutes(
  app: Hono,
  pipeline: () => PipelineNode | undefined,
  opts: PipelineRouteOptions = {},
): void {
  const budget = opts.budget ??
    new KvBudget(() => opts.kvTokens ?? planKvTokens(pipeline()?.board.current?.plan));
  app.get("/pipeline", async (c) => {
    const p = pipeline();
    if (!p) return c.json({ error: "this node runs no pipeline" }, 404);
    return c.json(await pipelineStatus(p));
  });
  const limit = bodyLimit({
    maxSize: GENERATE_BODY_LIMIT,
    onError: (c) => c.json({ error: `the body is larger than ${GENERATE_BODY_LIMIT} bytes` }, 413),
  });
  app.post("/generate", limit, async (c) => {
    const p = pipeline();
    if (!p) return c.json({ error: "this node runs no pipeline" }, 404);
    let body: unknown;
    try {
      body = await c.req.json();
    } catch {
      return c.json({ error: "the body must be JSON" }, 400);
    }
    const vocab = (p.board.current?.plan as { model?: { vocab?: unknown } } | undefined)?.model?.vocab;
    let req;
    try {
      req = parseGenerateRequest(body, { vocab: Number.isInteger(vocab) ? vocab as number : 2 ** 32 });
    } catch (e) {
      if (e instanceof BadRequestError) return c.json({ error: e.message }, 400);
      throw e;
    }
    const src = opts.speculation;
    if (req.speculate !== undefined) {
      if (!src) {
        return c.json(
          { error: "this node has no drafter: start it with `up --model DIR --draft DIR|ngram`" },
          400,
        );
      }
      if (req.draft !== undefined && req.draft !== src.draft) {
        return c.json({ error: `this node drafts with ${src.draft}, not ${req.draft}` }, 400);
      }
    }
    const admission = budget.admit(req.tokens.length + req.maxTokens);
    if (!admission.ok) return c.json({ error: admission.error }, admission.status);
    let chain;
    try {
      chain = await p.waitReady({ timeoutMs: 5000 });
    } catch (e) {
      admission.release();
      return c.json({ error: (e as Error).message }, 503);
    }
    const abort = new AbortController();
    c.req.raw.signal.addEventListener("abort", () => abort.abort(new Error("the client went away")));
    const stream = new ReadableStream<Uint8Array>({
      start: async (ctl) => {
        const line = (v: GenerateLine) => {
          try {
            ctl.enqueue(ndjsonLine(v));
          } catch { /* closed */ }
        };
        try {
          const request = {
            maxTokens: req.maxTokens,
            sampling: req.sampling,
            eos: req.eos,
            wire: req.wire,
            signal: abort.signal,
            onToken: (e: TokenEvent) =>
              line({
                token: e.token,
                index: e.index,
                atMs: e.atMs,
                timings: e.timings,
                trace: e.trace,
                prefill: e.prefill,
              }),
          };
          let out: GenerateOutcome & Partial<SpeculateOutcome>;
          if (req.speculate !== undefined && src) {
            const drafter = src.drafter(req.tokens.length + req.maxTokens + 1);
            try {
              out = await p.client.speculate(chain, req.tokens, {
                ...request,
                drafter,
                k: req.speculate === "auto" ? src.k : req.speculate,
                depth: req.speculateDepth ?? src.depth,
                auto: req.speculate === "auto",
              });
            } finally {
              drafter.close();
            }
          } else out = await p.client.generate(chain, req.tokens, request);
          line({
            done: {
              stopReason: out.stopReason,
              firstTokenMs: out.firstTokenMs,
              tokS: out.tokS,
              wire: out.wire,
              stages: chain.nodes.length,
              ...(out.stats && out.trips
                ? { speculation: { ...out.stats, chosenK: out.trips.map((t) => t.drafted) } }
                : {}),
              ...(out.recoveries?.length ? { recoveries: out.recoveries } : {}),
            },
          });
        } catch (e) {
          line({ error: (e as Error).message });
        } finally {
          admission.release();
        }
        try {
          ctl.close();
        } catch { /* closed */ }
      },
      cancel: () => abort.abort(new Error("the client went away")),
    });
    return new Response(stream, { headers: { "content-type": "application/x-ndjson" } });
  });
  // Teacher-forced logits of `tokens` through the chain (`logits` against a running cluster, e.g. one that
  // `up --cluster` keeps): float32 [T, vocab], little-endian, in the body; the shape in x-swactor-shape.
  app.post("/logits", limit, async (c) => {
    const p = pipeline();
    if (!p) return c.json({ error: "this node runs no pipeline" }, 404);
    let body: { tokens?: unknown; wire?: unknown };
    try {
      body = await c.req.json();
    } catch {
      return c.json({ error: "the body must be JSON" }, 400);
    }
    const vocab = (p.board.current?.plan as { model?: { vocab?: unknown } } | undefined)?.model?.vocab;
    if (!Number.isInteger(vocab)) return c.json({ error: "the chain has no Plan yet" }, 503);
    const V = vocab as number;
    const tokens = body?.tokens;
    if (
      !Array.isArray(tokens) || tokens.length === 0 ||
      !tokens.every((t) => Number.isInteger(t) && t >= 0 && t < V)
    ) {
      return c.json({ error: `tokens must be a non-empty array of token ids in [0, ${V})` }, 400);
    }
    if (body.wire !== undefined && body.wire !== "f16" && body.wire !== "f32") {
      return c.json({ error: `wire must be "f16" or "f32", got ${JSON.stringify(body.wire)}` }, 400);
    }
    const admission = budget.admit(tokens.length);
    if (!admission.ok) return c.json({ error: admission.error }, admission.status);
    try {
      const chain = await p.waitReady({ timeoutMs: 5000 }).catch((e) => {
        throw Object.assign(new Error((e as Error).message), { status: 503 });
      });
      const abort = new AbortController();
      c.req.raw.signal.addEventListener("abort", () => abort.abort(new Error("the client went away")));
      const { logits } = await p.client.logits(chain, tokens as number[], {
        vocab: V,
        wire: body.wire as WireDtype | undefined,
        signal: abort.signal,
      });
      return new Response(logits.slice().buffer as ArrayBuffer, {
        headers: { "content-type": "application/octet-stream", "x-swactor-shape": `${tokens.length},${V}` },
      });
    } catch (e) {
      const status = (e as { status?: number }).status === 503 ? 503 : 500;
      return c.json({ error: (e as Error).message }, status);
    } finally {
      admission.release();
    }
  });
}
