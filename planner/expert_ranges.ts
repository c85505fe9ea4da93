// Expert ids as ranges. The Plan lists each host's experts per layer as ids; the placement keeps them in
// contiguous runs, so a host's share of a layer is one or a few half-open ranges [start, end). This is the
// compact form the registry and a status line use (docs/PLAN_FORMAT.md).

/** A half-open run of expert ids [start, end). */
export type IdRange = [number, number];

/** Sorted, merged runs of `ids` (any order, duplicates allowed): [0, 1, 2, 7] -> [[0, 3], [7, 8]]. */
export function toRanges(ids: Iterable<number>): IdRange[] {
  const sorted = [...new Set(ids)].sort((a, b) => a - b);
  const out: IdRange[] = [];
  for (const id of sorted) {
    if (!Number.isSafeInteger(id) || id < 0) {
      throw new RangeError(`expert ids must be integers >= 0, got ${id}`);
    }
    const last = out.at(-1);
    if (last && last[1] === id) last[1] = id + 1;
    else out.push([id, id + 1]);
  }
  return out;
}

/** The ids of `ranges`, ascending: [[0, 3], [7, 8]] -> [0, 1, 2, 7]. */
export function fromRanges(ranges: readonly IdRange[]): number[] {
  const out: number[] = [];
  for (const [start, end] of ranges) {
    if (!(Number.isSafeInteger(start) && Number.isSafeInteger(end) && 0 <= start && start < end)) {
      throw new RangeError(`an id range must be [start, end) with 0 <= start < end, got [${start}, ${end})`);
    }
    for (let i = start; i < end; i++) out.push(i);
  }
  return [...new Set(out)].sort((a, b) => a - b);
}

/** Human form of some ids: [0, 1, 2, 7] -> "0-2,7". */
export function formatIds(ids: Iterable<number>): string {
  return toRanges(ids).map(([s, e]) => (e - s === 1 ? `${s}` : `${s}-${e - 1}`)).join(",");
}
