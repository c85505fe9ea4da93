// Recovery (rung 6, docs/RECOVERY.md): when a node of the current Plan dies or leaves (membership says so),
// the leader re-plans over the survivors and publishes the new Assignment; every node claims its new role
// (a role that did not change keeps its weights), and the clients resume their requests on the new chain
// (node/stage/client.ts: prompt + tokens so far are re-sent, the stages rebuild their KV). When the leader
// itself is gone, the live member with the lowest id takes over: it re-plans and leads from then on. Only a
// node that sees a strict majority of the members alive re-plans (hasMajority): a partition's minority side
// waits, so the Plans of the two sides never compete when it heals.
import { join } from "node:path";
import type { ActorSystem } from "../actors/mod.ts";
import type { Links } from "../links.ts";
import type { Member, Membership } from "../membership/mod.ts";
import type { Assignment, AssignmentBoard } from "./assignment.ts";
import { expertPlacement, type ExpertPlan } from "./experts.ts";
import { planChain } from "./plan_chain.ts";
import { liveMembers } from "./publish.ts";

/** A Plan's node-bearing fields (planner/plan.ts has the whole type). */
export type RecoverablePlan = ExpertPlan & {
  stages: ExpertPlan["stages"];
  nodes?: { id: string; role?: string }[];
} & Record<string, unknown>;

/** One re-plan the leader made, as `status --json` shows it. */
export interface Replan {
  /** Plan versions before and after. */
  from: number;
  to: number;
  /** The nodes that were lost, and why ("died", "left"). */
  lost: { node: string; reason: string }[];
  /** "spare": the lost nodes' parts moved to idle members; "replan": the Plan was made again over the survivors. */
  how: "spare" | "replan";
  /** From the first loss seen here to the new Plan's publication, ms. */
  ms: number;
  /** Whether this node took the lead to do it (the previous leader was among the lost). */
  tookLead: boolean;
}

/** Every node the Plan uses: its stages' nodes and its expert hosts. */
export function planNodes(plan: ExpertPlan): Set<string> {
  const hosts = [...expertPlacement(plan).values()].flatMap((m) => [...m.keys()]);
  return new Set([...plan.stages.map((s) => s.node), ...hosts]);
}

/**
 * Of `lost` (nodes of the Plan that are gone), those whose loss breaks the Plan (pure): a stage's node, or an
 * expert host holding an expert that no other live node of the Plan holds. The others are covered by
 * replicas: the stages send their experts' tokens to another copy (createFanout) and the Plan stands.
 */
export function breaking(plan: ExpertPlan, lost: string[]): string[] {
  const gone = new Set(lost);
  const stages = new Set(plan.stages.map((s) => s.node));
  const placement = expertPlacement(plan);
  return lost.filter((n) =>
    stages.has(n) ||
    [...placement.values()].some((nodes) =>
      (nodes.get(n) ?? []).some((e) => ![...nodes].some(([m, ids]) => !gone.has(m) && ids.includes(e)))
    )
  );
}

/**
 * The spares' move (pure): each lost node's part (a stage, with its experts, or an expert host's experts)
 * goes to a spare, in order; undefined when there are fewer spares than lost nodes. Spares are members the
 * Plan does not use.
 */
export function withSpares<P extends RecoverablePlan>(
  plan: P,
  lost: string[],
  spares: string[],
): P | undefined {
  const used = planNodes(plan);
  const gone = lost.filter((n) => used.has(n));
  const free = spares.filter((n) => !used.has(n));
  if (free.length < gone.length) return undefined;
  const to = new Map(gone.map((n, i) => [n, free[i]]));
  const map = (n: string) => to.get(n) ?? n;
  return {
    ...plan,
    stages: plan.stages.map((s) => ({ ...s, node: map(s.node) })),
    ...(plan.expertHosts ? { expertHosts: plan.expertHosts.map((h) => ({ ...h, node: map(h.node) })) } : {}),
    // The Plan's node list: a spare takes the lost node's role there, the lost node idles.
    ...(plan.nodes
      ? {
        nodes: plan.nodes.map((n) => {
          if (to.has(n.id)) return { ...n, role: "idle" };
          const was = [...to].find(([, spare]) => spare === n.id)?.[0];
          const role = was && plan.nodes!.find((m) => m.id === was)?.role;
          return role ? { ...n, role } : n;
        }),
      }
      : {}),
  };
}

/** Who leads: the Assignment's leader while it is live, else the live member with the lowest id. */
export function effectiveLeader(
  a: Pick<Assignment, "leader">,
  members: Pick<Member, "id" | "state">[],
): string {
  const alive = members.filter((m) => m.state === "alive").map((m) => m.id).sort();
  return alive.includes(a.leader) ? a.leader : alive[0] ?? a.leader;
}

