// The multi-token GEMV (kernels/gemv_multi.ts) against the CPU reference: every weight type and input
// transform, T from 2 to 16, awkward shapes (rows not a multiple of a workgroup's, K not a multiple of the
// tile nor of a lane's units, an x row offset, accumulate) and several tunings. Skips, saying so, without
// a GPU or without subgroups (the kernel needs them).
import assert from "node:assert/strict";
import {
  FLOAT_NORM_COPY_MIN_T,
  floatCopyFor,
  gemvFusedCall,
  gemvFusedCalls,
  gemvTuningKey,
  int8CopyFor,
  int8CopyOutFits,
  matmulRef,
  multiFits,
  multiTileK,
  type MultiTuning,
  rmsnormRef,
  runCalls,
  uploadBuffer,
} from "../../kernels/mod.ts";
import { f16ToF32, f32ToF16 } from "../../models/dtype.ts";
import { isQuant } from "../../kernels/quant.ts";
import {
  assertClose,
  assertCopyIsPass,
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
  console.log(`skipped: multi-token GEMV tests (${gpu.adapterName} has no fixed subgroup size)`);
}
const ignore = gpu === null || !gpu.subgroupSize;

const PER_UNIT = { f32: 4, f16: 8, q8: 16, q4: 32 } as const;

/** The producer's GEMV (the last call) takes the arrive mode (it owns the scratch) exactly when asked to. */
function assertArrive(calls: { owned?: GPUBuffer[] }[], arrive: boolean, what: string): void {
  const has = calls.at(-1)!.owned?.some((b) => b.label.includes("scratch")) === true;
  if (has !== arrive) {
    throw new Error(`${what}: the producer ${has ? "took" : "did not take"} the arrive mode`);
  }
}

/**
 * x staged as f16 (xh): each x is off by at most 2^-11 of itself (round to nearest; the test's values are
 * normal in f16), so a row moves by at most 2^-11 sum |x w| (+ f32 rounding).
 */
function checkF16Input(
  got: Float32Array,
  want: Float32Array,
  input: Float32Array,
  w: Float32Array,
  d: { T: number; N: number; K: number },
  what: string,
): void {
  const { T, N, K } = d;
  for (let r = 0; r < T; r++) {
    for (let n = 0; n < N; n++) {
      let mass = 0;
      for (let i = 0; i < K; i++) mass += Math.abs(input[r * K + i] * w[n * K + i]);
      const bound = 1e-4 + 1e-4 * Math.abs(want[r * N + n]) + mass * 2 ** -11 * 1.001;
      const err = Math.abs(got[r * N + n] - want[r * N + n]);
      if (!(err <= bound)) {
        throw new Error(
          `${what}: row ${r} col ${n}: got ${got[r * N + n]}, want ${
            want[r * N + n]
          } (|err| ${err} > ${bound})`,
        );
      }
    }
  }
}

Deno.test(
  { name: "multi-token GEMV matches the reference for every weight type, transform and T", ignore },
  async () => {
    const g = gpu!;
    const S = g.subgroupSize!;
    const tunings: MultiTuning[] = [
      { rows: 1, wg: S },
      { rows: 2, wg: 4 * S, prefetch: false },
      { rows: 3, wg: 2 * S, pipeline: true },
      { rows: 4, wg: 8 * S, prefetch: false },
      { rows: 2, wg: 2 * S },
    ];
    const dp4Tunings: MultiTuning[] = [
      { rows: 4, wg: 2 * S, dp4: true },
      { rows: 1, wg: S, dp4: true, prefetch: false },
      { rows: 3, wg: 4 * S, dp4: true, pipeline: true },
      { rows: 2, wg: 8 * S, dp4: true, prefetch: false },
    ];
    const xhTunings: MultiTuning[] = [
      { rows: 4, wg: 2 * S, xh: true },
      { rows: 1, wg: S, xh: true, prefetch: false },
      { rows: 8, wg: 4 * S, xh: true },
      { rows: 2, wg: 2 * S, xh: true, pipeline: true },
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
            // Each case with the rotating f32-staged tuning and one of the variants: quantised weights with
            // int8 activations (dp4, where WGSL has it) else x staged as f16 (xh).
            const variants = isQuant(wt) && !g.hasDp4 ? [] : isQuant(wt) ? dp4Tunings : xhTunings;
            for (
              const multi of [
                tunings[k % tunings.length],
                ...variants.slice(k % 5 % variants.length).slice(0, 1),
              ]
            ) {
              k++;
              const accumulate = k % 2 === 0;
              const normWeights = wt === "f32" || k % 3 === 0 ? "f32" as const : "f16" as const;
              const c = { wt, K, N, T, transform, accumulate, normWeights, seed: k };
              const { got, want, input, deq } = await gemvCase(g, c, { multi });
              const what =
                `multi gemv ${wt} ${transform} T${T} K${K} (tile ${multiTileK(g, K, T, wt, multi)}) N${N} ` +
                `nw ${normWeights} ${JSON.stringify(multi)}`;
              if (multi.dp4) checkDp4(got, want, input, deq, { T, N, K }, what);
              else if (multi.xh) checkF16Input(got, want, input, deq, { T, N, K }, what);
              else assertClose(got, want, 1e-4, 1e-4, what);
            }
          }
        }
      }
    }
  },
);

