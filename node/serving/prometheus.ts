// Counters, gauges and histograms in Prometheus' text exposition format (version 0.0.4): `# HELP` and
// `# TYPE` per family, one sample per label set, histograms as cumulative `_bucket{le=...}` plus `_sum` and
// `_count`. Label values are escaped (backslash, double quote, newline) as the format asks.

export type Labels = Record<string, string | number>;

/** The content type of the format, for the `/metrics` response. */
export const PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8";

function escape(v: string): string {
  return v.replaceAll("\\", "\\\\").replaceAll("\n", "\\n").replaceAll('"', '\\"');
}

function labelText(labels: Labels, extra?: [string, string]): string {
  const pairs = Object.entries(labels).map(([k, v]) => `${k}="${escape(String(v))}"`);
  if (extra) pairs.push(`${extra[0]}="${escape(extra[1])}"`);
  return pairs.length ? `{${pairs.join(",")}}` : "";
}

function value(v: number): string {
  if (Number.isNaN(v)) return "NaN";
  if (v === Infinity) return "+Inf";
  if (v === -Infinity) return "-Inf";
  return String(v);
}

function key(labels: Labels): string {
  return JSON.stringify(Object.entries(labels).sort(([a], [b]) => (a < b ? -1 : 1)));
}

abstract class Family {
  constructor(
    readonly name: string,
    readonly help: string,
    readonly type: "counter" | "gauge" | "histogram",
  ) {
    if (!/^[a-zA-Z_:][a-zA-Z0-9_:]*$/.test(name)) throw new TypeError(`bad metric name "${name}"`);
  }
  header(): string {
    return `# HELP ${this.name} ${
      this.help.replaceAll("\\", "\\\\").replaceAll("\n", "\\n")
    }\n# TYPE ${this.name} ${this.type}\n`;
  }
  abstract samples(): string;
}

export class Counter extends Family {
  #values = new Map<string, { labels: Labels; v: number }>();
  constructor(name: string, help: string) {
    super(name, help, "counter");
  }
  inc(labels: Labels = {}, by = 1): void {
    if (by < 0) throw new RangeError(`counter ${this.name} cannot go down (inc by ${by})`);
    const k = key(labels);
    const e = this.#values.get(k) ?? { labels, v: 0 };
    e.v += by;
    this.#values.set(k, e);
  }
  get(labels: Labels = {}): number {
    return this.#values.get(key(labels))?.v ?? 0;
  }
  samples(): string {
    return [...this.#values.values()].map((e) => `${this.name}${labelText(e.labels)} ${value(e.v)}\n`).join(
      "",
    );
  }
}

/** A gauge whose samples are set at scrape time (from the cluster's state), replacing the previous ones. */
export class Gauge extends Family {
  #values = new Map<string, { labels: Labels; v: number }>();
  constructor(name: string, help: string) {
    super(name, help, "gauge");
  }
  set(labels: Labels, v: number): void {
    this.#values.set(key(labels), { labels, v });
  }
  clear(): void {
    this.#values.clear();
  }
  samples(): string {
    return [...this.#values.values()].map((e) => `${this.name}${labelText(e.labels)} ${value(e.v)}\n`).join(
      "",
    );
  }
}

export class Histogram extends Family {
  #series = new Map<string, { labels: Labels; counts: number[]; sum: number; count: number }>();
  /** `buckets`: upper bounds, increasing (+Inf is added). */
  constructor(name: string, help: string, readonly buckets: number[]) {
    super(name, help, "histogram");
    if (buckets.some((b, i) => i > 0 && b <= buckets[i - 1])) {
      throw new RangeError(`histogram ${name}: buckets must increase`);
    }
  }
  observe(v: number, labels: Labels = {}): void {
    if (!Number.isFinite(v)) return;
    const k = key(labels);
    let s = this.#series.get(k);
    if (!s) this.#series.set(k, s = { labels, counts: this.buckets.map(() => 0), sum: 0, count: 0 });
    for (let i = 0; i < this.buckets.length; i++) if (v <= this.buckets[i]) s.counts[i]++;
    s.sum += v;
    s.count++;
  }
  count(labels: Labels = {}): number {
    return this.#series.get(key(labels))?.count ?? 0;
  }
  samples(): string {
    let out = "";
    for (const s of this.#series.values()) {
      for (let i = 0; i < this.buckets.length; i++) {
        out += `${this.name}_bucket${labelText(s.labels, ["le", value(this.buckets[i])])} ${s.counts[i]}\n`;
      }
      out += `${this.name}_bucket${labelText(s.labels, ["le", "+Inf"])} ${s.count}\n`;
      out += `${this.name}_sum${labelText(s.labels)} ${value(s.sum)}\n`;
      out += `${this.name}_count${labelText(s.labels)} ${s.count}\n`;
    }
    return out;
  }
}

/** Families rendered in the order they were added. */
export class MetricsRegistry {
  #families: Family[] = [];
  add<F extends Family>(f: F): F {
    if (this.#families.some((g) => g.name === f.name)) throw new TypeError(`metric ${f.name} added twice`);
    this.#families.push(f);
    return f;
  }
  render(): string {
    return this.#families.map((f) => f.header() + f.samples()).join("");
  }
}

/** Buckets in seconds from 1 ms to 60 s, for latencies. */
export const LATENCY_BUCKETS_S = [
  0.001,
  0.0025,
  0.005,
  0.01,
  0.025,
  0.05,
  0.1,
  0.25,
  0.5,
  1,
  2.5,
  5,
  10,
  30,
  60,
];
