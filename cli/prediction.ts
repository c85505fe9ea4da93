// The cost model's per-token time for a request, next to the measured one (`generate --json`:
// "predicted_ms_per_token" and "ms_per_token"): the chain's Plan evaluated on the members' current
// descriptors (node/stage/plan_chain.ts predictChain) at the request's mean context, so a short request is not
// predicted with the 4096-token KV cache the plan was sized for.
import { join } from "node:path";
import { predictChain } from "../node/stage/mod.ts";
import type { LiveMember, Plan } from "../planner/mod.ts";
import { predictSpeculative } from "../planner/speculative.ts";

export interface RequestPrediction {
  /** Predicted ms per decoded token. */
  msPerToken: number;
  /** The context (KV positions) it was evaluated at: the prompt plus half the generated tokens. */
  context: number;
  /** Per stage: predicted compute (incl. its fixed costs), hop and expert fan-out ms. */
  stages: { compute_ms: number; hop_ms: number; fanout_ms: number }[];
}

/** Predicts a request's per-token time, or undefined (with a line on stderr) when it cannot. */
export async function predictRequest(
  modelDir: string,
  plan: Plan,
  members: LiveMember[],
  r: { promptTokens: number; generated: number },
): Promise<RequestPrediction | undefined> {
  try {
    const config = JSON.parse(await Deno.readTextFile(join(modelDir, "config.json")));
    const context = r.promptTokens + r.generated / 2;
    const p = predictChain(config, plan, members, { context });
    return {
      msPerToken: round(p.tokenMs),
      context: Math.round(context),
      stages: p.stages.map((s) => ({
        compute_ms: round(s.computeMs + s.overheadMs),
        hop_ms: round(s.hopMs),
        fanout_ms: round(s.fanoutMs),
      })),
    };
  } catch (e) {
    console.error(`swactor: no prediction for this request: ${(e as Error).message}`);
    return undefined;
  }
}

/** The measured decode time per token: from the second generated token on (the first decode step builds the
 * stages' GPU programs once), ms; undefined with fewer than three tokens. */
export function measuredMsPerToken(events: { atMs: number }[]): number | undefined {
  if (events.length < 3) return undefined;
  return round((events[events.length - 1].atMs - events[1].atMs) / (events.length - 2));
}

/**
 * The cost model's speculative prediction for a request (planner/speculative.ts): the plain per-token time
 * predicted for the chain, the request's measured acceptance, k and depth. Undefined without a prediction or
 * a judged draft.
 */
export function predictSpeculativeRequest(
  plain: RequestPrediction | undefined,
  o: { alpha: number | null; k: number; depth: number },
) {
  if (!plain || o.alpha === null) return undefined;
  const p = predictSpeculative({ tripMs: plain.msPerToken, alpha: o.alpha, k: o.k, depth: o.depth });
  return {
    tokens_per_trip: round(p.tokensPerTrip),
    ms_per_token: round(p.msPerToken),
    speedup: round(p.speedup),
  };
}

const round = (x: number) => Math.round(x * 1000) / 1000;
