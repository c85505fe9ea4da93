// One configuration type for membership, with memberlist's presets. Durations are milliseconds.
// The LAN values are memberlist's DefaultLANConfig except the probe period (500 ms, not 1 s) and the
// suspicion multiplier (6, not 4): detection everywhere within 8 s at 50 nodes (docs/RECOVERY.md); WAN and
// local follow DefaultWANConfig and DefaultLocalConfig; `test` is tuned for fast in-process tests on a fake clock.

export interface MembershipConfig {
  /** Time between two failure-detection probes of one random member (round robin). memberlist: 1 s. */
  probeIntervalMs: number;
  /** How long a direct ping waits for its ack before indirect probes start. memberlist: 500 ms. */
  probeTimeoutMs: number;
  /** Number of members asked to ping the target on our behalf (ping-req) after a failed ping. memberlist: 3. */
  indirectChecks: number;
  /**
   * Suspicion timeout multiplier: the minimum suspicion timeout is suspicionMult * log10(max(1, N)) *
   * probeInterval (at least 1 * probeInterval * suspicionMult). Also sets the number of independent
   * confirmations that shrink a suspicion to that minimum: suspicionMult - 2. memberlist: 4.
   */
  suspicionMult: number;
  /** The maximum suspicion timeout (with no confirmation) is this times the minimum (Lifeguard). memberlist: 6. */
  suspicionMaxTimeoutMult: number;
  /** A broadcast is piggybacked at most retransmitMult * ceil(log10(N + 1)) times. memberlist: 4. */
  retransmitMult: number;
  /** Period of the full-state sync with one random member; 0 turns it off. memberlist: 30 s. */
  pushPullIntervalMs: number;
  /** Period of gossip rounds that send queued broadcasts to `gossipNodes` random members. memberlist: 200 ms. */
  gossipIntervalMs: number;
  /** Members gossiped to per round. memberlist: 3. */
  gossipNodes: number;
  /** Dead members still receive gossip for this long (helps them learn they are suspected). memberlist: 30 s. */
  gossipToTheDeadMs: number;
  /**
   * Lifeguard's local health multiplier ceiling: probe interval and probe timeout are scaled by
   * (score + 1), score in [0, awarenessMaxMultiplier - 1]. 1 turns local health awareness off. memberlist: 8.
   */
  awarenessMaxMultiplier: number;
  /** Lifeguard extras: nacks from indirect probers and confirmation-shrinking suspicion. false = classic SWIM. */
  lifeguard: boolean;
  /** Interval between attempts to re-contact one random dead member (push-pull), so healed partitions re-merge. */
  reconnectIntervalMs: number;
  /** Dead members are forgotten (tombstone removed) after this long; left members too. */
  tombstoneTimeoutMs: number;
  /**
   * A dead or left member may come back with a *lower* incarnation (a restart that lost its counter) once it
   * has been dead this long. memberlist: DeadNodeReclaimTime, 0 there (off); here 0 also means never.
   */
  deadNodeReclaimMs: number;
  /** Largest encoded gossip packet (broadcasts are packed up to this size). memberlist: UDPBufferSize 1400. */
  packetBytes: number;
}

/**
 * memberlist's DefaultLANConfig, probing twice as often (500 ms, timeout 250 ms) with a suspicion multiplier
 * of 6 instead of 4: the first probe of a dead node comes sooner (the slowest of 10 seeds at 50 nodes: 3.8 s
 * -> 1.6 s) and the minimum suspicion is 5.1 s at 50 nodes instead of 6.8 s, so every member marks it dead
 * within 7.0 s (10.9 s before), with no false death in 30 simulated minutes of 10% loss and a slow node;
 * the price is about twice the probe traffic (10.7 -> 19.7 messages per node per second). docs/RECOVERY.md.
 */
export const lan: Readonly<MembershipConfig> = Object.freeze({
  probeIntervalMs: 500,
  probeTimeoutMs: 250,
  indirectChecks: 3,
  suspicionMult: 6,
  suspicionMaxTimeoutMult: 6,
  retransmitMult: 4,
  pushPullIntervalMs: 30_000,
  gossipIntervalMs: 200,
  gossipNodes: 3,
  gossipToTheDeadMs: 30_000,
  awarenessMaxMultiplier: 8,
  lifeguard: true,
  reconnectIntervalMs: 10_000,
  tombstoneTimeoutMs: 24 * 3600_000,
  deadNodeReclaimMs: 0,
  packetBytes: 1400,
});

/** memberlist's DefaultWANConfig. */
export const wan: Readonly<MembershipConfig> = Object.freeze({
  ...lan,
  probeIntervalMs: 5000,
  probeTimeoutMs: 3000,
  suspicionMult: 6,
  pushPullIntervalMs: 60_000,
  gossipIntervalMs: 500,
  gossipNodes: 4,
  gossipToTheDeadMs: 60_000,
  reconnectIntervalMs: 30_000,
});

/** memberlist's DefaultLocalConfig (loopback, one machine). */
export const local: Readonly<MembershipConfig> = Object.freeze({
  ...lan,
  probeIntervalMs: 1000,
  probeTimeoutMs: 200,
  indirectChecks: 1,
  suspicionMult: 3,
  retransmitMult: 2,
  pushPullIntervalMs: 15_000,
  gossipIntervalMs: 100,
  gossipToTheDeadMs: 15_000,
  reconnectIntervalMs: 5_000,
});

/** Fast timings for in-process tests on a fake clock (a fake millisecond costs nothing, but fewer steps run faster). */
export const test: Readonly<MembershipConfig> = Object.freeze({
  ...lan,
  probeIntervalMs: 200,
  probeTimeoutMs: 100,
  suspicionMult: 3,
  pushPullIntervalMs: 2000,
  gossipIntervalMs: 50,
  gossipToTheDeadMs: 2000,
  reconnectIntervalMs: 1000,
  tombstoneTimeoutMs: 60_000,
});

/** Named presets, for `--membership lan|wan|local|test`. */
export const presets = { lan, wan, local, test } as const;

/** Returns a full config: `base` (default lan) overridden by `overrides`, validated. */
export function membershipConfig(
  overrides: Partial<MembershipConfig> = {},
  base: Readonly<MembershipConfig> = lan,
): MembershipConfig {
  const c: MembershipConfig = { ...base, ...overrides };
  for (const [k, v] of Object.entries(c)) {
    if (k === "lifeguard") {
      if (typeof v !== "boolean") throw new TypeError(`membership config ${k} must be a boolean, got ${v}`);
    } else if (typeof v !== "number" || !Number.isFinite(v) || v < 0) {
      throw new RangeError(`membership config ${k} must be a finite number >= 0, got ${v}`);
    }
  }
  if (c.probeIntervalMs <= 0 || c.gossipIntervalMs <= 0) {
    throw new RangeError("membership config probeIntervalMs and gossipIntervalMs must be > 0");
  }
  if (c.probeTimeoutMs >= c.probeIntervalMs) {
    throw new RangeError(
      `membership config probeTimeoutMs (${c.probeTimeoutMs}) must be < probeIntervalMs (${c.probeIntervalMs})`,
    );
  }
  if (c.awarenessMaxMultiplier < 1 || c.suspicionMaxTimeoutMult < 1 || c.suspicionMult < 1) {
    throw new RangeError("membership config multipliers must be >= 1");
  }
  if (c.packetBytes < 256) {
    throw new RangeError(`membership config packetBytes must be >= 256, got ${c.packetBytes}`);
  }
  return c;
}
