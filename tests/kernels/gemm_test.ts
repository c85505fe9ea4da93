// The prefill GEMM (kernels/gemm.ts) against gemmRef (f64 sums) over the same weights as floats (f16
// rounded, q8 / q4 dequantised: q * bf16 scale is exact in f32), on awkward shapes: T and N not multiples
// of any tile, K not a multiple of the slice (bk = 16), T = 1, every tile the defaults pick and a few more.
// Tolerance: the only difference is f32 accumulation order over K terms with |x|, |w| <= 2: atol 1e-4 +
// rtol 1e-4 holds with a wide margin at K <= 1056 (a wrong index misses it by orders of magnitude).
import {
  gemmCall,
  gemmCalls,
  gemmDefaultSplit,
  gemmDefaultTile,
  gemmFits,
  gemmRef,
  type GemmTile,
  gemmWhFits,
  type Int8Tile,
  readBack,
  runCalls,
  uploadBuffer,
} from "../../kernels/mod.ts";
import assert from "node:assert/strict";
import { f16ToF32, f32ToF16 } from "../../models/dtype.ts";
import {
  assertClose,
  checkDp4,
  gpuOrSkip,
  inputRows,
  packedWeights,
  randoms,
  readF32,
  upload,
} from "./harness.ts";

const gpu = await gpuOrSkip();
const ignore = gpu === null;

const TILES: (GemmTile | undefined)[] = [
  undefined,
  { bm: 128, bn: 128, bk: 16, rm: 2, rn: 2 },
  { bm: 64, bn: 128, bk: 16, rm: 2, rn: 2 },
  { bm: 64, bn: 64, bk: 16, rm: 2, rn: 2 },
  { bm: 64, bn: 64, bk: 16, rm: 1, rn: 1 },
  { bm: 32, bn: 64, bk: 32, rm: 1, rn: 2 },
  { bm: 64, bn: 64, bk: 16, rm: 1, rn: 1, db: true },
  { bm: 128, bn: 128, bk: 8, rm: 2, rn: 2, db: true },
  { bm: 128, bn: 128, bk: 8, rm: 2, rn: 2, ci: true },
  { bm: 64, bn: 64, bk: 16, rm: 1, rn: 1, ci: true, db: true },
  { bm: 64, bn: 128, bk: 16, rm: 2, rn: 4, ci: true },
  // Vector stores (v): 4-row groups a thread, transposed in registers (fit lavapipe's 32 KiB).
  { bm: 64, bn: 128, bk: 32, rm: 2, rn: 2, ci: true, v: true },
  { bm: 64, bn: 64, bk: 16, rm: 2, rn: 2, v: true, db: true },
  { bm: 64, bn: 64, bk: 32, rm: 2, rn: 2, ci: true, v: true },
];

/**
 * Case c's operands: x with xRow0 rows before its T (twice K wide for silu_mul), the packed weights, y's prior
 * content y0 and y on the GPU; every other case accumulates, every third reads from row 1.
 */
function gemmCase(
  g: NonNullable<typeof gpu>,
  c: number,
  d: { T: number; K: number; N: number; wt: "f32" | "f16" | "q8" | "q4"; transform: "none" | "silu_mul" },
) {
  const { T, K, N } = d;
  const xRow0 = c % 3 === 0 ? 1 : 0;
  const x = randoms((T + xRow0) * (d.transform === "silu_mul" ? 2 * K : K), c, 2);
  const y0 = randoms(T * N, c + 7);
  return {
    accumulate: c % 2 === 0,
    xRow0,
    x,
    w: packedWeights(d.wt, randoms(N * K, c + 100, 1), N, K),
    y0,
    y: upload(g, y0),
  };
}

