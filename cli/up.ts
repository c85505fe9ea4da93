// `swactor up`: start a node that leads a new cluster, print its ticket, optionally start local workers.
import { encodeTicket, newSecret } from "../node/ticket.ts";
import { claimState, clearState, statePath, writeState } from "../node/state_file.ts";
import { type Command, numberFlag, parseFlags, UsageError } from "./command.ts";
import { runNodeProcess } from "./node_process.ts";
import { resolve } from "node:path";
import { attachPipeline } from "./pipeline_node.ts";
import { parseKv, parseWeights } from "./load_model.ts";
import { type PipelineNode, publishPlan, requestWire } from "../node/stage/mod.ts";
import { shareMeasurement, shareOneGpu, spawnWorker, stopWorkers, termWorkers } from "./workers.ts";
import { readPlanFile } from "./plan_file.ts";
import { Checkpoint } from "../models/checkpoint.ts";
import { checkWeights } from "../models/model.ts";
import { KvBudget, planKvTokens } from "../node/api/kv_budget.ts";
import { type ApiServer, type MemberView, nodeServices } from "../node/api/mod.ts";
import { servedModel, SERVING_HELP, servingPlan, startServing } from "./serving.ts";
import type { SpeculationSource } from "../node/stage/speculative.ts";
import {
  type DrafterSource,
  drafterSource,
  draftName,
  MTP_ONE_NODE,
  SPECULATE_FLAGS,
  SPECULATE_UP_HELP,
  speculateFlags,
} from "./speculate_flags.ts";
import { MEMORY_HELP, memoryFlag } from "./memory_flag.ts";
import { parseRelay, RELAY_HELP } from "./relay_flag.ts";
import { readStdin } from "./workers.ts";
import { clusterFlags, clusterHelp, upCluster } from "./cluster_cli.ts";
import { labPlanOnMembers } from "./cluster_run.ts";
import { WIRE_UP_HELP, wireFlag } from "./wire_flag.ts";

