// `swactor down`: ask a node to leave the cluster gracefully, and wait until its process has exited.
import { apiError, apiFetch, apiTarget } from "../node/api/mod.ts";
import { processRuns } from "../node/state_file.ts";
import { type Command, numberFlag, parseFlags } from "./command.ts";

export const down: Command = {
  name: "down",
  summary: "make a node leave the cluster gracefully and exit",
  usage: `Usage: swactor down [--api HOST:PORT] [--timeout SECONDS]

Tells the node at --api (default: the node \`up\` started on this machine) to leave; the others then
see it as "left" (not "dead"). Then waits until the node's process has exited (\`up\` exits after its
workers) or, for a node this machine does not run, until its control API has gone away.
  --timeout SECONDS    give up waiting after this long, with exit code 1 (default 20)
The node's token, which /down needs, is read from the state files of this machine's nodes.`,
  async run(argv) {
    const { values } = parseFlags(argv, { api: { type: "string" }, timeout: { type: "string" } });
    const timeoutS = numberFlag(values.timeout, "timeout", { min: 0, fallback: 20 });
    const target = await apiTarget(values.api);
    const res = await apiFetch(target, "/down", { method: "POST" });
    if (res.status !== 202) {
      const why = await apiError(res);
      throw new Error(
        res.status === 401 && !target.token
          ? `${why}; no node of this machine serves ${target.base} (its token is in the state files of ` +
            `the machine that runs it: run \`swactor down\` there)`
          : `the node refused: ${why}`,
      );
    }
    await res.body?.cancel();
    const gone = target.pid !== undefined ? () => Promise.resolve(!processRuns(target.pid!)) : async () => {
      try {
        const r = await fetch(target.base + "/status", { signal: AbortSignal.timeout(1000) });
        await r.body?.cancel();
        return false;
      } catch {
        return true;
      }
    };
    const end = Date.now() + timeoutS * 1000;
    while (!(await gone())) {
      if (Date.now() > end) {
        const who = target.pid !== undefined ? `its process ${target.pid} still runs` : "it still answers";
        console.error(`swactor down: the node was told to leave, but ${who} after ${timeoutS} s`);
        return 1;
      }
      await new Promise((r) => setTimeout(r, 100));
    }
    console.error(
      `swactor down: the node left${target.pid !== undefined ? ` (process ${target.pid} exited)` : ""}`,
    );
    return 0;
  },
};
