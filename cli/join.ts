// `swactor join TICKET`: join the cluster a ticket names and serve until told to leave.
import { parseTicket, type Ticket } from "../node/ticket.ts";
import { addressFlag, type Command, parseFlags, UsageError } from "./command.ts";
import { apiAddress, runNodeProcess } from "./node_process.ts";
import { attachPipeline } from "./pipeline_node.ts";
import { readStdin } from "./workers.ts";
import type { PipelineNode } from "../node/stage/mod.ts";
import { MEMORY_HELP, memoryFlag } from "./memory_flag.ts";
import { parseRelay, RELAY_HELP } from "./relay_flag.ts";
import { readInputFile } from "./input_file.ts";

export const join: Command = {
  name: "join",
  summary: "join a cluster with a ticket from `up`",
  usage: `Usage: swactor join TICKET | - | --ticket-file FILE [--listen HOST:PORT] [--api HOST:PORT]
                    [--relay n0|URL|none] [--membership lan|wan|local|test] [--model DIR] [--memory SIZE]
                    [--name NAME] [--exit-with-stdin]

Joins the cluster that the ticket names (it carries the cluster secret and the leader's address) and
serves until SIGINT/SIGTERM/SIGHUP or \`swactor down --api ADDR\`, then leaves gracefully.
The ticket holds the cluster's secret, and any user of this machine can read a process's command line:
prefer \`--ticket-file FILE\` (a file only you can read) or \`-\` (the first line of stdin).
  --ticket-file FILE   read the ticket from FILE
  --listen HOST:PORT   where peers reach this node: iroh on UDP HOST:PORT and its TLS data path on TCP
                       HOST:PORT (default 127.0.0.1:0: this machine only; 0.0.0.0:7400 for every interface)
${RELAY_HELP}
                       (default: the relay the ticket names)
  --api HOST:PORT      control API address (default 127.0.0.1:0; printed on stderr as "api: ...");
                       a non-loopback address needs --expose-api
  --membership NAME    membership timing preset (default lan)
  --model DIR          where this machine keeps the checkpoint the cluster's Plan names (default: the
                       leader's path); the node loads the layers of the stage the Plan gives it
  --name NAME          this node's name in its descriptor (default: the host name; \`--cluster\` names
                       each node after the cluster file's node)
  --exit-with-stdin    leave when stdin reaches end of file (how \`up --peers\` and \`--local\` tie the
                       workers they start to their own life)
${MEMORY_HELP}
Exit codes: 0 left cleanly, 1 the leader refused or could not be reached, 2 bad ticket or usage.`,
  async run(argv) {
    const { values, positionals } = parseFlags(argv, {
      "ticket-file": { type: "string" },
      listen: { type: "string" },
      relay: { type: "string" },
      api: { type: "string" },
      "expose-api": { type: "boolean" },
      membership: { type: "string" },
      model: { type: "string" },
      "exit-with-stdin": { type: "boolean" },
      memory: { type: "string" },
      name: { type: "string" },
    }, { allowPositionals: true });
    const given = positionals.length + (values["ticket-file"] === undefined ? 0 : 1);
    if (given !== 1) {
      throw new UsageError("join expects one ticket: TICKET, - (read from stdin) or --ticket-file FILE");
    }
    // The flags first: a ticket read from stdin may be slow to come.
    if (values.listen !== undefined) addressFlag(values.listen, "listen");
    apiAddress(values.api, values["expose-api"] ?? false);
    const fromStdin = positionals[0] === "-";
    const stdin = fromStdin || values["exit-with-stdin"]
      ? readStdin({ watchEnd: values["exit-with-stdin"] })
      : undefined;
    const ticket = readTicket(
      values["ticket-file"] !== undefined
        ? await ticketFile(values["ticket-file"])
        : fromStdin
        ? { text: await stdin!.line, from: "the ticket on stdin" }
        : { text: positionals[0], from: "the ticket" },
    );
    const memoryCap = memoryFlag(values.memory);
    const relay = parseRelay(values.relay, ticket.relay);
    let pipeline: PipelineNode | undefined;
    return await runNodeProcess({
      exitsAfter: true,
      secret: ticket.secret,
      listen: values.listen,
      relay,
      api: values.api,
      exposeApi: values["expose-api"],
      membership: values.membership,
      parentGone: values["exit-with-stdin"] ? stdin!.ended : undefined,
      memoryCap,
      name: values.name,
      async ready(node, api) {
        console.error(`api: ${api.addr}`);
        console.error(`id: ${node.membership.id}`);
        pipeline = attachPipeline(node, { modelDir: values.model, memoryBudget: memoryCap });
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

async function ticketFile(path: string): Promise<{ text: string; from: string }> {
  const text = await readInputFile(path, "--ticket-file");
  const mode = (await Deno.stat(path)).mode;
  if (mode !== null && (mode & 0o077) !== 0) {
    console.error(
      `swactor join: warning: ${path} can be read by other users, and the ticket holds the cluster secret ` +
        `(chmod 600 ${path})`,
    );
  }
  return { text, from: `the ticket in ${path}` };
}

function readTicket(t: { text: string; from: string }): Ticket {
  const text = t.text.trim();
  if (text === "") throw new UsageError(`${t.from} is empty`);
  try {
    return parseTicket(text);
  } catch (e) {
    // parseTicket checks text only: whatever it throws says what is wrong with the ticket.
    throw new UsageError(`${t.from}: ${(e as Error).message}`);
  }
}
