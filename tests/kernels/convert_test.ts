// The GPU weight conversion (kernels/convert.ts) against the CPU's (models/dtype.ts, kernels/quant.ts):
// every source dtype to every storage, bit for bit, on random rows and on the values where rounding is
// decided: f16 ties, subnormals, overflow, inf and nan; q8 scales at bf16 boundaries, q4 codes at exact
// halves, zero groups, both signs of the largest value. And the random generator against its CPU twin.
import assert from "node:assert/strict";
import {
  type ConvertTarget,
  packColumnBlocks,
  packColumnBlocksCall,
  quantize,
  randomBf16,
  type RawType,
  readBack,
  runCalls,
  uploadBuffer,
} from "../../kernels/mod.ts";
import { bf16ToF32, f32ToBf16, f32ToF16, toF16Bits, toF32 } from "../../models/dtype.ts";
import { dequantFp8 } from "../../models/fp8.ts";
import { convertOnGpu } from "../../models/upload.ts";
import { gpuOrSkip, randoms } from "./harness.ts";

const gpu = await gpuOrSkip();
const ignore = gpu === null;

/** Values in f32 whose conversions are the hard cases. */
function awkward(n: number, seed: number): Float32Array {
  const w = randoms(n, seed, 1);
  const specials = [
    0,
    -0,
    1,
    -1,
    65504,
    65520,
    65519.99,
    1e6,
    -1e6,
    6.1e-5,
    6.0e-8,
    2.98e-8,
    2.9802322e-8,
    1e-9,
    -1e-9,
    1.00048828125,
    1.000244140625,
    1.0003662109375,
    0.5 + 2 ** -12,
    3 * 2 ** -25,
    2 ** -24,
    1.5 * 2 ** -24,
  ];
  for (let i = 0; i < n; i++) {
    if (i % 5 === 0) w[i] = specials[(i / 5) % specials.length];
    else if (i % 7 === 0) w[i] *= 2 ** (((i * 37) % 60) - 30);
  }
  return w;
}

function rawBytes(values: Float32Array, from: RawType): Uint8Array {
  const v = from === "F32" ? values : from === "F16" ? f32ToF16(values) : f32ToBf16(values);
  return new Uint8Array(v.buffer, v.byteOffset, v.byteLength);
}

function cpu(bytes: Uint8Array, from: RawType, to: ConvertTarget, N: number, K: number): Uint8Array {
  const r = to === "f16" ? toF16Bits(bytes, from) : toF32(bytes, from);
  const out = to === "q8" || to === "q4" ? quantize(r as Float32Array, { N, K }, to) : r;
  return new Uint8Array(out.buffer, out.byteOffset, out.byteLength);
}

function assertSameBytes(got: Uint8Array, want: Uint8Array, what: string): void {
  assert.equal(got.byteLength, want.byteLength, `${what}: length`);
  for (let i = 0; i < want.length; i++) {
    if (got[i] !== want[i]) {
      throw new Error(`${what}: byte ${i}: got ${got[i]}, want ${want[i]}`);
    }
  }
}

Deno.test({ name: "convert: f32 and f16 storage from bf16, f16, f32, bit for bit", ignore }, async () => {
  for (const from of ["BF16", "F16", "F32"] as RawType[]) {
    for (const to of ["f32", "f16"] as ConvertTarget[]) {
      for (const n of [1, 2, 3, 33, 1001]) {
        const v = awkward(n, n + 7);
        v[0] = n % 2 ? Infinity : NaN;
        const bytes = rawBytes(v, from);
        const { out } = await convertOnGpu(gpu!, bytes, { count: n, from, to });
        assertSameBytes(out, cpu(bytes, from, to, 1, n), `${from} -> ${to}, ${n} values`);
      }
    }
  }
});

Deno.test(
  { name: "convert: q8 and q4 storage, bit for bit, with exact halves and bf16 edges", ignore },
  async () => {
    for (const from of ["BF16", "F16", "F32"] as RawType[]) {
      for (const to of ["q8", "q4"] as ConvertTarget[]) {
        for (const [N, K] of [[1, 32], [3, 32], [2, 96], [5, 64], [7, 128]]) {
          // Finite in every source dtype (f16 overflows above 65504).
          const v = awkward(N * K, N * K + 3).map((x) => Math.max(-6e4, Math.min(6e4, x)));
          v.fill(0, 0, 32); // an all-zero group
          // Exact halves of the q4 step: the largest magnitude is 8 s, so v = (n + 1/2) s ties.
          for (let i = 32; i < 64 && i < N * K; i++) v[i] = i === 40 ? -2 : (((i % 16) - 8) + 0.5) * 0.25;
          // q8 scales at bf16 boundaries: |m| / 127 exactly on, just above and just below a bf16 value.
          if (N * K >= 192) {
            v[64] = 127 * 0.5;
            v[96] = 127 * (1 + 2 ** -7);
            v[128] = Math.fround(127 * (1 + 2 ** -7)) * (1 - 2 ** -23);
            v[160] = -127 * 3 * 2 ** -20;
          }
          const bytes = rawBytes(v, from);
          const { out, bad } = await convertOnGpu(gpu!, bytes, { count: N * K, from, to, K });
          assert.equal(bad, 0, "finite input flagged");
          assertSameBytes(out, cpu(bytes, from, to, N, K), `${from} -> ${to}, ${N}x${K}`);
        }
      }
    }
  },
);

