// A strict reader of Prometheus' text exposition format (0.0.4), for tests of /metrics: every line must be a
// HELP / TYPE comment or a sample; a family's TYPE comes once and before its samples, which are contiguous;
// label values are quoted with \\, \" and \n escapes; histograms have cumulative buckets ending in
// le="+Inf" equal to _count, and a _sum. Throws an Error naming the line otherwise.

export interface Sample {
  name: string;
  labels: Record<string, string>;
  value: number;
}

export interface Family {
  type: string;
  help?: string;
  samples: Sample[];
}

const NAME = /^[a-zA-Z_:][a-zA-Z0-9_:]*/;
const LABEL = /^[a-zA-Z_][a-zA-Z0-9_]*/;

function parseValue(s: string, where: string): number {
  if (s === "NaN") return NaN;
  if (s === "+Inf" || s === "Inf") return Infinity;
  if (s === "-Inf") return -Infinity;
  if (!/^[-+]?(\d+\.?\d*([eE][-+]?\d+)?|\.\d+([eE][-+]?\d+)?)$/.test(s)) {
    throw new Error(`${where}: bad value "${s}"`);
  }
  return Number(s);
}

function parseSample(line: string, where: string): Sample {
  const m = NAME.exec(line);
  if (!m) throw new Error(`${where}: no metric name`);
  const name = m[0];
  let rest = line.slice(name.length);
  const labels: Record<string, string> = {};
  if (rest.startsWith("{")) {
    rest = rest.slice(1);
    while (!rest.startsWith("}")) {
      const l = LABEL.exec(rest);
      if (!l) throw new Error(`${where}: bad label name at "${rest.slice(0, 20)}"`);
      rest = rest.slice(l[0].length);
      if (!rest.startsWith('="')) throw new Error(`${where}: label ${l[0]} without ="`);
      rest = rest.slice(2);
      let v = "";
      for (;;) {
        if (rest === "") throw new Error(`${where}: unterminated label value`);
        const c = rest[0];
        if (c === '"') break;
        if (c === "\\") {
          const e = rest[1];
          if (e === "\\") v += "\\";
          else if (e === '"') v += '"';
          else if (e === "n") v += "\n";
          else throw new Error(`${where}: bad escape \\${e}`);
          rest = rest.slice(2);
        } else {
          v += c;
          rest = rest.slice(1);
        }
      }
      rest = rest.slice(1);
      if (l[0] in labels) throw new Error(`${where}: label ${l[0]} twice`);
      labels[l[0]] = v;
      if (rest.startsWith(",")) rest = rest.slice(1);
      else if (!rest.startsWith("}")) throw new Error(`${where}: expected , or } after a label`);
    }
    rest = rest.slice(1);
  }
  if (!rest.startsWith(" ")) throw new Error(`${where}: no space before the value`);
  const parts = rest.trim().split(/\s+/);
  if (parts.length > 2) throw new Error(`${where}: trailing text`);
  if (parts.length === 2 && !/^-?\d+$/.test(parts[1])) throw new Error(`${where}: bad timestamp`);
  return { name, labels, value: parseValue(parts[0], where) };
}

const SUFFIXES: Record<string, string[]> = {
  histogram: ["_bucket", "_sum", "_count"],
  summary: ["_sum", "_count", ""],
};

/** The families of a /metrics body, by name. */
export function parsePrometheus(text: string): Map<string, Family> {
  if (text !== "" && !text.endsWith("\n")) throw new Error("the body must end with a newline");
  const families = new Map<string, Family>();
  const closed = new Set<string>();
  let current: string | undefined;
  const familyOf = (sample: string) => {
    for (const [name, f] of families) {
      const sfx = SUFFIXES[f.type] ?? [""];
      if (sfx.some((s) => sample === name + s)) return name;
    }
    return sample;
  };
  text.split("\n").forEach((line, i) => {
    const where = `line ${i + 1} (${line.slice(0, 60)})`;
    if (line.trim() === "") return;
    if (line.startsWith("#")) {
      const m = /^# (HELP|TYPE) ([a-zA-Z_:][a-zA-Z0-9_:]*) ?(.*)$/.exec(line);
      if (!m) return; // a plain comment
      const [, kind, name, rest] = m;
      if (closed.has(name)) throw new Error(`${where}: family ${name} appears again after other families`);
      if (current !== undefined && current !== name) closed.add(current);
      current = name;
      const f = families.get(name) ?? { type: "untyped", samples: [] };
      if (kind === "TYPE") {
        if (!["counter", "gauge", "histogram", "summary", "untyped"].includes(rest)) {
          throw new Error(`${where}: bad type`);
        }
        if (f.samples.length) throw new Error(`${where}: TYPE after samples`);
        f.type = rest;
      } else f.help = rest;
      families.set(name, f);
      return;
    }
    const s = parseSample(line, where);
    const name = familyOf(s.name);
    if (closed.has(name)) throw new Error(`${where}: samples of ${name} are not contiguous`);
    if (current !== undefined && current !== name) closed.add(current);
    current = name;
    const f = families.get(name) ?? { type: "untyped", samples: [] };
    f.samples.push(s);
    families.set(name, f);
  });
  for (const [name, f] of families) if (f.type === "histogram") checkHistogram(name, f);
  return families;
}

function checkHistogram(name: string, f: Family): void {
  const series = new Map<string, Sample[]>();
  for (const s of f.samples) {
    const { le: _le, ...rest } = s.labels;
    const k = JSON.stringify(Object.entries(rest).sort());
    series.set(k, [...(series.get(k) ?? []), s]);
  }
  for (const [k, samples] of series) {
    const buckets = samples.filter((s) => s.name === `${name}_bucket`);
    const count = samples.find((s) => s.name === `${name}_count`);
    const sum = samples.find((s) => s.name === `${name}_sum`);
    if (!count || !sum) throw new Error(`histogram ${name}${k}: no _count or _sum`);
    let lastLe = -Infinity, lastN = 0;
    for (const b of buckets) {
      const le = parseValue(b.labels.le ?? "", `histogram ${name}: le`);
      if (le <= lastLe) throw new Error(`histogram ${name}${k}: le not increasing`);
      if (b.value < lastN) throw new Error(`histogram ${name}${k}: buckets not cumulative`);
      lastLe = le;
      lastN = b.value;
    }
    if (lastLe !== Infinity) throw new Error(`histogram ${name}${k}: no le="+Inf" bucket`);
    if (lastN !== count.value) {
      throw new Error(`histogram ${name}${k}: +Inf bucket ${lastN} != _count ${count.value}`);
    }
  }
}

/** The value of the sample `name` whose labels include `labels` (undefined when none). */
export function sampleValue(
  f: Map<string, Family>,
  name: string,
  labels: Record<string, string> = {},
): number | undefined {
  for (const fam of f.values()) {
    for (const s of fam.samples) {
      if (s.name === name && Object.entries(labels).every(([k, v]) => s.labels[k] === v)) return s.value;
    }
  }
  return undefined;
}