Deno.test(
  { name: "GEMM matches the reference for every weight format, tile and awkward shape", ignore },
  async () => {
    const g = gpu!;
    // [T, K, N]: K = 4 * odd and not a multiple of 16 (float only), N odd, T = 1 and T past a tile.
    const shapes = [[1, 64, 5], [37, 100, 77], [130, 96, 129], [65, 1056, 33], [200, 32, 300]];
    let c = 0;
    for (const [T, K, N] of shapes) {
      for (const wt of ["f32", "f16", "q8", "q4"] as const) {
        if (!gemmFits(K, wt)) continue;
        for (const transform of ["none", "silu_mul"] as const) {
          // The default tile, multiplying in f32 (the default for f16 / q8 / q4 weights multiplies in f16,
          // checked against its bound below).
          const tile = TILES[c++ % TILES.length] ?? gemmDefaultTile(g, T, N, K);
          const { accumulate, xRow0, x, w, y0, y } = gemmCase(g, c, { T, K, N, wt, transform });
          // Split K (partial sums in scratch, a reduce adds them and the residual) on every fourth case.
          await runCalls(
            g,
            gemmCalls(g, { x: upload(g, x), w: uploadBuffer(g, w.bytes), y }, {
              K,
              N,
              T,
              accumulate,
              xRow0,
              weights: wt,
              transform,
              tile,
              splitK: c % 4 === 1 ? 2 : 1,
            }),
          );
          const want = gemmRef(x, w.deq, { K, N, T, accumulate, xRow0, transform }, y0);
          assertClose(
            await readF32(g, y, T * N),
            want,
            1e-4,
            1e-4,
            `${wt} ${transform} T${T} K${K} N${N} tile ${JSON.stringify(tile)} split ${c % 4 === 1 ? 2 : 1}`,
          );
        }
      }
    }
  },
);

// W staged as f16 with f32 math (wh): exact for f16 and q4 weights, so the same 1e-4 as f32 staging.
const WH_TILES: GemmTile[] = [
  { bm: 128, bn: 128, bk: 8, rm: 2, rn: 2, wh: true },
  { bm: 64, bn: 64, bk: 16, rm: 1, rn: 1, wh: true, db: true },
  { bm: 64, bn: 64, bk: 32, rm: 2, rn: 2, wh: true, ci: true },
  { bm: 128, bn: 64, bk: 16, rm: 2, rn: 1, wh: true, ci: true, db: true },
  { bm: 128, bn: 128, bk: 32, rm: 2, rn: 2, wh: true, ci: true, v: true },
];

Deno.test({
  name: `GEMM staging W as f16 (wh) matches the reference for f16 and q4 weights${
    gpu?.hasF16 ? "" : " [ignored: no shader-f16]"
  }`,
  ignore: ignore || !gpu?.hasF16,
}, async () => {
  const g = gpu!;
  let c = 200;
  for (const [T, K, N] of [[37, 96, 77], [130, 64, 129], [65, 1056, 33]]) {
    for (const wt of ["f16", "q4"] as const) {
      if (!gemmFits(K, wt) || !gemmWhFits(g, wt)) continue;
      const transform = c % 2 === 0 ? "silu_mul" as const : "none" as const;
      const tile = WH_TILES[c++ % WH_TILES.length];
      const accumulate = c % 3 === 0;
      const width = transform === "silu_mul" ? 2 * K : K;
      const x = randoms(T * width, c, 2);
      const w = packedWeights(wt, randoms(N * K, c + 100, 1), N, K);
      const y0 = randoms(T * N, c + 7);
      const y = upload(g, y0);
      await runCalls(g, [
        gemmCall(g, { x: upload(g, x), w: uploadBuffer(g, w.bytes), y }, {
          K,
          N,
          T,
          accumulate,
          weights: wt,
          transform,
          tile,
        }),
      ]);
      const want = gemmRef(x, w.deq, { K, N, T, accumulate, transform }, y0);
      assertClose(
        await readF32(g, y, T * N),
        want,
        1e-4,
        1e-4,
        `wh ${wt} T${T} K${K} N${N} ${JSON.stringify(tile)}`,
      );
    }
  }
});

