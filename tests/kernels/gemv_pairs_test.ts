// The paired gate/up GEMV (gemv_sg.ts and gemv_multi.ts with `pairs`: W = [gate; up], y = silu(gate) * up)
// against the CPU reference: every weight type, every input transform, T from 1 to 16 (one-row kernel with
// a grid row per token, and the multi-token kernel), awkward shapes (N not a multiple of a warp's pairs, x
// row offset), tunings with and without prefetch and (quantised) int8 activations; and the dense MLP's
// decode program with pairing on and off giving the same x. Skips, saying so, without a GPU or subgroups.
import {
  gemvFusedCall,
  gemvFusedCalls,
  gemvPairFits,
  matmulRef,
  type MultiTuning,
  rmsnormRef,
  runCalls,
  type SgTuning,
  siluMulRef,
  uploadBuffer,
} from "../../kernels/mod.ts";
import { f16ToF32, f32ToF16 } from "../../models/dtype.ts";
import {
  assertClose,
  dp4Bounds,
  dp4Simulated,
  gpuOrSkip,
  packedWeights,
  randoms,
  readF32,
  upload,
} from "./harness.ts";

const gpu = await gpuOrSkip();
if (gpu && !gpu.subgroupSize) {
  console.log(`skipped: paired gate/up GEMV tests (${gpu.adapterName} has no fixed subgroup size)`);
}
const ignore = gpu === null || !gpu.subgroupSize;

const PER_UNIT = { f32: 4, f16: 8, q8: 16, q4: 32 } as const;
const silu = (g: number) => g / (1 + Math.exp(-g));

async function checkPairs(
  g: NonNullable<typeof gpu>,
  o: {
    wt: "f32" | "f16" | "q8" | "q4";
    K: number;
    N: number;
    T: number;
    transform: "none" | "rmsnorm" | "silu_mul";
    seed: number;
    tuning?: SgTuning;
    multi?: MultiTuning | false;
    /** gpu.tuning.multiInt8 for the run (the int8 direct multi-token GEMV and its input pass). */
    int8?: boolean;
  },
): Promise<void> {
  const { wt, K, N, T, transform, seed } = o;
  const normWeights = wt === "f32" || seed % 3 === 0 ? "f32" as const : "f16" as const;
  const width = transform === "silu_mul" ? 2 * K : K;
  const x = randoms((T + 1) * width, seed, 2);
  const w = packedWeights(wt, randoms(2 * N * K, N + seed, 0.5), 2 * N, K);
  let nw = randoms(K, K + 3);
  const nbuf = normWeights === "f16" ? upload(g, f32ToF16(nw)) : upload(g, nw);
  if (normWeights === "f16") nw = f16ToF32(f32ToF16(nw));
  const y = upload(g, randoms(T * N, 9));
  const saved = { ...g.tuning };
  if (o.int8) g.tuning.multiInt8 = true;
  try {
    await runCalls(
      g,
      gemvFusedCalls(g, { x: upload(g, x), w: uploadBuffer(g, w.bytes), y, normWeight: nbuf }, {
        K,
        N,
        T,
        xRow0: 1,
        weights: wt,
        normWeights,
        transform,
        eps: 1e-5,
        tuning: o.tuning,
        multi: o.multi,
        pairs: true,
      }),
    );
  } finally {
    g.tuning = saved;
  }
  const rows = x.slice(width, (T + 1) * width);
  const input = transform === "rmsnorm"
    ? rmsnormRef(rows, nw, K, 1e-5)
    : transform === "silu_mul"
    ? siluMulRef(rows, K)
    : rows;
  const dims = { K, N, T, weights: "f32" as const };
  const gate = matmulRef(input, w.deq.subarray(0, N * K), dims);
  const up = matmulRef(input, w.deq.subarray(N * K), dims);
  const want = gate.map((v, i) => silu(v) * up[i]);
  const got = await readF32(g, y, T * N);
  const what = `pairs ${wt} ${transform} T${T} K${K} N${N} nw ${normWeights} ${
    JSON.stringify(o.tuning ?? o.multi ?? (o.int8 ? "int8" : "default"))
  }`;
  if (o.tuning?.dp4 || o.int8) {
    // silu' lies in (-0.1, 1.1): an error eg in gate and eu in up move the product by at most this.
    const eg = dp4Bounds(input, w.deq.subarray(0, N * K), T, N, K);
    const eu = dp4Bounds(input, w.deq.subarray(N * K), T, N, K);
    for (let i = 0; i < T * N; i++) {
      const bound = 1e-4 + 1e-4 * Math.abs(want[i]) + 1.1 * eg[i] * (Math.abs(up[i]) + eu[i]) +
        Math.abs(silu(gate[i])) * eu[i] + 1.1 * eg[i] * eu[i];
      if (!(Math.abs(got[i] - want[i]) <= bound)) {
        throw new Error(`dp4 ${what}: output ${i}: got ${got[i]}, want ${want[i]} (bound ${bound})`);
      }
    }
    // Tighter: silu(gate) * up of the int8 products themselves (harness dp4Simulated), within their f32
    // rounding and one code off by one, carried through the product as above.
    const sg = dp4Simulated(input, w.deq.subarray(0, N * K), T, N, K);
    const su = dp4Simulated(input, w.deq.subarray(N * K), T, N, K);
    for (let i = 0; i < T * N; i++) {
      const g8 = gate[i] + sg.shift[i], u8 = up[i] + su.shift[i];
      const tg = sg.tol[i] + 1e-4 * Math.abs(g8), tu = su.tol[i] + 1e-4 * Math.abs(u8);
      const int8 = silu(g8) * u8;
      const bound = 1e-5 + 1.1 * tg * (Math.abs(u8) + tu) + Math.abs(silu(g8)) * tu;
      if (!(Math.abs(got[i] - int8) <= bound)) {
        throw new Error(
          `dp4 ${what}: output ${i}: got ${got[i]}, the int8 product is ${int8} (bound ${bound})`,
        );
      }
    }
    return;
  }
  assertClose(got, want, 1e-4, 1e-4, what);
}

