// `--cluster FILE [--emulate-wan]` (generate, up): one real node process per node of a cluster file on this
// machine. Every node is a child process: the first node of the file leads (`up --cluster-plan FILE`: it
// waits for the others, plans with the lab's regional planner from the nodes the file declares, matched to
// the members by name, and publishes the Plan), the others join by ticket (`join -`). Each enforces its
// declared memory as its budget (`--memory`: the planner's and the loader's limit) and, when the file
// declares it slower than the fastest node, runs slowed to match (SWACTOR_SLOWDOWN = the fastest node's
// memory bandwidth over its own: every GPU wait of a step is stretched by that factor, kernels/gpu.ts).
// With --emulate-wan every node runs in a network namespace of its own and reaches the others only through
// the WAN emulation's relays (scripts/wan/), one relay pair per pair of nodes carrying the file's one-way
// latency and rate cap between them (`partition` cuts a node off there and heals it). The caller talks to the
// leader's control API. close() stops the nodes, the relays and the namespaces; namespaces left by an earlier
// run that died are deleted at start.
import { basename, join, resolve } from "node:path";
import type { ApiTarget } from "../node/api/mod.ts";
import { DIAL_TABLE_ENV } from "./dial_table.ts";
import { collect } from "./local_cluster.ts";
import { UsageError } from "./command.ts";
import { type LabCluster, labLink, planRegional, readLabCluster } from "./cluster_plan.ts";
import { PlacementError, type Plan } from "../planner/mod.ts";
import type { Membership } from "../node/membership/mod.ts";
import type { WireDtype } from "../node/stage/mod.ts";
import { createNetns, type NetnsSet } from "../scripts/wan/netns.ts";
import { startTopology, type Topology } from "../scripts/wan/topology.ts";
import { isWorkerWarning, shareOneGpu, stopWorkers } from "./workers.ts";
import { selfCommand } from "./self.ts";
import { draftName, type SpeculateFlags } from "./speculate_flags.ts";

/** Name prefix of the lab's namespaces: `swlab-{pid}s{set}-{node}`. */
export const LAB_NETNS_PREFIX = "swlab";

export interface ClusterRunOptions {
  /** The cluster file, as given (the leader reads it again). */
  file: string;
  lab: LabCluster;
  modelDir: string;
  weights: string;
  /** The KV cache's element type (`up --kv`; "auto": each node's default). */
  kv: string;
  /** The chain's activations between stages (`up --wire`; default f16). */
  wire?: WireDtype;
  emulateWan: boolean;
  /** --memory-scale, passed on to the leader so that it plans from the same budgets. */
  memoryScale?: number;
  context?: number;
  /** Speculative decoding: the leader drafts for the requests it serves (`up --draft ...`). */
  speculate?: SpeculateFlags;
  signal?: AbortSignal;
  log?: (msg: string) => void;
}

export interface ClusterRun {
  /** The leader's control API. */
  target: ApiTarget;
  /** The leader's ticket (more nodes may join with it). */
  ticket: string;
  /** Node id -> the file's name for it. */
  names: Map<string, string>;
  /** Datagrams the relays delivered, when the WAN is emulated. */
  relayDatagrams(): number | undefined;
  /**
   * With the WAN emulated: cuts the node the file names `name` off from every other node at the relays (every
   * datagram between it and them dropped, both ways), or with `cut` false gives it the file's links back. The
   * node runs on and its control API stays reachable from this machine: a partition as the others see it
   * (scripts/chaos/run.ts). Error without the emulation; RangeError for a name the file does not have.
   */
  partition(name: string, cut: boolean): void;
  /** Resolves when the leader's process has ended (`swactor down`, or it failed). */
  exited: Promise<void>;
  close(): Promise<void>;
}