/**
 * Whether `members` (one node's view, itself included) has a strict majority alive: only then may that node
 * take the lead or re-plan. Members that left gracefully are not counted; a dead one counts until its
 * tombstone is forgotten (a day with `lan`). So a cluster of two cannot re-plan after a loss: its survivor
 * cannot tell a dead peer from a partition.
 */
export function hasMajority(members: Pick<Member, "state">[]): boolean {
  const counted = members.filter((m) => m.state !== "left");
  return 2 * counted.filter((m) => m.state === "alive").length > counted.length;
}

/**
 * Which stage of a lost attempt's chain to name as lost, and why, once a new chain is ready (pure; undefined:
 * none, the chain was whole and the attempt failed for another reason). In order: the first old node the new
 * Assignment says its leader re-planned without (`replanned`: Assignment.lost, the leader's word); the first
 * that membership here says is dead or left; the first the new chain dropped that is not alive here; the
 * node the loss itself named, if the new chain dropped it. (The leader may re-plan before this node's
 * membership hears of the death: the node can still read alive here.)
 */
export function lostStage(
  old: readonly string[],
  next: readonly string[],
  state: (node: string) => string | undefined,
  loss: { stage?: number; node?: string },
  replanned: readonly { node: string; reason: string }[] = [],
): { stage: number; reason: string } | undefined {
  const said = old.findIndex((n) => replanned.some((l) => l.node === n));
  if (said >= 0) return { stage: said, reason: replanned.find((l) => l.node === old[said])!.reason };
  const why = (stage: number) => ({ stage, reason: state(old[stage]) === "left" ? "left" : "died" });
  let stage = old.findIndex((n) => state(n) === "dead" || state(n) === "left");
  if (stage < 0) stage = old.findIndex((n) => !next.includes(n) && state(n) !== "alive");
  if (stage >= 0) return why(stage);
  const named = loss.node ?? (loss.stage !== undefined ? old[loss.stage] : undefined);
  return named !== undefined && !next.includes(named) ? why(old.indexOf(named)) : undefined;
}

export interface RecoveryHost {
  membership: Membership;
  actors: ActorSystem;
  links: Links;
}

export interface RecoveryOptions {
  /** The checkpoint folder on this node (default: the Assignment's). */
  modelDir?: string;
  /** Wait this long after a loss for others that come with it before re-planning (default 100 ms). */
  settleMs?: number;
  /**
   * How long a death this node saw while it had no majority is disbelieved (default 60 s: two `lan` push-pull
   * periods, for the views to converge after a partition heals).
   */
  distrustMs?: number;
  log?: (msg: string) => void;
}

/** Watches membership on every node; on the leader (or the node that takes the lead) re-plans after a loss. */
export class ChainRecovery {
  /** The re-plans this node made, oldest first (at most 64). */
  readonly replans: Replan[] = [];
  #host: RecoveryHost;
  #board: AssignmentBoard;
  #o: RecoveryOptions;
  #log: (msg: string) => void;
  #firstLoss: number | undefined;
  /**
   * Members that turned dead while this node saw no majority (it was on a partition's minority side), and
   * when: until they are alive again (or distrustMs), they count as alive here. At the heal of a 15 s
   * partition of one stage, the cut-off node saw the others come back before the leader (it refuses
   * connections from members it holds dead, and no one had told the leader it was thought dead, so it had
   * not refuted), took the lead with the lowest live id and moved the leader's stage (5 of 20 chaos runs).
   */
  #distrusted = new Map<string, number>();
  #timer: ReturnType<typeof setTimeout> | undefined;
  #busy: Promise<void> = Promise.resolve();
  #leaderRef: { stop(): Promise<void> } | undefined;
  /** "version:node" of the losses replicas covered (logged once). */
  #covered = new Set<string>();
  #unsubscribe: Array<() => void> = [];
  #closed = false;

