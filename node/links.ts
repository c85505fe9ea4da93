// Link timings between members, measured continuously at no cost in packets: SWIM already pings every
// member in turn, and each direct ping's ack times a round trip (Membership.onRtt). Each node smooths the
// round trips it measures into its own row of the cluster's link table and gossips each link whose estimate
// moved on membership's broadcasts (piggybacked on pings and acks); the whole table rides in push-pulls, so
// every node holds every row and the planner sees the cluster's links (planner/live.ts). Each estimate
// travels with its age (ms since its last sample), so nodes date it without a common clock.
//
// The estimate is the smallest of the last `window` round trips (a windowed minimum, as TCP's BBR keeps):
// an ack that waited behind a busy event loop (a GPU step, a node measuring itself, loading weights) says
// nothing about the link, and a chain's hop finds its receiver idle, waiting for it. A lasting change shows
// at once when faster; when slower, after SLOWER_RUN samples in a row well above the estimate and within 1.5x
// of each other (each link is sampled about once per probe interval times the members: on lan 1 s each).
import type { DelegateHandle, MemberChange } from "./membership/mod.ts";
import type { GossipDelegate, Member } from "./membership/mod.ts";
import type { PeerId } from "./transport/transport.ts";

/** One link as a node measured it. */
export interface LinkEstimate {
  /** Round trip, ms: the smallest of the last few samples (see the top of this file). */
  rttMs: number;
  /** Throughput, Mbit/s; null: not measured (see docs/NODE.md). */
  mbps: number | null;
  /** ms since the measuring node's last sample, as this node reckons it. */
  ageMs: number;
  /** Samples the estimate rests on. */
  samples: number;
}

/** What Links needs from membership (Membership satisfies it). */
export interface LinksHost {
  readonly id: PeerId;
  now(): number;
  member(id: PeerId): Member | undefined;
  onChange(cb: (c: MemberChange) => void): () => void;
  onRtt(cb: (peer: PeerId, ms: number) => void): () => void;
  addDelegate(name: string, d: GossipDelegate): DelegateHandle;
}

export interface LinksOptions {
  /** Round trips the estimate is the minimum of (default 8). */
  window?: number;
  /** Gossip a link again when its estimate moved by this fraction since it was last gossiped (default 0.2)... */
  change?: number;
  /** ...and by at least this many ms (default 0.1). */
  minChangeMs?: number;
  /** This process's start, ms since the epoch (default now): a restarted node's rows replace its old ones. */
  boot?: number;
}

interface Stored {
  rttMs: number;
  /** The last samples, oldest first (this node's own links only). */
  recent?: number[];
  mbps: number | null;
  /** Local clock time of the last sample. */
  sampledAt: number;
  samples: number;
}

interface Row {
  /** The measuring node's start time: a higher one is a newer life of that node. */
  boot: number;
  links: Map<PeerId, Stored>;
}

/** On the wire: [to, rtt ms, mbps or null, age ms, samples]. */
type WireLink = [string, number, number | null, number, number];
/** On the wire: one node's links (all of them in a push-pull, one in a broadcast). */
interface WireRow {
  f: string;
  b: number;
  l: WireLink[];
}

/** Samples in a row above 1.5 x the estimate + 1 ms, within 1.5x of each other, that replace the window. */
const SLOWER_RUN = 3;
const LIMITS = { rows: 4096, links: 4096, idChars: 256 };
const enc = new TextEncoder();
const dec = new TextDecoder("utf-8", { fatal: true });

export class Links {
  /** Malformed payloads dropped. */
  malformed = 0;
  /** Round-trip samples taken, and links gossiped (each a broadcast on membership's queue). */
  readonly stats = { samples: 0, gossiped: 0 };
  #host: LinksHost;
  #window: number;
  #change: number;
  #minChangeMs: number;
  #boot: number;
  #rows = new Map<PeerId, Row>();
  /** The estimate each of this node's links had when last gossiped. */
  #gossiped = new Map<PeerId, number>();
  #handle: DelegateHandle;
  #unsubscribe: (() => void)[];

  /** Attaches to `host` under the delegate name "links". */
  constructor(host: LinksHost, opts: LinksOptions = {}) {
    this.#host = host;
    this.#window = opts.window ?? 8;
    this.#change = opts.change ?? 0.2;
    this.#minChangeMs = opts.minChangeMs ?? 0.1;
    this.#boot = opts.boot ?? Date.now();
    if (!(Number.isInteger(this.#window) && this.#window >= 1)) {
      throw new RangeError(`window must be an integer >= 1, got ${this.#window}`);
    }
    this.#rows.set(host.id, { boot: this.#boot, links: new Map() });
    this.#handle = host.addDelegate("links", {
      localState: () => this.#encode([...this.#rows.keys()].map((f) => this.#wireRow(f))),
      mergeRemoteState: (state) => this.#merge(state),
      notifyMsg: (payload) => this.#merge(payload),
    });
    this.#unsubscribe = [
      host.onRtt((peer, ms) => this.observe(peer, ms)),
      host.onChange((c) => this.#onMember(c)),
    ];
  }