// x stored as f16 (xHalf): the same sums over x rounded to f16, so the same 1e-4, on plain, vector-store and
// double-buffered tiles, both transforms, split K and a first row; every other case also writes y as f16
// (yHalf: the f32 result rounded, within one f16 step).
Deno.test({
  name: `GEMM reading x and writing y as f16 (xHalf, yHalf) matches the reference${
    gpu?.hasF16 ? "" : " [ignored: no shader-f16]"
  }`,
  ignore: ignore || !gpu?.hasF16,
}, async () => {
  const g = gpu!;
  const tiles = [undefined, TILES[8], TILES[6], TILES[11], TILES[13]];
  let c = 300;
  for (const [T, K, N] of [[1, 64, 5], [37, 100, 77], [65, 1056, 33]]) {
    for (const wt of ["f32", "f16", "q4"] as const) {
      if (!gemmFits(K, wt)) continue;
      for (const transform of c % 2 === 0 ? ["none", "silu_mul"] as const : ["none"] as const) {
        const tile = tiles[c++ % tiles.length] ?? gemmDefaultTile(g, T, N, K);
        const xRow0 = c % 3 === 0 ? 1 : 0;
        const width = transform === "silu_mul" ? 2 * K : K;
        const xh = f32ToF16(randoms((T + xRow0) * width, c, 2));
        const w = packedWeights(wt, randoms(N * K, c + 100, 1), N, K);
        const yHalf = c % 2 === 1;
        const y = upload(g, new Float32Array(T * N));
        const splitK = c % 4 === 1 ? 2 : 1;
        await runCalls(
          g,
          gemmCalls(g, { x: upload(g, xh), w: uploadBuffer(g, w.bytes), y }, {
            K,
            N,
            T,
            xRow0,
            xHalf: true,
            yHalf,
            weights: wt,
            transform,
            tile,
            splitK,
          }),
        );
        const want = gemmRef(f16ToF32(xh), w.deq, { K, N, T, xRow0, transform });
        const got = yHalf
          ? f16ToF32(new Uint16Array(await readBack(g, y, Math.ceil(T * N / 2) * 4), 0, T * N))
          : await readF32(g, y, T * N);
        assertClose(
          got,
          yHalf ? want.map((v) => f16ToF32(f32ToF16(new Float32Array([v])))[0]) : want,
          1e-4,
          yHalf ? 2 ** -10 : 1e-4,
          `xHalf${yHalf ? " yHalf" : ""} ${wt} ${transform} T${T} K${K} N${N} ${
            JSON.stringify(tile)
          } split ${splitK}`,
        );
      }
    }
  }
});

// f16 multiplies: x and the weights rounded to f16, each slice's bk products summed in f16. Bound
// per element: (2 + bk) 2^-11 sum_k |x w| (the roundings and a bk-term f16 sum) + f32's share; a wrong
// index or a lost slice is off by about sum |x w| / sqrt(K), far above it.
Deno.test({
  name: `GEMM with f16 multiplies stays within its rounding bound${
    gpu?.hasF16 ? "" : " [ignored: no shader-f16]"
  }`,
  ignore: ignore || !gpu?.hasF16,
}, async () => {
  const g = gpu!;
  let c = 50;
  for (const [T, K, N] of [[37, 100, 77], [130, 96, 129], [65, 1056, 33]]) {
    for (const wt of ["f16", "q8", "q4", "f32"] as const) {
      if (!gemmFits(K, wt)) continue;
      const transform = c % 2 === 0 ? "silu_mul" as const : "none" as const;
      // Every fourth case the default tile, which multiplies in f16 for these weights (f32: exact).
      const tile: GemmTile | undefined = c % 4 === 0 ? undefined : { ...TILES[1 + (c % 3)]!, f16: true };
      const bk = (tile ?? gemmDefaultTile(g, T, N, K)).bk;
      c++;
      const width = transform === "silu_mul" ? 2 * K : K;
      const x = randoms(T * width, c, 2);
      const w = packedWeights(wt, randoms(N * K, c + 100, 1), N, K);
      const y = upload(g, new Float32Array(T * N));
      await runCalls(g, [
        gemmCall(g, { x: upload(g, x), w: uploadBuffer(g, w.bytes), y }, {
          K,
          N,
          T,
          weights: wt,
          transform,
          tile,
        }),
      ]);
      const want = gemmRef(x, w.deq, { K, N, T, transform });
      const absIn = transform === "silu_mul"
        ? Float32Array.from({ length: T * K }, (_, i) => {
          const [t, k] = [Math.floor(i / K), i % K];
          const gt = x[t * 2 * K + k];
          return Math.abs(gt / (1 + Math.exp(-gt)) * x[t * 2 * K + K + k]);
        })
        : x.map(Math.abs);
      const got = await readF32(g, y, T * N);
      for (let t = 0; t < T; t++) {
        for (let n = 0; n < N; n++) {
          let sum = 0;
          for (let k = 0; k < K; k++) sum += absIn[t * K + k] * Math.abs(w.deq[n * K + k]);
          const err = Math.abs(got[t * N + n] - want[t * N + n]);
          const bound = 1e-4 + (2 + bk) * 2 ** -11 * sum;
          if (!(err <= bound)) {
            throw new Error(
              `f16 ${wt} ${transform} T${T} K${K} N${N} at (${t}, ${n}): |err| ${err} > ${bound}`,
            );
          }
        }
      }
    }
  }
});

