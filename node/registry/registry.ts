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
import type { DelegateHandle, GossipDelegate, MemberChange } from "../membership/swim.ts";
import type { Member } from "../membership/state.ts";
import type { PeerId } from "../transport/transport.ts";
import { decodeEntries, encodeEntries, type Entry, newer } from "./entry.ts";

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

/** A name's owner changed; owner undefined means the name is gone. */
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
    this.#write(name, this.#host.id);
  }

  /** Removes `name` if this node owns it; returns whether it did. */
  unregister(name: string): boolean {
    const e = this.#entries.get(name);
    if (!e || e.owner !== this.#host.id) return false;
    this.#write(name, null);
    return true;
  }

  /** The node hosting `name`, or undefined. */
  resolve(name: string): PeerId | undefined {
    return this.#entries.get(name)?.owner ?? undefined;
  }

  /** Live entries, name -> owner, sorted by name. */
  entries(): [string, PeerId][] {
    const out: [string, PeerId][] = [];
    for (const e of this.#entries.values()) if (e.owner !== null) out.push([e.name, e.owner]);
    return out.sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0));
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

  /** Writes a new version of `name`, above `floor` too (a version seen elsewhere), and broadcasts it. */
  #write(name: string, owner: PeerId | null, floor = 0): void {
    const prev = this.#entries.get(name);
    const version = Math.max(prev?.version ?? 0, floor) + 1;
    const e: Entry = { name, owner, version, writer: this.#host.id };
    this.#set(e, prev);
    this.#handle.broadcast(name, this.#encode([e]));
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
      this.#write(e.name, self, e.version);
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

  #onMember(c: MemberChange): void {
    const { member } = c;
    if (member.state !== "dead" && member.state !== "left") return;
    if (member.id === this.#host.id) return;
    for (const e of [...this.#entries.values()]) {
      // The same tombstone on every node: same version and writer, owner null (wins ties, see newer).
      if (e.owner === member.id) this.#set({ ...e, owner: null }, e);
    }
  }

  /** Stores `e` (a tombstone `age` ms old) and tells the watchers if the owner changed. */
  #set(e: Entry, prev: Entry | undefined, age = 0): void {
    this.#entries.set(e.name, e);
    if (e.owner !== null) this.#tombSince.delete(e.name);
    else this.#tombSince.set(e.name, this.#host.now() - age);
    if ((prev?.owner ?? null) === e.owner) return;
    for (const w of this.#watchers) {
      try {
        w(e.name, e.owner ?? undefined);
      } catch {
        // A watcher's bug must not break replication.
      }
    }
  }
}
