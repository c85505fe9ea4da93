// The pipeline's control API: `GET /pipeline` (the Assignment and every stage's report: active requests,
// KV bytes) and `POST /generate` (token ids in, NDJSON out: one line per token, then the outcome; closing
// the connection cancels the request, which every stage then releases). A client reads that stream with
// readGenerateLines.
import type { Hono } from "hono";
import type { GenerateOutcome, PipelineNode, TokenEvent } from "../stage/mod.ts";
import { ndjsonLine, readNdjson } from "./ndjson.ts";

/** One line of `POST /generate`'s body: a line per token, then either the outcome or an error. */
export type GenerateLine =
  | TokenEvent
  | { done: Pick<GenerateOutcome, "stopReason" | "firstTokenMs" | "tokS"> & { stages: number } }
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
  if (!a) return { assignment: null, local: p.local ?? null, stages: [] };
  return {
    assignment: { version: a.version, leader: a.leader, model: a.model, layers: a.layers, plan: a.plan },
    local: p.local ?? null,
    stages: await p.stageReports(),
  };
}

export function pipelineRoutes(app: Hono, pipeline: () => PipelineNode | undefined): void {
  app.get("/pipeline", async (c) => {
    const p = pipeline();
    if (!p) return c.json({ error: "this node runs no pipeline" }, 404);
    return c.json(await pipelineStatus(p));
  });
  app.post("/generate", async (c) => {
    const p = pipeline();
    if (!p) return c.json({ error: "this node runs no pipeline" }, 404);
    let req: Record<string, unknown>;
    try {
      req = await c.req.json();
    } catch {
      return c.json({ error: "the body must be JSON" }, 400);
    }
    const tokens = req.tokens;
    if (
      !Array.isArray(tokens) || tokens.length === 0 || !tokens.every((t) => Number.isInteger(t) && t >= 0)
    ) {
      return c.json({ error: "tokens must be a non-empty array of token ids" }, 400);
    }
    let chain;
    try {
      chain = await p.waitReady({ timeoutMs: 5000 });
    } catch (e) {
      return c.json({ error: (e as Error).message }, 503);
    }
    const abort = new AbortController();
    c.req.raw.signal.addEventListener("abort", () => abort.abort(new Error("the client went away")));
    const body = new ReadableStream<Uint8Array>({
      start: async (ctl) => {
        const line = (v: GenerateLine) => {
          try {
            ctl.enqueue(ndjsonLine(v));
          } catch { /* closed */ }
        };
        try {
          const out = await p.client.generate(chain, tokens as number[], {
            maxTokens: Number(req.maxTokens ?? 64),
            sampling: req.sampling as never,
            eos: req.eos as number[] | undefined,
            wire: req.wire === "f32" ? "f32" : "f16",
            signal: abort.signal,
            onToken: (e) =>
              line({
                token: e.token,
                index: e.index,
                atMs: e.atMs,
                timings: e.timings,
                trace: e.trace,
                prefill: e.prefill,
              }),
          });
          line({
            done: {
              stopReason: out.stopReason,
              firstTokenMs: out.firstTokenMs,
              tokS: out.tokS,
              stages: chain.nodes.length,
            },
          });
        } catch (e) {
          line({ error: (e as Error).message });
        }
        try {
          ctl.close();
        } catch { /* closed */ }
      },
      cancel: () => abort.abort(new Error("the client went away")),
    });
    return new Response(body, { headers: { "content-type": "application/x-ndjson" } });
  });
}