// q4 (and, asked, q8) layers on int8 inputs (matmul_int8.ts): the input pass and the packed-dot tile kernel,
// each output within its int8 inputs' error of the f64 products (checkDp4), over every tile shape.
const INT8_TILES: Int8Tile[] = [
  { rows: 32, features: 128, blocks: 2, prefetch: false },
  { rows: 16, features: 64, blocks: 1, prefetch: true },
  { rows: 64, features: 64, blocks: 4, prefetch: false },
  { rows: 16, features: 128, blocks: 2, prefetch: true },
  { rows: 32, features: 64, blocks: 1, prefetch: false },
];

Deno.test(
  { name: "int8 GEMM (q8 / q4 on int8 inputs) is within the int8 inputs' error", ignore },
  async () => {
    const g = gpu!;
    if (!(g.hasDp4 && g.subgroupSize)) {
      console.log("skipped: int8 GEMM (this adapter has no packed dot products or no subgroups)");
      return;
    }
    // The last two split K (given, and by default: few tiles and K = 2048), the splits' sums added by the reduce.
    const shapes = [[17, 64, 5], [37, 96, 130], [70, 128, 129], [200, 32, 300], [33, 1056, 33], [
      40,
      2048,
      64,
    ]];
    let c = 0;
    for (const [T, K, N] of shapes) {
      for (const wt of ["q8", "q4"] as const) {
        for (const transform of ["none", "silu_mul"] as const) {
          const tile = INT8_TILES[c++ % INT8_TILES.length];
          const { accumulate, xRow0, x, w, y0, y } = gemmCase(g, c, { T, K, N, wt, transform });
          g.tuning.gemmMath = "int8";
          g.tuning.gemmInt8 = tile;
          let calls;
          try {
            calls = gemmCalls(g, { x: upload(g, x), w: uploadBuffer(g, w.bytes), y }, {
              K,
              N,
              T,
              accumulate,
              xRow0,
              weights: wt,
              transform,
              splitK: K === 1056 ? 3 : undefined,
            });
          } finally {
            delete g.tuning.gemmMath;
            delete g.tuning.gemmInt8;
          }
          const path = `gemv_int8_x,gemm_int8${K >= 1056 ? ",gemm_reduce" : ""}`;
          if (calls.map((k) => k.label).join() !== path) {
            throw new Error(`${wt} K${K}: took ${calls.map((k) => k.label)}, not ${path}`);
          }
          await runCalls(g, calls);
          const want = gemmRef(x, w.deq, { K, N, T, accumulate, xRow0, transform }, y0);
          const input = inputRows(x, xRow0, T, K, transform === "silu_mul");
          checkDp4(
            await readF32(g, y, T * N),
            want,
            input,
            w.deq,
            { T, N, K },
            `${wt} ${transform} T${T} ${JSON.stringify(tile)}`,
          );
        }
      }
    }
    // By default q4 layers take it (gemmInt8Math), q8 ones do not, and a given float tile keeps the float GEMM;
    // a short prompt's few int8 tiles split K deeper than the float tiles do (gemmDefaultSplit).
    const b = upload(g, new Float32Array(64));
    const labels = (d: Parameters<typeof gemmCalls>[2]) =>
      gemmCalls(g, { x: b, w: b, y: b }, d).map((k) => k.label).join();
    for (
      const [d, want] of [
        [{ K: 64, N: 4096, T: 512, weights: "q4" }, "gemv_int8_x,gemm_int8"],
        [{ K: 64, N: 4096, T: 32, weights: "q4" }, "gemv_int8_x,gemm_int8"],
        [{ K: 2048, N: 4096, T: 32, weights: "q4" }, "gemv_int8_x,gemm_int8,gemm_reduce"],
        [{ K: 64, N: 4096, T: 512, weights: "q8" }, "gemm_none"],
        [
          { K: 64, N: 4096, T: 512, weights: "q4", tile: { bm: 64, bn: 64, bk: 16, rm: 1, rn: 1 } },
          "gemm_none",
        ],
      ] as const
    ) {
      const got = labels(d);
      if (got !== want) throw new Error(`${JSON.stringify(d)}: ${got}, want ${want}`);
    }
  },
);