  constructor(host: RecoveryHost, board: AssignmentBoard, opts: RecoveryOptions = {}) {
    this.#host = host;
    this.#board = board;
    this.#o = opts;
    this.#log = opts.log ?? ((m) => console.error(`swactor: ${m}`));
    this.#unsubscribe.push(host.membership.onChange(({ member }) => {
      if (member.state === "dead" && !hasMajority(host.membership.members())) {
        this.#distrusted.set(member.id, performance.now());
      }
      if (member.state === "alive") this.#distrusted.delete(member.id);
      if (member.state === "dead" || member.state === "left") this.#schedule();
    }));
    this.#unsubscribe.push(board.onChange(() => this.#schedule()));
  }

  async close(): Promise<void> {
    this.#closed = true;
    clearTimeout(this.#timer);
    for (const u of this.#unsubscribe) u();
    await this.#busy;
    await this.#leaderRef?.stop();
  }

  #schedule(): void {
    if (this.#closed) return;
    this.#firstLoss ??= performance.now();
    clearTimeout(this.#timer);
    this.#timer = setTimeout(() => {
      this.#busy = this.#busy.then(() => this.#check()).catch((e) =>
        this.#log(`recovery: ${(e as Error).message}`)
      );
    }, this.#o.settleMs ?? 100);
  }

  async #check(): Promise<void> {
    const a = this.#board.current;
    const since = this.#firstLoss;
    this.#firstLoss = undefined;
    if (!a || this.#closed) return;
    const self = this.#host.membership.id;
    const now = performance.now();
    for (const [id, at] of this.#distrusted) {
      if (now - at > (this.#o.distrustMs ?? 60_000)) this.#distrusted.delete(id);
    }
    const members = this.#host.membership.members().map((m) =>
      m.state === "dead" && this.#distrusted.has(m.id) ? { ...m, state: "alive" as const } : m
    );
    const leader = effectiveLeader(a, members);
    if (leader !== self) return;
    if (!hasMajority(members)) {
      // A node cut off from the others (or a leader on a partition's minority side) sees them all dead: were
      // it to re-plan, it would put the whole model on itself, and its Plan, the newer one, would replace the
      // majority's when the partition heals. It waits instead; the majority re-plans without it.
      const alive = members.filter((m) => m.state === "alive").length;
      const counted = members.filter((m) => m.state !== "left").length;
      this.#log(
        `recovery: this node sees ${alive} of ${counted} members alive, no majority: it does not re-plan`,
      );
      return;
    }
    this.#holdLeaderName();
    const state = new Map(members.map((m) => [m.id, m.state]));
    const lost = [...planNodes(a.plan)]
      .filter((n) => n !== self && state.get(n) !== "alive" && state.get(n) !== "suspect")
      .map((node) => ({ node, reason: state.get(node) === "left" ? "left" : "died" }));
    const tookLead = a.leader !== self;
    if (lost.length === 0 && !tookLead) return;
    // Expert hosts whose every expert has a live replica: the stages route around them, no re-plan (which
    // would restart the requests in flight). The Plan keeps them until a loss that does break it.
    if (!tookLead && breaking(a.plan, lost.map((l) => l.node)).length === 0) {
      for (const l of lost) {
        if (this.#covered.has(`${a.version}:${l.node}`)) continue;
        this.#covered.add(`${a.version}:${l.node}`);
        this.#log(
          `recovery: expert host ${
            l.node.slice(0, 10)
          } ${l.reason}; replicas hold its experts, plan v${a.version} stands`,
        );
      }
      return;
    }
    const alive = members.filter((m) => m.state === "alive")
      .sort((x, y) => (x.id === self ? -1 : y.id === self ? 1 : x.id < y.id ? -1 : 1));
    let how: Replan["how"] = "spare";
    let plan = withSpares(a.plan as RecoverablePlan, lost.map((l) => l.node), alive.map((m) => m.id));
    if (!plan) {
      // No spare for every lost part: plan again over the survivors, from their measured descriptors.
      how = "replan";
      const dir = this.#o.modelDir ?? a.model.dir;
      const config = JSON.parse(await Deno.readTextFile(join(dir, "config.json")));
      plan = planChain(config, liveMembers(this.#host, alive), {
        weights: a.model.weights,
        kv: a.model.kv,
        experts: (a.plan as ExpertPlan).expertMode === "spread" ? "spread" : "local",
      }) as unknown as RecoverablePlan;
    }
    if (this.#closed || this.#board.current !== a) return; // a newer Plan came meanwhile
    const next = this.#board.publish({
      plan: plan as Assignment["plan"],
      model: a.model,
      layers: a.layers,
      ...(a.wire ? { wire: a.wire } : {}),
      lost,
    });
    const r: Replan = {
      from: a.version,
      to: next.version,
      lost,
      how,
      ms: Math.round(performance.now() - (since ?? performance.now())),
      tookLead,
    };
    this.replans.push(r);
    if (this.replans.length > 64) this.replans.shift();
    this.#log(
      `recovery: plan v${r.from} -> v${r.to} (${how}${tookLead ? ", this node leads now" : ""}): lost ${
        lost.map((l) => `${l.node.slice(0, 10)} (${l.reason})`).join(", ") || "the leader"
      }; ${next.plan.stages.length} stage(s)`,
    );
  }

  /** The leader answers to the name `leader` (status shows it as a role). */
  #holdLeaderName(): void {
    if (this.#leaderRef || this.#host.actors.localNames().includes("leader")) return;
    this.#leaderRef = this.#host.actors.spawn("leader", { receive: () => {} });
  }
}
