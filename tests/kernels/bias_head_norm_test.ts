// The bias add and the per-head q/k RMSNorm against their CPU references, on awkward shapes.
import { biasAddCall, biasAddRef, headNormCall, headNormRef, runCalls } from "../../kernels/mod.ts";
import { assertClose, gpuOrSkip, randoms, readF32, upload } from "./harness.ts";

const gpu = await gpuOrSkip();
const ignore = gpu === null;

Deno.test({ name: "bias_add adds the bias to every row", ignore }, async () => {
  const g = gpu!;
  for (const [T, N] of [[1, 1], [3, 7], [2, 257], [5, 96]]) {
    const y0 = randoms(T * N, T + N);
    const b = randoms(N, N + 1);
    const y = upload(g, y0);
    await runCalls(g, [biasAddCall(g, { b: upload(g, b), y }, { N, T })]);
    assertClose(await readF32(g, y, T * N), biasAddRef(y0, b), 0, 1e-7, `bias_add ${T}x${N}`);
  }
});

Deno.test({ name: "head_norm normalises each q and k head and leaves v alone", ignore }, async () => {
  const g = gpu!;
  for (const [T, heads, kvHeads, headDim] of [[1, 1, 1, 2], [3, 4, 2, 24], [2, 6, 3, 130], [1, 8, 1, 256]]) {
    const d = { heads, kvHeads, headDim, eps: 1e-6 };
    const qkv0 = randoms(T * (heads + 2 * kvHeads) * headDim, T * heads + headDim, 3);
    const wq = randoms(headDim, headDim + 1);
    const wk = randoms(headDim, headDim + 2);
    const qkv = upload(g, qkv0);
    await runCalls(g, [headNormCall(g, { qkv, wq: upload(g, wq), wk: upload(g, wk) }, { ...d, T })]);
    assertClose(
      await readF32(g, qkv, qkv0.length),
      headNormRef(qkv0, wq, wk, d),
      1e-6,
      1e-5,
      `head_norm T${T} ${heads}/${kvHeads}x${headDim}`,
    );
  }
});
