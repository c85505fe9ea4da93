// The piggyback queue (memberlist's TransmitLimitedQueue). Each broadcast is sent at most
// retransmitMult * ceil(log10(N + 1)) times; the least-sent go first so news spreads before repeats;
// a newer broadcast with the same key (about the same member, or the same registry name) replaces the
// older one, which is then stale.

interface Item {
  key: string;
  bytes: Uint8Array;
  transmits: number;
  /** Insertion order, newest highest: among equal transmits, newer first. */
  id: number;
}

export class BroadcastQueue {
  #items = new Map<string, Item>();
  #next = 0;
  #retransmitMult: number;

  constructor(retransmitMult: number) {
    this.#retransmitMult = retransmitMult;
  }

  /** The retransmit limit for a cluster of `n` live members. */
  limit(n: number): number {
    return this.#retransmitMult * Math.max(1, Math.ceil(Math.log10(n + 1)));
  }

  /** Queues an encoded message, replacing any queued message with the same key. */
  queue(key: string, bytes: Uint8Array): void {
    this.#items.set(key, { key, bytes, transmits: 0, id: this.#next++ });
  }

  /** Number of queued broadcasts. */
  get length(): number {
    return this.#items.size;
  }

  /**
   * Takes broadcasts whose framed size (bytes + overhead each) fits in `budget`, fewest transmits first,
   * counts a transmit for each, and drops those that reached the limit for `n` members.
   */
  take(budget: number, overhead: number, n: number): Uint8Array[] {
    if (this.#items.size === 0 || budget <= overhead) return [];
    const limit = this.limit(n);
    const items = [...this.#items.values()].sort((a, b) => a.transmits - b.transmits || b.id - a.id);
    const out: Uint8Array[] = [];
    let left = budget;
    for (const it of items) {
      const size = it.bytes.length + overhead;
      if (size > left) continue;
      left -= size;
      out.push(it.bytes);
      it.transmits++;
      if (it.transmits >= limit) this.#items.delete(it.key);
      if (left <= overhead) break;
    }
    return out;
  }

  /** Drops everything (on leave/stop). */
  clear(): void {
    this.#items.clear();
  }
}
