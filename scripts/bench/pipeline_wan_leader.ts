// The leading node of scripts/bench/pipeline_wan.ts, run inside node 0's network namespace: it starts a
// node (its dial table from $SWACTOR_DIAL_TABLE, so it reaches the others through the relays), publishes
// the Plan once all members joined, waits for the chain, then runs one generation per "generate" line on
// stdin. Talks JSON lines on stdout: {"ticket","id"}, {"ready": {stages}}, {"result": {...}} per request,
// {"error"} on failure. Not a product command: `up` starts its own local workers, which the bench cannot use.
// The node measures itself like any node; each result carries the cost model's per-token time for it,
// from the members' descriptors and links as they are then (node/stage/plan_chain.ts predictChain).
// A request line may name its own prompt ("tokens") and speculate: {"draft": DIR|"ngram", "noise": P, "k": K}
// runs it as speculative decoding with that drafter in this process, beside stage 0 (the drafters `generate
// --draft` makes: cli/speculate_flags.ts; each loaded once). `--one-stage-each` publishes a Plan with one
// layer per node (the model must have as many layers as there are nodes) instead of planning.
//   deno run -A scripts/bench/pipeline_wan_leader.ts --listen IP:PORT --model DIR --nodes N --tokens 1,2,3
//     [--weights f32|f16|auto] [--wire f16|f32] [--one-stage-each]
import { resolve } from "node:path";
import { parseFlags } from "../../cli/command.ts";
import { dialTableFromEnv } from "../../cli/dial_table.ts";
import { parseTokenList } from "../../cli/load_model.ts";
import { attachPipeline } from "../../cli/pipeline_node.ts";
import { Checkpoint } from "../../models/checkpoint.ts";
import { presets } from "../../node/membership/mod.ts";
import { startNode } from "../../node/node.ts";
import { expertReport, liveMembers, meanTimings, predictChain, publishPlan } from "../../node/stage/mod.ts";
import { measuredMsPerToken } from "../../cli/prediction.ts";
import { type Plan, PLAN_FORMAT_VERSION } from "../../planner/mod.ts";
import { type DrafterSource, drafterSource } from "../../cli/speculate_flags.ts";
import { acceptanceRate } from "../../models/speculative.ts";
import type { GenerateOutcome, SpeculateOutcome } from "../../node/stage/client.ts";
import { encodeTicket, newSecret } from "../../node/ticket.ts";
import { scriptArgs } from "../args.ts";

const { values } = scriptArgs(import.meta.url, (args) =>
  parseFlags(args, {
    listen: { type: "string" },
    model: { type: "string" },
    nodes: { type: "string" },
    tokens: { type: "string" },
    wire: { type: "string", default: "f16" },
    experts: { type: "string", default: "local" },
    weights: { type: "string", default: "f32" },
    "one-stage-each": { type: "boolean" },
  }));
