// The signals that end a long-running command: Ctrl-C (SIGINT), `kill` or `timeout` (SIGTERM), a closed
// terminal or ssh session (SIGHUP). Each gets the same orderly teardown; the exit code is 128 + its number.

const STOP_SIGNALS: [Deno.Signal, number][] = [["SIGINT", 130], ["SIGTERM", 143], ["SIGHUP", 129]];

/**
 * Calls `handler` with the signal and its exit code each time one of the stop signals arrives; returns a
 * function that removes the listeners. Signals the OS does not have (Windows: only SIGINT) are skipped.
 */
export function onStopSignal(handler: (signal: Deno.Signal, exitCode: number) => void): () => void {
  const added: [Deno.Signal, () => void][] = [];
  for (const [signal, code] of STOP_SIGNALS) {
    const listener = () => handler(signal, code);
    try {
      Deno.addSignalListener(signal, listener);
      added.push([signal, listener]);
    } catch { /* not a signal on this OS */ }
  }
  return () => {
    for (const [signal, listener] of added) Deno.removeSignalListener(signal, listener);
  };
}