Deno.test(
  {
    name: "direct multi-token GEMV matches the reference: every weight type, none / rmsnorm / pairs, T 2..16",
    ignore,
  },
  async () => {
    const g = gpu!;
    const S = g.subgroupSize!;
    const silu = (v: number) => v / (1 + Math.exp(-v));
    // splitK dividing the chunks or not, several units in flight, a workgroup of several row blocks.
    const tunings: MultiTuning[] = [
      { rows: 4, wg: 4 * S, direct: true, splitK: 2 },
      { rows: 1, wg: 3 * S, direct: true, splitK: 3, unroll: 2 },
      { rows: 2, wg: 8 * S, direct: true, splitK: 4 },
      { rows: 2, wg: S, direct: true, splitK: 1, unroll: 4 },
      { rows: 3, wg: 4 * S, direct: true, splitK: 1, unroll: 2 },
    ];
    let k = 0;
    for (const wt of ["f32", "f16", "q8", "q4"] as const) {
      // K: 4 chunks of one unit a lane; 8 short of 3 S vec2s (a ragged last chunk); fewer units than lanes.
      // Quantised rows are whole groups of 32: a group short of 3 S units (ragged) and one group.
      const Ks = isQuant(wt)
        ? [PER_UNIT[wt] * 4 * S, 32 * (3 * S - 1), 32]
        : [PER_UNIT[wt] * 4 * S, 8 * (3 * S - 1), 16];
      for (const K of Ks) {
        // Quantised units are 4-8 x vec4s of x a token, so their kernels are large: T = 16 on the short row
        // only (the software adapter's compile time).
        const TNs = isQuant(wt) && K > 32 ? [[2, 37], [3, 5], [8, 19]] : [[2, 37], [3, 5], [8, 19], [16, 7]];
        for (const [T, N] of TNs) {
          for (
            const [transform, pairs] of [["none", false], ["rmsnorm", false], ["rmsnorm", true], [
              "none",
              true,
            ]] as const
          ) {
            k++;
            // Every fifth case the default tuning through gpu.tuning.multiDirect.
            const multi = k % 5 === 0 ? undefined : tunings[k % tunings.length];
            const accumulate = !pairs && k % 2 === 0;
            const normWeights = wt === "f32" || k % 3 === 0 ? "f32" as const : "f16" as const;
            const MR = pairs ? 2 * N : N;
            const x = randoms((T + 1) * K, k, 2);
            const w = packedWeights(wt, randoms(MR * K, N + k, 0.5), MR, K);
            let nw = randoms(K, K + 3);
            const nbuf = normWeights === "f16" ? upload(g, f32ToF16(nw)) : upload(g, nw);
            if (normWeights === "f16") nw = f16ToF32(f32ToF16(nw));
            const y0 = randoms(T * N, 9);
            const y = upload(g, y0);
            // q4 takes the multi-token GEMV (and its direct mode) only when asked.
            const saved = { multi: g.tuning.multi, multiDirect: g.tuning.multiDirect };
            g.tuning.multi = true;
            g.tuning.multiDirect = true;
            try {
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
                  pairs,
                }),
              ]);
            } finally {
              Object.assign(g.tuning, saved);
            }
            const rows = x.slice(K, (T + 1) * K);
            const input = transform === "rmsnorm" ? rmsnormRef(rows, nw, K, 1e-5) : rows;
            const dims = { K, N, T, weights: "f32" as const };
            let want: Float32Array;
            if (pairs) {
              const gate = matmulRef(input, w.deq.subarray(0, N * K), dims);
              const up = matmulRef(input, w.deq.subarray(N * K), dims);
              want = gate.map((v, i) => silu(v) * up[i]);
            } else want = matmulRef(input, w.deq, { ...dims, accumulate }, y0);
            const what = `direct multi gemv ${wt} ${transform}${pairs ? " pairs" : ""} T${T} K${K} N${N} ` +
              `acc ${accumulate} nw ${normWeights} ${JSON.stringify(multi ?? "default")}`;
            assertClose(await readF32(g, y, T * N), want, 1e-4, 1e-4, what);
          }
        }
      }
    }
  },
);

