// Membership and registry simulations on the in-memory network and a fake clock (simulated time: 30
// simulated minutes of 50 nodes take seconds). Results feed docs/MEMBERSHIP.md.
//
//   deno run -A scripts/sim/membership.ts [--n 50] [--seeds 5] [--long-min 30] [--json out.json]
import { parseArgs } from "node:util";
import { scriptArgs } from "../args.ts";
import { lan, type MembershipConfig, membershipConfig } from "../../node/membership/mod.ts";
import { SimCluster, type SimNode } from "../../tests/support/sim_cluster.ts";

export interface Spread {
  min: number;
  median: number;
  max: number;
}

export function spread(xs: number[]): Spread {
  const s = [...xs].sort((a, b) => a - b);
  return { min: s[0], median: s[Math.floor((s.length - 1) / 2)], max: s[s.length - 1] };
}

const live = (c: SimCluster) => c.nodes.filter((n) => c.up(n));

/** (a) Everyone joins node 0 at t=0: time until every node sees all N alive. */
export function convergence(n: number, config: MembershipConfig, seed: number): number | undefined {
  const c = new SimCluster({ n, config, seed });
  c.joinAll();
  return c.clock.runUntilTrue(() => c.converged(), { stepMs: 50, maxMs: 300_000 });
}

/** (b) Kill one member of a converged cluster: when each other member marks it suspect, then dead. */
export function detection(n: number, config: MembershipConfig, seed: number) {
  const c = new SimCluster({ n, config, seed });
  c.joinAll();
  c.clock.runUntilTrue(() => c.converged(), { stepMs: 50, maxMs: 300_000 });
  c.clock.advance(10_000);
  const victim = c.nodes[n >> 1];
  const t0 = c.clock.now();
  const dead = new Map<string, number>();
  const firstSuspect: number[] = [];
  for (const node of c.nodes) {
    node.membership.onChange(({ member }) => {
      if (member.id !== victim.id) return;
      if (member.state === "suspect" && firstSuspect.length === 0) firstSuspect.push(c.clock.now() - t0);
      if (member.state === "dead" && !dead.has(node.id)) dead.set(node.id, c.clock.now() - t0);
    });
  }
  c.kill(victim);
  c.clock.runUntilTrue(() => dead.size === n - 1, { stepMs: 50, maxMs: 300_000 });
  return { firstSuspectMs: firstSuspect[0], dead: spread([...dead.values()]), observers: dead.size };
}

/**
 * (c) A long run with `loss` on every link and one member whose messages are intermittently late
 * (beyond the probe timeout). Counts false suspicions and false deaths (no node ever fails here).
 */
export function longRun(
  n: number,
  config: MembershipConfig,
  seed: number,
  opts: { minutes: number; loss: number; slowProbability: number; slowMinMs: number; slowMaxMs: number },
) {
  const c = new SimCluster({ n, config, seed });
  c.joinAll();
  c.clock.runUntilTrue(() => c.converged(), { stepMs: 50, maxMs: 300_000 });
  c.net.setDefaultLink({ loss: opts.loss });
  const slow = c.nodes[n - 1];
  c.net.setSlow(slow.id, { probability: opts.slowProbability, minMs: opts.slowMinMs, maxMs: opts.slowMaxMs });
  let suspicions = 0, deaths = 0, slowAccused = 0, slowDeclaredDead = 0;
  for (const node of c.nodes) {
    node.membership.onChange(({ member }) => {
      if (member.id === node.id) return;
      if (member.state === "suspect") {
        suspicions++;
        if (member.id === slow.id) slowAccused++;
      }
      if (member.state === "dead") {
        deaths++;
        if (member.id === slow.id) slowDeclaredDead++;
      }
    });
  }
  const sent0 = c.net.stats.sent;
  c.clock.advance(opts.minutes * 60_000);
  const stats = c.nodes.map((x) => x.membership.stats);
  const result = {
    suspicionsSeen: suspicions,
    falseDeathsSeen: deaths,
    slowAccused,
    slowDeclaredDead,
    raisedBySlowNode: slow.membership.stats.suspected,
    raisedByOthers: stats.reduce((a, s) => a + s.suspected, 0) - slow.membership.stats.suspected,
    refutations: stats.reduce((a, s) => a + s.refuted, 0),
    declaredDead: stats.reduce((a, s) => a + s.declaredDead, 0),
    slowNodeAwareness: slow.membership.awareness.score,
    messagesPerNodePerSec: Math.round((c.net.stats.sent - sent0) / n / (opts.minutes * 60) * 10) / 10,
  };
  // Then a quiet minute: every view must be whole again.
  c.net.setDefaultLink({ loss: 0 });
  c.net.setSlow(slow.id, undefined);
  const settleMs = c.clock.runUntilTrue(() => c.converged(), { stepMs: 100, maxMs: 120_000 });
  return { ...result, settleAfterMs: settleMs };
}

