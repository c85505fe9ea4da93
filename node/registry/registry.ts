// The name registry: actor name -> owner node, replicated over membership. Writes are broadcast on
// membership's gossip (each node that learns something new gossips it on, like membership events);
// the whole table rides in every push-pull, so nodes that missed a broadcast catch up. Entries of a
// member that membership declares dead or left are dropped everywhere (each node does it itself).
// Tombstones are forgotten `tombstoneTtlMs` after they came to be (the table would otherwise grow with
// every name ever used): each carries its age on the wire, so every node dates it the same way without a
// common clock, forgets it at about the same time, and ignores one that is already too old (no node
// re-teaches a forgotten tombstone to another). What could go wrong after that heals itself: a stale live
// entry that comes back is withdrawn by its owner (or rejected, its owner being dead), and an owner that
// sees a tombstone for a name it holds claims the name again above that tombstone's version.
//
// Name sets (name_set.ts) keep large families of names compact: a node that hosts experts registers
// "layers 5 and 6, experts 0-47" as a few set entries (parts) instead of one entry per expert, and
// `resolve("moe-expert-5-17")` looks the name up in the sets when no entry of that exact name exists. Set
// entries are ordinary entries (versions, gossip, push-pull, tombstones, dead-owner cleanup), one per
// part and holder, so two holders of one name (a replicated expert) never conflict.
import type { DelegateHandle, GossipDelegate, MemberChange } from "../membership/swim.ts";
import type { Member } from "../membership/state.ts";
import type { PeerId } from "../transport/transport.ts";
import { decodeEntries, encodeEntries, type Entry, newer } from "./entry.ts";
import {
  checkPrefix,
  decodePart,
  encodeParts,
  type Groups,
  nameInSet,
  parseSetName,
  type Ranges,
  setEntryName,
  toGroups,
} from "./name_set.ts";

/** One holder's set of names under a prefix (every part merged). */
export interface NameSetView {
  prefix: string;
  owner: PeerId;
  /** Group key -> half-open ranges [start, end), ascending. */
  groups: Record<string, Ranges>;
}

/** Per prefix, per group: the runs of ids and who holds them (built from the set entries on demand). */
type SetIndex = Map<string, Map<string, { start: number; end: number; owner: PeerId }[]>>;

/** What the registry needs from membership (Membership satisfies it). */
export interface RegistryHost {
  readonly id: PeerId;
  member(id: PeerId): Member | undefined;
  onChange(cb: (c: MemberChange) => void): () => void;
  addDelegate(name: string, d: GossipDelegate): DelegateHandle;
  /** Current time, ms (membership's clock). */
  now(): number;
}

export interface RegistryOptions {
  /**
   * How long a tombstone is kept after it came to be (its write, or its owner's death), ms. Long enough
   * for it to have reached every node by gossip or push-pull. Default 10 minutes (20 push-pulls with lan).
   */
  tombstoneTtlMs?: number;
}

/**
 * A name's owner changed; owner undefined means the name is gone. For a set entry (a part of a name set,
 * `${prefix}*${part}@${holder}`) it is also called when the names the part covers change.
 */
export type Watcher = (name: string, owner: PeerId | undefined) => void;

export class Registry {
  /** Malformed registry payloads dropped. */
  malformed = 0;
  #host: RegistryHost;
  #entries = new Map<string, Entry>();
  /** When each tombstone in #entries came to be (local clock, dated back by its age on the wire). */
  #tombSince = new Map<string, number>();
  #ttl: number;
  #watchers = new Set<Watcher>();
  /** The set entries' index; undefined when a set entry changed since it was built. */
  #index: SetIndex | undefined;
  #handle: DelegateHandle;
  #unsubscribe: () => void;

