import assert from "node:assert/strict";
import { needs } from "../support/needs.ts";
import { bf16ToF32, f16ToF32, f32ToBf16, f32ToF16, toF16Bits, toF32 } from "../../models/dtype.ts";
import { CheckpointError } from "../../models/errors.ts";

/** Float32 values from their bit patterns, so tests can name exact neighbours of a rounding point. */
function fromBits(...bits: number[]): Float32Array {
  return new Float32Array(Uint32Array.from(bits).buffer);
}

Deno.test("f16ToF32 on known bit patterns: normals, subnormals, signed zero, inf, nan", () => {
  const out = f16ToF32(Uint16Array.from([
    0x3c00, // 1
    0xc000, // -2
    0x7bff, // 65504, the largest f16
    0x0400, // 2^-14, the smallest normal
    0x0001, // 2^-24, the smallest subnormal
    0x03ff, // the largest subnormal
    0x8000, // -0
    0x7c00, // inf
    0xfc00, // -inf
    0x3555, // 0.333251953125
  ]));
  assert.deepEqual(
    [...out],
    [1, -2, 65504, 2 ** -14, 2 ** -24, 1023 * 2 ** -24, -0, Infinity, -Infinity, 0.333251953125],
  );
  assert.ok(Object.is(out[6], -0));
  assert.ok(Number.isNaN(f16ToF32(Uint16Array.from([0x7e00]))[0]));
});

Deno.test("f32ToF16 rounds to nearest even and handles overflow, subnormals, inf and nan", () => {
  const cases: [number, number][] = [
    [1, 0x3c00],
    [-2, 0xc000],
    [65504, 0x7bff],
    [65519.99, 0x7bff], // below the rounding point to inf
    [65520, 0x7c00], // exactly halfway to 2^16: rounds to even, which is inf
    [1e6, 0x7c00],
    [2 ** -14, 0x0400],
    [2 ** -24, 0x0001],
    [2 ** -25, 0x0000], // halfway between 0 and the smallest subnormal: even is 0
    [1.5 * 2 ** -25, 0x0001],
    [3 * 2 ** -25, 0x0002], // halfway between subnormals 1 and 2: even is 2
    [1023.5 * 2 ** -24, 0x0400], // rounds up out of the subnormals into the smallest normal
    [1e-10, 0x0000],
    [Infinity, 0x7c00],
    [-Infinity, 0xfc00],
    [0.1, 0x2e66],
    [1 + 2 ** -11, 0x3c00], // halfway between 1 and 1+2^-10: even is 1
    [1 + 3 * 2 ** -11, 0x3c02], // halfway between 1+2^-10 and 1+2^-9: even is the latter
  ];
  const out = f32ToF16(Float32Array.from(cases.map(([v]) => v)));
  cases.forEach(([v, want], i) => assert.equal(out[i], want, `${v}: got 0x${out[i].toString(16)}`));
  const minus0 = f32ToF16(Float32Array.from([-0]));
  assert.equal(minus0[0], 0x8000);
  const nan = f32ToF16(Float32Array.from([NaN]))[0];
  assert.equal(nan & 0x7c00, 0x7c00);
  assert.notEqual(nan & 0x3ff, 0, "nan stays nan, not inf");
});

Deno.test("f16 -> f32 -> f16 is the identity on every non-nan f16", () => {
  const all = Uint16Array.from({ length: 65536 }, (_, i) => i);
  const back = f32ToF16(f16ToF32(all));
  for (let h = 0; h < 65536; h++) {
    const isNaN = (h & 0x7c00) === 0x7c00 && (h & 0x3ff) !== 0;
    if (!isNaN) assert.equal(back[h], h, `0x${h.toString(16)}`);
  }
});

Deno.test("bf16: exact widening, round-to-nearest-even narrowing, nan kept", () => {
  assert.deepEqual([...bf16ToF32(Uint16Array.from([0x3f80, 0xc040, 0x7f80, 0x0001]))], [
    1,
    -3,
    Infinity,
    2 ** -133,
  ]);
  const out = f32ToBf16(fromBits(
    0x3f800000, // 1
    0x3f808000, // halfway between 0x3f80 and 0x3f81: even is 0x3f80
    0x3f818000, // halfway between 0x3f81 and 0x3f82: even is 0x3f82
    0x3f808001, // just above halfway: up
    0x7f7fffff, // max float rounds to inf
    0x7fc00001, // nan
  ));
  assert.deepEqual([...out].slice(0, 5), [0x3f80, 0x3f80, 0x3f82, 0x3f81, 0x7f80]);
  assert.ok(Number.isNaN(bf16ToF32(out.subarray(5))[0]));
});

Deno.test("toF32 and toF16Bits read unaligned byte slices and reject other dtypes", () => {
  const values = Float32Array.from([1.5, -2, 0.1]);
  const buf = new Uint8Array(1 + 12);
  buf.set(new Uint8Array(values.buffer), 1);
  const unaligned = buf.subarray(1); // byteOffset 1: not a valid Float32Array offset
  assert.deepEqual([...toF32(unaligned, "F32")], [...values]);
  assert.deepEqual([...toF16Bits(unaligned, "F32")], [0x3e00, 0xc000, 0x2e66]);

  const halves = new Uint8Array(1 + 4);
  halves.set([0x00, 0x3c, 0x00, 0xc0], 1);
  assert.deepEqual([...toF32(halves.subarray(1), "F16")], [1, -2]);
  assert.deepEqual([...toF16Bits(halves.subarray(1), "F16")], [0x3c00, 0xc000]);
  halves.set([0x80, 0x3f, 0x40, 0xc0], 1);
  assert.deepEqual([...toF32(halves.subarray(1), "BF16")], [1, -3]);
  assert.deepEqual([...toF16Bits(halves.subarray(1), "BF16")], [0x3c00, 0xc200]);

  assert.throws(
    () => toF32(new Uint8Array(4), "I32"),
    (e) => e instanceof CheckpointError && /unsupported dtype I32/.test(e.message),
  );
  assert.throws(() => toF16Bits(new Uint8Array(8), "F64"), CheckpointError);
});

const F16 = (globalThis as { Float16Array?: new (a: ArrayLike<number>) => ArrayBufferView }).Float16Array;
Deno.test(
  needs("f32ToF16 agrees with the engine's Float16Array on random bit patterns of every exponent", {
    "Float16Array in this runtime": F16,
  }),
  () => {
    let seed = 12345;
    const bits = Uint32Array.from(
      { length: 200_000 },
      () => (seed = (Math.imul(seed, 1664525) + 1013904223) >>> 0),
    );
    const values = new Float32Array(bits.buffer);
    const want = new Uint16Array(new F16!(values).buffer as ArrayBuffer);
    const got = f32ToF16(values);
    for (let i = 0; i < values.length; i++) {
      if (Number.isNaN(values[i])) continue;
      assert.equal(
        got[i],
        want[i],
        `0x${bits[i].toString(16)}: got 0x${got[i].toString(16)}, want 0x${want[i].toString(16)}`,
      );
    }
  },
);
