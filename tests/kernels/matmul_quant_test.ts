// The q8 / q4 kernels against quantise -> dequantise on the CPU -> matmulRef (f64 accumulation): the
// decode GEMV with each transform, the tiled prefill matmul, and the embedding gather.
// Tolerance: both sides use the same dequantised weights exactly (q * bf16 scale is exact in f32), so the
// only difference is f32 accumulation order over K terms: |err| <= K * 2^-24 * sum |x w| in the worst
// case; for our K <= 2048 with |x|, |w| <= ~1 atol 1e-4 + rtol 1e-4 holds with a wide margin.
import {
  createStepBuffer,
  embedCall,
  embedRef,
  gemvFusedCall,
  matmulCall,
  matmulRef,
  type QuantType,
  rmsnormRef,
  runCalls,
  sgFits,
  siluMulRef,
  storageBuffer,
  uploadBuffer,
  writeStep,
} from "../../kernels/mod.ts";
import { f16ToF32, f32ToF16 } from "../../models/dtype.ts";
import { assertClose, checkDp4, gpuOrSkip, packedWeights, randoms, readF32, upload } from "./harness.ts";

const gpu = await gpuOrSkip();
const ignore = gpu === null;
const TYPES: QuantType[] = ["q8", "q4"];

Deno.test(
  { name: "quantised GEMV (none / rmsnorm / silu_mul) matches dequantised reference", ignore },
  async () => {
    const g = gpu!;
    const tunings = [undefined, { team: 4, rows: 1 }, { team: 32, rows: 2 }, { team: 256, rows: 4 }];
    // [T, K, N]: N = 1, odd N, K = 32 / 64 / 96 / 2048.
    const shapes = [[1, 32, 1], [2, 64, 7], [3, 96, 33], [4, 2048, 5], [1, 128, 300]];
    let k = 0;
    for (const [T, K, N] of shapes) {
      // f16 with f32 norms: a quantised model's fallback for a matrix whose rows are not a multiple of 32.
      for (const t of [...TYPES, "f16"] as const) {
        for (const transform of ["none", "rmsnorm", "silu_mul"] as const) {
          const tuning = tunings[k++ % tunings.length];
          const accumulate = k % 2 === 0;
          // Norm weights in f32 and (every third quantised case) f16.
          const normWeights = k % 3 === 0 && t !== "f16" ? "f16" as const : "f32" as const;
          const width = transform === "silu_mul" ? 2 * K : K;
          const x = randoms((T + 1) * width, k, 2);
          const w = packedWeights(t, randoms(N * K, N + k, 0.5), N, K);
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
              weights: t,
              normWeights,
              transform,
              eps: 1e-5,
              tuning,
            }),
          ]);
          const rows = x.slice(width, (T + 1) * width);
          const input = transform === "rmsnorm"
            ? rmsnormRef(rows, nw, K, 1e-5)
            : transform === "silu_mul"
            ? siluMulRef(rows, K)
            : rows;
          const want = matmulRef(input, w.deq, { K, N, T, accumulate, weights: t }, y0);
          if (tuning === undefined && t !== "f16" && g.hasDp4 && sgFits(g, K, t) && (T === 1 || t === "q4")) {
            // The default there is the int8-activation subgroup kernel (gemv_sg_test.ts has its bound); q8
            // rows of 2..16 take the multi-token GEMV with f32 activations through gemvFusedCall (its int8
            // mode is gemvFusedCalls', gemv_multi_test.ts).
            checkDp4(
              await readF32(g, y, T * N),
              want,
              input,
              w.deq,
              { T, N, K },
              `${t} ${transform} default`,
            );
            continue;
          }
          assertClose(
            await readF32(g, y, T * N),
            want,
            1e-4,
            1e-4,
            `gemv ${t} ${transform} T${T} K${K} N${N} nw ${normWeights} ${JSON.stringify(tuning)}`,
          );
        }
      }
    }
  },
);

Deno.test(
  { name: "quantised matmul: GEMV for T <= 4, tiled for prefill, accumulate and row offset", ignore },
  async () => {
    const g = gpu!;
    // Exact paths only: the subgroup GEMV's int8 x (dp4, the default for quantised decode where WGSL has it)
    // is checked against its own bound in gemv_sg_test.ts.
    g.tuning.dp4 = false;
    try {
      await quantMatmulCases(g);
    } finally {
      delete g.tuning.dp4;
    }
  },
);

async function quantMatmulCases(g: NonNullable<typeof gpu>): Promise<void> {
  for (const [T, K, N] of [[1, 32, 1], [4, 64, 3], [5, 32, 17], [17, 96, 31], [33, 64, 40], [6, 2048, 9]]) {
    for (const t of TYPES) {
      for (const accumulate of [false, true]) {
        const x = randoms((T + 1) * K, T * 1000 + K);
        const w = packedWeights(t, randoms(N * K, N), N, K);
        const y0 = randoms(T * N, 7);
        const y = upload(g, y0);
        const d = { K, N, T, accumulate, xRow0: 1, weights: t };
        await runCalls(g, [matmulCall(g, { x: upload(g, x), w: uploadBuffer(g, w.bytes), y }, d)]);
        assertClose(
          await readF32(g, y, T * N),
          matmulRef(x, w.deq, d, y0),
          1e-4,
          1e-4,
          `matmul ${t} T${T} K${K} N${N} acc=${accumulate}`,
        );
      }
    }
  }
}

Deno.test({ name: "embedding gather from q8 / q4 tables", ignore }, async () => {
  const g = gpu!;
  for (const t of TYPES) {
    for (const [V, H] of [[1, 32], [7, 96], [50, 64]]) {
      const table = packedWeights(t, randoms(V * H, V), V, H);
      const toks = Uint32Array.from({ length: 9 }, (_, i) => (i * 5 + 3) % V);
      const step = createStepBuffer(g);
      const x = storageBuffer(g, 4 * 4 * H);
      const call = embedCall(g, { step, tokens: upload(g, toks), table: uploadBuffer(g, table.bytes), x }, {
        hidden: H,
        vocab: V,
        T: 4,
        weights: t,
      });
      writeStep(g, step, { pos0: 5, T: 4, tokOut: 0 });
      await runCalls(g, [call]);
      assertClose(
        await readF32(g, x, 4 * H),
        embedRef(table.deq, toks.slice(5, 9), H),
        0,
        0,
        `embed ${t} ${V}x${H}`,
      );
    }
  }
});