  /** Attaches to `host` under the delegate name "registry". */
  constructor(host: RegistryHost, opts: RegistryOptions = {}) {
    this.#host = host;
    this.#ttl = opts.tombstoneTtlMs ?? 600_000;
    this.#handle = host.addDelegate("registry", {
      localState: () => {
        this.#forgetOldTombstones();
        return this.#encode([...this.#entries.values()]);
      },
      mergeRemoteState: (state) => this.#mergeAll(state, false),
      notifyMsg: (payload) => this.#mergeAll(payload, true),
    });
    this.#unsubscribe = host.onChange((c) => this.#onMember(c));
  }

  /**
   * Claims `name` for this node: a new version above any known one, so it wins over earlier owners
   * (deliberate takeover); two nodes claiming at once: the higher node id wins (see entry.ts `newer`).
   */
  register(name: string): void {
    if (typeof name !== "string" || name.length === 0 || name.length > 256) {
      throw new TypeError(`registry name must be a string of 1..256 characters, got ${JSON.stringify(name)}`);
    }
    if (parseSetName(name)) {
      throw new TypeError(`registry name "${name}" has the form of a name set's part; use registerSet`);
    }
    this.#write(name, this.#host.id);
  }

  /** Removes `name` if this node owns it; returns whether it did. */
  unregister(name: string): boolean {
    const e = this.#entries.get(name);
    if (!e || e.owner !== this.#host.id) return false;
    this.#write(name, null);
    return true;
  }

  /**
   * Claims every name `${prefix}${group}-${i}` for i in each group's ranges [start, end), e.g.
   * registerSet("moe-expert-", {"5": [[0, 48]]}) for experts 0-47 of layer 5, replacing what this node
   * held under `prefix` before (an empty record withdraws it all). Other nodes may hold the same names
   * (replicas): resolve picks one, owners lists all. TypeError / RangeError on a bad prefix, group or range.
   */
  registerSet(prefix: string, groups: Record<string, Iterable<readonly [number, number]>>): void {
    checkPrefix(prefix);
    const parts = encodeParts(toGroups(groups));
    const self = this.#host.id;
    const written: Entry[] = [];
    parts.forEach((text, i) => {
      const name = setEntryName(prefix, i, self);
      if (this.#entries.get(name)?.set !== text) written.push(this.#write(name, self, 0, text));
    });
    for (const e of [...this.#entries.values()]) {
      const p = parseSetName(e.name);
      if (p && p.prefix === prefix && p.holder === self && p.part >= parts.length && e.owner === self) {
        written.push(this.#write(e.name, null));
      }
    }
    // A set changes when a Plan does, and every member needs it soon: besides the gossip, tell each member
    // directly (one message each), so no member waits for a push-pull because every retransmit missed it.
    if (written.length) this.#handle.sendToMembers(this.#encode(written));
  }

  /** Withdraws this node's set under `prefix`; returns whether it held one. */
  unregisterSet(prefix: string): boolean {
    checkPrefix(prefix);
    const held = this.sets().some((s) => s.prefix === prefix && s.owner === this.#host.id);
    this.registerSet(prefix, {});
    return held;
  }

  /** The node hosting `name`, or undefined: an entry of that exact name first, else a set holding it. */
  resolve(name: string): PeerId | undefined {
    const e = this.#entries.get(name);
    if (e?.owner) return e.owner;
    return this.#fromSets(name)[0];
  }

  /**
   * The node hosting `name` once there is one: at once where `resolve` finds it, else when a registration
   * (local or by gossip) makes it resolve. Rejects with `signal`'s reason when it aborts, or after
   * `timeoutMs` with an Error naming the name.
   */
  whenResolved(name: string, o: { timeoutMs: number; signal?: AbortSignal }): Promise<PeerId> {
    const now = this.resolve(name);
    if (now !== undefined) return Promise.resolve(now);
    return new Promise((resolve, reject) => {
      const done = () => {
        clearTimeout(timer);
        unwatch();
        o.signal?.removeEventListener("abort", onAbort);
      };
      const onAbort = () => (done(), reject(o.signal!.reason));
      const unwatch = this.watch(() => {
        const owner = this.resolve(name);
        if (owner !== undefined) done(), resolve(owner);
      });
      const timer = setTimeout(
        () => (done(), reject(new Error(`no node registered "${name}" within ${o.timeoutMs} ms`))),
        o.timeoutMs,
      );
      if (o.signal?.aborted) onAbort();
      else o.signal?.addEventListener("abort", onAbort, { once: true });
    });
  }

  /** Every node hosting `name` (an exact entry's owner, then the holders of sets that cover it), sorted. */
  owners(name: string): PeerId[] {
    const exact = this.#entries.get(name)?.owner;
    const fromSets = this.#fromSets(name);
    return exact && !fromSets.includes(exact) ? [exact, ...fromSets].sort() : fromSets;
  }

  /** Live entries, name -> owner, sorted by name (ordinary names; the sets are in `sets()`). */
  entries(): [string, PeerId][] {
    const out: [string, PeerId][] = [];
    for (const e of this.#entries.values()) {
      if (e.owner !== null && e.set === undefined) out.push([e.name, e.owner]);
    }
    return out.sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0));
  }

  /** Live name sets, one per (prefix, holder) with its parts merged, sorted by prefix then holder. */
  sets(): NameSetView[] {
    const merged = new Map<string, { prefix: string; owner: PeerId; groups: Groups }>();
    for (const e of this.#entries.values()) {
      if (e.owner === null || e.set === undefined) continue;
      const p = parseSetName(e.name)!;
      const key = `${p.prefix}\n${e.owner}`;
      const m = merged.get(key) ?? { prefix: p.prefix, owner: e.owner, groups: new Map() };
      for (const [g, r] of decodePart(e.set)!) m.groups.set(g, [...(m.groups.get(g) ?? []), ...r]);
      merged.set(key, m);
    }
    return [...merged.values()]
      .sort((a, b) => (a.prefix !== b.prefix ? (a.prefix < b.prefix ? -1 : 1) : a.owner < b.owner ? -1 : 1))
      .map((m) => ({
        prefix: m.prefix,
        owner: m.owner,
        groups: Object.fromEntries(
          [...m.groups].sort((a, b) => (a[0] < b[0] ? -1 : 1)).map((
            [g, r],
          ) => [g, toGroups({ [g]: r }).get(g)!]),
        ),
      }));
  }

  /** Tombstones held (unregistered names and dead owners' names not yet forgotten). */
  tombstones(): number {
    return this.#tombSince.size;
  }

  /** Calls `cb` whenever a name's owner changes; returns an unsubscribe function. */
  watch(cb: Watcher): () => void {
    this.#watchers.add(cb);
    return () => this.#watchers.delete(cb);
  }

  /** Detaches from membership. */
  close(): void {
    this.#handle.remove();
    this.#unsubscribe();
  }

  /**
   * Writes a new version of `name` (with `set`, for a set entry), above `floor` too (a version seen
   * elsewhere), and broadcasts it.
   */
  #write(name: string, owner: PeerId | null, floor = 0, set?: string): Entry {
    const prev = this.#entries.get(name);
    const version = Math.max(prev?.version ?? 0, floor) + 1;
    const e: Entry = { name, owner, version, writer: this.#host.id };
    if (owner !== null && set !== undefined) e.set = set;
    this.#set(e, prev);
    this.#handle.broadcast(name, this.#encode([e]));
    return e;
  }

  /** Entries for the wire: tombstones with their age. */
  #encode(entries: Entry[]): Uint8Array {
    const now = this.#host.now();
    return encodeEntries(entries.map((e) => {
      if (e.owner !== null) return e;
      return { ...e, age: Math.max(0, Math.round(now - (this.#tombSince.get(e.name) ?? now))) };
    }));
  }

  #mergeAll(bytes: Uint8Array, rebroadcast: boolean): void {
    const entries = decodeEntries(bytes);
    if (!entries) {
      this.malformed++;
      return;
    }
    for (const e of entries) this.#merge(e, rebroadcast);
  }

  #merge(e: Entry, rebroadcast: boolean): void {
    if (e.owner === null && (e.age ?? 0) >= this.#ttl) return; // forgotten everywhere by now
    const prev = this.#entries.get(e.name);
    if (prev && !newer(e, prev)) return;
    const self = this.#host.id;
    if (e.owner === self && prev?.owner !== self) {
      // An entry naming us that we did not write in this life (we restarted): withdraw it.
      this.#entries.set(e.name, e);
      this.#write(e.name, null);
      return;
    }
    if (e.owner === null && prev?.owner === self) {
      // A tombstone for a name we hold: others dropped our entry because they thought we died, or kept an
      // old tombstone of a name we registered again after forgetting it. We are alive: claim it again.
      this.#write(e.name, self, e.version, prev.set);
      return;
    }
    if (e.owner !== null && e.owner !== self) {
      const m = this.#host.member(e.owner);
      if (m && (m.state === "dead" || m.state === "left")) return; // stale: its owner is gone
    }
    const { age = 0, ...entry } = e;
    this.#set(entry, prev, age);
    if (rebroadcast) this.#handle.broadcast(e.name, this.#encode([entry]));
  }

  #forgetOldTombstones(): void {
    const cutoff = this.#host.now() - this.#ttl;
    for (const [name, since] of this.#tombSince) {
      if (since > cutoff) continue;
      this.#tombSince.delete(name);
      this.#entries.delete(name);
    }
  }

  /** Holders of `name` through the sets, sorted. */
  #fromSets(name: string): PeerId[] {
    const index = this.#index ??= this.#buildIndex();
    const out = new Set<PeerId>();
    for (const [prefix, groups] of index) {
      const at = nameInSet(name, prefix);
      const runs = at && groups.get(at.group);
      if (!runs) continue;
      for (const r of runs) if (r.start <= at.index && at.index < r.end) out.add(r.owner);
    }
    return [...out].sort();
  }

  #buildIndex(): SetIndex {
    const index: SetIndex = new Map();
    for (const e of this.#entries.values()) {
      if (e.owner === null || e.set === undefined) continue;
      const prefix = parseSetName(e.name)!.prefix;
      const groups = index.get(prefix) ?? new Map();
      index.set(prefix, groups);
      for (const [g, ranges] of decodePart(e.set)!) {
        const runs = groups.get(g) ?? [];
        for (const [start, end] of ranges) runs.push({ start, end, owner: e.owner });
        groups.set(g, runs);
      }
    }
    return index;
  }

  #onMember(c: MemberChange): void {
    const { member } = c;
    if (member.state !== "dead" && member.state !== "left") return;
    if (member.id === this.#host.id) return;
    for (const e of [...this.#entries.values()]) {
      // The same tombstone on every node: same version and writer, owner null (wins ties, see newer).
      if (e.owner !== member.id) continue;
      const { set: _, ...rest } = e;
      this.#set({ ...rest, owner: null }, e);
    }
  }

  /** Stores `e` (a tombstone `age` ms old) and tells the watchers if the owner changed. */
  #set(e: Entry, prev: Entry | undefined, age = 0): void {
    this.#entries.set(e.name, e);
    if (e.owner !== null) this.#tombSince.delete(e.name);
    else this.#tombSince.set(e.name, this.#host.now() - age);
    if (e.set !== prev?.set) this.#index = undefined;
    if ((prev?.owner ?? null) === e.owner && e.set === prev?.set) return;
    for (const w of this.#watchers) {
      try {
        w(e.name, e.owner ?? undefined);
      } catch {
        // A watcher's bug must not break replication.
      }
    }
  }
}
