// The open speed targets (issues 12 and 13) judged from benchmark lines: reads the JSON lines that
// decode.ts, moe.ts and prefill.ts print (any number of files, runs and processes; other lines are skipped)
// and prints one row a target with every figure found, their median and whether the median meets it.
// Only lines run with the default tuning count (a line with a non-empty `tuning` is an A/B run).
//   deno run -A scripts/bench/targets.ts FILE... [--json]
// `scripts/device/h200.sh targets` runs the benchmarks and then this. The targets are H200 figures: rows
// from another adapter are marked so (compare those only within their own run).
import { parseArgs } from "node:util";
import { median } from "./stats.ts";

/** One target: its name, how to find its figures among benchmark lines, and its bound. */
export interface Target {
  name: string;
  /** Its figures among the default-tuning benchmark lines, in order. */
  figures(lines: Record<string, unknown>[]): number[];
  /** "min": the figure must be at least `bound`; "max": at most. */
  sense: "min" | "max";
  bound: number;
  unit: string;
}

/**
 * What decode.ts and moe.ts pin in every run: the first token handed out after the read-ahead batches, the
 * decode window every session measured (decode.ts says why). Their lines' `tuning` carries it, and a line
 * whose tuning is this alone is a default-tuning line.
 */
export const DECODE_WINDOW = { firstTokenAtOnce: false } as const;

const isDefault = (l: Record<string, unknown>) =>
  l.tuning === undefined ||
  (typeof l.tuning === "object" && l.tuning !== null &&
    Object.entries(l.tuning).every(([k, v]) => (DECODE_WINDOW as Record<string, unknown>)[k] === v));

/** The figures `read` gives the lines that are this target's (undefined for the others). */
const each =
  (read: (l: Record<string, unknown>) => number | undefined) => (lines: Record<string, unknown>[]) =>
    lines.map(read).filter((v): v is number => v !== undefined);

const num = (v: unknown) => typeof v === "number" && Number.isFinite(v) ? v : undefined;

/**
 * Prefill lines (prefill.ts prints no `bench` key) at `prompt` tokens with the default GEMM math: `math`
 * "default", or in lines from before it was a value (none of the lines has it), "f16", then the default.
 */
const prefill = (prompt: number) => (lines: Record<string, unknown>[]) => {
  const math = lines.some((l) => l.math === "default") ? "default" : "f16";
  return each((l) =>
    l.bench === undefined && l.prompt === prompt && l.ttftMs !== undefined && (l.math ?? math) === math &&
      (l.gemm ?? "default") === "default" && (l.early ?? "on") !== "off"
      ? num(l.tokS)
      : undefined
  )(lines);
};

/** One-token decode tok/s of the Llama-1B shape with `weights` (decode.ts). */
const decode = (weights: string) =>
  each((l) => l.bench === "swactor-decode" && l.weights === weights ? num(l.decode_tok_s) : undefined);

export const TARGETS: Target[] = [
  {
    name: "prefill pp512 (f16 and q4)",
    figures: prefill(512),
    sense: "min",
    bound: 15_000,
    unit: "tok/s",
  },
  {
    name: "prefill pp2048 (f16 and q4)",
    figures: prefill(2048),
    sense: "min",
    bound: 15_000,
    unit: "tok/s",
  },
  {
    name: "q4 decode, Llama-3.2-1B shape",
    figures: decode("q4"),
    sense: "min",
    bound: 2_000,
    unit: "tok/s",
  },
  {
    name: "f16 decode, Llama-3.2-1B shape",
    figures: decode("f16"),
    sense: "min",
    bound: 1_100,
    unit: "tok/s",
  },
  {
    name: "q4 k = 8 step / one-token step",
    figures: each((l) => {
      if (l.bench !== "swactor-k-step" || l.weights !== "q4") return undefined;
      const k = l.k_step_ms as Record<string, number> | undefined;
      return k?.["8"] && k?.["1"] ? k["8"] / k["1"] : undefined;
    }),
    sense: "max",
    bound: 1.5,
    unit: "x",
  },
  {
    name: "q4 decode at 8,192 keys / at 128",
    figures: contextRatios,
    sense: "min",
    bound: 0.8,
    unit: "",
  },
  {
    name: "Qwen3-30B-A3B shape, q4 decode",
    figures: each((l) =>
      l.bench === "swactor-moe-decode" && l.shape === "qwen3-30b-a3b" && l.weights === "q4"
        ? num(l.decode_tok_s)
        : undefined
    ),
    sense: "min",
    bound: 650,
    unit: "tok/s",
  },
];