/** Whether namespaces can be made here; a UsageError (exit 2) saying why not otherwise. */
export async function checkNamespaces(
  host: { os: string; uid: number | null } = { os: Deno.build.os, uid: Deno.uid() },
): Promise<void> {
  if (host.os !== "linux") throw new UsageError("--emulate-wan needs Linux network namespaces");
  if (host.uid !== 0) {
    throw new UsageError("--emulate-wan needs root (it creates network namespaces); run it as root");
  }
  try {
    const out = await new Deno.Command("ip", { args: ["netns", "list"], stdout: "null", stderr: "piped" })
      .output();
    if (!out.success) throw new Error(new TextDecoder().decode(out.stderr).trim());
  } catch (e) {
    throw new UsageError(`--emulate-wan needs iproute2's \`ip netns\`: ${(e as Error).message}`);
  }
  if ((await Deno.readTextFile("/proc/sys/net/ipv4/ip_forward")).trim() !== "0") {
    throw new UsageError(
      "--emulate-wan needs ip_forward off in this namespace (else the nodes reach each other around the relays)",
    );
  }
}

/** Deletes the lab namespaces whose run (the pid in their name) is gone; returns their names. */
export async function clearStaleNamespaces(): Promise<string[]> {
  const stale = await staleNamespaces();
  for (const n of stale) {
    await new Deno.Command("ip", { args: ["netns", "del", n], stdout: "null", stderr: "null" }).output();
  }
  return stale;
}

/** The lab namespaces whose run (the pid in their name) is gone. */
export async function staleNamespaces(): Promise<string[]> {
  const out = await new Deno.Command("ip", { args: ["netns", "list"], stdout: "piped", stderr: "null" })
    .output();
  const names = new TextDecoder().decode(out.stdout).split("\n").map((l) => l.split(" ")[0])
    .filter((n) => n.startsWith(`${LAB_NETNS_PREFIX}-`));
  // A name carries its run's pid modulo 100000 (interface names are short: scripts/wan/netns.ts), so a
  // namespace is stale only when no running process has that pid modulo 100000.
  const running = new Set<number>();
  for (const e of Deno.readDirSync("/proc")) {
    if (/^\d+$/.test(e.name)) running.add(Number(e.name) % 100000);
  }
  const stale = names.filter((n) => {
    const tag = Number(/^[^-]+-(\d+)s/.exec(n)?.[1]);
    return Number.isInteger(tag) && !running.has(tag);
  });
  return stale;
}