if (!values.listen || !values.model || !values.nodes || !values.tokens) {
  console.error("usage: pipeline_wan_leader.ts --listen IP:PORT --model DIR --nodes N --tokens 1,2,3");
  Deno.exit(2);
}
const say = (o: unknown) => console.log(JSON.stringify(o));
const modelDir = resolve(values.model);
const prompt = parseTokenList(values.tokens);
const ckpt = (await Checkpoint.open(modelDir)).config;
const eos = ckpt.eosTokenIds;
const nodes = Number(values.nodes);
if (values["one-stage-each"] && ckpt.numLayers !== nodes) {
  console.error(`--one-stage-each: the model has ${ckpt.numLayers} layers for ${nodes} nodes`);
  Deno.exit(2);
}
const secret = newSecret();
const node = await startNode({
  secret,
  listen: values.listen,
  membership: presets.lan,
  dialOverrides: await dialTableFromEnv(),
  measure: true,
});
const config = JSON.parse(await Deno.readTextFile(`${modelDir}/config.json`));
const pipeline = attachPipeline(node);
/** Drafter sources by draft and noise, each made once (a draft model is loaded whole into this process). */
const sources = new Map<string, DrafterSource>();
async function drafters(draft: string, noise: number): Promise<DrafterSource> {
  const key = `${draft} ${noise}`;
  if (!sources.has(key)) {
    sources.set(
      key,
      await drafterSource({ draft, k: 4, auto: false, depth: 1, noise }, {
        modelDir,
        vocab: ckpt.vocabSize,
        seed: 7,
        weights: values.weights,
      }),
    );
  }
  return sources.get(key)!;
}
let code = 0;
try {
  say({ ticket: encodeTicket({ secret, leader: node.transport.self }), id: node.membership.id });
  const assignment = await publishPlan(node, pipeline, {
    modelDir,
    weights: values.weights,
    members: nodes,
    timeoutMs: 120_000,
    // Node names are mapped onto the members in order, this node first.
    plan: values["one-stage-each"]
      ? {
        version: PLAN_FORMAT_VERSION,
        stages: Array.from({ length: nodes }, (_, i) => ({
          index: i,
          node: `n${i}`,
          layers: [i, i + 1],
          embeds: i === 0,
          head: i === nodes - 1,
        })),
      }
      : undefined,
    experts: values.experts === "spread" ? "spread" : "local",
  });
  const chain = await pipeline.waitReady();
  say({ ready: { stages: assignment.plan.stages } });
  const lines = Deno.stdin.readable.pipeThrough(new TextDecoderStream());
  let buf = "";
  read: for await (const chunk of lines) {
    buf += chunk;
    let i;
    while ((i = buf.indexOf("\n")) >= 0) {
      const cmd = JSON.parse(buf.slice(0, i));
      buf = buf.slice(i + 1);
      if (cmd.quit) break read;
      const request = {
        maxTokens: cmd.maxTokens,
        sampling: { temperature: 0, topP: 1, seed: 0 },
        eos,
        wire: values.wire as "f16" | "f32",
      };
      const tokens: number[] = cmd.tokens ?? prompt;
      const sp = cmd.speculate as { draft: string; noise?: number; k?: number } | undefined;
      const drafter = sp && (await drafters(sp.draft, sp.noise ?? 0)).make(tokens.length + cmd.maxTokens + 1);
      const r: GenerateOutcome & Partial<SpeculateOutcome> = await (drafter
        ? pipeline.client.speculate(chain, [...tokens], { ...request, drafter, k: sp!.k ?? 4 })
        : pipeline.client.generate(chain, [...tokens], request)).finally(() =>
          drafter?.close()
        );
      const spec = r.stats
        ? { trips: r.stats.trips, acceptance: acceptanceRate(r.stats), cancelled: r.stats.cancelled }
        : {};
      const decode = r.events.slice(1).map((e) => e.timings);
      const plan = assignment.plan as unknown as Plan;
      const inPlan = new Set([
        ...plan.stages.map((s) => s.node),
        ...(plan.expertHosts ?? []).map((h) => h.node),
      ]);
      const members = node.membership.members().filter((m) => inPlan.has(m.id));
      // A Plan given (--one-stage-each) has no model section (dtypes) to predict from: no prediction then.
      const predicted = plan.model
        ? predictChain(config, plan, liveMembers(node, members), {
          context: tokens.length + r.tokens.length / 2,
        })
        : undefined;
      say({
        result: {
          tokens: r.tokens,
          stopReason: r.stopReason,
          ...spec,
          tokS: r.tokS,
          firstTokenMs: r.firstTokenMs,
          mean: meanTimings(decode),
          perToken: decode,
          ...(expertReport(r.events.map((e) => e.trace)) ?? {}),
          fanoutParts: expertReport(r.events.slice(1).map((e) => e.trace))?.parts,
          msPerToken: measuredMsPerToken(r.events),
          predictedMs: predicted?.tokenMs,
          predictedStages: predicted?.stages.map((s) => ({
            computeMs: s.computeMs + s.overheadMs,
            hopMs: s.hopMs,
            fanoutMs: s.fanoutMs,
          })),
        },
      });
    }
  }
} catch (e) {
  say({ error: e instanceof Error ? e.message : String(e) });
  code = 1;
}
for (const s of sources.values()) s.close();
await pipeline.close().catch(() => {});
await node.leave().catch(() => {});
Deno.exit(code); // iroh's native threads can keep the process alive after the endpoint closes
