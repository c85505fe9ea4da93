// Acceptance with real OS processes on loopback: `up` + 4 `join`; all see 5 alive; kill -9 of one is
// detected as dead by every other node within the lan bound; a restarted node (fresh identity) rejoins; a
// node with the wrong secret is refused and logged; `down` shows as `left`.
import assert from "node:assert/strict";
import { encodeTicket, newSecret, parseTicket } from "../../node/ticket.ts";

const MAIN = new URL("../../main.ts", import.meta.url).pathname;
/** The `lan` preset's documented bound for every live node to mark a killed node dead (docs/NODE.md). */
const LAN_DEAD_BOUND_MS = 15_000;

interface Proc {
  child: Deno.ChildProcess;
  out: () => string;
  err: () => string;
  api?: string;
  id?: string;
}

function spawn(args: string[], env: Record<string, string>): Proc {
  const child = new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", "--quiet", MAIN, ...args],
    env: { ...env, SWACTOR_NO_GPU: "1" },
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  let out = "", err = "";
  const pump = async (s: ReadableStream<Uint8Array>, add: (t: string) => void) => {
    for await (const chunk of s.pipeThrough(new TextDecoderStream())) add(chunk);
  };
  pump(child.stdout, (t) => (out += t));
  pump(child.stderr, (t) => (err += t));
  return { child, out: () => out, err: () => err };
}

async function until<T>(
  what: string,
  f: () => T | undefined | Promise<T | undefined>,
  ms: number,
): Promise<T> {
  const end = Date.now() + ms;
  for (;;) {
    const v = await f();
    if (v !== undefined && v !== false) return v as T;
    if (Date.now() > end) throw new Error(`timed out after ${ms} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

async function started(p: Proc): Promise<Proc> {
  p.api = await until("api line", () => p.err().match(/^api: (\S+)$/m)?.[1], 20_000);
  p.id = await until("id line", () => p.err().match(/^id: (\S+)$/m)?.[1], 20_000);
  return p;
}

type Status = { members: { id: string; state: string; roles: string[] }[]; plan: unknown };

async function status(p: Proc): Promise<Status | undefined> {
  try {
    const r = await fetch(`http://${p.api}/status`);
    return await r.json();
  } catch {
    return undefined;
  }
}

function stateOf(s: Status | undefined, id: string): string | undefined {
  return s?.members.find((m) => m.id === id)?.state;
}

Deno.test({
  name: "cluster: up + 4 join processes; kill -9, restart, wrong secret, down",
  sanitizeResources: false,
  sanitizeOps: false,
  async fn() {
    const env = { SWACTOR_STATE_DIR: await Deno.makeTempDir() };
    const procs: Proc[] = [];
    try {
      const leader = spawn(["up"], env);
      procs.push(leader);
      const ticket = await until("ticket", () => leader.out().match(/^ticket: (\S+)$/m)?.[1], 20_000);
      assert.equal(leader.out().trim().split("\n").length, 1, "up prints exactly one line on stdout");
      await started(leader);
      const t0 = Date.now();
      const workers = await Promise.all([1, 2, 3, 4].map(() => started(spawn(["join", ticket], env))));
      procs.push(...workers);
      const all = [leader, ...workers];
      const allAlive = async (nodes: Proc[]) => {
        const ss = await Promise.all(nodes.map(status));
        return ss.every((s) => nodes.every((n) => stateOf(s, n.id!) === "alive")) || undefined;
      };
      await until("5 members alive at every node", () => allAlive(all), 20_000);
      console.log(`5 processes alive at every node ${Date.now() - t0} ms after the joins were spawned`);
      const s = await status(leader);
      assert.deepEqual(s!.members.find((m) => m.id === leader.id)!.roles, ["leader"]);

      // kill -9 one worker: every other node marks it dead within the lan bound
      const victim = workers[0];
      victim.child.kill("SIGKILL");
      await victim.child.status;
      const killedAt = Date.now();
      const rest = all.filter((p) => p !== victim);
      await until("the killed node dead everywhere", async () => {
        const ss = await Promise.all(rest.map(status));
        return ss.every((x) => stateOf(x, victim.id!) === "dead") || undefined;
      }, LAN_DEAD_BOUND_MS);
      console.log(`kill -9 detected as dead by all 4 others in ${Date.now() - killedAt} ms`);

      // restart (a fresh identity): it rejoins and everyone sees 5 alive again
      const again = await started(spawn(["join", ticket], env));
      procs.push(again);
      const now = [...rest, again];
      await until("the restarted node alive everywhere", () => allAlive(now), 30_000).catch(async (e) => {
        for (const p of now) {
          console.log(
            p.id!.slice(0, 8),
            JSON.stringify((await status(p))?.members.map((m) => [m.id.slice(0, 8), m.state])),
          );
        }
        console.log(again.err());
        throw e;
      });

      // a node with the wrong secret is refused, and the refusal is logged by the leader
      const t = parseTicket(ticket);
      const forged = encodeTicket({ secret: newSecret(), leader: t.leader });
      const stranger = spawn(["join", forged], env);
      procs.push(stranger);
      const code = (await stranger.child.status).code;
      assert.equal(code, 1);
      assert.match(stranger.err(), /cannot join the cluster/);
      await until(
        "the refusal in the leader's log",
        () => /refused connection from/.test(leader.err()),
        5_000,
      );
      const after = await status(leader);
      assert.equal(after!.members.length, 6, "the stranger never became a member");

      // down: the others see `left`, not `dead`
      const leaver = workers[1];
      const down = spawn(["down", "--api", leaver.api!], env);
      procs.push(down);
      assert.equal((await down.child.status).code, 0);
      assert.equal((await leaver.child.status).code, 0);
      const others = now.filter((p) => p !== leaver);
      await until("`left` at every other node", async () => {
        const ss = await Promise.all(others.map(status));
        return ss.every((x) => stateOf(x, leaver.id!) === "left") || undefined;
      }, 5_000);
    } finally {
      for (const p of procs) {
        try {
          p.child.kill("SIGTERM");
        } catch { /* exited */ }
      }
      await Promise.all(procs.map((p) => p.child.status));
    }
  },
});