/** Starts the cluster and waits until its chain is ready. */
export async function startClusterRun(o: ClusterRunOptions): Promise<ClusterRun> {
  const log = o.log ?? ((m: string) => console.error(`swactor: ${m}`));
  const nodes = o.lab.nodes;
  const n = nodes.length;
  const modelDir = resolve(o.modelDir);
  // The plan first: a model the file's memory cannot hold is bad input, and nothing has started yet.
  const config = JSON.parse(await Deno.readTextFile(join(modelDir, "config.json")));
  try {
    planRegional(config, o.lab.cluster, { context: o.context, weights: o.weights, kv: o.kv });
  } catch (e) {
    if (e instanceof PlacementError) throw new UsageError(`--cluster ${o.file}: ${e.message}`);
    throw e;
  }
  shareOneGpu(); // the lab's nodes are processes of this machine
  if (o.emulateWan) {
    await checkNamespaces();
    const stale = await clearStaleNamespaces();
    if (stale.length) log(`deleted ${stale.length} namespace(s) of an earlier lab run: ${stale.join(" ")}`);
  }
  const tmp = await Deno.makeTempDir({ prefix: "swactor-lab" });
  let net: NetnsSet | undefined;
  let topo: Topology | undefined;
  const children: Deno.ChildProcess[] = [];
  const tail: string[] = [];
  const debug = Deno.env.get("SWACTOR_DEBUG") === "1";
  const names = new Map<string, string>();
  let closed = false;
  const close = async () => {
    if (closed) return;
    closed = true;
    await stopWorkers(children);
    await topo?.close();
    await net?.close();
    await Deno.remove(tmp, { recursive: true }).catch(() => {});
  };
  try {
    let addrs: string[] | undefined;
    if (o.emulateWan) {
      net = await createNetns(n, { prefix: LAB_NETNS_PREFIX });
      addrs = net.nodes.map((x) => `${x.nodeIp}:7400`);
      const links = [];
      for (let a = 0; a < n; a++) {
        for (let b = a + 1; b < n; b++) {
          links.push({ a, b, spec: labLink(o.lab.cluster, nodes[a].name, nodes[b].name) });
        }
      }
      topo = await startTopology(addrs, links, { listenHosts: net.nodes.map((x) => x.hostIp) });
      log(`WAN emulation: ${n} namespaces, ${topo.relays.length} relays (${links.length} links)`);
    }
    const spawn = async (i: number, args: string[]) => {
      const env: Record<string, string> = {
        SWACTOR_STATE_DIR: join(tmp, `node-${i}`),
        SWACTOR_SLOWDOWN: String(nodes[i].slowdown),
      };
      if (addrs && topo) {
        const table = join(tmp, `dial-${i}.json`);
        const entries = addrs.map((a, j) => [a, topo!.dialAddr(i, j)]).filter((_, j) => j !== i);
        await Deno.writeTextFile(table, JSON.stringify(Object.fromEntries(entries)));
        env[DIAL_TABLE_ENV] = table;
        env.SWACTOR_TLS = "off"; // the relays carry UDP: the data stays on iroh, through them
      }
      const argv = selfCommand(args);
      const [cmd, ...rest] = net ? net.command(i, argv) : argv;
      const child = new Deno.Command(cmd, {
        args: rest,
        env,
        stdin: "piped",
        stdout: "piped",
        stderr: "piped",
      })
        .spawn();
      children.push(child);
      return child;
    };
    const common = (i: number) => [
      "--name",
      nodes[i].name,
      "--memory",
      String(nodes[i].memBytes),
      "--exit-with-stdin",
      ...(addrs ? ["--listen", addrs[i]] : []),
    ];
    const api = net ? `${net.nodes[0].nodeIp}:7401` : "127.0.0.1:0";
    const leader = await spawn(0, [
      "up",
      ...common(0),
      "--model",
      modelDir,
      "--members",
      String(n),
      "--weights",
      o.weights,
      "--kv",
      o.kv,
      ...(o.wire ? ["--wire", o.wire] : []),
      "--cluster-plan",
      resolve(o.file),
      ...(o.memoryScale !== undefined ? ["--memory-scale", String(o.memoryScale)] : []),
      ...(o.context !== undefined ? ["--context", String(o.context)] : []),
      ...(o.speculate
        ? [
          ...["--draft", draftName(o.speculate.draft)],
          ...["--speculate", o.speculate.auto ? "auto" : String(o.speculate.k)],
          ...["--speculate-depth", String(o.speculate.depth), "--draft-noise", String(o.speculate.noise)],
        ]
        : []),
      "--api",
      api,
      "--http",
      "off",
      ...(net ? ["--expose-api"] : []),
    ]);
    const leaderWriter = leader.stdin.getWriter(); // held open: the leader leaves when this process is gone
    void leaderWriter;
    let ticket: string | undefined, apiAddr: string | undefined, ready = false, failed: string | undefined;
    const keep = (who: string) => (l: string) => {
      if (debug || isWorkerWarning(l)) console.error(`[${who}] ${l}`);
      tail.push(`[${who}] ${l}`);
      if (tail.length > 60) tail.shift();
    };
    const watch = (i: number, child: Deno.ChildProcess) => {
      const k = keep(nodes[i].name);
      collect(child.stderr, (l) => {
        k(l);
        const id = /^id: (\S+)$/.exec(l);
        if (id) names.set(id[1], nodes[i].name);
        if (i === 0) {
          const a = /^api: (\S+)$/.exec(l);
          if (a) apiAddr = a[1];
          if (l.startsWith("swactor: chain ready")) ready = true;
        }
      });
      child.status.then((s) => {
        if (!closed && !failed) failed = `node ${nodes[i].name} exited (code ${s.code})`;
      });
    };
    watch(0, leader);
    collect(leader.stdout, (l) => {
      if (l.startsWith("ticket: ")) ticket = l.slice(8).trim();
    });
    const until = async (what: string, ok: () => boolean, ms: number) => {
      const deadline = performance.now() + ms;
      while (!ok()) {
        o.signal?.throwIfAborted();
        if (failed) throw new Error(failed);
        if (performance.now() > deadline) throw new Error(`${what}: not within ${ms / 1000} s`);
        await new Promise((r) => setTimeout(r, 50));
      }
    };
    await until("the leader's ticket", () => ticket !== undefined && apiAddr !== undefined, 60_000);
    for (let i = 1; i < n; i++) {
      const w = await spawn(i, ["join", "-", ...common(i)]);
      w.stdin.getWriter().write(new TextEncoder().encode(ticket + "\n")).catch(() => {});
      watch(i, w);
      collect(w.stdout, () => {});
    }
    log(`${n} node processes (${o.lab.cluster.name}); waiting for the plan and the chain`);
    await until("the chain", () => ready, 600_000);
    const token = JSON.parse(await Deno.readTextFile(join(tmp, "node-0", "node.json"))).token as string;
    return {
      target: { base: `http://${apiAddr}`, token, pid: leader.pid },
      ticket: ticket!,
      names,
      exited: leader.status.then(() => {}),
      relayDatagrams: () => topo?.stats().reduce((s, r) => s + r.up.delivered + r.down.delivered, 0),
      partition: (name, cut) => {
        if (!topo) throw new Error("a partition needs the WAN emulated (--emulate-wan)");
        const i = nodes.findIndex((x) => x.name === name);
        if (i < 0) throw new RangeError(`no node ${name} in ${o.file}`);
        for (let j = 0; j < n; j++) {
          if (j === i) continue;
          const [a, b] = i < j ? [i, j] : [j, i];
          const spec = labLink(o.lab.cluster, nodes[a].name, nodes[b].name);
          topo.setLink(a, b, cut ? { ...spec, loss: 1 } : spec);
        }
      },
      close,
    };
  } catch (e) {
    await close();
    if (tail.length && !debug && !o.signal?.aborted) console.error(tail.join("\n"));
    throw e;
  }
}

