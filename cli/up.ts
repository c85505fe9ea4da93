// `swactor up`: start a node that leads a new cluster, print its ticket, optionally start local workers.
import { encodeTicket, newSecret } from "../node/ticket.ts";
import { clearState, writeState } from "../node/state_file.ts";
import { type Command, numberFlag, parseFlags } from "./command.ts";
import { runNodeProcess } from "./node_process.ts";
import { resolve } from "node:path";
import { attachPipeline } from "./pipeline_node.ts";
import { parseWeights } from "./load_model.ts";
import { type PipelineNode, publishPlan } from "../node/stage/mod.ts";
import { parseRelay, RELAY_HELP } from "./relay_flag.ts";

export const up: Command = {
  name: "up",
  summary: "start a node that leads a cluster and print its ticket",
  usage: `Usage: swactor up [--peers N] [--listen HOST:PORT] [--relay n0|URL|none] [--api HOST:PORT]
                  [--membership lan|wan|local|test] [--model DIR] [--plan FILE] [--weights f32|f16|q8|q4]

Starts a node that leads a new cluster (fresh secret), prints exactly one line "ticket: <TICKET>" on
stdout and keeps running until SIGINT/SIGTERM or \`swactor down\`, then leaves gracefully.
  --peers N            also start N-1 local worker nodes (\`swactor join\`), so one command gives a cluster
  --listen HOST:PORT   where peers reach this node: iroh on UDP HOST:PORT and its TLS data path on TCP
                       HOST:PORT (default 127.0.0.1:0: this machine only; 0.0.0.0:7400 for every
                       interface, see docs/DEPLOY.md for the firewall)
${RELAY_HELP}
  --api HOST:PORT      control API address (default 127.0.0.1:0); recorded with the ticket in the state
                       file ($SWACTOR_STATE_DIR, $XDG_RUNTIME_DIR/swactor or ~/.cache/swactor) for status/down
  --membership NAME    membership timing preset (default lan)
  --model DIR          serve this checkpoint on a chain over the N nodes (layers placed by the planner);
                       \`generate\` on this machine then uses the cluster; \`status\` shows each stage
  --plan FILE          with --model: use this Plan JSON instead of planning (its stage nodes are mapped
                       onto the members in order); without --model it is only shown by \`status\`
  --weights f32|f16|q8|q4  weights on the GPU (default f32; q8 / q4 quantised at load)`,
  async run(argv) {
    const { values } = parseFlags(argv, {
      peers: { type: "string" },
      listen: { type: "string" },
      relay: { type: "string" },
      api: { type: "string" },
      membership: { type: "string" },
      model: { type: "string" },
      plan: { type: "string" },
      weights: { type: "string" },
    });
    const weights = parseWeights(values.weights);
    const relay = parseRelay(values.relay);
    let pipeline: PipelineNode | undefined;
    const peers = numberFlag(values.peers, "peers", { min: 1, max: 64, integer: true, fallback: 1 });
    const plan = values.plan ? JSON.parse(await Deno.readTextFile(values.plan)) : undefined;
    const secret = newSecret();
    const workers: Deno.ChildProcess[] = [];
    return await runNodeProcess({
      secret,
      listen: values.listen,
      relay,
      api: values.api,
      membership: values.membership,
      plan: values.model ? undefined : plan,
      pipeline: () => pipeline,
      async ready(node, api) {
        pipeline = attachPipeline(node);
        node.actors.spawn("leader", { receive: () => {} });
        const ticket = encodeTicket({ secret, leader: node.transport.self, relay: relay.relay });
        await writeState({
          pid: Deno.pid,
          api,
          ticket,
          id: node.membership.id,
          startedAt: new Date().toISOString(),
        });
        console.log(`ticket: ${ticket}`);
        console.error(`api: ${api}`);
        console.error(`id: ${node.membership.id}`);
        const main = new URL("../main.ts", import.meta.url).pathname;
        for (let i = 1; i < peers; i++) {
          const args = ["run", "-A", "--quiet", main, "join", ticket];
          if (values.membership) args.push("--membership", values.membership);
          workers.push(
            new Deno.Command(Deno.execPath(), { args, stdout: "null", stderr: "inherit" }).spawn(),
          );
        }
        if (values.model) {
          const a = await publishPlan(node, pipeline, {
            modelDir: resolve(values.model),
            weights,
            members: peers,
            plan,
          });
          console.error(`swactor: plan v${a.version}: ${a.plan.stages.length} stage(s); loading`);
          const chain = await pipeline.waitReady();
          console.error(
            `swactor: chain ready: ${chain.nodes.length} stage(s) serving ${resolve(values.model)}`,
          );
        }
      },
      async cleanup() {
        await pipeline?.close();
        for (const w of workers) {
          try {
            w.kill("SIGTERM");
          } catch { /* already gone */ }
        }
        await Promise.all(workers.map((w) => w.status));
        await clearState(Deno.pid);
      },
    });
  },
};