Deno.test({ name: "direct multi-token GEMV refuses silu_mul", ignore }, () => {
  const g = gpu!;
  const S = g.subgroupSize!;
  const buf = upload(g, new Float32Array(4096));
  const multi: MultiTuning = { rows: 2, wg: 2 * S, direct: true, splitK: 2 };
  for (
    const [weights, transform, re] of [
      ["q4", "silu_mul", /silu_mul/],
      ["f16", "silu_mul", /silu_mul/],
    ] as const
  ) {
    let err: unknown;
    try {
      gemvFusedCall(g, { x: buf, w: buf, y: buf, normWeight: buf }, {
        K: 256,
        N: 4,
        T: 3,
        weights,
        transform,
        multi,
      });
    } catch (e) {
      err = e;
    }
    if (!(err instanceof RangeError) || !re.test(err.message)) {
      throw new Error(`${weights} ${transform}: want a RangeError matching ${re}, got ${err}`);
    }
  }
});

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

Deno.test(
  {
    name: "int8 direct multi-token GEMV (gpu.tuning.multiInt8): q8 / q4, every transform, T 2..16",
    ignore: ignore || !gpu?.hasDp4,
  },
  async () => {
    // (Paired gate/up in this mode: gemv_pairs_test.ts.)
    const g = gpu!;
    const S = g.subgroupSize!;
    let k = 0;
    for (const wt of ["q8", "q4"] as const) {
      // One group; a group short of 3 S units (q4: a ragged last chunk); 4 chunks of one unit a lane; more
      // blocks than the input pass has threads (RMSNorm reads x twice there).
      for (const K of [32, 32 * (3 * S - 1), PER_UNIT[wt] * 4 * S, 32 * 260]) {
        const TNs = K > 8192 ? [[3, 5]] : K > 32 ? [[2, 37], [8, 19]] : [[3, 5], [16, 7]];
        for (const [T, N] of TNs) {
          for (const transform of ["none", "rmsnorm", "silu_mul"] as const) {
            k++;
            const saved = { ...g.tuning };
            g.tuning.multiInt8 = true;
            if (k % 3 === 0) g.tuning.multiUnroll = 2;
            try {
              const accumulate = k % 2 === 0;
              const normWeights = k % 3 === 0 ? "f16" as const : "f32" as const;
              const c = { wt, K, N, T, transform, accumulate, normWeights, seed: k };
              const { got, want, input, deq } = await gemvCase(g, c, {});
              const what = `int8 direct multi gemv ${wt} ${transform} T${T} K${K} N${N} acc ${accumulate}`;
              checkDp4(got, want, input, deq, { T, N, K }, what);
            } finally {
              g.tuning = saved;
            }
          }
        }
      }
    }
  },
);

