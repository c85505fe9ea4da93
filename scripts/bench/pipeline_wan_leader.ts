// The leading node of scripts/bench/pipeline_wan.ts, run inside node 0's network namespace: it starts a
// node (its dial table from $SWACTOR_DIAL_TABLE, so it reaches the others through the relays), publishes
// the Plan once all members joined, waits for the chain, then runs one generation per "generate" line on
// stdin. Talks JSON lines on stdout: {"ticket","id"}, {"ready": {stages}}, {"result": {...}} per request,
// {"error"} on failure. Not a product command: `up` starts its own local workers, which the bench cannot use.
// The node measures itself like any node; each result carries the cost model's per-token time for it,
// from the members' descriptors and links as they are then (node/stage/plan_chain.ts predictChain).
//   deno run -A scripts/bench/pipeline_wan_leader.ts --listen IP:PORT --model DIR --nodes N --tokens 1,2,3
//     [--weights f32|f16|auto]
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
import type { Plan } from "../../planner/mod.ts";
import { encodeTicket, newSecret } from "../../node/ticket.ts";

const { values } = parseFlags(Deno.args, {
  listen: { type: "string" },
  model: { type: "string" },
  nodes: { type: "string" },
  tokens: { type: "string" },
  wire: { type: "string", default: "f16" },
  experts: { type: "string", default: "local" },
  weights: { type: "string", default: "f32" },
});
if (!values.listen || !values.model || !values.nodes || !values.tokens) {
  console.error("usage: pipeline_wan_leader.ts --listen IP:PORT --model DIR --nodes N --tokens 1,2,3");
  Deno.exit(2);
}
const say = (o: unknown) => console.log(JSON.stringify(o));
const modelDir = resolve(values.model);
const prompt = parseTokenList(values.tokens);
const eos = (await Checkpoint.open(modelDir)).config.eosTokenIds;
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
let code = 0;
try {
  say({ ticket: encodeTicket({ secret, leader: node.transport.self }), id: node.membership.id });
  const assignment = await publishPlan(node, pipeline, {
    modelDir,
    weights: values.weights,
    members: Number(values.nodes),
    timeoutMs: 120_000,
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
      const r = await pipeline.client.generate(chain, prompt, {
        maxTokens: cmd.maxTokens,
        sampling: { temperature: 0, topP: 1, seed: 0 },
        eos,
        wire: values.wire as "f16" | "f32",
      });
      const decode = r.events.slice(1).map((e) => e.timings);
      const plan = assignment.plan as unknown as Plan;
      const inPlan = new Set([
        ...plan.stages.map((s) => s.node),
        ...(plan.expertHosts ?? []).map((h) => h.node),
      ]);
      const members = node.membership.members().filter((m) => inPlan.has(m.id));
      const predicted = predictChain(config, plan, liveMembers(node, members), {
        context: prompt.length + r.tokens.length / 2,
      });
      say({
        result: {
          tokens: r.tokens,
          stopReason: r.stopReason,
          tokS: r.tokS,
          firstTokenMs: r.firstTokenMs,
          mean: meanTimings(decode),
          perToken: decode,
          ...(expertReport(r.events.map((e) => e.trace)) ?? {}),
          fanoutParts: expertReport(r.events.slice(1).map((e) => e.trace))?.parts,
          msPerToken: measuredMsPerToken(r.events),
          predictedMs: predicted.tokenMs,
          predictedStages: predicted.stages.map((s) => ({
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
await pipeline.close().catch(() => {});
await node.leave().catch(() => {});
Deno.exit(code); // iroh's native threads can keep the process alive after the endpoint closes