/**
 * The leader's side (`up --cluster-plan FILE`): waits until every node of the file is a live member (matched
 * by the name it declares, `--name`), then plans with the lab's regional planner from what the file declares
 * for each, the nodes named by their member ids.
 */
export async function labPlanOnMembers(
  node: { membership: Membership },
  o: {
    file: string;
    modelDir: string;
    weights: string;
    kv?: string;
    memoryScale?: number;
    context?: number;
    timeoutMs?: number;
    signal?: AbortSignal;
  },
): Promise<Plan> {
  const lab = await readLabCluster(o.file, { memoryScale: o.memoryScale });
  const config = JSON.parse(await Deno.readTextFile(join(o.modelDir, "config.json")));
  const deadline = performance.now() + (o.timeoutMs ?? 600_000);
  for (;;) {
    o.signal?.throwIfAborted();
    const ids = new Map<string, string>();
    for (const m of node.membership.members()) {
      if (m.state === "alive" && lab.nodes.some((x) => x.name === m.meta.name)) ids.set(m.meta.name, m.id);
    }
    if (ids.size === lab.nodes.length) {
      return planRegional(config, lab.cluster, {
        context: o.context,
        weights: o.weights,
        kv: o.kv,
        ids,
        name: basename(o.modelDir),
      });
    }
    if (performance.now() > deadline) {
      const missing = lab.nodes.filter((x) => !ids.has(x.name)).map((x) => x.name);
      throw new Error(`nodes ${missing.join(", ")} of ${o.file} did not join`);
    }
    await new Promise((r) => setTimeout(r, 100));
  }
}