Deno.test(
  {
    name:
      "int8 direct multi-token GEMV writes the int8 copy of its output (copyOut) the input pass would make",
    ignore: ignore || !gpu?.hasDp4,
  },
  async () => {
    // The producer's tail quantises what its workgroup wrote; the pass (gemvInt8InputCall) quantises y as
    // it is in memory: the same values, so the same words and scales, bit for bit. Then a consumer reading
    // the copy (copyIn, no pass) matches the int8 product of y.
    // Arrive (the last workgroup of a block of 32 rows quantises it): the same copy, and again after a
    // second dispatch (its counters reset).
    const g = gpu!;
    const S = g.subgroupSize!;
    let k = 0;
    for (const arrive of [false, true]) {
      for (const wt of ["q8", "q4"] as const) {
        for (const pairs of [true, false]) {
          // N: one block of rows; several workgroups with a ragged last one.
          for (const [T, K, N] of [[2, PER_UNIT[wt] * S, 32], [8, 32 * (2 * S - 1), 32 * 37], [16, 64, 96]]) {
            k++;
            const saved = { ...g.tuning };
            g.tuning.multiInt8 = true;
            if (arrive) g.tuning.multiInt8CopyArrive = true;
            try {
              const d = {
                K,
                N,
                T,
                weights: wt,
                transform: "rmsnorm" as const,
                normWeights: "f32" as const,
                eps: 1e-5,
                pairs,
              };
              const consumer = { K: N, N: 24, T, weights: wt, accumulate: k % 2 === 0 };
              if (!int8CopyOutFits(g, d)) throw new Error(`no copyOut for ${JSON.stringify(d)} at S = ${S}`);
              const copy = int8CopyFor(g, consumer)!;
              const x = upload(g, randoms(T * K, k, 2));
              const rows = (pairs ? 2 : 1) * N;
              const w = uploadBuffer(g, packedWeights(wt, randoms(rows * K, k + 1, 0.5), rows, K).bytes);
              const y = upload(g, new Float32Array(T * N));
              const nw = upload(g, randoms(K, k + 2));
              const what = `copyOut ${wt} pairs ${pairs} T${T} K${K} N${N} arrive ${arrive}`;
              const producer = gemvFusedCalls(g, { x, w, y, normWeight: nw, copyOut: copy }, d);
              assertArrive(producer, arrive, what);
              await runCalls(g, producer);
              if (arrive) await runCalls(g, producer);
              await assertCopyIsPass(g, copy, y, { K: N, T, wt }, what);
              // The consumer on the copy, without a pass.
              const cw = packedWeights(wt, randoms(consumer.N * N, k + 3, 0.5), consumer.N, N);
              const y0 = randoms(T * consumer.N, k + 4);
              const cy = upload(g, y0);
              const calls = gemvFusedCalls(
                g,
                { x: y, w: uploadBuffer(g, cw.bytes), y: cy, copyIn: copy },
                consumer,
              );
              if (calls.length !== 1) {
                throw new Error(`${what}: the consumer made ${calls.length} calls, not 1`);
              }
              await runCalls(g, calls);
              const input = await readF32(g, y, T * N);
              if (!input.every((v) => Number.isFinite(v)) || input.every((v) => v === 0)) {
                throw new Error(`${what}: the producer's output is not a finite, nonzero row`);
              }
              const want = matmulRef(input, cw.deq, {
                K: N,
                N: consumer.N,
                T,
                accumulate: consumer.accumulate,
                weights: "f32",
              }, y0);
              checkDp4(
                await readF32(g, cy, T * consumer.N),
                want,
                input,
                cw.deq,
                { T, N: consumer.N, K: N },
                what,
              );
            } finally {
              g.tuning = saved;
            }
          }
        }
      }
    }
  },
);

