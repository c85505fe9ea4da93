// A private state folder (node/state_file.ts) for a test, with a process that counts as a running swactor.

/**
 * Runs `fn` with SWACTOR_STATE_DIR set to a fresh folder, beside a process whose command line names swactor
 * (what node/state_file.ts processRuns takes for a node or leader that still runs; its pid is `livePid`).
 * Afterwards the process is killed, the folder removed and the variable restored.
 */
export async function withStateDir(fn: (state: string, livePid: number) => Promise<void>): Promise<void> {
  const before = Deno.env.get("SWACTOR_STATE_DIR");
  const state = await Deno.makeTempDir({ prefix: "swactor-state-test-" });
  // `; :` keeps bash from replacing itself with sleep, whose command line would not name swactor.
  const live = new Deno.Command("bash", { args: ["-c", "sleep 60; :", "swactor-test-process"] }).spawn();
  try {
    Deno.env.set("SWACTOR_STATE_DIR", state);
    await fn(state, live.pid);
  } finally {
    live.kill("SIGKILL");
    await live.status;
    if (before === undefined) Deno.env.delete("SWACTOR_STATE_DIR");
    else Deno.env.set("SWACTOR_STATE_DIR", before);
    await Deno.remove(state, { recursive: true });
  }
}
