// The Assignment: the Plan a leader chose, versioned, with the model it is for. It rides on membership as
// the delegate "pipeline": a small announcement {version, leader} is gossiped, and the full Assignment
// travels in push-pull state (the leader pushes it to every member at once; a late or restarted node gets
// it from its first push-pull). The latest wins: higher version, then higher leader id.
import type { DelegateHandle, GossipDelegate } from "../membership/swim.ts";
import type { PeerAddr, PeerId } from "../transport/transport.ts";
import type { ModelRef } from "./backend.ts";
import type { PlanStages } from "./roles.ts";
import type { WireDtype } from "./messages.ts";

export interface Assignment {
  version: number;
  /** The node that made it. */
  leader: PeerId;
  /** The Plan (docs/PLAN_FORMAT.md); the chain reads `stages`. */
  plan: PlanStages & Record<string, unknown>;
  model: ModelRef;
  /** The model's layer count. */
  layers: number;
  /**
   * The activations between stages of requests that name none (`up --wire`); absent (an older leader's
   * Assignment): f16. A re-plan keeps it.
   */
  wire?: WireDtype;
  /**
   * The nodes whose loss made the leader publish this Assignment (node/stage/recovery.ts), and why ("died",
   * "left"); absent on a Plan not made by a recovery. The clients name the lost stage of the requests they
   * resume from it, since their own membership may not have heard of the loss yet.
   */
  lost?: { node: string; reason: string }[];
}

/** What the delegate needs from membership (Membership satisfies it). */
export interface AssignmentHost {
  readonly id: PeerId;
  addDelegate(name: string, d: GossipDelegate): DelegateHandle;
  members(): { id: PeerId; state: string; addrs: string[] }[];
  pushPull(peer?: PeerAddr): void;
}

export function newerAssignment(
  a: { version: number; leader: string },
  b?: { version: number; leader: string },
): boolean {
  if (!b) return true;
  return a.version !== b.version ? a.version > b.version : a.leader > b.leader;
}

const enc = new TextEncoder();
const dec = new TextDecoder();

function parse(bytes: Uint8Array): Record<string, unknown> | undefined {
  try {
    const v = JSON.parse(dec.decode(bytes));
    if (
      typeof v !== "object" || v === null || typeof v.version !== "number" || typeof v.leader !== "string"
    ) {
      return undefined;
    }
    return v;
  } catch {
    return undefined;
  }
}

export class AssignmentBoard {
  #host: AssignmentHost;
  #current: Assignment | undefined;
  #handle: DelegateHandle;
  #listeners = new Set<(a: Assignment) => void>();

  constructor(host: AssignmentHost) {
    this.#host = host;
    this.#handle = host.addDelegate("pipeline", {
      localState: () => (this.#current ? enc.encode(JSON.stringify(this.#current)) : undefined),
      mergeRemoteState: (bytes) => this.#merge(bytes),
      notifyMsg: (bytes, from) => this.#announced(bytes, from),
    });
  }

  get current(): Assignment | undefined {
    return this.#current;
  }

  /** Calls `cb` with every newer Assignment; returns an unsubscribe function. */
  onChange(cb: (a: Assignment) => void): () => void {
    this.#listeners.add(cb);
    return () => this.#listeners.delete(cb);
  }

  /** Publishes a new Assignment made here (a version above any seen) and pushes it to every live member. */
  publish(a: Omit<Assignment, "version" | "leader">): Assignment {
    const version = Math.max(Date.now(), (this.#current?.version ?? 0) + 1);
    const full: Assignment = { ...a, version, leader: this.#host.id };
    this.#adopt(full);
    this.#handle.broadcast("plan", enc.encode(JSON.stringify({ version, leader: full.leader })));
    for (const m of this.#host.members()) {
      if (m.id !== this.#host.id && m.state === "alive") this.#host.pushPull({ id: m.id, addrs: m.addrs });
    }
    return full;
  }

  close(): void {
    this.#handle.remove();
  }

  #merge(bytes: Uint8Array): void {
    const v = parse(bytes);
    if (!v || typeof v.plan !== "object" || typeof v.model !== "object" || typeof v.layers !== "number") {
      return;
    }
    const a = v as unknown as Assignment;
    if (!newerAssignment(a, this.#current)) return;
    this.#adopt(a);
    // Announce it on: a member whose push from the leader was lost hears of it from many members then,
    // not only from the leader's few retransmits (which the same loss may have eaten), and pulls it.
    this.#handle.broadcast("plan", enc.encode(JSON.stringify({ version: a.version, leader: a.leader })));
  }

  #announced(bytes: Uint8Array, from: PeerId): void {
    const v = parse(bytes);
    if (!v) return;
    const a = v as { version: number; leader: string };
    if (!newerAssignment(a, this.#current)) return;
    // Fetch the full Assignment from its leader (its push may have been lost or not reached us yet), and
    // from the member that announced it (which has it, when it announced after adopting).
    for (const id of new Set([a.leader, from])) {
      const m = this.#host.members().find((x) => x.id === id && x.state === "alive");
      if (m && m.id !== this.#host.id) this.#host.pushPull({ id: m.id, addrs: m.addrs });
    }
    this.#handle.broadcast("plan", bytes);
  }

  #adopt(a: Assignment): void {
    this.#current = a;
    for (const cb of this.#listeners) {
      try {
        cb(a);
      } catch {
        // a listener's bug must not break replication
      }
    }
  }
}
