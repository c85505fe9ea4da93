// The subgroup GEMV (kernels/gemv_sg.ts) against the CPU reference, for every weight type and input
// transform and a spread of tunings (rows per warp, unroll, workgroup size, persistent grid, weight
// loads issued before the prologue, RMSNorm's 1 / rms applied to the sums, x loaded before the weights). On lavapipe the subgroup is 8 lanes, on NVIDIA 32: shapes are
// chosen from the adapter's size so each type has 1..4 units per lane. Skips, saying so, without a GPU or without subgroups.
import {
  gemvFusedCall,
  gemvTuningKey,
  matmulRef,
  rmsnormRef,
  runCalls,
  type SgTuning,
  uploadBuffer,
} from "../../kernels/mod.ts";
import {
  assertClose,
  checkDp4,
  gemvCase,
  gpuOrSkip,
  packedWeights,
  randoms,
  readF32,
  upload,
} from "./harness.ts";

const gpu = await gpuOrSkip();
if (gpu && !gpu.subgroupSize) {
  console.log(`skipped: subgroup GEMV tests (${gpu.adapterName} has no fixed subgroup size)`);
}
const ignore = gpu === null || !gpu.subgroupSize;

const PER_UNIT = { f32: 4, f16: 8, q8: 16, q4: 32 } as const;

Deno.test(
  { name: "subgroup GEMV matches the reference for every weight type, transform and tuning", ignore },
  async () => {
    const g = gpu!;
    const S = g.subgroupSize!;
    const tunings: SgTuning[] = [
      { rows: 1, unroll: 1, wg: S, groups: 0 },
      { rows: 2, unroll: 2, wg: 4 * S, groups: 0 },
      { rows: 3, unroll: 1, wg: 2 * S, groups: 2 },
      { rows: 4, unroll: 4, wg: 8 * S, groups: 1 },
      { rows: 2, unroll: 2, wg: 2 * S, groups: 0, dp4: true },
      { rows: 3, unroll: 1, wg: 4 * S, groups: 2, dp4: true },
      { rows: 2, unroll: 2, wg: 4 * S, groups: 0, prefetch: true },
      { rows: 3, unroll: 1, wg: 2 * S, groups: 2, dp4: true, prefetch: true },
      { rows: 4, unroll: 1, wg: S, groups: 3, prefetch: true },
      { rows: 2, unroll: 2, wg: 4 * S, groups: 0, deferNorm: true },
      { rows: 3, unroll: 1, wg: 2 * S, groups: 2, dp4: true, deferNorm: true },
      { rows: 1, unroll: 4, wg: 8 * S, groups: 0, prefetch: true, deferNorm: true },
      { rows: 2, unroll: 2, wg: 2 * S, groups: 1, dp4: true, prefetch: true, deferNorm: true },
      { rows: 2, unroll: 1, wg: 4 * S, groups: 0, prefetch: true, deferNorm: true, earlyX: true },
      { rows: 1, unroll: 2, wg: 2 * S, groups: 2, prefetch: true, deferNorm: true, earlyX: true },
      { rows: 3, unroll: 2, wg: 8 * S, groups: 0, deferNorm: true, earlyX: true },
      { rows: 2, unroll: 1, wg: S, groups: 1, deferNorm: true, earlyX: true },
    ];
    let k = 0;
    for (const wt of ["f32", "f16", "q8", "q4"] as const) {
      for (const lanesUnits of [4, 2]) {
        const K = PER_UNIT[wt] * S * lanesUnits;
        for (const [T, N] of [[1, 37], [2, 5], [3, 64]]) {
          for (const transform of ["none", "rmsnorm", "silu_mul"] as const) {
            const tuning = { ...tunings[k++ % tunings.length] };
            if (wt === "f32" || wt === "f16" || !g.hasDp4) delete tuning.dp4;
            tuning.unroll = Math.min(tuning.unroll, lanesUnits);
            const accumulate = k % 2 === 0;
            const normWeights = wt === "f32" || k % 3 === 0 ? "f32" as const : "f16" as const;
            const c = { wt, K, N, T, transform, accumulate, normWeights, seed: k };
            const { got, want, input, deq } = await gemvCase(g, c, { tuning });
            if (tuning.dp4) {
              checkDp4(got, want, input, deq, { T, N, K }, JSON.stringify(tuning));
              continue;
            }
            assertClose(
              got,
              want,
              1e-4,
              1e-4,
              `sg gemv ${wt} ${transform} T${T} K${K} N${N} nw ${normWeights} ${JSON.stringify(tuning)}`,
            );
          }
        }
      }
    }
  },
);

