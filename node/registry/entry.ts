// A registry entry and the rule that picks between two versions of one name. Pure.
import type { PeerId } from "../transport/transport.ts";
import { decodePart, parseSetName } from "./name_set.ts";

export interface Entry {
  /** Actor name, e.g. "stage-3" or "moe-expert-7-12". */
  name: string;
  /** The node hosting the actor; null marks a tombstone (unregistered, or its owner died). */
  owner: PeerId | null;
  /** Raised by one on every write of this name; the higher version wins. */
  version: number;
  /** The node that wrote this version (breaks ties between concurrent writes). */
  writer: PeerId;
  /**
   * Tombstones on the wire only: ms since the tombstone came to be, as the sender knows it (a duration,
   * so nodes need no common clock). Receivers date it back by this much and forget it at the same age.
   */
  age?: number;
  /**
   * Set entries only (name `${prefix}*${part}@${owner}`, name_set.ts): the groups and ranges of names this
   * part stands for, as text. Live set entries carry it; tombstones do not.
   */
  set?: string;
}

/**
 * Conflict resolution, deterministic on every node: the higher version wins; on equal versions the
 * higher writer id (plain string comparison) wins; on equal (version, writer) a tombstone wins over a
 * live entry (so every node's local cleanup of a dead owner's entry agrees with every other's).
 */
export function newer(a: Entry, b: Entry): boolean {
  if (a.version !== b.version) return a.version > b.version;
  if (a.writer !== b.writer) return a.writer > b.writer;
  return a.owner === null && b.owner !== null;
}

const MAX_NAME = 256;

/** Validates an entry from the wire; a clean copy or undefined. */
export function validateEntry(v: unknown): Entry | undefined {
  if (typeof v !== "object" || v === null || Array.isArray(v)) return undefined;
  const { name, owner, version, writer } = v as Record<string, unknown>;
  if (typeof name !== "string" || name.length === 0 || name.length > MAX_NAME) return undefined;
  if (owner !== null && (typeof owner !== "string" || owner.length === 0 || owner.length > MAX_NAME)) {
    return undefined;
  }
  if (typeof version !== "number" || !Number.isSafeInteger(version) || version < 1) return undefined;
  if (typeof writer !== "string" || writer.length === 0 || writer.length > MAX_NAME) return undefined;
  const age = (v as Record<string, unknown>).age;
  if (age !== undefined && (typeof age !== "number" || !Number.isFinite(age) || age < 0)) return undefined;
  const e: Entry = { name, owner: owner as PeerId | null, version, writer };
  if (owner === null && age !== undefined) e.age = age;
  // A live set entry names its owner and carries a well-formed set; nothing else carries one.
  const set = (v as Record<string, unknown>).set, parsed = parseSetName(name);
  if (set !== undefined) {
    if (typeof set !== "string" || !parsed || owner !== parsed.holder || !decodePart(set)) return undefined;
    e.set = set;
  } else if (parsed && owner !== null) return undefined;
  return e;
}

const enc = new TextEncoder();
const dec = new TextDecoder("utf-8", { fatal: true });

export function encodeEntries(entries: Entry[]): Uint8Array {
  return enc.encode(JSON.stringify(entries));
}

/** Decodes a list of entries; undefined if the bytes are not exactly that (never throws). */
export function decodeEntries(bytes: Uint8Array): Entry[] | undefined {
  let v: unknown;
  try {
    v = JSON.parse(dec.decode(bytes));
  } catch {
    return undefined;
  }
  if (!Array.isArray(v)) return undefined;
  const out: Entry[] = [];
  for (const raw of v) {
    const e = validateEntry(raw);
    if (!e) return undefined;
    out.push(e);
  }
  return out;
}
