// The user's cluster path end to end with real processes: `up --peers 3 --model DIR --wire f32` (the leader
// plans a 3-stage chain over itself and two `join` workers it spawns, f32 activations between its stages),
// then a plain `generate ... --json --trace F` from another process finds that chain through the state file
// and the control API: the reference continuation on the chain's f32 wire, per-stage timings, and a trace
// with one track per stage; `status` shows the chain's wire and KV cache (`up --kv f32`), and a request naming
// its own KV cache or weights is refused; `down` ends it all,
// with no worker re-planning on its way out. The two workers adopt the leader's measurement of the GPU.
import assert from "node:assert/strict";
import { fixtureDir } from "../fixtures.ts";
import { gpuAvailable, needs } from "../support/needs.ts";
import { runCli } from "./run.ts";

const MAIN = new URL("../../main.ts", import.meta.url).pathname;
const micro = fixtureDir("llama-micro")!;
const hasGpu = await gpuAvailable();

Deno.test({
  ...needs(
    "up --peers 3 --model --wire f32, then generate --trace through the chain: reference tokens, the chain's " +
      "wire and a trace per stage",
    { "a WebGPU adapter": hasGpu },
  ),
  sanitizeResources: false,
  sanitizeOps: false,
  async fn() {
    const env = { SWACTOR_STATE_DIR: await Deno.makeTempDir() };
    const ref = JSON.parse(await Deno.readTextFile(`${micro}/reference.json`));
    const prompt: number[] = ref.tokens.slice(0, ref.prompt_length);
    const want: number[] = ref.tokens.slice(ref.prompt_length);
    const up = new Deno.Command(Deno.execPath(), {
      args: [
        "run",
        "-A",
        "--quiet",
        MAIN,
        "up",
        "--peers",
        "3",
        "--membership",
        "test",
        "--model",
        micro,
        "--wire",
        "f32",
        "--kv",
        "f32",
        "--http",
        "off",
      ],
      env,
      stdout: "piped",
      stderr: "piped",
    }).spawn();
    let err = "";
    const pump = (async () => {
      for await (const t of up.stderr.pipeThrough(new TextDecoderStream())) err += t;
    })();
    const drainOut = up.stdout.pipeTo(new WritableStream());
    const tmp = await Deno.makeTempDir();
    try {
      const end = Date.now() + 90_000;
      while (!/chain ready: 3 stage/.test(err)) {
        if (Date.now() > end) throw new Error(`no chain after 90 s:\n${err}`);
        await new Promise((r) => setTimeout(r, 200));
      }
      // The workers share this GPU: they take the leader's measurement (cli/workers.ts shareMeasurement).
      assert.equal(err.match(/^swactor: measured: /gm)?.length, 1, `one measurement:\n${err}`);
      assert.equal(err.match(/^swactor: adopted the measurement of this machine's GPU/gm)?.length, 2, err);
      const trace = `${tmp}/trace.json`;
      const gen = await runCli([
        ...["generate", "--model", micro, "--tokens", prompt.join(","), "--max-tokens", String(want.length)],
        ...["--temperature", "0", "--json", "--trace", trace],
      ], { env });
      assert.equal(gen.code, 0, gen.stderr);
      const out = JSON.parse(gen.stdout.trim().split("\n").at(-1)!);
      assert.deepEqual(out.tokens, want);
      assert.equal(out.wire, "f32", "the request named no wire: the chain's (`up --wire f32`)");
      assert.equal(out.kv, "f32", "the chain's KV cache (`up --kv f32`), not the request's default");
      // 1 position x hidden 64 (llama-micro) x 4 bytes on each hop of a decode step.
      assert.deepEqual(out.timings.per_token[1].bytes.slice(0, 2), [256, 256]);
      assert.equal(out.timings.mean_decode.compute_ms.length, 3);
      const st = await runCli(["status", "--json"], { env });
      assert.equal(st.code, 0, st.stderr);
      const view = JSON.parse(st.stdout);
      assert.equal(view.pipeline.assignment.wire, "f32");
      assert.equal(view.pipeline.assignment.model.kv, "f32", "`up --kv` in the Plan's model");
      const plain = await runCli(["status"], { env });
      assert.match(plain.stdout, /: ready, weights auto, KV cache f32, activations f32/);
      // The chain's KV cache and weights are up's: a request to it that names either is refused before
      // anything runs.
      for (const [flag, value] of [["--kv", "q8"], ["--weights", "f32"]]) {
        const r = await runCli(["generate", "--model", micro, "--tokens", "1", flag, value], { env });
        assert.equal(r.code, 2, `${flag}: ${r.stderr}`);
        assert.match(r.stderr, new RegExp(`${flag} is the chain's: give it to \`up\``));
      }
      // The chain's hops ran: the node asked links to both others, their data on the direct TLS path.
      const others = view.members.filter((m: { id: string }) => m.id !== view.self);
      assert.deepEqual(others.map((m: { dataPath?: string }) => m.dataPath), ["tls", "tls"]);
      const t = JSON.parse(await Deno.readTextFile(trace));
      const tracks = t.traceEvents.filter((e: { name: string }) => e.name === "process_name").length;
      assert.equal(tracks, 3, "a track per node");
      const spans = t.traceEvents.filter((e: { cat?: string; pid: number }) =>
        e.cat === "compute" && e.pid === 2
      );
      assert.equal(spans.length, want.length, "stage 1 computes once per generated token");
    } finally {
      const down = await runCli(["down"], { env });
      const status = await Promise.race([
        up.status,
        new Promise<null>((r) => setTimeout(() => r(null), 20_000)),
      ]);
      if (status === null) up.kill("SIGKILL");
      await up.status;
      await Promise.allSettled([pump, drainOut]);
      await Deno.remove(tmp, { recursive: true });
      assert.equal(down.code, 0);
      // The workers leave with the leader, not after it: none re-plans for the moment it has left.
      assert.doesNotMatch(err, /recovery:/);
    }
  },
});
