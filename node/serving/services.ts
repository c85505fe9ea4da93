// What the OpenAI server needs from the node, as an interface (tests pass fakes), and its implementation
// over the node's pipeline: requests run on the chain of the current Plan through the pipeline's client
// (PipelineClient.generate), the same path as the control API's POST /generate and the CLI's `generate`
// on a running cluster. A cluster of one node is a chain of one stage, which runs the engine's
// GPU-resident decode loop: one code path with or without peers.
import type { ChatTemplate } from "../../models/chat_template.ts";
import type { TextTokenizer } from "../../models/tokenizer.ts";
import type { MemberView } from "../api/app.ts";
import type { KvBudget } from "../api/kv_budget.ts";
import type { GenerateOutcome, PipelineNode, RequestOptions, StageReport } from "../stage/mod.ts";
import { ApiError } from "./errors.ts";
import type { SpeculationSource } from "../stage/speculative.ts";

/** Speculative decoding on the server (`up --model DIR --draft ...`): the drafter runs on this node. */
export type ServedSpeculation = SpeculationSource;

/** What a request asks of speculation: undefined, the server's default; 0, off; K, K drafts per chunk. */
export interface SpeculateRequest {
  speculate?: number;
}

/** The model the server offers. */
export interface ServedModel {
  /** The id clients name in `model`: the checkpoint folder's name. */
  id: string;
  /** The checkpoint folder (also accepted as `model`). */
  dir: string;
  /** Unix seconds when the server started offering it. */
  created: number;
  /** null: the checkpoint has no tokenizer (prompts are then token ids, and the answers' text is empty). */
  tokenizer: TextTokenizer | null;
  /** null: the checkpoint has no chat template (chat requests get a 400). */
  chat: ChatTemplate | null;
  /** Token ids that end any generation (config.json's eos_token_id). */
  eos: number[];
  vocab: number;
}

/** The cluster as the dashboard and /metrics show it. */
export interface ClusterView {
  self: string;
  members: MemberView[];
  plan: unknown;
  /** Each stage's report (active requests, KV bytes, ...), or [] with no Plan. */
  stages: StageReport[];
}

export interface ServingServices {
  model: ServedModel;
  /** Whether the chain serves the model now; else why not (requests get 503 with Retry-After). */
  ready(): { ready: true } | { ready: false; why: string };
  /** Runs one generation on the chain; rejects with the signal's reason when aborted. */
  generate(prompt: number[], opts: RequestOptions & SpeculateRequest): Promise<GenerateOutcome>;
  /** The KV budget requests are admitted against (the node's, shared with POST /generate). */
  budget: KvBudget;
  cluster(): Promise<ClusterView>;
}

/**
 * The services over a running node: `pipeline` is the node's PipelineNode, `readyVersion` the Plan version
 * whose chain `up` saw ready (undefined while the first one loads), `members` and `self` what /status shows.
 * When a newer Plan replaces that chain, the server checks the new chain itself (PipelineNode.waitReady) and
 * serves again once it is ready.
 */
export function pipelineServing(o: {
  model: ServedModel;
  pipeline: () => PipelineNode | undefined;
  readyVersion: () => number | undefined;
  budget: KvBudget;
  self: () => string;
  members: () => MemberView[];
  speculation?: ServedSpeculation;
}): ServingServices {
  let verified: number | undefined;
  let checking: number | undefined;
  const chain = () => {
    const p = o.pipeline();
    const c = p?.chain();
    if (!p || !c) return undefined;
    const first = o.readyVersion();
    if (first === undefined) return undefined;
    if (c.version === first || c.version === verified) return { p, c };
    if (checking !== c.version) {
      checking = c.version;
      p.waitReady({ timeoutMs: 600_000 }).then(
        (ready) => (verified = ready.version),
        () => (checking = undefined), // checked again at the next request
      );
    }
    return undefined;
  };
  return {
    model: o.model,
    budget: o.budget,
    ready() {
      if (chain()) return { ready: true };
      const v = o.pipeline()?.chain()?.version;
      return {
        ready: false,
        why: v === undefined || o.readyVersion() === undefined
          ? "the model is loading"
          : `the chain is changing (plan v${v}) and loading`,
      };
    },
    generate(prompt, opts) {
      const r = chain();
      if (!r) return Promise.reject(new ApiError(503, "the model is loading", { retryAfterS: 5 }));
      const sp = o.speculation;
      const k = opts.speculate ?? sp?.k ?? 0;
      if (k === 0) return r.p.client.generate(r.c, prompt, opts);
      if (!sp) {
        return Promise.reject(
          new ApiError(400, "this server has no drafter: start it with `up --model DIR --draft DIR|ngram`", {
            code: "speculate_unavailable",
          }),
        );
      }
      const drafter = sp.drafter(prompt.length + (opts.maxTokens ?? 64) + 1);
      const auto = opts.speculate === undefined && sp.auto;
      return r.p.client.speculate(r.c, prompt, { ...opts, drafter, k, depth: sp.depth, auto })
        .finally(() => drafter.close());
    },
    async cluster() {
      const p = o.pipeline();
      return {
        self: o.self(),
        members: o.members(),
        plan: p?.board.current?.plan ?? null,
        stages: p ? await p.stageReports({ timeoutMs: 2000 }) : [],
      };
    },
  };
}
