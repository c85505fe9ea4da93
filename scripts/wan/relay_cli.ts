// The relay's command line: `deno run -A scripts/wan/relay.ts --target HOST:PORT [link flags]`.
import { parseFlags, UsageError } from "../../cli/command.ts";
import { linkFlagOptions, linkFlagUsage, linkSpecFromFlags } from "./link_flags.ts";
import type { Relay, RelayOptions } from "./relay.ts";

export const relayUsage = `Usage: deno run -A scripts/wan/relay.ts --target HOST:PORT [options]

Forwards UDP datagrams from clients to the target and replies back, through an emulated WAN link
(the same spec in each direction, with independent random draws). Prints the listen address on
the first line of stdout; prints counters on stderr every --stats-s seconds and on Ctrl-C.

  --target HOST:PORT  where datagrams go (required)
  --listen HOST:PORT  where clients send (default 127.0.0.1:0)
${linkFlagUsage}
  --stats-s S         print counters every S seconds (default: only at exit)`;

/**
 * Runs the relay until SIGINT/SIGTERM; resolves to the exit code. `startRelay` is passed in because
 * relay.ts is the entry point and imports this file (a cycle would deadlock its top-level await).
 */
export async function runRelayCli(
  argv: string[],
  startRelay: (options: RelayOptions) => Promise<Relay>,
): Promise<number> {
  let relay;
  let statsEvery = 0;
  try {
    const { values } = parseFlags(argv, {
      ...linkFlagOptions,
      target: { type: "string" },
      listen: { type: "string" },
      "stats-s": { type: "string" },
      help: { type: "boolean" },
    });
    if (values.help) {
      console.log(relayUsage);
      return 0;
    }
    if (!values.target) throw new UsageError("--target HOST:PORT is required");
    statsEvery = Number(values["stats-s"] ?? 0);
    if (!(statsEvery >= 0)) throw new UsageError(`--stats-s expects seconds >= 0, got ${values["stats-s"]}`);
    const spec = linkSpecFromFlags(values);
    relay = await startRelay({ target: values.target, listen: values.listen, up: spec });
  } catch (e) {
    if (e instanceof UsageError || e instanceof TypeError || e instanceof RangeError) {
      console.error(`relay: ${(e as Error).message}\n\n${relayUsage}`);
      return 2;
    }
    throw e;
  }
  console.log(relay.addr);
  const r = relay;
  const report = () => console.error(JSON.stringify(r.stats()));
  const timer = statsEvery > 0 ? setInterval(report, statsEvery * 1000) : undefined;
  await new Promise<void>((resolve) => {
    Deno.addSignalListener("SIGINT", resolve);
    Deno.addSignalListener("SIGTERM", resolve);
  });
  if (timer !== undefined) clearInterval(timer);
  report();
  await r.close();
  return 0;
}
