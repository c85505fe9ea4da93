// Name sets: one registry entry that stands for many names. A node hosting experts registers "layer 5:
// experts 0-47; layer 6: 0-47" instead of 96 names; `moe-expert-5-17` still resolves. A set covers the
// names `${prefix}${group}-${i}` for every id i in the group's ranges (for experts: prefix "moe-expert-",
// group = the layer, i = the expert).
//
// On the wire a set is split into parts, each an ordinary registry entry (same versions, tombstones and
// dead-owner cleanup) named `${prefix}*${part}@${holder}` whose `set` field holds its groups as text:
// "5:0-47,60;6:0-47" (inclusive runs, ";" between groups). A part's text stays under PART_CHARS so that a
// part fits in one gossip packet with room to spare. Pure.

/** Largest text of one part (a gossip packet is 1400 bytes; the entry also carries names and ids, base64). */
export const PART_CHARS = 480;
/** Most parts one holder may have under one prefix (256 x 480 characters: ~120 KB of ranges). */
export const MAX_PARTS = 256;

/** Half-open id ranges [start, end), ascending and disjoint once normalized. */
export type Ranges = [number, number][];

/** A set's groups: group key -> ranges. */
export type Groups = Map<string, Ranges>;

const SET_NAME = /^([^*]+)\*(0|[1-9][0-9]{0,5})@(.+)$/;
const GROUP_KEY = /^[^:;,\s]{1,64}$/;
const INDEX = /^(0|[1-9][0-9]{0,8})$/;

/** The entry name of part `part` of `holder`'s set under `prefix`. */
export function setEntryName(prefix: string, part: number, holder: string): string {
  return `${prefix}*${part}@${holder}`;
}

/** The pieces of a set entry's name, or undefined for an ordinary name. */
export function parseSetName(name: string): { prefix: string; part: number; holder: string } | undefined {
  const m = SET_NAME.exec(name);
  return m ? { prefix: m[1], part: Number(m[2]), holder: m[3] } : undefined;
}

/** Validates a set's prefix; TypeError says what is wrong. */
export function checkPrefix(prefix: unknown): string {
  if (typeof prefix !== "string" || prefix.length === 0 || prefix.length > 128 || prefix.includes("*")) {
    throw new TypeError(
      `a name set's prefix must be 1..128 characters without "*", got ${JSON.stringify(prefix)}`,
    );
  }
  return prefix;
}

/** Sorted, merged copy of `ranges`; RangeError for a range that is not [start, end) with 0 <= start < end. */
export function normalizeRanges(ranges: Iterable<readonly [number, number]>): Ranges {
  const list: Ranges = [];
  for (const r of ranges) {
    const [s, e] = r;
    if (!(Number.isSafeInteger(s) && Number.isSafeInteger(e) && 0 <= s && s < e && e <= 1e9)) {
      throw new RangeError(`a range must be [start, end) with 0 <= start < end <= 1e9, got [${s}, ${e})`);
    }
    list.push([s, e]);
  }
  list.sort((a, b) => a[0] - b[0]);
  const out: Ranges = [];
  for (const [s, e] of list) {
    const last = out.at(-1);
    if (last && s <= last[1]) last[1] = Math.max(last[1], e);
    else out.push([s, e]);
  }
  return out;
}

/** Groups as a record (what callers pass) to normalized, sorted groups; empty groups dropped. */
export function toGroups(rec: Record<string, Iterable<readonly [number, number]>>): Groups {
  const out: Groups = new Map();
  for (const key of Object.keys(rec).sort()) {
    if (!GROUP_KEY.test(key)) {
      throw new TypeError(
        `a name set's group must be 1..64 characters without ":;," or spaces, got "${key}"`,
      );
    }
    const r = normalizeRanges(rec[key]);
    if (r.length) out.set(key, r);
  }
  return out;
}

const runText = ([s, e]: [number, number]) => (e - s === 1 ? `${s}` : `${s}-${e - 1}`);

/** Splits `groups` into part texts of at most PART_CHARS each (a long group continues in the next part). */
export function encodeParts(groups: Groups): string[] {
  const parts: string[] = [];
  let cur = "";
  for (const [key, ranges] of groups) {
    let open = false; // `cur` already has "key:" for this group
    for (const r of ranges) {
      const run = runText(r);
      const add = open ? `,${run}` : `${cur ? ";" : ""}${key}:${run}`;
      if (cur && cur.length + add.length > PART_CHARS) {
        parts.push(cur);
        cur = `${key}:${run}`;
      } else cur += add;
      open = true;
    }
  }
  if (cur) parts.push(cur);
  if (parts.length > MAX_PARTS) {
    throw new RangeError(
      `a name set of ${parts.length} parts exceeds ${MAX_PARTS}; register fewer, longer ranges`,
    );
  }
  return parts;
}

/** Parses one part's text; undefined unless it is exactly "key:runs;key:runs". */
export function decodePart(text: string): Groups | undefined {
  if (typeof text !== "string" || text.length === 0 || text.length > PART_CHARS * 2) return undefined;
  const out: Groups = new Map();
  for (const group of text.split(";")) {
    const colon = group.indexOf(":");
    const key = group.slice(0, colon);
    if (colon < 1 || !GROUP_KEY.test(key)) return undefined;
    const ranges: Ranges = out.get(key) ?? [];
    for (const run of group.slice(colon + 1).split(",")) {
      const dash = run.indexOf("-");
      const a = dash < 0 ? run : run.slice(0, dash), b = dash < 0 ? run : run.slice(dash + 1);
      if (!INDEX.test(a) || !INDEX.test(b) || Number(b) < Number(a)) return undefined;
      ranges.push([Number(a), Number(b) + 1]);
    }
    out.set(key, ranges);
  }
  for (const [k, r] of out) out.set(k, normalizeRanges(r));
  return out;
}

/** The group and index a name stands for under `prefix` ("moe-expert-5-17" -> {"5", 17}), or undefined. */
export function nameInSet(name: string, prefix: string): { group: string; index: number } | undefined {
  if (!name.startsWith(prefix)) return undefined;
  const rest = name.slice(prefix.length);
  const dash = rest.lastIndexOf("-");
  if (dash < 1) return undefined;
  const group = rest.slice(0, dash), index = rest.slice(dash + 1);
  return GROUP_KEY.test(group) && INDEX.test(index) ? { group, index: Number(index) } : undefined;
}