/** (d) Split into two halves for `partitionMs`, heal, and time the re-merge. */
export function partition(n: number, config: MembershipConfig, seed: number, partitionMs: number) {
  const c = new SimCluster({ n, config, seed });
  c.joinAll();
  c.clock.runUntilTrue(() => c.converged(), { stepMs: 50, maxMs: 300_000 });
  const a = c.nodes.slice(0, n >> 1), b = c.nodes.slice(n >> 1);
  c.net.partition([a.map((x) => x.id), b.map((x) => x.id)]);
  const split = c.clock.runUntilTrue(() => seesOnly(a) && seesOnly(b), { stepMs: 100, maxMs: partitionMs });
  c.clock.advance(Math.max(0, partitionMs - (split ?? partitionMs)));
  // Share of cross-group views (a node's view of a member of the other half) that are dead at the heal.
  let cross = 0, crossDead = 0;
  for (const [mine, other] of [[a, b], [b, a]]) {
    for (const x of mine) {
      for (const y of other) {
        cross++;
        if (x.membership.member(y.id)?.state === "dead") crossDead++;
      }
    }
  }
  const awareness = c.nodes.map((x) => x.membership.awareness.score);
  c.net.heal();
  const merge = c.clock.runUntilTrue(() => c.converged(), { stepMs: 100, maxMs: 600_000 });
  return {
    splitDetectedMs: split,
    crossDeadAtHeal: crossDead / cross,
    maxAwareness: Math.max(...awareness),
    remergeMs: merge,
  };
}

function seesOnly(group: SimNode[]): boolean {
  const ids = new Set(group.map((x) => x.id));
  return group.every((x) => x.membership.members().every((m) => (m.state === "alive") === ids.has(m.id)));
}

/** (e) Every node registers two names; time to agreement; then a node dies: time until its names are gone. */
export function registry(n: number, config: MembershipConfig, seed: number) {
  const c = new SimCluster({ n, config, seed });
  c.joinAll();
  c.clock.runUntilTrue(() => c.converged(), { stepMs: 50, maxMs: 300_000 });
  for (const [i, node] of c.nodes.entries()) {
    node.registry.register(`stage-${i}`);
    node.registry.register(`moe-expert-${i}-0`);
  }
  const agree = () => {
    const views = new Set(live(c).map((x) => JSON.stringify(x.registry.entries())));
    return views.size === 1;
  };
  const full = () => agree() && live(c)[0].registry.entries().length === 2 * live(c).length;
  const agreeMs = c.clock.runUntilTrue(full, { stepMs: 50, maxMs: 300_000 });
  const victim = c.nodes[3];
  c.kill(victim);
  const goneMs = c.clock.runUntilTrue(
    () => live(c).every((x) => x.registry.resolve("stage-3") === undefined) && full(),
    { stepMs: 50, maxMs: 300_000 },
  );
  // A conflicting claim: two nodes take the same name at the same instant; all must pick the same owner.
  c.nodes[10].registry.register("stage-0");
  c.nodes[20].registry.register("stage-0");
  const conflictMs = c.clock.runUntilTrue(agree, { stepMs: 50, maxMs: 300_000 });
  return { agreeMs, goneMs, conflictMs, conflictWinner: c.nodes[0].registry.resolve("stage-0") };
}

