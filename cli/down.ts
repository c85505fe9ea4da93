// `swactor down`: ask a node to leave the cluster gracefully and exit.
import { apiBase, apiFetch } from "../node/api/mod.ts";
import { type Command, parseFlags } from "./command.ts";

export const down: Command = {
  name: "down",
  summary: "make a node leave the cluster gracefully and exit",
  usage: `Usage: swactor down [--api HOST:PORT]

Tells the node at --api (default: the node \`up\` started on this machine) to leave; the others then
see it as "left" (not "dead"). Waits until its control API has gone away (up to 10 s).`,
  async run(argv) {
    const { values } = parseFlags(argv, { api: { type: "string" } });
    const base = await apiBase(values.api);
    const res = await apiFetch(base, "/down", { method: "POST" });
    if (res.status !== 202) throw new Error(`control API answered ${res.status}`);
    await res.body?.cancel();
    const end = Date.now() + 10_000;
    while (Date.now() < end) {
      await new Promise((r) => setTimeout(r, 100));
      try {
        const r = await fetch(base + "/status");
        await r.body?.cancel();
      } catch {
        console.error("swactor down: the node left");
        return 0;
      }
    }
    console.error("swactor down: the node was told to leave but still answers after 10 s");
    return 1;
  },
};
