// The member table and its pure state machine: apply(table, event) -> result, with SWIM/memberlist's
// incarnation precedence. No timers, no I/O: swim.ts turns results into effects (suspicion timers,
// broadcasts, refutations, notifications).
import type { PeerId } from "../transport/transport.ts";

export type MemberState = "alive" | "suspect" | "dead" | "left";

/** What a node tells the cluster about itself; the planner reads it. */
export interface NodeDescriptor {
  /** Human-readable node name (host name by default). */
  name: string;
  /** swactor version the node runs. */
  version: string;
  /** GPU adapter name ("NVIDIA H200", "llvmpipe", "" when none). */
  adapter: string;
  /** GPU memory usable for weights and activations, in bytes (the measured figure once measured). */
  gpuMemoryBytes: number;
  /** Direct addresses ("ip:port") the node listens on. */
  addrs: string[];
  /** The node's process id (status shows it for members on the same machine: by `name`, the host name). */
  pid?: number;
  /** The node is measuring itself (node/measure.ts); a planner waits a little for `measured`. */
  measuring?: boolean;
  /** What the node measured about itself, once it has. */
  measured?: NodeMeasurement;
}

/** A node's self-measurement (node/measure.ts says how each number is taken). */
export interface NodeMeasurement {
  /** When it was measured, ms since the epoch. */
  at: number;
  /** Usable GPU memory, bytes: what the adapter let this process allocate, within the cap. */
  memoryBytes: number;
  /** The cap the user set (`--memory`), bytes; 0 when none. */
  memoryCapBytes: number;
  /** What bounded memoryBytes: "device" (the adapter refused more), "cap", "host" (a software adapter's host
   *  memory), "time" (the probe ran out of time: a lower bound), "none" (no probe: the cap, or 0). */
  memoryBound: "device" | "cap" | "host" | "time" | "none";
  /** Weight-read bandwidth of the decode GEMV streaming from memory, by input width: [K, GB/s], K ascending. */
  readGbps: [number, number][];
  /** The same reading one matrix that stays in the cache, by the same widths. */
  cachedGbps: [number, number][];
  /** The largest working set, bytes, that still reads at the cached rate (0: no cache effect seen). */
  cacheBytes: number;
  /** Weights those GEMVs read ("f16" where the engine would choose it, else "f32"). */
  readWeights: "f16" | "f32";
  /** Whether GPU timestamps timed the GEMVs (else the wall clock around a submit and its readback). */
  timestamps: boolean;
  /** Wall ms one more small dispatch adds to a step (its host encode and the GPU's launch cost). */
  dispatchMs: number;
  /** Wall ms of a step's fixed part: upload the input, submit, read back a small result. */
  readbackMs: number;
  /** Host ms to encode one decoder layer's dispatches (LAYER_DISPATCHES of planner/live.ts). */
  encodeLayerMs: number;
  /** How long the measurement took, ms. */
  tookMs: number;
}

export interface Member {
  id: PeerId;
  /** Transport addresses used to reach the member. */
  addrs: string[];
  /** Only the member itself raises it (refuting a suspicion, changing metadata); higher wins. */
  incarnation: number;
  state: MemberState;
  meta: NodeDescriptor;
  /** Local clock time (ms) of the last state change; drives tombstone expiry and reclaim. */
  since: number;
}

export type MemberTable = ReadonlyMap<PeerId, Member>;

export type MemberEvent =
  | { type: "alive"; id: PeerId; incarnation: number; addrs: string[]; meta: NodeDescriptor }
  | { type: "suspect"; id: PeerId; incarnation: number; from: PeerId }
  | { type: "dead"; id: PeerId; incarnation: number; from: PeerId }
  | { type: "leave"; id: PeerId; incarnation: number };

export interface ApplyContext {
  /** This node's id: events accusing it are not applied but reported for refutation. */
  self: PeerId;
  /** Current local time (ms). */
  now: number;
  /** See MembershipConfig.deadNodeReclaimMs (0 = never). */
  deadNodeReclaimMs?: number;
}

