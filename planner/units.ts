// Units of the planner language. Internally: bytes, bytes/s, seconds, FLOP/s, bytes per element.
// `formatQuantity` picks the largest unit that represents a value exactly, so that printing and parsing
// again gives back the very same number (the language's round-trip guarantee).

export type Dimension = "bytes" | "rate" | "netrate" | "time" | "flops" | "elem" | "count";

const RATE = {
  "B/s": 1,
  "KB/s": 1e3,
  "MB/s": 1e6,
  "GB/s": 1e9,
  "TB/s": 1e12,
  "kbit/s": 125,
  "Mbit/s": 125e3,
  "Gbit/s": 125e6,
};

const UNITS: Record<Dimension, Record<string, number>> = {
  bytes: {
    B: 1,
    KB: 1e3,
    MB: 1e6,
    GB: 1e9,
    TB: 1e12,
    KiB: 2 ** 10,
    MiB: 2 ** 20,
    GiB: 2 ** 30,
    TiB: 2 ** 40,
  },
  rate: RATE,
  // Network rates: the same units, printed in bits per second as network people quote them.
  netrate: RATE,
  time: { s: 1, ms: 1e-3, us: 1e-6 },
  flops: { "FLOP/s": 1, "GFLOP/s": 1e9, "TFLOP/s": 1e12 },
  // Bytes per stored element; "bits" lets a file say `experts = 4.5 bits`.
  elem: { bytes: 1, bits: 1 / 8 },
  count: {},
};

/** Units a dimension accepts, for error messages. */
export function unitsOf(dim: Dimension): string[] {
  return Object.keys(UNITS[dim]);
}

/** The factor that converts a value in `unit` to the dimension's base unit, or undefined if unknown. */
export function unitFactor(dim: Dimension, unit: string): number | undefined {
  return UNITS[dim][unit];
}

/** Preferred units for printing, largest first. */
const PRINT: Record<Dimension, string[]> = {
  bytes: ["TiB", "GiB", "MiB", "KiB", "TB", "GB", "MB", "KB"],
  rate: ["TB/s", "GB/s", "MB/s", "KB/s"],
  netrate: ["Gbit/s", "Mbit/s", "kbit/s", "GB/s", "MB/s", "KB/s"],
  time: ["s", "ms", "us"],
  flops: ["TFLOP/s", "GFLOP/s"],
  elem: ["bytes"],
  count: [],
};

/** Formats `value` (base unit) with the largest unit that parses back to exactly `value`. */
export function formatQuantity(dim: Dimension, value: number): string {
  for (const unit of PRINT[dim]) {
    const f = UNITS[dim][unit];
    const scaled = value / f;
    if (Math.abs(scaled) < 1 && value !== 0) continue;
    const text = String(Number(scaled.toPrecision(12)));
    if (Number(text) * f === value) return `${text} ${unit}`;
  }
  const base = Object.keys(UNITS[dim]).find((u) => UNITS[dim][u] === 1);
  return base ? `${value} ${base}` : String(value);
}

/** Human-readable bytes for tables and error messages (not for round trips). */
export function humanBytes(bytes: number): string {
  const gib = bytes / 2 ** 30;
  if (Math.abs(gib) >= 1) return `${gib.toFixed(gib >= 100 ? 0 : 1)} GiB`;
  return `${(bytes / 2 ** 20).toFixed(1)} MiB`;
}

const ALL_UNITS = new Set(Object.values(UNITS).flatMap((u) => Object.keys(u)));

/** True when `word` is a unit of any dimension. */
export function isUnit(word: string): boolean {
  return ALL_UNITS.has(word);
}

/**
 * Parses a quantity written with a unit of `dim` ("8GiB", "512 MiB", "1.5GB"), or a bare number in the base
 * unit; throws RangeError saying what was expected.
 */
export function parseQuantity(dim: Dimension, text: string): number {
  const m = /^\s*(\d+(?:\.\d+)?(?:e\d+)?)\s*([A-Za-z/]*)\s*$/.exec(text);
  const factor = m ? (m[2] === "" ? 1 : unitFactor(dim, m[2])) : undefined;
  if (!m || factor === undefined) {
    throw new RangeError(
      `"${text}" is not a ${dim === "bytes" ? "size" : dim} (e.g. 8GiB, 512MiB; units: ${
        unitsOf(dim).join(", ")
      })`,
    );
  }
  return Number(m[1]) * factor;
}
