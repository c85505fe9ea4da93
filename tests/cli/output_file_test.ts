// Output files (issue 11, item 8): a regular file is replaced atomically, through a symlink its target is;
// a FIFO or a device is written in place and stays what it was (as root, `logits --out /dev/full` once
// replaced the device with a regular file and reported success); write errors are reported.
import assert from "node:assert/strict";
import { join } from "node:path";
import { checkOutputPath, writeJsonOutput } from "../../cli/output_file.ts";
import { fixtureDir } from "../fixtures.ts";
import { gpuAvailable, needs } from "../support/needs.ts";
import { spawnCli } from "./run.ts";

const linux = Deno.build.os === "linux";
const root = linux && Deno.uid() === 0;
const hasGpu = await gpuAvailable();
const micro = fixtureDir("llama-micro");

async function mkfifo(path: string) {
  assert.ok((await new Deno.Command("mkfifo", { args: [path] }).output()).success);
}

/** A private copy of /dev/full (root only): every write fails with ENOSPC. */
async function fullDevice(dir: string): Promise<string> {
  const path = join(dir, "full");
  assert.ok((await new Deno.Command("mknod", { args: [path, "c", "1", "7"] }).output()).success);
  return path;
}

Deno.test("output: a regular file is replaced; through a symlink, the file it points to", async () => {
  const dir = await Deno.makeTempDir();
  const file = join(dir, "a.json");
  await Deno.writeTextFile(file, "old");
  await writeJsonOutput(file, { n: 1 });
  assert.equal(await Deno.readTextFile(file), '{"n":1}');
  await Deno.symlink(file, join(dir, "link.json"));
  await writeJsonOutput(join(dir, "link.json"), { n: 2 });
  assert.ok((await Deno.lstat(join(dir, "link.json"))).isSymlink, "the symlink stays");
  assert.equal(await Deno.readTextFile(file), '{"n":2}');
  assert.deepEqual([...Deno.readDirSync(dir)].map((e) => e.name).sort(), ["a.json", "link.json"]);
});

Deno.test(
  { ...needs("output: a FIFO is written in place and stays a FIFO", { "Linux (mkfifo)": linux }) },
  async () => {
    const fifo = join(await Deno.makeTempDir(), "out");
    await mkfifo(fifo);
    const read = Deno.readTextFile(fifo);
    await writeJsonOutput(fifo, { n: 3 });
    assert.equal(await read, '{"n":3}');
    assert.ok((await Deno.stat(fifo)).isFifo);
  },
);

Deno.test(
  needs("output: a write error is reported, naming the file; the device stays", {
    "root on Linux (mknod)": root,
  }),
  async () => {
    const full = await fullDevice(await Deno.makeTempDir());
    await assert.rejects(writeJsonOutput(full, { n: 4 }), /cannot write .*full: .*(space|ENOSPC)/i);
    assert.ok((await Deno.stat(full)).isCharDevice);
  },
);

Deno.test("output: a missing folder or a folder as the file is bad input, found before any work", async () => {
  await assert.rejects(
    checkOutputPath("/nonexistent/x.json", "--out"),
    /--out .*folder \/nonexistent does not exist/,
  );
  await assert.rejects(checkOutputPath(Deno.cwd(), "--out"), /is a folder/);
  await checkOutputPath(join(await Deno.makeTempDir(), "new.json"), "--out");
});

Deno.test({
  ...needs(
    "logits --out: a FIFO receives the safetensors; a full device (as root) fails with exit 1, stays",
    {
      "Linux (mkfifo)": linux,
      "a WebGPU adapter": hasGpu,
      "the llama-micro fixture": micro,
    },
  ),
  sanitizeResources: false,
  sanitizeOps: false,
}, async () => {
  const dir = await Deno.makeTempDir();
  const fifo = join(dir, "logits.safetensors");
  await mkfifo(fifo);
  const read = Deno.readFile(fifo);
  const p = spawnCli(["logits", "--model", micro!, "--tokens", "1,2,3", "--out", fifo]);
  const timer = setTimeout(() => p.child.kill("SIGKILL"), 60_000);
  assert.equal(await p.code(), 0, p.stderr());
  clearTimeout(timer);
  const bytes = await Promise.race([
    read,
    new Promise<never>((_, j) => setTimeout(() => j("no data"), 5000)),
  ]);
  const header = JSON.parse(
    new TextDecoder().decode(bytes.slice(8, 8 + Number(new DataView(bytes.buffer).getBigUint64(0, true)))),
  );
  assert.deepEqual(header.logits.shape, [3, 512]);
  assert.ok((await Deno.stat(fifo)).isFifo, "the FIFO stays a FIFO");
  if (root) {
    const full = await fullDevice(dir);
    const q = spawnCli(["logits", "--model", micro!, "--tokens", "1,2,3", "--out", full]);
    assert.equal(await q.code(), 1, q.stderr());
    assert.match(q.stderr(), /cannot write .*full/);
    assert.ok((await Deno.stat(full)).isCharDevice, "the device stays a device");
  }
});
