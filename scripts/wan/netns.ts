// Isolated network namespaces for WAN emulation with iroh. Needed because iroh advertises its bound
// addresses inside the QUIC handshake and migrates to the faster direct path within a round trip or
// two (measured: a 10 ms relay was abandoned for the peer's real loopback address at once), and the
// binding has no switch to stop that. So each node gets its own namespace joined to the root namespace
// by one veth pair (a /30), with no other route: a node can reach only the root side of its own veth,
// where the relays listen; the relays (root namespace) reach every node. With ip_forward off in the
// root namespace (the default; checked at creation), nodes cannot reach each other except by relay.
//
// Needs root and iproute2. Everything created is named with `prefix` and the process id, and removed by
// `close()`; `deno run -A scripts/wan/netns.ts --cleanup` removes leftovers of crashed runs.

/** One isolated node: its namespace and the two ends of its veth link. */
export interface NetnsNode {
  /** Namespace name (for `ip netns exec`). */
  ns: string;
  /** Root-namespace side of the veth: relays listen here for this node. */
  hostIp: string;
  /** The node's own address inside its namespace: bind the node's endpoint here. */
  nodeIp: string;
}

export interface NetnsSet {
  readonly nodes: readonly NetnsNode[];
  /** argv that runs `argv` inside node i's namespace (`ip netns exec NS ...`). */
  command(i: number, argv: string[]): string[];
  /** Deletes the namespaces (their veth pairs go with them). */
  close(): Promise<void>;
}

/** Options of `createNetns`. */
export interface NetnsOptions {
  /** Name prefix of namespaces. Default "swwan". */
  prefix?: string;
  /** Second octet of the 10.x.0.0/16 block the /30 links come from. Default: an unused one in 213..250. */
  octet?: number;
}

let setCounter = 0;

async function ip(args: string[]): Promise<string> {
  const out = await new Deno.Command("ip", { args, stdout: "piped", stderr: "piped" }).output();
  if (!out.success) throw new Error(`ip ${args.join(" ")}: ${new TextDecoder().decode(out.stderr).trim()}`);
  return new TextDecoder().decode(out.stdout);
}

/** Creates `count` isolated namespaces. */
export async function createNetns(count: number, options: NetnsOptions = {}): Promise<NetnsSet> {
  if (!Number.isInteger(count) || count < 1 || count > 16000) {
    throw new RangeError(`namespace count must be an integer in [1, 16000], got ${count}`);
  }
  if (Deno.uid() !== 0) throw new Error("network namespaces need root (ip netns add)");
  if (Deno.readTextFileSync("/proc/sys/net/ipv4/ip_forward").trim() !== "0") {
    throw new Error("ip_forward is on in the root namespace: nodes could reach each other around the relays");
  }
  const prefix = options.prefix ?? "swwan";
  const used = await ip(["-4", "-o", "addr"]);
  // Start the scan at a pid-dependent block so two runs starting together rarely pick the same one.
  const octet = options.octet ??
    [...Array(38).keys()].map((k) => 213 + (k + Deno.pid) % 38).find((o) => !used.includes(` 10.${o}.`));
  if (octet === undefined) throw new Error("no free 10.x.0.0/16 block among 10.213-250");
  // Interface names are at most 15 characters: sw + pid + s + set number + h/n + node (base 36).
  const tag = `${Deno.pid % 100000}s${(setCounter++).toString(36)}`;
  const nodes: NetnsNode[] = [];
  const set: NetnsSet = {
    nodes,
    command: (i, argv) => ["ip", "netns", "exec", nodes[i].ns, ...argv],
    close: async () => {
      await Promise.allSettled(nodes.map((n) => ip(["netns", "del", n.ns])));
    },
  };
  try {
    for (let i = 0; i < count; i++) {
      const base = i * 4;
      const net = `10.${octet}.${base >> 8}.${base & 255}`.split(".").map(Number);
      const hostIp = `${net[0]}.${net[1]}.${net[2]}.${net[3] + 1}`;
      const nodeIp = `${net[0]}.${net[1]}.${net[2]}.${net[3] + 2}`;
      const node = { ns: `${prefix}-${tag}-${i}`, hostIp, nodeIp };
      const host = `sw${tag}h${i.toString(36)}`, peer = `sw${tag}n${i.toString(36)}`;
      await ip(["netns", "add", node.ns]);
      nodes.push(node);
      await ip(["link", "add", host, "type", "veth", "peer", "name", peer]);
      await ip(["link", "set", peer, "netns", node.ns]);
      await ip(["addr", "add", `${hostIp}/30`, "dev", host]);
      await ip(["link", "set", host, "up"]);
      await ip(["-n", node.ns, "addr", "add", `${nodeIp}/30`, "dev", peer]);
      await ip(["-n", node.ns, "link", "set", peer, "up"]);
      await ip(["-n", node.ns, "link", "set", "lo", "up"]);
    }
  } catch (e) {
    await set.close();
    throw e;
  }
  return set;
}

/** Deletes namespaces whose name starts with `${prefix}-` (leftovers of runs that crashed). */
export async function cleanupNetns(prefix = "swwan"): Promise<string[]> {
  const names = (await ip(["netns", "list"])).split("\n").map((l) => l.split(" ")[0])
    .filter((n) => n.startsWith(`${prefix}-`));
  await Promise.allSettled(names.map((n) => ip(["netns", "del", n])));
  return names;
}

if (import.meta.main) {
  const usage = "Usage: deno run -A scripts/wan/netns.ts --cleanup   (deletes swwan-* namespaces)";
  if (Deno.args[0] === "--help" || Deno.args[0] === "-h") {
    console.log(usage);
    Deno.exit(0);
  }
  if (Deno.args.length !== 1 || Deno.args[0] !== "--cleanup") {
    console.error(Deno.args.length ? `unknown arguments: ${Deno.args.join(" ")}\n${usage}` : usage);
    Deno.exit(2);
  }
  console.log(`deleted: ${(await cleanupNetns()).join(" ") || "none"}`);
}