Deno.test(
  { name: "subgroup GEMV with RMSNorm's 1 / rms deferred to the sums, every weight type", ignore },
  async () => {
    const g = gpu!;
    const S = g.subgroupSize!;
    let k = 0;
    for (const wt of ["f32", "f16", "q8", "q4"] as const) {
      const K = PER_UNIT[wt] * S * 2;
      for (const dp4 of wt === "f32" || wt === "f16" || !g.hasDp4 ? [false] : [false, true]) {
        for (const [prefetch, earlyX] of [[false, false], [true, false], [true, true], [false, true]]) {
          const tuning: SgTuning = {
            rows: 2,
            unroll: 2,
            wg: 2 * S,
            groups: 0,
            dp4,
            prefetch,
            deferNorm: true,
            earlyX,
          };
          const [T, N] = [2, 13];
          const x = randoms((T + 1) * K, 50 + k, 2);
          const w = packedWeights(wt, randoms(N * K, 60 + k++, 0.5), N, K);
          const nw = randoms(K, K + 3);
          const y = upload(g, new Float32Array(T * N));
          await runCalls(g, [
            gemvFusedCall(g, { x: upload(g, x), w: uploadBuffer(g, w.bytes), y, normWeight: upload(g, nw) }, {
              K,
              N,
              T,
              xRow0: 1,
              weights: wt,
              normWeights: "f32",
              transform: "rmsnorm",
              eps: 1e-5,
              tuning,
            }),
          ]);
          const input = rmsnormRef(x.slice(K, (T + 1) * K), nw, K, 1e-5);
          const want = matmulRef(input, w.deq, { K, N, T, weights: "f32" });
          const got = await readF32(g, y, T * N);
          const what = `deferNorm ${wt} ${JSON.stringify(tuning)}`;
          if (dp4) checkDp4(got, want, input, w.deq, { T, N, K }, what);
          else assertClose(got, want, 1e-4, 1e-4, what);
        }
      }
    }
  },
);

Deno.test({ name: "subgroup GEMV: gpu.tuning.gemvTunings replaces one shape's tuning", ignore }, async () => {
  const g = gpu!;
  const S = g.subgroupSize!;
  const K = PER_UNIT.f16 * S * 2;
  const c = { wt: "f16" as const, K, N: 19, T: 1, transform: "rmsnorm" as const, accumulate: false };
  const saved = g.tuning;
  try {
    // A valid override computes the same product; an invalid one reaches checkSgTuning (so it was applied);
    // another shape's key leaves this one alone.
    g.tuning = {
      ...saved,
      gemvTunings: { [gemvTuningKey("f16", "rmsnorm", 19, K)]: { rows: 3, unroll: 1, wg: 2 * S } },
    };
    const { got, want } = await gemvCase(g, { ...c, normWeights: "f32", seed: 5 }, {});
    assertClose(got, want, 1e-4, 1e-4, "gemvTunings override");
    g.tuning = { ...saved, gemvTunings: { [gemvTuningKey("f16", "rmsnorm", 19, K)]: { rows: 0 } } };
    let err: unknown;
    try {
      await gemvCase(g, { ...c, normWeights: "f32", seed: 6 }, {});
    } catch (e) {
      err = e;
    }
    if (!(err instanceof RangeError)) throw new Error(`an invalid override was not applied: ${err}`);
    g.tuning = { ...saved, gemvTunings: { [gemvTuningKey("f16", "rmsnorm", 20, K)]: { rows: 0 } } };
    await gemvCase(g, { ...c, normWeights: "f32", seed: 7 }, {});
  } finally {
    g.tuning = saved;
  }
});

