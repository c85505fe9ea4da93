// `swactor join TICKET`: join the cluster a ticket names and serve until told to leave.
import { parseTicket } from "../node/ticket.ts";
import { type Command, parseFlags, UsageError } from "./command.ts";
import { runNodeProcess } from "./node_process.ts";
import { attachPipeline } from "./pipeline_node.ts";
import type { PipelineNode } from "../node/stage/mod.ts";
import { parseRelay, RELAY_HELP } from "./relay_flag.ts";

export const join: Command = {
  name: "join",
  summary: "join a cluster with a ticket from `up`",
  usage: `Usage: swactor join TICKET [--listen HOST:PORT] [--relay n0|URL|none] [--api HOST:PORT]
                    [--membership lan|wan|local|test] [--model DIR]

Joins the cluster that TICKET names (it carries the cluster secret and the leader's address) and serves
until SIGINT/SIGTERM or \`swactor down --api ADDR\`, then leaves gracefully.
  --listen HOST:PORT   where peers reach this node: iroh on UDP HOST:PORT and its TLS data path on TCP
                       HOST:PORT (default 127.0.0.1:0: this machine only; 0.0.0.0:7400 for every interface)
${RELAY_HELP}
                       (default: the relay the ticket names)
  --api HOST:PORT      control API address (default 127.0.0.1:0; printed on stderr as "api: ...")
  --membership NAME    membership timing preset (default lan)
  --model DIR          where this machine keeps the checkpoint the cluster's Plan names (default: the
                       leader's path); the node loads the layers of the stage the Plan gives it
Exit codes: 0 left cleanly, 1 the leader refused or could not be reached, 2 bad ticket or usage.`,
  async run(argv) {
    const { values, positionals } = parseFlags(argv, {
      listen: { type: "string" },
      relay: { type: "string" },
      api: { type: "string" },
      membership: { type: "string" },
      model: { type: "string" },
    }, { allowPositionals: true });
    if (positionals.length !== 1) throw new UsageError("join expects exactly one TICKET argument");
    const ticket = parseTicket(positionals[0]);
    const relay = parseRelay(values.relay, ticket.relay);
    let pipeline: PipelineNode | undefined;
    return await runNodeProcess({
      secret: ticket.secret,
      listen: values.listen,
      relay,
      api: values.api,
      membership: values.membership,
      async ready(node, api) {
        console.error(`api: ${api}`);
        console.error(`id: ${node.membership.id}`);
        pipeline = attachPipeline(node, { modelDir: values.model });
        try {
          const url = ticket.relay?.startsWith("http") ? ticket.relay : undefined;
          await node.join([url ? { ...ticket.leader, relay: url } : ticket.leader]);
        } catch (e) {
          throw new Error(`cannot join the cluster: ${(e as Error).message}`);
        }
        console.error(
          `swactor join: joined ${ticket.leader.id.slice(0, 10)} (${node.membership.numLive()} live)`,
        );
      },
      pipeline: () => pipeline,
      async cleanup() {
        await pipeline?.close();
      },
    });
  },
};