Deno.test(
  {
    name:
      "an RMSNorm GEMV's int8 input from the GEMV before it: x * norm weight, and 1 / rms from block sums",
    ignore: ignore || !gpu?.hasDp4,
  },
  async () => {
    // The producer (o_proj-like: accumulates into the residual) quantises h * nw for its consumer (gate/up-
    // like: RMSNorm, paired or not) and writes each block's sum of squares of h. The copy must be the input
    // pass's on h * nw bit for bit, the sums h's; the consumer on it (no pass) must match the consumer with
    // its own input pass up to the codes' rounding. Norm weights random, f32 and f16; one token (the q4
    // one-token steps' down writing qkv's input) and several.
    const g = gpu!;
    const S = g.subgroupSize!;
    let k = 100;
    const cases = [
      [4, 64, 32 * 5, true, "f32"],
      [8, 32 * S, 32 * 9, false, "f16"],
      [1, 64, 32 * 3, false, "f32"],
    ] as const;
    for (const arrive of [false, true]) {
      for (const wt of ["q8", "q4"] as const) {
        for (const [T, K, N, pairs, nwt] of cases) {
          if (nwt === "f16" && !g.hasF16) continue;
          k++;
          const saved = { ...g.tuning };
          g.tuning.multiInt8 = true;
          if (T === 1) g.tuning.multiInt8One = true;
          if (arrive) g.tuning.multiInt8CopyArrive = true;
          try {
            const producer = { K, N, T, weights: wt, accumulate: true };
            const consumer = {
              K: N,
              N: 48,
              T,
              weights: wt,
              transform: "rmsnorm" as const,
              normWeights: nwt,
              eps: 1e-5,
              pairs,
            };
            const what = `norm copy ${wt} T${T} K${K} N${N} pairs ${pairs} ${nwt} arrive ${arrive}`;
            if (!int8CopyOutFits(g, producer)) throw new Error(`${what}: no copyOut`);
            const nw32 = randoms(N, k + 5);
            const nw = upload(g, nwt === "f16" ? f32ToF16(nw32) : nw32);
            const nwv = nwt === "f16" ? f16ToF32(f32ToF16(nw32)) : nw32;
            const copy = int8CopyFor(g, consumer, nw)!;
            if (!copy?.ssq || !copy.norm) throw new Error(`${what}: int8CopyFor gave no norm copy`);
            const y0 = randoms(T * N, k + 6);
            const h = upload(g, y0);
            const w = uploadBuffer(g, packedWeights(wt, randoms(N * K, k + 1, 0.5), N, K).bytes);
            const calls = gemvFusedCalls(
              g,
              { x: upload(g, randoms(T * K, k, 2)), w, y: h, copyOut: copy },
              producer,
            );
            assertArrive(calls, arrive, what);
            // Accumulating, a second dispatch moves h: the copy must be of h as it ends.
            await runCalls(g, calls);
            if (arrive) await runCalls(g, calls);
            const hv = await readF32(g, h, T * N);
            const u = new Float32Array(T * N).map((_, i) => hv[i] * nwv[i % N]);
            await assertCopyIsPass(g, copy, upload(g, u), { K: N, T, wt }, what);
            const ssq = await readF32(g, copy.ssq, (T * N) / 32);
            const ssqWant = new Float32Array((T * N) / 32).map((_, b) =>
              hv.slice(32 * b, 32 * b + 32).reduce((s, v) => s + v * v, 0)
            );
            assertClose(ssq, ssqWant, 1e-6, 1e-5, `${what}: block sums of squares`);
            // The consumer on the copy, and with its own pass.
            const rows = (pairs ? 2 : 1) * consumer.N;
            const cw = uploadBuffer(g, packedWeights(wt, randoms(rows * N, k + 3, 0.5), rows, N).bytes);
            const run = async (copyIn?: typeof copy) => {
              const cy = upload(g, new Float32Array(T * consumer.N));
              const calls = gemvFusedCalls(g, { x: h, w: cw, y: cy, normWeight: nw, copyIn }, consumer);
              if (calls.length !== (copyIn ? 1 : 2)) throw new Error(`${what}: ${calls.length} calls`);
              await runCalls(g, calls);
              return await readF32(g, cy, T * consumer.N);
            };
            const want = await run();
            const got = await run(copy);
            const scale = want.reduce((m, v) => Math.max(m, Math.abs(v)), 0);
            assertClose(got, want, 0.02 * scale, 0, `${what}: the consumer on the copy`);
          } finally {
            g.tuning = saved;
          }
        }
      }
    }
  },
);