Deno.test("GEMM split K by default: to a wave, deeper for int8 tiles and outputs of a few tiles", () => {
  const small = { bm: 64, bn: 64 }, int8 = { bm: 32, bn: 64 };
  // Qwen3-30B-A3B-like o_proj at 32 tokens: 64 float tiles split 2 (each >= 1024 of K), int8 ones 4.
  assert.equal(gemmDefaultSplit(32, 4096, 2048, small), 2);
  assert.equal(gemmDefaultSplit(32, 4096, 2048, int8, {}, true), 4);
  // A router's [32, 128] output: 2 tiles, split until 256 of K each.
  assert.equal(gemmDefaultSplit(32, 128, 2048, small), 8);
  assert.equal(gemmDefaultSplit(32, 128, 2048, small, { gemmSplit: { minK: 1024, max: 8 } }), 2);
  // Tiles that make a wave are not split.
  assert.equal(gemmDefaultSplit(512, 4096, 2048, int8, {}, true), 1);
  assert.equal(gemmDefaultSplit(32, 128, 2048, small, { gemmWave: 2 }), 1);
});

Deno.test({ name: "GEMM rejects shapes and tiles it cannot take", ignore }, () => {
  const g = gpu!;
  const b = upload(g, new Float32Array(64));
  const bufs = { x: b, w: b, y: b };
  const bad = (d: Parameters<typeof gemmCall>[2], re: RegExp) => {
    let msg = "";
    try {
      gemmCall(g, bufs, d);
    } catch (e) {
      msg = (e as Error).message;
    }
    if (!re.test(msg)) throw new Error(`want ${re}, got "${msg}"`);
  };
  bad({ K: 6, N: 4, T: 2, weights: "f32" }, /K % 4 == 0/);
  bad({ K: 48, N: 4, T: 2, weights: "q4" }, /K % 32 == 0/);
  bad({ K: 8, N: 4, T: 2, weights: "f32", tile: { bm: 64, bn: 64, bk: 6, rm: 2, rn: 2 } }, /bk % 4/);
  bad({ K: 8, N: 4, T: 2, weights: "f32", tile: { bm: 256, bn: 256, bk: 16, rm: 2, rn: 2 } }, /threads/);
  if (g.hasF16) {
    bad(
      { K: 64, N: 4, T: 2, weights: "q8", tile: { bm: 64, bn: 64, bk: 16, rm: 1, rn: 1, wh: true } },
      /not q8/,
    );
  }
});
