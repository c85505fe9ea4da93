import assert from "node:assert/strict";
import { ReadAhead } from "../../models/read_ahead.ts";
import { Checkpoint } from "../../models/checkpoint.ts";
import { CheckpointError } from "../../models/errors.ts";
import type { TensorInfo } from "../../models/safetensors.ts";
import { fixtureDir } from "../fixtures.ts";
import { countFileReads } from "../support/file_reads.ts";

/** Tensors t0, t1, ... of these byte sizes, back to back in one (imaginary) file. */
function infos(sizes: number[]): TensorInfo[] {
  let at = 0;
  return sizes.map((n, i) => {
    const info = { name: `t${i}`, dtype: "U8" as const, shape: [n], file: "f", begin: at, end: at + n };
    at += n;
    return info;
  });
}

/** A fake read the test finishes by hand: `started` in order, `finish(name)` resolves (or fails) one. */
function manualReads() {
  const started: string[] = [];
  const pending = new Map<string, { resolve: (b: Uint8Array) => void; reject: (e: Error) => void }>();
  const read = (info: TensorInfo) => {
    started.push(info.name);
    return new Promise<Uint8Array>((resolve, reject) => pending.set(info.name, { resolve, reject }));
  };
  const finish = async (name: string, error?: Error) => {
    const p = pending.get(name)!;
    pending.delete(name);
    if (error) p.reject(error);
    else p.resolve(new TextEncoder().encode(name));
    await new Promise((r) => setTimeout(r, 0)); // the reader's own handlers run
  };
  return { started, read, finish };
}

Deno.test("reads ahead in order, within the bytes and the reads at once, and hands each over once", async () => {
  const all = infos([100, 100, 100, 100, 100]);
  const m = manualReads();
  const ahead = new ReadAhead(all, { bytes: 300, reads: 2 }, m.read);
  assert.deepEqual(m.started, ["t0", "t1"]); // two at once
  await m.finish("t0");
  assert.deepEqual(m.started, ["t0", "t1", "t2"]); // 300 bytes held: no more
  assert.equal(ahead.held, 300);
  await m.finish("t1");
  assert.deepEqual(m.started, ["t0", "t1", "t2"]);
  assert.equal(new TextDecoder().decode(await ahead.take(all[0])!), "t0");
  assert.deepEqual(m.started, ["t0", "t1", "t2", "t3"]); // t0 taken: room for t3
  assert.equal(ahead.take(all[0]), undefined); // handed over once
  assert.equal(ahead.held, 300);
  assert.ok(ahead.inFlight <= 2);
});

Deno.test("a tensor asked for before it is read ahead is left to the caller and never read here", async () => {
  const all = infos([100, 100, 100]);
  const m = manualReads();
  const ahead = new ReadAhead(all, { bytes: 100, reads: 4 }, m.read);
  assert.deepEqual(m.started, ["t0"]);
  assert.equal(ahead.take(all[2]), undefined); // out of order: the caller reads t2 itself
  const t0 = ahead.take(all[0])!;
  await m.finish("t0");
  assert.equal(new TextDecoder().decode(await t0), "t0");
  await m.finish("t1");
  assert.deepEqual(m.started, ["t0", "t1"]); // t2 is not read a second time
});

Deno.test("one tensor larger than the limit is still read ahead, alone; a limit of 0 reads nothing", () => {
  const m = manualReads();
  new ReadAhead(infos([500, 10]), { bytes: 100, reads: 4 }, m.read);
  assert.deepEqual(m.started, ["t0"]);
  const none = manualReads();
  new ReadAhead(infos([10, 10]), { bytes: 0 }, none.read);
  assert.deepEqual(none.started, []);
});

Deno.test("a failed read fails its taker; one never taken is dropped without an unhandled rejection", async () => {
  const all = infos([10, 10]);
  const m = manualReads();
  const ahead = new ReadAhead(all, { bytes: 100, reads: 4 }, m.read);
  const t0 = ahead.take(all[0])!;
  await m.finish("t0", new Error("disk gone"));
  await assert.rejects(t0, /disk gone/);
  await m.finish("t1", new Error("never taken")); // the test fails on an unhandled rejection
  ahead.stop();
  assert.equal(ahead.held, 0);
});

Deno.test("stop starts nothing more", async () => {
  const all = infos([10, 10, 10]);
  const m = manualReads();
  const ahead = new ReadAhead(all, { bytes: 100, reads: 1 }, m.read);
  ahead.stop();
  await m.finish("t0");
  assert.deepEqual(m.started, ["t0"]);
  assert.equal(ahead.take(all[1]), undefined);
});

Deno.test("bad limits are refused, naming them", () => {
  assert.throws(() => new ReadAhead([], { bytes: -1 }), /read-ahead bytes must be >= 0, got -1/);
  assert.throws(
    () => new ReadAhead([], { bytes: 1, reads: 0 }),
    /read-ahead reads must be a whole number >= 1/,
  );
});

Deno.test("a checkpoint read ahead gives the same bytes, reading each tensor's bytes once", async () => {
  const dir = fixtureDir("llama-micro")!;
  const plain = await Checkpoint.open(dir);
  const ahead = await Checkpoint.open(dir);
  const names = [...plain.tensors.keys()];
  const want = new Map<string, Uint8Array>();
  for (const n of names) want.set(n, (await plain.read(n)).bytes);
  // Asked for in another order than read ahead in: some are handed over, others read directly.
  const { bytes } = await countFileReads(async () => {
    ahead.readAhead(names, { bytes: 4096, reads: 2 });
    for (const n of [...names].reverse()) assert.deepEqual((await ahead.read(n)).bytes, want.get(n), n);
    ahead.stopReadAhead();
  });
  const total = names.reduce((s, n) => s + plain.info(n).end - plain.info(n).begin, 0);
  assert.equal(bytes, total);
});

Deno.test("a file cut short after opening: its reads ahead fail as CheckpointErrors, to their takers", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const src = fixtureDir("llama-micro")!;
    await Deno.copyFile(`${src}/config.json`, `${dir}/config.json`);
    await Deno.copyFile(`${src}/model.safetensors`, `${dir}/model.safetensors`);
    const ckpt = await Checkpoint.open(dir);
    const infos = [...ckpt.tensors.values()].sort((a, b) => a.begin - b.begin);
    const last = infos.at(-1)!;
    await Deno.truncate(`${dir}/model.safetensors`, last.begin + 4);
    ckpt.readAhead(infos.map((i) => i.name));
    for (const i of infos.slice(0, -1)) {
      assert.equal((await ckpt.read(i.name)).bytes.byteLength, i.end - i.begin);
    }
    await assert.rejects(
      ckpt.read(last.name),
      (e: Error) =>
        e instanceof CheckpointError && /truncated: tensor .* but the file ended at/.test(e.message),
    );
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