export const up: Command = {
  name: "up",
  summary: "start a node that leads a cluster and print its ticket",
  usage: `Usage: swactor up [--peers N] [--listen HOST:PORT] [--relay n0|URL|none] [--api HOST:PORT]
                  [--membership lan|wan|local|test]
                  [--model DIR] [--members N] [--plan FILE] [--weights auto|f32|f16|q8|q4]
                  [--kv auto|f32|f16|q8] [--wire f16|f32] [--memory SIZE] [--http HOST:PORT|off]
                  [--api-key KEY] [--insecure] [--parallel N] [--queue N]
       swactor up --cluster FILE --model DIR [--emulate-wan] [--memory-scale F] [--weights W] [--kv K]
                  [--wire W]

Starts a node that leads a new cluster (fresh secret), prints exactly one line "ticket: <TICKET>" on
stdout and keeps running until SIGINT/SIGTERM/SIGHUP or \`swactor down\`, then leaves gracefully.
  --peers N            also start N-1 local worker nodes (\`swactor join\`; they get the ticket on a pipe,
                       not on their command line, and leave when this process ends, however it ends)
  --listen HOST:PORT   where peers reach this node: iroh on UDP HOST:PORT and its TLS data path on TCP
                       HOST:PORT (default 127.0.0.1:0: this machine only; 0.0.0.0:7400 for every
                       interface, see docs/DEPLOY.md for the firewall)
${RELAY_HELP}
  --api HOST:PORT      control API address (default 127.0.0.1:0); recorded with the ticket in the state
                       file ($SWACTOR_STATE_DIR, $XDG_RUNTIME_DIR/swactor or ~/.cache/swactor) for status/down;
                       a non-loopback address needs --expose-api
  --membership NAME    membership timing preset (default lan)
  --model DIR          serve this checkpoint on a chain over the N nodes (layers placed by the planner);
                       \`generate\` on this machine then uses the cluster; \`status\` shows each stage;
                       the layers are split by what the nodes measured (docs/PLANNER.md, "Live clusters")
  --members N          with --model: plan once N nodes are in the cluster, this one and the --peers workers
                       included, the others joining with the ticket (default: --peers)
  --plan FILE          with --model: use this Plan JSON instead of planning (its stage nodes are mapped
                       onto the members in order); without --model it is only shown by \`status\`
  --weights auto|f32|f16|q8|q4  weights on the GPU (default auto: f16 where the GPU has shader-f16, else
                       f32; q8 / q4 quantised at load)
  --kv auto|f32|f16|q8 with --model: the KV cache every stage holds (default auto: f16 beside f16 / q8 / q4
                       weights where the GPU has shader-f16, else f32); q8 (int8 rows with a scale each)
                       about halves f16's bytes, and the planner counts it so: longer contexts on the
                       same nodes (GQA layers; MLA's keep f16; docs/KERNELS.md "The 8-bit KV cache")
${WIRE_UP_HELP}
${SERVING_HELP}
${SPECULATE_UP_HELP}
${MEMORY_HELP}
  --name NAME          this node's name in its descriptor (default: the host name)
${clusterHelp(23)}`,
  async run(argv) {
    const { values } = parseFlags(argv, {
      peers: { type: "string" },
      listen: { type: "string" },
      relay: { type: "string" },
      api: { type: "string" },
      "expose-api": { type: "boolean" },
      membership: { type: "string" },
      model: { type: "string" },
      plan: { type: "string" },
      weights: { type: "string" },
      kv: { type: "string" },
      wire: { type: "string" },
      http: { type: "string" },
      "api-key": { type: "string" },
      insecure: { type: "boolean" },
      parallel: { type: "string" },
      queue: { type: "string" },
      members: { type: "string" },
      memory: { type: "string" },
      name: { type: "string" },
      "exit-with-stdin": { type: "boolean" },
      ...SPECULATE_FLAGS,
      ...clusterFlags,
    });
    const wire = wireFlag(values.wire);
    if (wire !== undefined && values.model === undefined) {
      throw new UsageError(
        "--wire sets the activations of the chain that `up --model DIR` serves: it needs --model",
      );
    }
    const kv = parseKv(values.kv);
    if (values.kv !== undefined && values.model === undefined) {
      throw new UsageError(
        "--kv sets the KV cache of the chain that `up --model DIR` serves: it needs --model",
      );
    }
    if (values.cluster !== undefined) return await upCluster(values, wire);
    if (values["emulate-wan"]) throw new UsageError("--emulate-wan needs --cluster FILE");
    if (values["cluster-plan"] !== undefined && !values.model) {
      throw new UsageError("--cluster-plan needs --model");
    }
    const spec = speculateFlags(values);
    if (spec && values.model === undefined) {
      throw new UsageError("--draft speculates for the chain of `up --model DIR`: it needs --model");
    }
    if (spec?.draft === "mtp") throw new UsageError(MTP_ONE_NODE);
    const weights = parseWeights(values.weights);
    const relay = parseRelay(values.relay);
    let pipeline: PipelineNode | undefined;
    const peers = numberFlag(values.peers, "peers", { min: 1, max: 64, integer: true, fallback: 1 });
    if (peers > 1) shareOneGpu();
    const serving = servingPlan(values, values.model !== undefined);
    // The checkpoint is checked before any node starts (its weights against config.json too): a bad one
    // exits 2 with nothing left running.
    const ckpt = values.model === undefined ? undefined : await Checkpoint.open(resolve(values.model));
    if (ckpt) checkWeights(ckpt);
    const served = ckpt && serving.addr !== undefined ? await servedModel(values.model!, ckpt) : undefined;
    const plan = values.plan === undefined ? undefined : await readPlanFile(values.plan, {
      modelDir: values.model,
      nodes: values.model ? peers : undefined,
    });
    // One cluster per state folder: a second `up` would hide the first from status and down.
    const running = await claimState(Deno.pid, (stale) =>
      console.error(
        `swactor up: removed the stale state of an \`up\` that is gone (pid ${stale.pid}, since ${stale.startedAt})`,
      ));
    if (running) {
      throw new UsageError(
        `a cluster already runs on this machine: \`up\` pid ${running.pid}, control API ${
          running.api ?? "(starting)"
        }, since ${running.startedAt} (state in ${statePath()}). Stop it with \`swactor down\`, or ` +
          `give this one a state folder of its own with SWACTOR_STATE_DIR`,
      );
    }
    const members = numberFlag(values.members, "members", {
      min: 1,
      max: 1024,
      integer: true,
      fallback: peers,
    });
    if (values.members !== undefined && !values.model) throw new UsageError("--members needs --model");
    if (members < peers) throw new UsageError(`--members ${members} is fewer than --peers ${peers}`);
    const memoryCap = memoryFlag(values.memory);
    const secret = newSecret();
    const workers: Deno.ChildProcess[] = [];
    let measurement: Awaited<ReturnType<typeof shareMeasurement>> | undefined;
    // One KV budget for the node: the control API's POST /generate and the OpenAI server admit against it.
    const budget = new KvBudget(() => planKvTokens(pipeline?.board.current?.plan));
    let readyVersion: number | undefined;
    let view: { self(): string; members(): MemberView[] } | undefined;
    let http: ApiServer | undefined;
    let drafts: DrafterSource | undefined;
    try {
      // The drafter runs here, on the node that serves the requests (it originates them on the chain).
      drafts = spec && ckpt &&
        await drafterSource(spec, {
          modelDir: resolve(values.model!),
          vocab: ckpt.config.vocabSize,
          seed: 0x5eed,
          weights,
        });
      const speculation: SpeculationSource | undefined = spec && drafts
        ? {
          drafter: drafts.make,
          draft: draftName(spec.draft),
          k: spec.k,
          depth: spec.depth,
          auto: spec.auto,
        }
        : undefined;
      // Bound before any node starts: a bad or busy --http exits 2 with nothing left running.
      http = served && startServing(serving, {
        model: served,
        budget,
        pipeline: () => pipeline,
        readyVersion: () => readyVersion,
        self: () => view?.self() ?? "",
        members: () => view?.members() ?? [],
        speculation,
      });
      return await runNodeProcess({
        exitsAfter: true,
        secret,
        listen: values.listen,
        relay,
        api: values.api,
        exposeApi: values["expose-api"],
        membership: values.membership,
        memoryCap,
        name: values.name,
        parentGone: values["exit-with-stdin"] ? readStdin({ watchEnd: true }).ended : undefined,
        plan: values.model ? undefined : plan,
        pipeline: () => pipeline,
        budget,
        speculation,
        async ready(node, api, signal) {
          pipeline = attachPipeline(node, { memoryBudget: memoryCap });
          view = nodeServices(node, { down: () => {}, pipeline: () => pipeline });
          node.actors.spawn("leader", { receive: () => {} });
          const ticket = encodeTicket({ secret, leader: node.transport.self, relay: relay.relay });
          await writeState({
            pid: Deno.pid,
            api: api.addr,
            token: api.token,
            ticket,
            id: node.membership.id,
            startedAt: new Date().toISOString(),
          });
          console.log(`ticket: ${ticket}`);
          console.error(`api: ${api.addr}`);
          console.error(`id: ${node.membership.id}`);
          if (http) console.error(`http: http://${http.addr} (OpenAI API at /v1, dashboard at /, /metrics)`);
          const args = values.membership ? ["--membership", values.membership] : [];
          // The workers run on this GPU too: they take this node's measurement rather than make their own.
          if (peers > 1) measurement = await shareMeasurement(node.measured);
          for (let i = 1; i < peers; i++) {
            workers.push(spawnWorker(ticket, { args, stderr: "inherit", env: measurement?.env }));
          }
          // Taking the cluster down: the workers start their leave with this node's, not after it.
          signal.addEventListener("abort", () => termWorkers(workers), { once: true });
          if (values.model) {
            // --cluster-plan: the lab's regional plan over the nodes the file declares (cli/cluster_run.ts).
            const labPlan = values["cluster-plan"] === undefined ? undefined : await labPlanOnMembers(node, {
              file: values["cluster-plan"],
              modelDir: resolve(values.model),
              weights,
              kv,
              memoryScale: values["memory-scale"] === undefined ? undefined : Number(values["memory-scale"]),
              context: values.context === undefined ? undefined : Number(values.context),
              signal,
            });
            const a = await publishPlan(node, pipeline, {
              modelDir: resolve(values.model),
              weights,
              kv,
              wire,
              members,
              // Nodes beyond --peers join by hand: give them time.
              timeoutMs: members > peers ? 600_000 : undefined,
              plan: labPlan as unknown as typeof plan ?? plan,
              signal,
            });
            console.error(`swactor: plan v${a.version}: ${a.plan.stages.length} stage(s); loading`);
            const chain = await pipeline.waitReady({ signal });
            readyVersion = chain.version;
            console.error(
              `swactor: chain ready: ${chain.nodes.length} stage(s) serving ${resolve(values.model)} ` +
                `(activations ${requestWire(chain)} between stages)`,
            );
          }
        },
        async cleanup() {
          await http?.close();
          await pipeline?.close();
          await stopWorkers(workers);
          await measurement?.close();
        },
      });
    } finally {
      await http?.close();
      drafts?.close();
      await clearState(Deno.pid);
    }
  },
};
