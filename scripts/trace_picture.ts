// A picture of a `--trace FILE` in Perfetto's layout (a row per node and thread, spans on a shared time
// axis), for docs: Perfetto's UI is a web app this machine cannot reach, so this draws the same tracks as an
// SVG, and Chromium (headless) turns it into a PNG when asked.
//
//   deno run -A scripts/trace_picture.ts TRACE.json OUT.svg [--tokens A..B] [--png OUT.png] [--width PX]
import { parseFlags } from "../cli/command.ts";
import { scriptArgs } from "./args.ts";

interface Event {
  name: string;
  ph: string;
  pid: number;
  tid: number;
  cat?: string;
  ts?: number;
  dur?: number;
  args?: Record<string, unknown>;
}

const COLORS: Record<string, string> = {
  compute: "#4e79a7",
  hop: "#f28e2b",
  fanout: "#59a14f",
  expert: "#8cd17d",
  recovery: "#e15759",
  speculation: "#b07aa1",
};

const esc = (s: string) => s.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");

/** The SVG of `events` between tokens `from` and `to` (inclusive; by the events' `args.token`). */
export function tracePicture(
  events: Event[],
  opts: { from?: number; to?: number; width?: number } = {},
): string {
  const width = opts.width ?? 1600;
  const inRange = (e: Event) => {
    const t = Number(e.args?.token);
    return e.ph !== "M" && Number.isInteger(t) && t >= (opts.from ?? 0) && t <= (opts.to ?? Infinity);
  };
  const spans = events.filter(inRange);
  if (spans.length === 0) throw new RangeError("no events in the tokens asked for");
  const procs = new Map<number, string>(),
    threads = new Map<string, string>(),
    sort = new Map<number, number>();
  for (const e of events) {
    if (e.ph !== "M") continue;
    if (e.name === "process_name") procs.set(e.pid, String(e.args?.name));
    if (e.name === "thread_name") threads.set(`${e.pid}:${e.tid}`, String(e.args?.name));
    if (e.name === "process_sort_index") sort.set(e.pid, Number(e.args?.sort_index));
  }
  const rows = [...new Set(spans.map((e) => `${e.pid}:${e.tid}`))].sort((a, b) => {
    const [pa, ta] = a.split(":").map(Number), [pb, tb] = b.split(":").map(Number);
    return (sort.get(pa) ?? pa) - (sort.get(pb) ?? pb) || ta - tb;
  });
  const t0 = Math.min(...spans.map((e) => e.ts ?? 0));
  const t1 = Math.max(...spans.map((e) => (e.ts ?? 0) + (e.dur ?? 0)));
  const label = 330, rowH = 18, top = 40, plot = width - label - 20;
  const x = (us: number) => label + ((us - t0) / Math.max(1, t1 - t0)) * plot;
  const height = top + rows.length * rowH + 30;
  const out: string[] = [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" font-family="sans-serif" font-size="11">`,
    `<rect width="${width}" height="${height}" fill="white"/>`,
  ];
  // time axis: a tick every "nice" step
  const spanMs = (t1 - t0) / 1000;
  const step = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000].find((s) => spanMs / s <= 12) ?? 5000;
  for (let ms = 0; ms <= spanMs; ms += step) {
    const px = x(t0 + ms * 1000);
    out.push(`<line x1="${px}" y1="${top - 6}" x2="${px}" y2="${height - 30}" stroke="#ddd"/>`);
    out.push(`<text x="${px + 2}" y="${top - 10}" fill="#555">${ms} ms</text>`);
  }
  let lastPid = -1;
  rows.forEach((key, i) => {
    const [pid] = key.split(":").map(Number);
    const y = top + i * rowH;
    if (pid !== lastPid) {
      out.push(`<line x1="0" y1="${y}" x2="${width}" y2="${y}" stroke="#999"/>`);
      out.push(`<text x="4" y="${y + 13}" font-weight="bold">${esc(procs.get(pid) ?? String(pid))}</text>`);
      lastPid = pid;
    }
    out.push(
      `<text x="${label - 6}" y="${y + 13}" text-anchor="end" fill="#333">${
        esc(threads.get(key) ?? "")
      }</text>`,
    );
    for (const e of spans.filter((s) => `${s.pid}:${s.tid}` === key)) {
      const a = x(e.ts ?? 0), w = Math.max(1, x((e.ts ?? 0) + (e.dur ?? 0)) - a);
      const color = COLORS[e.cat ?? ""] ?? "#999";
      out.push(
        `<rect x="${a.toFixed(1)}" y="${y + 2}" width="${w.toFixed(1)}" height="${
          rowH - 4
        }" fill="${color}">` +
          `<title>${esc(e.name)}</title></rect>`,
      );
      if (w > 60) {
        out.push(
          `<text x="${a + 2}" y="${y + 13}" fill="white">${esc(e.name.slice(0, Math.floor(w / 6)))}</text>`,
        );
      }
    }
  });
  const legend = Object.entries(COLORS).filter(([c]) => spans.some((e) => e.cat === c));
  legend.forEach(([c, color], i) => {
    const lx = label + i * 130, ly = height - 18;
    out.push(`<rect x="${lx}" y="${ly - 10}" width="12" height="12" fill="${color}"/>`);
    out.push(`<text x="${lx + 16}" y="${ly}">${c}</text>`);
  });
  out.push("</svg>");
  return out.join("\n");
}

if (import.meta.main) {
  const { values, positionals } = scriptArgs(import.meta.url, (args) =>
    parseFlags(args, {
      tokens: { type: "string" },
      png: { type: "string" },
      width: { type: "string" },
    }, { allowPositionals: true }));
  if (positionals.length !== 2) {
    console.error(
      "Usage: deno run -A scripts/trace_picture.ts TRACE.json OUT.svg [--tokens A..B] [--png OUT.png]",
    );
    Deno.exit(2);
  }
  const t = JSON.parse(await Deno.readTextFile(positionals[0]));
  const m = values.tokens ? /^(\d+)\.\.(\d+)$/.exec(values.tokens) : null;
  if (values.tokens && !m) {
    console.error(`--tokens expects A..B, got "${values.tokens}"`);
    Deno.exit(2);
  }
  const width = values.width ? Number(values.width) : 1600;
  const svg = tracePicture(t.traceEvents ?? t, {
    from: m ? Number(m[1]) : 0,
    to: m ? Number(m[2]) : undefined,
    width,
  });
  await Deno.writeTextFile(positionals[1], svg);
  if (values.png) {
    const height = Number(/height="(\d+)"/.exec(svg)![1]);
    const out = await new Deno.Command("chromium", {
      args: [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        `--window-size=${width},${height}`,
        `--screenshot=${values.png}`,
        `file://${await Deno.realPath(positionals[1])}`,
      ],
      stdout: "null",
      stderr: "piped",
    }).output();
    if (!out.success) {
      console.error(new TextDecoder().decode(out.stderr).slice(-500));
      Deno.exit(1);
    }
  }
}
