// The q8 / q4 quantisers (CPU, no GPU needed): layout, round-trip bounds, zero groups, bad input.
import assert from "node:assert/strict";
import {
  dequantize,
  groupScale,
  QUANT_GROUP,
  quantBytes,
  quantize,
  type QuantType,
} from "../../kernels/quant.ts";
import { randoms } from "./harness.ts";

const TYPES: QuantType[] = ["q8", "q4"];

Deno.test("quantised sizes: 8.5 and 4.5 bits per weight", () => {
  assert.equal(quantBytes(3, 64, "q8"), 3 * 64 + 3 * 2 * 2);
  assert.equal(quantBytes(3, 64, "q4"), 3 * 32 + 3 * 2 * 2);
});

Deno.test("round trip: |x - deq(q(x))| <= scale / 2 (q4: <= |scale| for the clamped side)", () => {
  for (const t of TYPES) {
    for (const [N, K, amp] of [[1, 32, 1], [3, 96, 0.05], [7, 64, 300], [2, 2048, 1e-30]]) {
      const w = randoms(N * K, N * K + 1, amp);
      w[5] = 0; // exact zeros stay exact
      const q = quantize(w, { N, K }, t);
      const d = dequantize(q, { N, K }, t);
      for (let i = 0; i < N * K; i++) {
        const g = Math.floor(i / QUANT_GROUP);
        const s = Math.abs(groupScale(q, { N, K }, t, g));
        const err = Math.abs(w[i] - d[i]);
        // The other-sign side of a q4 group can exceed 7.5 steps and clamp to code 7 (Q4_0's trade).
        const bound = t === "q4" && Math.abs(w[i]) > 7.5 * s ? s : s / 2;
        assert.ok(err <= bound * (1 + 1e-6), `${t} ${N}x${K} #${i}: |${w[i]} - ${d[i]}| > ${bound}`);
      }
      assert.ok(d[5] === 0);
      // The scale is at most one bf16 step (2^-7) above the ideal amax / 127 or amax / 8.
      for (let g = 0; g < (N * K) / QUANT_GROUP; g++) {
        const amax = Math.max(...w.subarray(g * QUANT_GROUP, (g + 1) * QUANT_GROUP).map(Math.abs));
        const ideal = amax / (t === "q8" ? 127 : 8);
        const s = Math.abs(groupScale(q, { N, K }, t, g));
        assert.ok(s >= ideal && s <= ideal * (1 + 2 ** -7), `${t} group ${g}: scale ${s} vs ${ideal}`);
      }
    }
  }
});

Deno.test("q4's largest-magnitude value is exact (it maps to code -8), whatever its sign", () => {
  for (const sign of [1, -1]) {
    const w = randoms(32, 9, 0.5);
    w[17] = sign * 0.75; // a bf16-exact extreme
    const d = dequantize(quantize(w, { N: 1, K: 32 }, "q4"), { N: 1, K: 32 }, "q4");
    assert.equal(d[17], w[17]);
  }
});

Deno.test("all-zero groups decode to zero; rows are independent", () => {
  for (const t of TYPES) {
    const w = randoms(2 * 64, 3);
    w.fill(0, 32, 64); // row 0's second group
    const q = quantize(w, { N: 2, K: 64 }, t);
    const d = dequantize(q, { N: 2, K: 64 }, t);
    assert.ok(d.subarray(32, 64).every((v) => v === 0));
    assert.equal(groupScale(q, { N: 2, K: 64 }, t, 1), 0);
    // Quantising the rows one by one gives the same values and scales (so q/k/v concatenate).
    const r1 = quantize(w.subarray(64), { N: 1, K: 64 }, t);
    assert.deepEqual(dequantize(r1, { N: 1, K: 64 }, t), d.subarray(64));
  }
});

Deno.test("quantize rejects K % 32 != 0, wrong sizes and non-finite weights", () => {
  assert.throws(() => quantize(new Float32Array(48), { N: 1, K: 48 }, "q8"), RangeError);
  assert.throws(() => quantize(new Float32Array(64), { N: 3, K: 32 }, "q4"), RangeError);
  const w = new Float32Array(32);
  w[3] = NaN;
  assert.throws(() => quantize(w, { N: 1, K: 32 }, "q8"), /weight 3 .* NaN/);
});
