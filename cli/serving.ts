// `up --model DIR`'s HTTP server for people and tools (node/serving/): the OpenAI-compatible API, the
// dashboard and /metrics, on 127.0.0.1:8080 unless --http says otherwise (or `--http off`). It is bound
// before any node starts, so that a bad or busy address exits 2 with nothing left running, and answers
// 503 with Retry-After until the chain is ready.
import { basename, resolve } from "node:path";
import { loadChatTemplate } from "../models/chat_template.ts";
import type { Checkpoint } from "../models/checkpoint.ts";
import { loadTokenizer } from "../models/tokenizer.ts";
import { type ApiServer, serveApi } from "../node/api/mod.ts";
import type { KvBudget } from "../node/api/kv_budget.ts";
import type { MemberView } from "../node/api/app.ts";
import type { PipelineNode } from "../node/stage/mod.ts";
import { createServingApp, pipelineServing, type ServedModel } from "../node/serving/mod.ts";
import type { ServedSpeculation } from "../node/serving/services.ts";
import { addressFlag, numberFlag, UsageError } from "./command.ts";

export const DEFAULT_HTTP = "127.0.0.1:8080";

export const SERVING_HELP =
  `  --http HOST:PORT|off  with --model: serve the OpenAI-compatible API (/v1/...), the dashboard (/) and
                       /metrics here (default ${DEFAULT_HTTP}; port 0 picks a free one); off: not at all
  --api-key KEY        clients must send "Authorization: Bearer KEY" (also read from $SWACTOR_API_KEY);
                       needed for a non-loopback --http
  --insecure           allow a non-loopback --http without a key
  --parallel N         requests generating at once (default 8); more wait in a queue
  --queue N            requests that may wait (default 64); beyond that: 429`;

export interface ServingFlags {
  http?: string;
  "api-key"?: string;
  insecure?: boolean;
  parallel?: string;
  queue?: string;
}

export interface ServingPlan {
  /** The address to bind, or undefined for `--http off`. */
  addr?: string;
  loopback: boolean;
  apiKey?: string;
  parallel: number;
  queue: number;
  /** Whether the address is the default one (a busy default gets a hint). */
  isDefault: boolean;
}

/** Checks the serving flags (UsageError naming the flag); `model` is whether --model was given. */
export function servingPlan(flags: ServingFlags, model: boolean): ServingPlan {
  const apiKey = flags["api-key"] ?? (Deno.env.get("SWACTOR_API_KEY") || undefined);
  if (!model) {
    for (const f of ["http", "api-key", "insecure", "parallel", "queue"] as const) {
      if (flags[f] !== undefined) {
        throw new UsageError(`--${f} configures the model's HTTP server: it needs --model`);
      }
    }
    return { loopback: true, parallel: 8, queue: 64, isDefault: false };
  }
  if (apiKey !== undefined && apiKey.length < 8) {
    throw new UsageError("--api-key must be at least 8 characters (a key anyone can guess protects nothing)");
  }
  const parallel = numberFlag(flags.parallel, "parallel", { min: 1, max: 1024, integer: true, fallback: 8 });
  const queue = numberFlag(flags.queue, "queue", { min: 0, max: 100_000, integer: true, fallback: 64 });
  if (flags.http === "off") return { loopback: true, apiKey, parallel, queue, isDefault: false };
  const a = addressFlag(flags.http ?? DEFAULT_HTTP, "http", { localhost: true });
  if (!a.loopback && apiKey === undefined && !flags.insecure) {
    throw new UsageError(
      `--http ${a.text} is reachable from other machines, and the server runs generations for anyone who ` +
        `reaches it: give --api-key KEY (or $SWACTOR_API_KEY), or add --insecure to mean it`,
    );
  }
  const addr = a.host === "localhost" ? `127.0.0.1:${a.port}` : a.text;
  return { addr, loopback: a.loopback, apiKey, parallel, queue, isDefault: flags.http === undefined };
}

/** What the served model is: its id (the folder's name), tokenizer, chat template and EOS ids. */
export async function servedModel(dir: string, ckpt: Checkpoint): Promise<ServedModel> {
  const full = resolve(dir);
  return {
    id: basename(full),
    dir: full,
    created: Math.floor(Date.now() / 1000),
    tokenizer: await loadTokenizer(full, ckpt.config),
    chat: await loadChatTemplate(full),
    eos: ckpt.config.eosTokenIds,
    vocab: ckpt.config.vocabSize,
  };
}

/** Binds the server (UsageError when the address cannot be bound); its services read the node lazily. */
export function startServing(
  plan: ServingPlan,
  o: {
    model: ServedModel;
    budget: KvBudget;
    pipeline: () => PipelineNode | undefined;
    readyVersion: () => number | undefined;
    self: () => string;
    members: () => MemberView[];
    /** `up --draft`: requests speculate by default (docs/SPECULATIVE.md). */
    speculation?: ServedSpeculation;
  },
): ApiServer | undefined {
  if (plan.addr === undefined) return undefined;
  const app = createServingApp(pipelineServing(o), {
    apiKey: plan.apiKey,
    loopback: plan.loopback,
    concurrency: plan.parallel,
    queue: plan.queue,
  });
  try {
    return serveApi(app, plan.addr);
  } catch (e) {
    const hint = plan.isDefault
      ? " (the default): pass --http HOST:PORT (port 0 picks a free one) or --http off"
      : "";
    throw new UsageError(`--http ${plan.addr}${hint}: cannot serve there: ${(e as Error).message}`);
  }
}
