// argmax of every logits row on the GPU (kernels/argmax_rows.ts) against the reference: vocabularies that
// are not a multiple of a workgroup's chunk, ties (lowest index wins), the max in the last chunk; at the
// default chunk and others (gpu.tuning.argmaxChunk).
import { argmaxRowsCalls, argmaxRowsRef, runCalls, storageBuffer } from "../../kernels/mod.ts";
import { gpuOrSkip, randoms, readU32, upload } from "./harness.ts";

const gpu = await gpuOrSkip();

for (const chunk of [undefined, 256, 4096]) {
  Deno.test({
    name: `argmax of each logits row matches the reference (argmaxChunk ${chunk ?? "default"})`,
    ignore: gpu === null,
  }, async () => {
    const g = gpu!;
    g.tuning.argmaxChunk = chunk;
    try {
      await rows(g);
    } finally {
      delete g.tuning.argmaxChunk;
    }
  });
}

async function rows(g: NonNullable<typeof gpu>): Promise<void> {
  for (const [T, V] of [[1, 5], [3, 4097], [16, 9000], [5, 12289], [2, 1025]]) {
    const logits = randoms(T * V, T + V);
    if (T > 1) {
      // Row 1: a tie between two positions (the lower wins); row 2 (if any): the max at the very end.
      logits[V + 7] = 5;
      logits[V + V - 1] = 5;
      if (T > 2) logits[2 * V + V - 1] = 9;
    }
    const out = storageBuffer(g, T * 4);
    await runCalls(g, argmaxRowsCalls(g, { logits: upload(g, logits), out }, { vocab: V, T }));
    const got = Array.from(await readU32(g, out, T));
    const want = Array.from(argmaxRowsRef(logits, V));
    if (got.join() !== want.join()) throw new Error(`T ${T} V ${V}: got ${got}, want ${want}`);
    if (T > 1 && got[1] !== 7) throw new Error(`a tie should give the lower index 7, got ${got[1]}`);
  }
}