Deno.test(
  {
    name: "paired gate/up GEMV (one-row kernel) matches silu(gate) * up for every weight type and tuning",
    ignore,
  },
  async () => {
    const g = gpu!;
    const S = g.subgroupSize!;
    const tunings: SgTuning[] = [
      { rows: 1, unroll: 1, wg: S, groups: 0 },
      { rows: 2, unroll: 2, wg: 4 * S, groups: 0, prefetch: true },
      { rows: 3, unroll: 1, wg: 2 * S, groups: 2 },
      { rows: 4, unroll: 2, wg: 8 * S, groups: 1, prefetch: true },
      { rows: 2, unroll: 2, wg: 2 * S, groups: 0, dp4: true },
      { rows: 3, unroll: 1, wg: 4 * S, groups: 2, dp4: true, prefetch: true },
      { rows: 2, unroll: 2, wg: 4 * S, groups: 0, deferNorm: true },
      { rows: 1, unroll: 2, wg: 2 * S, groups: 3, dp4: true, prefetch: true, deferNorm: true },
    ];
    let k = 0;
    for (const wt of ["f32", "f16", "q8", "q4"] as const) {
      for (const lanesUnits of [2, 4]) {
        const K = PER_UNIT[wt] * S * lanesUnits;
        for (const [T, N] of [[1, 37], [3, 5]]) {
          for (const transform of ["none", "rmsnorm", "silu_mul"] as const) {
            const tuning = { ...tunings[k++ % tunings.length] };
            if (wt === "f32" || wt === "f16" || !g.hasDp4) delete tuning.dp4;
            tuning.unroll = Math.min(tuning.unroll, lanesUnits);
            // multi: false keeps T = 3 on this kernel (a grid row per token).
            await checkPairs(g, { wt, K, N, T, transform, seed: k, tuning, multi: false });
          }
        }
      }
    }
  },
);

Deno.test(
  {
    name: "paired gate/up GEMV in direct mode (x read in place, K split over warps) matches the reference",
    ignore,
  },
  async () => {
    const g = gpu!;
    const S = g.subgroupSize!;
    const tunings: SgTuning[] = [
      { rows: 1, unroll: 1, wg: S, groups: 0, direct: true, splitK: 1 },
      { rows: 2, unroll: 1, wg: 4 * S, groups: 0, direct: true, splitK: 4 },
      { rows: 3, unroll: 2, wg: 4 * S, groups: 0, direct: true, splitK: 2 },
      { rows: 4, unroll: 1, wg: 8 * S, groups: 0, direct: true, splitK: 8 },
    ];
    let k = 0;
    for (const wt of ["f32", "f16"] as const) {
      // 3 and 6 units a lane: chunk counts the splits do and do not divide.
      for (const lanesUnits of [3, 6]) {
        const K = PER_UNIT[wt] * S * lanesUnits;
        for (const [T, N] of [[1, 37], [3, 5]]) {
          for (const transform of ["none", "rmsnorm"] as const) {
            const tuning = { ...tunings[k++ % tunings.length] };
            if (lanesUnits % tuning.unroll !== 0) tuning.unroll = 1;
            await checkPairs(g, { wt, K, N, T, transform, seed: 300 + k, tuning, multi: false });
          }
        }
      }
    }
  },
);