Deno.test({ name: "convert: q8 scales match the CPU's over many random magnitudes", ignore }, async () => {
  // Each group's largest value sweeps magnitudes so |m| / 127 lands everywhere between bf16 values.
  const N = 64, K = 256;
  const v = randoms(N * K, 11, 1);
  for (let g = 0; g < (N * K) / 32; g++) v[g * 32 + (g % 32)] = (1 + g / 4096) * 2 ** ((g % 40) - 20);
  for (const from of ["F32", "BF16"] as RawType[]) {
    for (const to of ["q8", "q4"] as ConvertTarget[]) {
      const bytes = rawBytes(v, from);
      const { out } = await convertOnGpu(gpu!, bytes, { count: N * K, from, to, K });
      assertSameBytes(out, cpu(bytes, from, to, N, K), `${from} -> ${to} sweep`);
    }
  }
});

Deno.test(
  { name: "convert: a value that is not finite is flagged for quantised storage", ignore },
  async () => {
    const v = randoms(64, 5);
    v[37] = NaN;
    v[50] = Infinity;
    const { bad } = await convertOnGpu(gpu!, rawBytes(v, "F32"), { count: 64, from: "F32", to: "q4", K: 32 });
    assert.equal(0xffffffff - bad, 37);
  },
);

Deno.test(
  { name: "convert: random weights equal the CPU twin (randomBf16) in every storage", ignore },
  async () => {
    for (
      const random of [{ seed: 3, stream: 77, scale: 0.03 }, { seed: 1, stream: 2, scale: 0, offset: 1 }]
    ) {
      const N = 6, K = 64;
      const bits = randomBf16(N * K, random);
      const bytes = new Uint8Array(bits.buffer);
      for (const to of ["f32", "f16", "q8", "q4"] as ConvertTarget[]) {
        const { out } = await convertOnGpu(gpu!, new Uint8Array(0), {
          count: N * K,
          from: "random",
          to,
          K,
          random,
        });
        assertSameBytes(out, cpu(bytes, "BF16", to, N, K), `random -> ${to}`);
      }
      const values = bf16ToF32(bits);
      if (random.scale) {
        assert.ok(values.every((x) => Math.abs(x) <= random.scale * (1 + 2 ** -8)), "within scale");
        assert.ok(new Set(values).size > N * K / 2, "values vary");
      } else assert.ok(values.every((x) => x === 1));
    }
  },
);

Deno.test({
  name:
    "packColumnBlocksCall: a quantised stack regrouped in column blocks equals quantising the permuted floats",
  ignore,
}, async () => {
  const g = gpu!;
  // [matrices, N, K, C]: whole and partial pairs of groups (an odd group count), one and several blocks a row.
  const shapes: [number, number, number, number][] = [[3, 5, 96, 32], [2, 7, 128, 64], [1, 3, 64, 64], [
    4,
    6,
    192,
    96,
  ]];
  for (const type of ["q4", "q8"] as const) {
    for (const [M, N, K, C] of shapes) {
      const w = randoms(M * N * K, M + N + K, 1);
      const src = uploadBuffer(g, quantize(w, { N: M * N, K }, type));
      const out = g.device.createBuffer({ size: src.size, usage: src.usage });
      await runCalls(g, [packColumnBlocksCall(g, { src, out }, { matrices: M, N, K, C, type })]);
      const want = quantize(
        packColumnBlocks(w, { matrices: M, N, K, C }),
        { N: M * (K / C) * N, K: C },
        type,
      );
      const got = new Uint8Array(await readBack(g, out, want.byteLength));
      assert.deepEqual(got, want, `${type} ${M} x [${N}, ${K}] in blocks of ${C}`);
    }
  }
  assert.throws(
    () =>
      packColumnBlocksCall(g, {
        src: uploadBuffer(g, new Uint8Array(16)),
        out: uploadBuffer(g, new Uint8Array(16)),
      }, {
        matrices: 1,
        N: 1,
        K: 64,
        C: 48,
        type: "q4",
      }),
    /column blocks of 48/,
  );
});

Deno.test(
  { name: "convert: fp8 (E4M3 codes, block scales) to every storage, bit for bit", ignore },
  async () => {
    // [48, 64] in blocks of [16, 24]: 64 = 2 x 24 + 16, a partial column of blocks. Every code appears
    // (subnormals, both zeros, +-448), but NaN, which the next case flags.
    const [N, K, bn, bk] = [48, 64, 16, 24];
    const SN = N / bn, SK = Math.ceil(K / bk);
    const codes = Uint8Array.from({ length: N * K }, (_, i) => {
      const c = (i * 131 + 7) % 256;
      return (c & 0x7f) === 0x7f ? c - 1 : c;
    });
    const scales = Float32Array.from(randoms(SN * SK, 3, 1), (x, i) => (i % 5 === 0 ? 2 ** -20 : x / 448));
    const q = { method: "fp8" as const, block: [bn, bk] as [number, number] };
    const want = dequantFp8("w", codes, [N, K], scales, [SN, SK], q);
    const wantBytes = new Uint8Array(want.buffer);
    for (const to of ["f32", "f16", "q8", "q4"] as ConvertTarget[]) {
      const { out, bad } = await convertOnGpu(gpu!, codes, {
        count: N * K,
        from: "F8_E4M3",
        to,
        K,
        fp8: { K, bn, bk, scales },
      });
      assert.equal(bad, 0, `F8_E4M3 -> ${to}: finite input flagged`);
      assertSameBytes(out, cpu(wantBytes, "F32", to, N, K), `F8_E4M3 -> ${to}`);
    }
    // A NaN code is flagged for quantised storage.
    const nan = codes.slice();
    nan[100] = 0x7f;
    const r = await convertOnGpu(gpu!, nan, {
      count: N * K,
      from: "F8_E4M3",
      to: "q4",
      K,
      fp8: { K, bn, bk, scales },
    });
    assert.notEqual(r.bad, 0, "a NaN code");
  },
);
