// The speculative decoding flags of `generate` (docs/SPECULATIVE.md): --draft DIR|ngram|mtp, --speculate K,
// --speculate-depth D, --draft-noise P; and the drafter they make on this (the originating) node.
import { resolve } from "node:path";
import { numberFlag, UsageError } from "./command.ts";
import { type Engine, loadEngine } from "../models/engine.ts";
import { CheckpointError, RequestError } from "../models/errors.ts";
import { type Drafter, ModelDrafter, NgramDrafter, NoisyDrafter } from "../models/speculative.ts";
import { loadMtp, MtpDrafter } from "../models/mtp.ts";

export const SPECULATE_HELP =
  `  --draft DIR|ngram|mtp speculative decoding: a draft model (any supported family, whole on this node,
                        with the target's vocabulary; the target's own folder works), prompt lookup
                        (ngram: continues the latest earlier match of the last tokens; no model) or the
                        target's own multi-token-prediction module (mtp: DeepSeek-V3 checkpoints with
                        num_nextn_predict_layers; one node only). --json then adds trips (passes through
                        the chain) and accepted_per_trip
  --speculate K|auto    tokens drafted per verification step (default 4 with --draft; 1 to 16); auto:
                        chosen for each step from the acceptance, trip time, drafting
                        and verification costs measured so far (docs/SPECULATIVE.md)
  --speculate-depth D   verification steps in flight at once on a chain (default 1; pipelined
                        speculation: the next step is drafted assuming the current one is kept); with
                        --speculate auto, the most that may be chosen
  --draft-noise P       (tests, benchmarks) replace each drafted token with another with probability P`;

export const SPECULATE_UP_HELP =
  `  --draft DIR|ngram    with --model: speculative decoding; the drafter (a draft model with the target's
                       vocabulary, or prompt lookup) runs on this node (mtp needs one node: generate);
                       the OpenAI API's requests speculate unless they send "speculate": 0 (or
                       "speculate": K for K drafts), and \`generate --draft\` on this machine drafts with it
  --speculate K|auto   tokens drafted per verification step (default 4; 1 to 16; auto: chosen per step
                       from what the request measured)
  --speculate-depth D  verification steps in flight at once (default 1; with auto, the most)
  --draft-noise P      (benchmarks) replace each drafted token with another with probability P`;

/** The parsed flags; undefined when speculation is off. */
export interface SpeculateFlags {
  draft: string;
  /** Drafts per chunk (with `auto`, the first chunk's). */
  k: number;
  /** --speculate auto: k and depth chosen per chunk from measurements. */
  auto: boolean;
  depth: number;
  noise: number;
}

export const SPECULATE_FLAGS = {
  draft: { type: "string" },
  speculate: { type: "string" },
  "speculate-depth": { type: "string" },
  "draft-noise": { type: "string" },
} as const;

export function speculateFlags(values: Record<string, unknown>): SpeculateFlags | undefined {
  const draft = values.draft as string | undefined;
  const k = values.speculate as string | undefined;
  const depth = values["speculate-depth"] as string | undefined;
  const noise = values["draft-noise"] as string | undefined;
  if (draft === undefined) {
    const stray = k !== undefined
      ? "--speculate"
      : depth !== undefined
      ? "--speculate-depth"
      : noise !== undefined
      ? "--draft-noise"
      : undefined;
    if (stray) throw new UsageError(`${stray} needs --draft DIR|ngram|mtp`);
    return undefined;
  }
  if (draft === "") throw new UsageError("--draft expects a checkpoint folder, ngram or mtp");
  return {
    draft,
    k: k === "auto" ? 4 : numberFlag(k, "speculate", { min: 1, max: 16, integer: true, fallback: 4 }),
    auto: k === "auto",
    depth: numberFlag(depth, "speculate-depth", { min: 1, max: 16, integer: true, fallback: 1 }),
    noise: numberFlag(noise, "draft-noise", { min: 0, max: 1, fallback: 0 }),
  };
}

/** What --draft names, as nodes compare it: "ngram", "mtp", or the folder's absolute path. */
export function draftName(draft: string): string {
  return draft === "ngram" || draft === "mtp" ? draft : resolve(draft);
}

/**
 * Why `--draft mtp` runs on one node: the module reads the target's last hidden states, which a chain holds
 * on its last stage, away from the drafter beside stage 0 (docs/SPECULATIVE.md).
 */
export const MTP_ONE_NODE = "--draft mtp drafts with the target's own multi-token-prediction module, which " +
  "reads the target's hidden states where they are computed: it runs on one node only for now (generate " +
  "--model DIR without --local, --cluster, or a running `up`); use --draft DIR or ngram on a chain";

/** Drafters for many requests: one draft model loaded once (or none for ngram); close() frees it. */
export interface DrafterSource {
  make(maxSeq: number): Drafter;
  close(): void;
}

/**
 * Prepares this node's drafters. A draft folder equal to the target's reuses `target` when it is loaded
 * here (one node); otherwise the draft model is loaded (whole) onto this process's GPU. An unreadable
 * folder or another vocabulary than the target's is a UsageError naming --draft.
 */
export async function drafterSource(
  f: SpeculateFlags,
  o: { modelDir: string; vocab: number; seed: number; target?: Engine; weights?: string },
): Promise<DrafterSource> {
  const noisy = (d: Drafter) =>
    f.noise > 0 ? new NoisyDrafter(d, f.noise, { vocab: o.vocab, seed: o.seed }) : d;
  if (f.draft === "ngram") return { make: () => noisy(new NgramDrafter()), close() {} };
  if (f.draft === "mtp") {
    const target = o.target;
    if (!target) throw new UsageError(MTP_ONE_NODE);
    const module = await loadMtp(target, o.modelDir).catch((e) => {
      if (e instanceof CheckpointError || e instanceof RequestError) {
        throw new UsageError(`--draft mtp: ${e.message}`);
      }
      throw e;
    });
    return {
      make: (maxSeq) => noisy(new MtpDrafter(target, module, { maxSeq })),
      close: () => module.destroy(),
    };
  }
  let engine = o.target;
  if (!engine || resolve(f.draft) !== resolve(o.modelDir)) {
    try {
      engine = await loadEngine(f.draft, {
        weights: o.weights === undefined || o.weights === "auto" ? undefined : o.weights as "f32",
      });
    } catch (e) {
      if (e instanceof CheckpointError || e instanceof RequestError) {
        throw new UsageError(`--draft ${f.draft}: ${e.message}`);
      }
      throw e;
    }
  }
  const owned = engine !== o.target ? engine : undefined;
  const draft = engine;
  if (draft.model.vocab !== o.vocab || !draft.role.embeds || !draft.role.head) {
    owned?.close();
    throw new UsageError(
      `--draft ${f.draft}: its vocabulary has ${draft.model.vocab} tokens, the target's ${o.vocab}: a draft ` +
        `model must share the target's vocabulary`,
    );
  }
  return {
    make: (maxSeq) =>
      noisy(new ModelDrafter(draft, { maxSeq: Math.min(maxSeq, draft.model.maxPositions), vocab: o.vocab })),
    close: () => owned?.close(),
  };
}

/** One drafter for one request (its source freed with it). */
export async function makeDrafter(
  f: SpeculateFlags,
  o: { modelDir: string; vocab: number; maxSeq: number; seed: number; target?: Engine; weights?: string },
): Promise<Drafter> {
  const source = await drafterSource(f, o);
  const d = source.make(o.maxSeq);
  const close = d.close.bind(d);
  d.close = () => {
    close();
    source.close();
  };
  return d;
}
