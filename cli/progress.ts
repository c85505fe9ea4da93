// A progress bar on stderr for long loads (weights, the demo model's first generation). On a terminal
// it is cli-progress's redrawn bar; when stderr is a pipe or a file it prints a plain line at each
// quarter instead, so logs stay readable and free of escape codes.
import process from "node:process";
import cliProgress from "cli-progress";

export interface ProgressBar {
  /** Sets the amount done so far (clamped to [0, total]). */
  update(done: number): void;
  /** Finishes the bar (idempotent); a bar left running would keep its redraw timer alive. */
  stop(): void;
}

/** Where the bar writes: stderr by default; tests pass their own. */
export interface ProgressStream {
  isTTY?: boolean;
  write(s: string): unknown;
}

export interface ProgressOptions {
  /** "bytes" shows amounts in MiB; "items" (default) as plain counts. */
  units?: "items" | "bytes";
  /** Default: process.stderr. */
  stream?: ProgressStream;
}

function formatAmount(n: number, units: "items" | "bytes"): string {
  return units === "bytes" ? `${(n / 2 ** 20).toFixed(1)} MiB` : String(n);
}

/** A progress bar labelled `label` that counts up to `total`. */
export function progressBar(label: string, total: number, opts: ProgressOptions = {}): ProgressBar {
  const units = opts.units ?? "items";
  const stream = opts.stream ?? process.stderr;
  const clamp = (n: number) => Math.max(0, Math.min(total, n));
  if (stream.isTTY) {
    const bar = new cliProgress.SingleBar({
      stream: stream as NodeJS.WritableStream,
      format: `${label} [{bar}] {percentage}% | {amount}`,
      hideCursor: true,
      clearOnComplete: false,
    }, cliProgress.Presets.shades_classic);
    const amount = (n: number) => `${formatAmount(n, units)} / ${formatAmount(total, units)}`;
    bar.start(total, 0, { amount: amount(0) });
    let stopped = false;
    return {
      update(done) {
        if (!stopped) bar.update(clamp(done), { amount: amount(clamp(done)) });
      },
      stop() {
        if (!stopped) bar.stop();
        stopped = true;
      },
    };
  }
  // Not a terminal: a line per quarter reached, and a last line at stop if 100% was never reported.
  let quarter = 0;
  let last = 0;
  let stopped = false;
  const line = (n: number) => {
    const pct = total > 0 ? Math.floor((100 * n) / total) : 100;
    stream.write(`${label}: ${pct}% (${formatAmount(n, units)} / ${formatAmount(total, units)})\n`);
  };
  return {
    update(done) {
      if (stopped) return;
      last = clamp(done);
      const q = total > 0 ? Math.floor((4 * last) / total) : 4;
      if (q > quarter) {
        quarter = q;
        line(last);
      }
    },
    stop() {
      if (stopped) return;
      stopped = true;
      if (quarter < 4) line(last);
    },
  };
}
