// The multi-token GEMV (kernels/gemv_multi.ts) against the CPU reference: every weight type and input
// transform, T from 2 to 16, awkward shapes (rows not a multiple of a workgroup's, K not a multiple of the
// tile nor of a lane's units, an x row offset, accumulate) and several tunings. Skips, saying so, without
// a GPU or without subgroups (the kernel needs them).
import {
  gemvFusedCall,
  matmulRef,
  multiFits,
  multiTileK,
  type MultiTuning,
  rmsnormRef,
  runCalls,
  siluMulRef,
  uploadBuffer,
} from "../../kernels/mod.ts";
import { f16ToF32, f32ToF16 } from "../../models/dtype.ts";
import { assertClose, gpuOrSkip, packedWeights, randoms, readF32, upload } from "./harness.ts";

const gpu = await gpuOrSkip();
if (gpu && !gpu.subgroupSize) {
  console.log(`skipped: multi-token GEMV tests (${gpu.adapterName} has no fixed subgroup size)`);
}
const ignore = gpu === null || !gpu.subgroupSize;

const PER_UNIT = { f32: 4, f16: 8, q8: 16, q4: 32 } as const;

Deno.test(
  { name: "multi-token GEMV matches the reference for every weight type, transform and T", ignore },
  async () => {
    const g = gpu!;
    const S = g.subgroupSize!;
    const tunings: MultiTuning[] = [
      { rows: 1, wg: S },
      { rows: 2, wg: 4 * S, prefetch: false },
      { rows: 3, wg: 2 * S },
      { rows: 4, wg: 8 * S, prefetch: false },
      { rows: 2, wg: 2 * S },
    ];
    let k = 0;
    for (const wt of ["f32", "f16", "q8", "q4"] as const) {
      // K: one unit short of three tiles' worth of lanes (a ragged last tile), and a short row.
      for (
        const K of [
          Math.max(wt === "q8" ? 32 : 8, PER_UNIT[wt]) * (3 * S - 1),
          Math.max(32, PER_UNIT[wt] * 2),
        ]
      ) {
        for (const [T, N] of [[2, 37], [5, 8], [16, 19], [8, 3]]) {
          for (const transform of ["none", "rmsnorm", "silu_mul"] as const) {
            if (!multiFits(g, K, T, wt)) throw new Error(`multi GEMV should fit K ${K} T ${T} ${wt}`);
            const multi = tunings[k++ % tunings.length];
            const accumulate = k % 2 === 0;
            const normWeights = wt === "f32" || k % 3 === 0 ? "f32" as const : "f16" as const;
            const width = transform === "silu_mul" ? 2 * K : K;
            const x = randoms((T + 1) * width, k, 2);
            const w = packedWeights(wt, randoms(N * K, N + k, 0.5), N, K);
            let nw = randoms(K, K + 3);
            const nbuf = normWeights === "f16" ? upload(g, f32ToF16(nw)) : upload(g, nw);
            if (normWeights === "f16") nw = f16ToF32(f32ToF16(nw));
            const y0 = randoms(T * N, 9);
            const y = upload(g, y0);
            await runCalls(g, [
              gemvFusedCall(g, { x: upload(g, x), w: uploadBuffer(g, w.bytes), y, normWeight: nbuf }, {
                K,
                N,
                T,
                accumulate,
                xRow0: 1,
                weights: wt,
                normWeights,
                transform,
                eps: 1e-5,
                multi,
              }),
            ]);
            const rows = x.slice(width, (T + 1) * width);
            const input = transform === "rmsnorm"
              ? rmsnormRef(rows, nw, K, 1e-5)
              : transform === "silu_mul"
              ? siluMulRef(rows, K)
              : rows;
            const want = matmulRef(input, w.deq, { K, N, T, accumulate, weights: "f32" }, y0);
            assertClose(
              await readF32(g, y, T * N),
              want,
              1e-4,
              1e-4,
              `multi gemv ${wt} ${transform} T${T} K${K} (tile ${multiTileK(g, K, T, wt, multi)}) N${N} ` +
                `nw ${normWeights} ${JSON.stringify(multi)}`,
            );
          }
        }
      }
    }
  },
);

Deno.test({ name: "multi-token GEMV rejects a bad tuning", ignore }, () => {
  const g = gpu!;
  const buf = upload(g, new Float32Array(64));
  let err: unknown;
  try {
    gemvFusedCall(g, { x: buf, w: buf, y: buf }, {
      K: 64,
      N: 4,
      T: 3,
      weights: "f32",
      multi: { rows: 0, wg: g.subgroupSize! },
    });
  } catch (e) {
    err = e;
  }
  if (!(err instanceof RangeError) || !/multi-token GEMV tuning/.test(err.message)) {
    throw new Error(`want a RangeError, got ${err}`);
  }
});
