import assert from "node:assert/strict";
import { join } from "node:path";
import { CheckpointError } from "../../models/errors.ts";
import { readSafetensorsHeader, readTensorBytes, writeSafetensors } from "../../models/safetensors.ts";
import { fixtureDir } from "../fixtures.ts";

function bytes(n: number, seed = 1): Uint8Array {
  return Uint8Array.from({ length: n }, (_, i) => (i * 31 + seed) & 0xff);
}

/** A safetensors file built by hand from a header object and a data length. */
async function rawFile(dir: string, header: unknown, dataLen: number, opts: { len?: bigint } = {}) {
  const json = new TextEncoder().encode(typeof header === "string" ? header : JSON.stringify(header));
  const prefix = new Uint8Array(8);
  new DataView(prefix.buffer).setBigUint64(0, opts.len ?? BigInt(json.length), true);
  const path = join(dir, "x.safetensors");
  await Deno.writeFile(path, new Uint8Array([...prefix, ...json, ...bytes(dataLen)]));
  return path;
}

async function rejects(p: Promise<unknown>, pattern: RegExp) {
  await assert.rejects(p, (e: Error) => {
    assert.ok(e instanceof CheckpointError, `expected CheckpointError, got ${e}`);
    assert.match(e.message, pattern);
    return true;
  });
}

Deno.test("write then read a header: absolute offsets, dtypes, metadata skipped, exact bytes back", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const path = join(dir, "t.safetensors");
    const a = bytes(2 * 3 * 4);
    const b = bytes(5 * 2, 7);
    const c = bytes(3 * 8, 9);
    await writeSafetensors(path, [
      { name: "a", dtype: "F32", shape: [2, 3], data: a },
      { name: "b", dtype: "BF16", shape: [5], data: b },
      { name: "c", dtype: "I64", shape: [3], data: c },
    ], { format: "pt" });
    const header = await readSafetensorsHeader(path);
    assert.deepEqual([...header.keys()], ["a", "b", "c"]);
    const info = header.get("b")!;
    assert.equal(info.dtype, "BF16");
    assert.deepEqual(info.shape, [5]);
    assert.equal(info.file, path);
    assert.equal(info.end - info.begin, 10);
    const raw = await Deno.readFile(path);
    const headerLen = Number(new DataView(raw.buffer).getBigUint64(0, true));
    assert.equal(headerLen % 8, 0, "header padded to 8 bytes");
    assert.equal(header.get("a")!.begin, 8 + headerLen);
    assert.deepEqual(await readTensorBytes(header.get("a")!), a);
    assert.deepEqual(await readTensorBytes(info), b);
    assert.deepEqual(await readTensorBytes(header.get("c")!), c);
    assert.deepEqual([...Deno.readDirSync(dir)].map((e) => e.name), ["t.safetensors"], "no temp file left");
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("writeSafetensors refuses data whose length disagrees with the shape", async () => {
  await assert.rejects(
    writeSafetensors("/nonexistent/x", [{ name: "a", dtype: "F16", shape: [3], data: new Uint8Array(4) }]),
    /tensor a: 4 bytes, expected 6/,
  );
});

Deno.test("bad headers and truncated files are CheckpointErrors that say what was wrong", async (t) => {
  const dir = await Deno.makeTempDir();
  const entry = (offsets: unknown, extra = {}) => ({
    w: { dtype: "F32", shape: [2], data_offsets: offsets, ...extra },
  });
  try {
    await t.step(
      "missing file",
      () => rejects(readSafetensorsHeader(join(dir, "none.safetensors")), /not found/),
    );
    await t.step("shorter than the length prefix", async () => {
      const path = join(dir, "short.safetensors");
      await Deno.writeFile(path, new Uint8Array(5));
      await rejects(readSafetensorsHeader(path), /bad safetensors header: file has 5 bytes/);
    });
    await t.step("garbage length", async () => {
      const path = await rawFile(dir, entry([0, 8]), 8, { len: 0xdeadbeefcafen });
      await rejects(readSafetensorsHeader(path), /bad safetensors header: header length 244837814094590/);
    });
    await t.step("length past the end of the file", async () => {
      const path = await rawFile(dir, entry([0, 8]), 0, { len: 1000n });
      await rejects(readSafetensorsHeader(path), /header length 1000/);
    });
    await t.step("invalid JSON", async () => {
      const path = await rawFile(dir, "{not json", 8);
      await rejects(readSafetensorsHeader(path), /not valid UTF-8 JSON/);
    });
    await t.step("JSON that is not an object", async () => {
      const path = await rawFile(dir, [1, 2], 8);
      await rejects(readSafetensorsHeader(path), /expected a JSON object/);
    });
    await t.step("unknown dtype", async () => {
      const path = await rawFile(dir, entry([0, 8], { dtype: "F12" }), 8);
      await rejects(readSafetensorsHeader(path), /tensor w: unknown dtype "F12"/);
    });
    await t.step("offsets out of order", async () => {
      const path = await rawFile(dir, entry([8, 0]), 8);
      await rejects(readSafetensorsHeader(path), /tensor w: data_offsets \[8,0\]/);
    });
    await t.step("offsets that disagree with the shape", async () => {
      const path = await rawFile(dir, entry([0, 6]), 8);
      await rejects(readSafetensorsHeader(path), /data_offsets span 6 bytes, expected 8 for F32 \[2\]/);
    });
    await t.step("bad shape", async () => {
      const path = await rawFile(dir, entry([0, 8], { shape: [-2] }), 8);
      await rejects(readSafetensorsHeader(path), /shape \[-2\]/);
    });
    await t.step("truncated: offsets past the end of the file", async () => {
      const path = await rawFile(dir, entry([0, 8]), 5);
      await rejects(
        readSafetensorsHeader(path),
        /truncated: tensor w needs bytes \d+\.\.\d+ but file has \d+/,
      );
    });
    await t.step("file truncated after the header was read: the tensor read fails clearly", async () => {
      const path = await rawFile(dir, entry([0, 8]), 8);
      const info = (await readSafetensorsHeader(path)).get("w")!;
      await Deno.truncate(path, info.begin + 3);
      await rejects(readTensorBytes(info), /truncated: tensor w needs bytes/);
    });
    await t.step("__metadata__ is skipped", async () => {
      const path = await rawFile(dir, { __metadata__: { format: "pt" }, ...entry([0, 8]) }, 8);
      assert.deepEqual([...(await readSafetensorsHeader(path)).keys()], ["w"]);
    });
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("a file written by torch (llama-micro's reference): int32 tokens and float32 logits", async () => {
  const dir = fixtureDir("llama-micro", { needs: "reference.safetensors" })!;
  const header = await readSafetensorsHeader(join(dir, "reference.safetensors"));
  const ref = JSON.parse(await Deno.readTextFile(join(dir, "reference.json")));
  const tokens = header.get("tokens")!;
  assert.equal(tokens.dtype, "I32");
  assert.deepEqual(tokens.shape, [ref.tokens.length]);
  const bytes = await readTensorBytes(tokens);
  assert.deepEqual([...new Int32Array(bytes.buffer, bytes.byteOffset, bytes.length / 4)], ref.tokens);
  assert.equal(header.get("logits")!.dtype, "F32");
  assert.deepEqual(header.get("logits")!.shape, [ref.tokens.length, 512]);
});