if (import.meta.main) {
  const { values } = scriptArgs(import.meta.url, (args) =>
    parseArgs({
      args,
      options: {
        n: { type: "string", default: "50" },
        seeds: { type: "string", default: "5" },
        "long-min": { type: "string", default: "30" },
        json: { type: "string" },
      },
    }));
  const n = Number(values.n), seeds = Number(values.seeds), minutes = Number(values["long-min"]);
  const noLifeguard = membershipConfig({ lifeguard: false, awarenessMaxMultiplier: 1 }, lan);
  const out: Record<string, unknown> = { n, seeds, config: "lan" };
  const t0 = performance.now();
  const runs = Array.from({ length: seeds }, (_, i) => i + 1);

  const conv = runs.map((s) => convergence(n, lan, s)!);
  out.convergenceMs = spread(conv);
  console.log(`(a) convergence of ${n} nodes joining one seed: ${JSON.stringify(out.convergenceMs)} ms`);

  for (const size of [5, n]) {
    const det = runs.map((s) => detection(size, lan, s));
    const all = det.map((d) => d.dead);
    const res = {
      firstSuspectMs: spread(det.map((d) => d.firstSuspectMs)),
      firstObserverMs: spread(all.map((d) => d.min)),
      medianObserverMs: spread(all.map((d) => d.median)),
      lastObserverMs: spread(all.map((d) => d.max)),
    };
    out[`detection${size}`] = res;
    console.log(`(b) detection, ${size} nodes (over ${seeds} seeds): ${JSON.stringify(res)}`);
  }

  const longOpts = { minutes, loss: 0.1, slowProbability: 0.3, slowMinMs: 600, slowMaxMs: 1500 };
  out.longRunOptions = longOpts;
  out.longRunLifeguard = longRun(n, lan, 1, longOpts);
  console.log(
    `(c) ${minutes} min, 10% loss, one slow node, Lifeguard on: ${JSON.stringify(out.longRunLifeguard)}`,
  );
  out.longRunClassic = longRun(n, noLifeguard, 1, longOpts);
  console.log(`(c) same, Lifeguard off (classic SWIM): ${JSON.stringify(out.longRunClassic)}`);

  const parts = runs.map((s) => partition(n, lan, s, 60_000));
  out.partition = {
    splitCompleteWithin60s: parts.map((p) => p.splitDetectedMs ?? null),
    crossDeadAtHeal: spread(parts.map((p) => p.crossDeadAtHeal)),
    maxAwarenessAtHeal: parts.map((p) => p.maxAwareness),
    remergeMs: spread(parts.map((p) => p.remergeMs!)),
  };
  console.log(`(d) 25/25 partition for 60 s, then healed: ${JSON.stringify(out.partition)}`);

  const regs = runs.map((s) => registry(n, lan, s));
  out.registry = {
    agreeMs: spread(regs.map((r) => r.agreeMs!)),
    deadOwnerGoneMs: spread(regs.map((r) => r.goneMs!)),
    conflictAgreeMs: spread(regs.map((r) => r.conflictMs!)),
    conflictWinners: regs.map((r) => r.conflictWinner),
  };
  console.log(`(e) registry: ${JSON.stringify(out.registry)}`);
  const wall = (performance.now() - t0) / 1000;
  out.wallSeconds = Math.round(wall * 10) / 10;
  console.log(`wall time ${wall.toFixed(1)} s`);
  if (values.json) Deno.writeTextFileSync(values.json, JSON.stringify(out, null, 2) + "\n");
}