Deno.test(
  { name: "paired gate/up GEMV (multi-token kernel) matches silu(gate) * up for T = 2..16", ignore },
  async () => {
    const g = gpu!;
    const S = g.subgroupSize!;
    const tunings: MultiTuning[] = [
      { rows: 1, wg: S },
      { rows: 2, wg: 4 * S, prefetch: false },
      { rows: 3, wg: 2 * S },
      { rows: 4, wg: 8 * S, prefetch: false },
    ];
    let k = 0;
    for (const wt of ["f32", "f16", "q8", "q4"] as const) {
      // A ragged last tile, and a short row.
      for (
        const K of [
          Math.max(wt === "q8" ? 32 : 8, PER_UNIT[wt]) * (3 * S - 1),
          Math.max(32, PER_UNIT[wt] * 2),
        ]
      ) {
        for (const [T, N] of [[2, 37], [16, 19], [5, 3]]) {
          const transform = (["none", "rmsnorm", "silu_mul"] as const)[k % 3];
          await checkPairs(g, {
            wt,
            K,
            N,
            T,
            transform,
            seed: 100 + k,
            multi: tunings[k++ % tunings.length],
          });
        }
      }
    }
  },
);

Deno.test({ name: "paired gate/up GEMV at its default tunings, T = 1..16", ignore }, async () => {
  const g = gpu!;
  const S = g.subgroupSize!;
  let k = 0;
  for (const wt of ["f32", "f16", "q8", "q4"] as const) {
    const K = PER_UNIT[wt] * S * 2;
    for (const T of [1, 2, 4, 16]) {
      if (!gemvPairFits(g, K, T, wt)) throw new Error(`pairs should fit K ${K} T ${T} ${wt}`);
      // Int8 activations by default for quantised one-row steps (gpu.hasDp4): the dp4 bound's case.
      const saved = g.tuning;
      g.tuning = { ...saved, dp4: false };
      try {
        await checkPairs(g, { wt, K, N: 3 * S + 1, T, transform: "rmsnorm", seed: 200 + k++ });
      } finally {
        g.tuning = saved;
      }
    }
  }
});

Deno.test({ name: "paired gate/up GEMV refuses to accumulate and the team kernel", ignore }, () => {
  const g = gpu!;
  const buf = upload(g, new Float32Array(64));
  const d = { K: 64, N: 4, T: 1, weights: "f32" as const, pairs: true };
  for (
    const [what, f] of [
      ["accumulate", () => gemvFusedCall(g, { x: buf, w: buf, y: buf }, { ...d, accumulate: true })],
      ["team", () => gemvFusedCall(g, { x: buf, w: buf, y: buf }, { ...d, tuning: { team: 8, rows: 1 } })],
    ] as const
  ) {
    let err: unknown;
    try {
      f();
    } catch (e) {
      err = e;
    }
    if (!(err instanceof RangeError)) throw new Error(`${what}: want a RangeError, got ${err}`);
  }
  const saved = g.tuning;
  g.tuning = { ...saved, pairGateUp: false };
  try {
    if (gemvPairFits(g, 64, 1, "f32")) throw new Error("pairGateUp: false should turn pairing off");
  } finally {
    g.tuning = saved;
  }
});

Deno.test(
  {
    name:
      "paired gate/up GEMV in the int8 direct multi-token mode (gpu.tuning.multiInt8): q8 / q4, T = 2..16",
    ignore: ignore || !gpu?.hasDp4,
  },
  async () => {
    const g = gpu!;
    const S = g.subgroupSize!;
    let k = 0;
    for (const wt of ["q8", "q4"] as const) {
      // A group short of 3 S units (a ragged last chunk for q4), and one group.
      for (const K of [32 * (3 * S - 1), 32]) {
        for (const [T, N] of [[2, 37], [16, 5]]) {
          for (const transform of ["none", "rmsnorm", "silu_mul"] as const) {
            await checkPairs(g, { wt, K, N, T, transform, seed: 600 + k++, int8: true });
          }
        }
      }
    }
  },
);