/**
 * The 8,192-key ratios: each q4 `swactor-context` line at 8,192 keys against the line at 128 keys printed
 * before it by the same run (decode.ts prints a run's contexts in order).
 */
function contextRatios(lines: Record<string, unknown>[]): number[] {
  const out: number[] = [];
  let at128: number | undefined;
  for (const l of lines) {
    if (l.bench !== "swactor-context" || l.weights !== "q4") continue;
    const ms = num(l.gpu_ms_per_token);
    if (l.context === 128) at128 = ms;
    else if (l.context === 8192 && at128 !== undefined && ms) {
      out.push(at128 / ms);
      at128 = undefined;
    }
  }
  return out;
}

export interface TargetRow {
  name: string;
  bound: string;
  figures: number[];
  median: number;
  /** "met", "missed", or "no figure" when no line measured it. */
  status: "met" | "missed" | "no figure";
}

/** Judges every target against the default-tuning lines among `lines`. */
export function judgeTargets(lines: Record<string, unknown>[]): TargetRow[] {
  const plain = lines.filter(isDefault);
  return TARGETS.map((t) => {
    const figures = t.figures(plain);
    const m = median(figures);
    const ok = t.sense === "min" ? m >= t.bound : m <= t.bound;
    return {
      name: t.name,
      bound: `${t.sense === "min" ? ">=" : "<="} ${t.bound.toLocaleString("en-US")}${
        t.unit ? ` ${t.unit}` : ""
      }`,
      figures,
      median: m,
      status: figures.length === 0 ? "no figure" : ok ? "met" : "missed",
    };
  });
}

/** The JSON objects among `text`'s lines (a line that does not parse, or is not an object, is skipped). */
export function jsonLines(text: string): Record<string, unknown>[] {
  const out: Record<string, unknown>[] = [];
  for (const line of text.split("\n")) {
    if (!line.startsWith("{")) continue;
    try {
      const v = JSON.parse(line);
      if (typeof v === "object" && v !== null && !Array.isArray(v)) out.push(v);
    } catch { /* not a benchmark line */ }
  }
  return out;
}

const fmt = (v: number) => v >= 100 ? v.toFixed(0) : v.toFixed(3);

if (import.meta.main) {
  const { values, positionals } = parseArgs({
    args: Deno.args,
    options: { json: { type: "boolean" } },
    allowPositionals: true,
  });
  if (positionals.length === 0) {
    console.error(
      "usage: deno run -A scripts/bench/targets.ts FILE... [--json]  (JSON lines of decode.ts, moe.ts, prefill.ts)",
    );
    Deno.exit(2);
  }
  const lines = (await Promise.all(positionals.map((f) => Deno.readTextFile(f)))).flatMap(jsonLines);
  const rows = judgeTargets(lines);
  const adapters = [...new Set(lines.map((l) => l.adapter).filter((a) => typeof a === "string"))];
  if (values.json) {
    console.log(JSON.stringify({ adapters, targets: rows }));
  } else {
    console.log(`adapters: ${adapters.join(", ") || "(none named)"}`);
    if (adapters.some((a) => !/H200/.test(a as string))) {
      console.log("(the targets are H200 figures: rows from another GPU compare only within their own run)");
    }
    for (const r of rows) {
      const figs = r.figures.length ? `median ${fmt(r.median)} of [${r.figures.map(fmt).join(", ")}]` : "-";
      console.log(`${r.status.padEnd(9)} ${r.name.padEnd(34)} ${r.bound.padEnd(16)} ${figs}`);
    }
  }
}