export interface ApplyResult {
  /** The table after the event (the same object when nothing changed). */
  table: MemberTable;
  /** Set when a member was added or its state/incarnation/metadata changed. */
  change?: { before?: Member; after: Member };
  /** The event is news and should be gossiped on. */
  rebroadcast: boolean;
  /** The event accuses this node (suspect/dead/leave, or a higher incarnation): refute above this number. */
  refute?: number;
  /** A suspect event about a member already suspected: a possible independent confirmation. */
  confirm?: boolean;
}

const unchanged = (table: MemberTable): ApplyResult => ({ table, rebroadcast: false });

function withMember(table: MemberTable, m: Member): MemberTable {
  const next = new Map(table);
  next.set(m.id, m);
  return next;
}

/** Applies one membership event with SWIM's incarnation rules. Pure. */
export function apply(table: MemberTable, event: MemberEvent, ctx: ApplyContext): ApplyResult {
  const local = table.get(event.id);
  const isSelf = event.id === ctx.self;
  switch (event.type) {
    case "alive": {
      if (isSelf) {
        // Our own alive echoed back is fine; a higher incarnation than ours (we restarted and lost the
        // counter, or someone replays stale metadata) must be overridden.
        return local && event.incarnation > local.incarnation
          ? { table, rebroadcast: false, refute: event.incarnation }
          : unchanged(table);
      }
      const reclaim = local !== undefined && (local.state === "dead" || local.state === "left") &&
        (ctx.deadNodeReclaimMs ?? 0) > 0 && ctx.now - local.since >= ctx.deadNodeReclaimMs!;
      if (local && event.incarnation <= local.incarnation && !reclaim) return unchanged(table);
      const after: Member = {
        id: event.id,
        addrs: [...event.addrs],
        incarnation: event.incarnation,
        state: "alive",
        meta: event.meta,
        since: local?.state === "alive" ? local.since : ctx.now,
      };
      return { table: withMember(table, after), change: { before: local, after }, rebroadcast: true };
    }
    case "suspect": {
      if (!local || event.incarnation < local.incarnation) return unchanged(table);
      if (isSelf) return { table, rebroadcast: false, refute: event.incarnation };
      if (local.state === "dead" || local.state === "left") return unchanged(table);
      if (local.state === "suspect") return { table, rebroadcast: false, confirm: true };
      const after: Member = { ...local, incarnation: event.incarnation, state: "suspect", since: ctx.now };
      return { table: withMember(table, after), change: { before: local, after }, rebroadcast: true };
    }
    case "dead":
    case "leave": {
      if (!local || event.incarnation < local.incarnation) return unchanged(table);
      if (isSelf) return { table, rebroadcast: false, refute: event.incarnation };
      if (local.state === "dead" || local.state === "left") return unchanged(table);
      const state: MemberState = event.type === "leave" ? "left" : "dead";
      const after: Member = { ...local, incarnation: event.incarnation, state, since: ctx.now };
      return { table: withMember(table, after), change: { before: local, after }, rebroadcast: true };
    }
  }
}

/** Sets this node's own entry (start, refutation, metadata change, leave). Pure. */
export function setSelf(table: MemberTable, self: Member): MemberTable {
  return withMember(table, self);
}

/** Removes a member's tombstone. Pure. */
export function forget(table: MemberTable, id: PeerId): MemberTable {
  if (!table.has(id)) return table;
  const next = new Map(table);
  next.delete(id);
  return next;
}

/**
 * The event a push-pull entry from a peer turns into. A remote "dead" becomes a suspicion, as in
 * memberlist's mergeState: the accused gets a chance to refute instead of being declared dead by hearsay
 * (this is what lets a healed partition re-merge).
 */
export function eventFromRemote(m: Member, from: PeerId): MemberEvent {
  switch (m.state) {
    case "alive":
      return { type: "alive", id: m.id, incarnation: m.incarnation, addrs: m.addrs, meta: m.meta };
    case "suspect":
    case "dead":
      return { type: "suspect", id: m.id, incarnation: m.incarnation, from };
    case "left":
      return { type: "leave", id: m.id, incarnation: m.incarnation };
  }
}

/** Members counted for log(N) scaling: alive and suspect, including this node. */
export function liveCount(table: MemberTable): number {
  let n = 0;
  for (const m of table.values()) if (m.state === "alive" || m.state === "suspect") n++;
  return n;
}
