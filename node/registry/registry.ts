// The name registry: actor name -> owner node, replicated over membership. Writes are broadcast on
// membership's gossip (each node that learns something new gossips it on, like membership events);
// the whole table rides in every push-pull, so nodes that missed a broadcast catch up. Entries of a
// member that membership declares dead or left are dropped everywhere (each node does it itself).
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
}

/** A name's owner changed; owner undefined means the name is gone. */
export type Watcher = (name: string, owner: PeerId | undefined) => void;

export class Registry {
  /** Malformed registry payloads dropped. */
  malformed = 0;
  #host: RegistryHost;
  #entries = new Map<string, Entry>();
  #watchers = new Set<Watcher>();
  #handle: DelegateHandle;
  #unsubscribe: () => void;

  /** Attaches to `host` under the delegate name "registry". */
  constructor(host: RegistryHost) {
    this.#host = host;
    this.#handle = host.addDelegate("registry", {
      localState: () => encodeEntries([...this.#entries.values()]),
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

  #write(name: string, owner: PeerId | null): void {
    const prev = this.#entries.get(name);
    const e: Entry = { name, owner, version: (prev?.version ?? 0) + 1, writer: this.#host.id };
    this.#set(e, prev);
    this.#handle.broadcast(name, encodeEntries([e]));
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
    const prev = this.#entries.get(e.name);
    if (prev && !newer(e, prev)) return;
    const self = this.#host.id;
    if (e.owner === self && prev?.owner !== self) {
      // An entry naming us that we did not write in this life (we restarted): withdraw it.
      this.#entries.set(e.name, e);
      this.#write(e.name, null);
      return;
    }
    if (e.owner === null && e.writer === self && prev?.owner === self && e.version === prev.version) {
      // Others dropped our entry because they thought we died; we are alive: claim it again.
      this.#write(e.name, self);
      return;
    }
    if (e.owner !== null && e.owner !== self) {
      const m = this.#host.member(e.owner);
      if (m && (m.state === "dead" || m.state === "left")) return; // stale: its owner is gone
    }
    this.#set(e, prev);
    if (rebroadcast) this.#handle.broadcast(e.name, encodeEntries([e]));
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

  #set(e: Entry, prev: Entry | undefined): void {
    this.#entries.set(e.name, e);
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