Deno.test(
  {
    name: "an RMSNorm GEMV's f32 input from the GEMV before it: x * norm weight, 1 / rms from workgroup sums",
    ignore,
  },
  async () => {
    // The producer (o_proj- or down-like, f32 direct mode: accumulates into the residual) writes h * nw for
    // its consumer (qkv-, gate/up- or head-like: RMSNorm, paired or not) and one sum of squares of h a
    // workgroup and token. The copy must be h * nw to f32 rounding, the sums h's; the consumer on it must
    // match the consumer normalising h itself to f32 rounding. Odd row counts (a producer's last workgroup
    // part-full, a consumer's last row block too), random norm weights, f32 and f16.
    const g = gpu!;
    const S = g.subgroupSize!;
    let k = 300;
    const cases = [
      // [weights, T, K, N (producer rows = consumer K), consumer N, pairs, norm weights]
      // (T = 16: the sums of squares loaded after the main loop; q8 in the f32 direct mode when forced)
      ["f16", 8, 8 * S, 8 * 37, 45, true, "f16"],
      ["f16", 16, 16 * S, 8 * 40, 70, false, "f32"],
      ["f32", 5, 4 * S + 8, 4 * 30, 33, false, "f32"],
      ["q8", 4, 16 * S, 32 * 6, 17, true, "f32"],
      // The producer's shape retuned through gemvTunings (a workgroup a row): the copy's partials follow it.
      ["f32", 5, 4 * S + 8, 4 * 30, 33, false, "f32", { rows: 1, wg: S, splitK: 1 }],
    ] as const;
    for (const [wt, T, K, N, CN, pairs, nwt, over] of cases) {
      g.tuning = wt === "q8" ? { multiInt8: false } : {};
      if (over) g.tuning.gemvTunings = { [gemvTuningKey(wt, "none", N, K, false, T)]: over };
      if (!g.hasF16 && (wt as string) + nwt !== "f32f32" && (wt as string) + nwt !== "q8f32") continue;
      k++;
      const what = `f32 norm copy ${wt} T${T} K${K} N${N} -> ${CN} pairs ${pairs} ${nwt}`;
      const producer = { K, N, T, weights: wt, accumulate: true };
      const consumer = {
        K: N,
        N: CN,
        T,
        weights: wt,
        transform: "rmsnorm" as const,
        normWeights: nwt,
        eps: 1e-5,
        pairs,
      };
      const nw32 = randoms(N, k + 5);
      const nw = upload(g, nwt === "f16" ? f32ToF16(nw32) : nw32);
      const nwv = nwt === "f16" ? f16ToF32(f32ToF16(nw32)) : nw32;
      const copy = floatCopyFor(g, producer, consumer, nw);
      if (!copy) throw new Error(`${what}: floatCopyFor gave no copy`);
      const h = upload(g, randoms(T * N, k + 6));
      const w = uploadBuffer(g, packedWeights(wt, randoms(N * K, k + 1, 0.5), N, K).bytes);
      const prod = gemvFusedCalls(
        g,
        { x: upload(g, randoms(T * K, k, 2)), w, y: h, copyOut: copy },
        producer,
      );
      if (prod.length !== 1 || !prod[0].label?.endsWith("_direct")) {
        throw new Error(`${what}: the producer is not the f32 direct mode (${prod.map((c) => c.label)})`);
      }
      await runCalls(g, prod);
      const hv = await readF32(g, h, T * N);
      const want = new Float32Array(T * N).map((_, i) => hv[i] * nwv[i % N]);
      assertClose(await readF32(g, copy.x, T * N), want, 1e-6, 1e-6, `${what}: the copy`);
      // One partial a producer workgroup (each the sum over a run of its rows): a token's add up to its row's.
      const parts = await readF32(g, copy.ssq, T * copy.parts);
      const sums = new Float32Array(T).map((_, t) =>
        parts.slice(t * copy.parts, (t + 1) * copy.parts).reduce((s, v) => s + v, 0)
      );
      const ssqWant = new Float32Array(T).map((_, t) =>
        hv.slice(t * N, (t + 1) * N).reduce((s, v) => s + v * v, 0)
      );
      assertClose(sums, ssqWant, 1e-6, 1e-5, `${what}: sums of squares`);
      if (copy.parts < 2) throw new Error(`${what}: ${copy.parts} partial a token (the case wants several)`);
      if (over && copy.parts !== N) {
        throw new Error(`${what}: ${copy.parts} partials, want the ${N} workgroups`);
      }
      const rows = (pairs ? 2 : 1) * CN;
      const cw = uploadBuffer(g, packedWeights(wt, randoms(rows * N, k + 3, 0.5), rows, N).bytes);
      const run = async (copyIn?: typeof copy) => {
        const cy = upload(g, new Float32Array(T * CN));
        const calls = gemvFusedCalls(g, { x: h, w: cw, y: cy, normWeight: nw, copyIn }, consumer);
        await runCalls(g, calls);
        return await readF32(g, cy, T * CN);
      };
      const own = await run();
      const got = await run(copy);
      const scale = own.reduce((m, v) => Math.max(m, Math.abs(v)), 0);
      assertClose(got, own, 1e-5 * scale, 1e-5, `${what}: the consumer on the copy`);
    }
    g.tuning = {};
    const d = { K: 8 * S, N: 64, T: FLOAT_NORM_COPY_MIN_T - 1, weights: "f32" as const };
    const c = { ...d, K: 64, transform: "rmsnorm" as const };
    assert.equal(
      floatCopyFor(g, d, c, upload(g, randoms(64, 1))),
      undefined,
      "no f32 copy below its fewest rows",
    );
  },
);