Deno.test({ name: "subgroup GEMV rejects a tuning that does not divide the row", ignore }, () => {
  const g = gpu!;
  const S = g.subgroupSize!;
  const buf = upload(g, new Float32Array(64));
  let err: unknown;
  try {
    gemvFusedCall(g, { x: buf, w: buf, y: buf }, {
      K: 8 * S * 3,
      N: 4,
      T: 1,
      weights: "f16",
      tuning: { rows: 1, unroll: 2, wg: S, groups: 0 },
    });
  } catch (e) {
    err = e;
  }
  if (!(err instanceof RangeError) || !/tuning/.test(err.message)) {
    throw new Error(`want a RangeError, got ${err}`);
  }
});

// Direct mode (SgTuning `direct`: x read in place, each row block's K split over `splitK` warps): f32 and
// f16 weights, no transform and RMSNorm (f32 / f16 norm weights), accumulate on and off, N not a multiple
// of the rows a workgroup owns, K whose chunks (unroll x S units) do and do not divide by splitK, and T = 1
// and T = 3 (the grid's y).
Deno.test({ name: "direct subgroup GEMV matches the reference", ignore }, async () => {
  const g = gpu!;
  const S = g.subgroupSize!;
  const tunings: SgTuning[] = [
    { rows: 1, unroll: 1, wg: S, groups: 0, direct: true, splitK: 1 },
    { rows: 1, unroll: 1, wg: 4 * S, groups: 0, direct: true, splitK: 4 },
    { rows: 2, unroll: 2, wg: 4 * S, groups: 0, direct: true, splitK: 2 },
    { rows: 3, unroll: 1, wg: 8 * S, groups: 0, direct: true, splitK: 4 },
    { rows: 2, unroll: 1, wg: 8 * S, groups: 0, direct: true, splitK: 8 },
    { rows: 1, unroll: 2, wg: 2 * S, groups: 0, direct: true, splitK: 2 },
  ];
  let k = 0;
  for (const wt of ["f32", "f16"] as const) {
    // Units per lane: 3 and 6 leave chunks that splitK 2, 4 and 8 do not divide; 8 divides.
    for (const perLane of [3, 6, 8]) {
      const K = PER_UNIT[wt] * S * perLane;
      for (const [T, N] of [[1, 37], [3, 5]]) {
        for (const transform of ["none", "rmsnorm"] as const) {
          for (const accumulate of [false, true]) {
            const tuning = { ...tunings[k++ % tunings.length] };
            if (perLane % tuning.unroll !== 0) tuning.unroll = 1;
            const normWeights = k % 3 === 0 ? "f16" as const : "f32" as const;
            const c = { wt, K, N, T, transform, accumulate, normWeights, seed: 70 + k };
            const { got, want } = await gemvCase(g, c, { tuning });
            assertClose(
              got,
              want,
              1e-4,
              1e-4,
              `direct ${wt} ${transform} T${T} K${K} N${N} acc ${accumulate} nw ${normWeights} ${
                JSON.stringify(tuning)
              }`,
            );
          }
        }
      }
    }
  }
});

Deno.test({ name: "direct subgroup GEMV refuses what it does not serve, clearly", ignore }, () => {
  const g = gpu!;
  const S = g.subgroupSize!;
  const buf = upload(g, new Float32Array(64));
  const K = 8 * S * 2;
  const base: SgTuning = { rows: 1, unroll: 1, wg: 2 * S, groups: 0, direct: true, splitK: 2 };
  const cases: [string, Partial<Parameters<typeof gemvFusedCall>[2]>, RegExp][] = [
    ["silu_mul", { transform: "silu_mul" }, /silu_mul/],
    ["q8", { weights: "q8", K: 32 * S }, /q8/],
    ["splitK 3", { tuning: { ...base, splitK: 3 } }, /splitK/],
    ["groups", { tuning: { ...base, groups: 4 } }, /groups/],
  ];
  for (const [what, over, re] of cases) {
    let err: unknown;
    try {
      gemvFusedCall(g, { x: buf, w: buf, y: buf, normWeight: buf }, {
        K,
        N: 4,
        T: 1,
        weights: "f16",
        tuning: base,
        ...over,
      });
    } catch (e) {
      err = e;
    }
    if (!(err instanceof RangeError) || !re.test(err.message)) throw new Error(`${what}: got ${err}`);
  }
});