  /** Takes one round-trip sample to `peer`, ms (membership calls it for every direct ping answered). */
  observe(peer: PeerId, rttMs: number): void {
    if (peer === this.#host.id || !(rttMs >= 0) || !Number.isFinite(rttMs)) return;
    this.stats.samples++;
    const own = this.#rows.get(this.#host.id)!.links;
    const cur = own.get(peer);
    const now = this.#host.now();
    let recent = [...(cur?.recent ?? []), rttMs].slice(-this.#window);
    // Samples in a row well above the estimate and close to each other: the link got slower (a route, a WAN
    // delay); start over. Acks held up by a busy peer scatter instead (1 ms, 14 ms, 6 ms).
    const tail = recent.slice(-SLOWER_RUN);
    if (
      cur && tail.length === SLOWER_RUN && tail.every((x) => x > cur.rttMs * 1.5 + 1) &&
      Math.max(...tail) <= 1.5 * Math.min(...tail)
    ) recent = tail;
    const next: Stored = {
      rttMs: Math.min(...recent),
      recent,
      mbps: cur?.mbps ?? null,
      sampledAt: now,
      samples: (cur?.samples ?? 0) + 1,
    };
    own.set(peer, next);
    const last = this.#gossiped.get(peer);
    const moved = last === undefined ||
      Math.abs(next.rttMs - last) > Math.max(this.#change * last, this.#minChangeMs);
    if (moved) {
      this.#gossiped.set(peer, next.rttMs);
      this.stats.gossiped++;
      this.#handle.broadcast(
        peer,
        this.#encode([{ f: this.#host.id, b: this.#boot, l: [this.#wireLink(peer, next)] }]),
      );
    }
  }

  /** The links node `from` measured (this node's own, or as last gossiped), by peer id. */
  of(from: PeerId): Map<PeerId, LinkEstimate> {
    const out = new Map<PeerId, LinkEstimate>();
    const row = this.#rows.get(from);
    if (!row) return out;
    const now = this.#host.now();
    for (const [to, s] of row.links) {
      out.set(to, {
        rttMs: s.rttMs,
        mbps: s.mbps,
        ageMs: Math.max(0, now - s.sampledAt),
        samples: s.samples,
      });
    }
    return out;
  }

  /** Nodes whose rows this node holds. */
  rows(): PeerId[] {
    return [...this.#rows.keys()];
  }

  /** Detaches from membership. */
  close(): void {
    this.#handle.remove();
    for (const u of this.#unsubscribe) u();
  }

  #wireLink(to: PeerId, s: Stored): WireLink {
    const age = Math.max(0, Math.round(this.#host.now() - s.sampledAt));
    return [
      to,
      Number(s.rttMs.toFixed(3)),
      s.mbps === null ? null : Number(s.mbps.toFixed(1)),
      age,
      s.samples,
    ];
  }

  #wireRow(from: PeerId): WireRow {
    const row = this.#rows.get(from)!;
    return { f: from, b: row.boot, l: [...row.links].map(([to, s]) => this.#wireLink(to, s)) };
  }

  #encode(rows: WireRow[]): Uint8Array {
    return enc.encode(JSON.stringify(rows));
  }

  #merge(bytes: Uint8Array): void {
    const rows = decodeRows(bytes);
    if (!rows) {
      this.malformed++;
      return;
    }
    const now = this.#host.now();
    for (const r of rows) {
      if (r.f === this.#host.id) continue; // our own row is ours to say
      const m = this.#host.member(r.f);
      if (m && (m.state === "dead" || m.state === "left")) continue;
      let row = this.#rows.get(r.f);
      if (row && r.b < row.boot) continue; // an earlier life of that node
      if (!row || r.b > row.boot) this.#rows.set(r.f, row = { boot: r.b, links: new Map() });
      for (const [to, rttMs, mbps, age, samples] of r.l) {
        const cur = row.links.get(to);
        if (cur && samples <= cur.samples) continue;
        row.links.set(to, { rttMs, mbps, sampledAt: now - age, samples });
      }
    }
  }

  #onMember(c: MemberChange): void {
    const { member } = c;
    if (member.id === this.#host.id || (member.state !== "dead" && member.state !== "left")) return;
    this.#rows.delete(member.id);
    for (const row of this.#rows.values()) row.links.delete(member.id);
    this.#gossiped.delete(member.id);
  }
}

/** Strict decoder of a links payload; undefined when it is not exactly one. */
function decodeRows(bytes: Uint8Array): WireRow[] | undefined {
  let v: unknown;
  try {
    v = JSON.parse(dec.decode(bytes));
  } catch {
    return undefined;
  }
  if (!Array.isArray(v) || v.length > LIMITS.rows) return undefined;
  const isId = (x: unknown): x is string =>
    typeof x === "string" && x.length > 0 && x.length <= LIMITS.idChars;
  const isNum = (x: unknown): x is number => typeof x === "number" && Number.isFinite(x) && x >= 0;
  const out: WireRow[] = [];
  for (const r of v) {
    if (typeof r !== "object" || r === null) return undefined;
    const { f, b, l } = r as Record<string, unknown>;
    if (!isId(f) || !isNum(b) || !Array.isArray(l) || l.length > LIMITS.links) return undefined;
    const links: WireLink[] = [];
    for (const x of l) {
      if (!Array.isArray(x) || x.length !== 5) return undefined;
      const [to, rtt, mbps, age, n] = x;
      if (!isId(to) || !isNum(rtt) || !(mbps === null || isNum(mbps)) || !isNum(age)) return undefined;
      if (!(Number.isSafeInteger(n) && n >= 1)) return undefined;
      links.push([to, rtt, mbps, age, n]);
    }
    out.push({ f, b, l: links });
  }
  return out;
}