Deno.test({
  name: "multi-token GEMV: gpu.tuning.gemvTunings replaces one shape's tuning at T tokens",
  ignore,
}, async () => {
  const g = gpu!;
  const S = g.subgroupSize!;
  const K = 8 * S * 4;
  const c = { wt: "f16" as const, K, N: 19, T: 8, transform: "rmsnorm" as const, accumulate: false };
  const saved = g.tuning;
  const key = (N: number, T: number) => gemvTuningKey("f16", "rmsnorm", N, K, false, T);
  try {
    // A valid override computes the same product; an invalid one reaches checkMultiTuning (so it was
    // applied); another T's key leaves this one alone.
    g.tuning = { ...saved, gemvTunings: { [key(19, 8)]: { rows: 3 } } };
    const { got, want } = await gemvCase(g, { ...c, normWeights: "f32", seed: 5 }, {});
    assertClose(got, want, 1e-4, 1e-4, "gemvTunings override at T = 8");
    g.tuning = { ...saved, gemvTunings: { [key(19, 8)]: { rows: 0 } } };
    await assert.rejects(() => gemvCase(g, { ...c, normWeights: "f32", seed: 6 }, {}), RangeError);
    g.tuning = { ...saved, gemvTunings: { [key(19, 4)]: { rows: 0 } } };
    await gemvCase(g, { ...c, normWeights: "f32", seed: 7 }, {});
    // The int8 direct mode (q4, gemvFusedCalls) takes it too.
    if (g.hasDp4) {
      const K4 = 32 * S * 2;
      const q = { wt: "q4" as const, K: K4, N: 32, T: 8, transform: "rmsnorm" as const, accumulate: false };
      g.tuning = {
        ...saved,
        multiInt8: true,
        gemvTunings: { [gemvTuningKey("q4", "rmsnorm", 32, K4, false, 8)]: { rows: 0 } },
      };
      await assert.rejects(() => gemvCase(g, { ...q, normWeights: "f32", seed: 8 }, {}), RangeError);
      g.tuning = {
        ...saved,
        multiInt8: true,
        gemvTunings: { [gemvTuningKey("q4", "rmsnorm", 32, K4, false, 8)]: { rows: 2 } },
      };
      const r = await gemvCase(g, { ...q, normWeights: "f32", seed: 9 }, {});
      checkDp4(
        r.got,
        r.want,
        r.input,
        r.deq,
        { T: 8, N: 32, K: K4 },
        "gemvTunings override, int8 direct mode",
      );
    }
  } finally {
    g.tuning = saved;
  }
});
