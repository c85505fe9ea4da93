// o_proj folded into the decode attention (kernels/attention_oproj.ts through attentionDecodeCalls' oProj):
// the residual gains out . W_o^T (out: the attention's own output, which attention_decode_test.ts checks
// against the CPU references), with and without flash-decoding splits (then the combine folds it), every
// weight type, uneven row splits, k-steps, twice in a row (the accumulator and the count are left zeroed),
// and the next RMSNorm GEMV's int8 input copy as that GEMV's own pass makes it. Skips without subgroups.
import {
  attentionDecodeCalls,
  attentionOProjFits,
  createStepBuffer,
  int8CopyFor,
  ropeInvFreq,
  ropeTable,
  runCalls,
  uploadBuffer,
  writeStep,
} from "../../kernels/mod.ts";
import { f16ToF32, f32ToF16 } from "../../models/dtype.ts";
import {
  assertClose,
  assertCopyIsPass,
  gpuOrSkip,
  packedWeights,
  randoms,
  readF32,
  upload,
} from "./harness.ts";

const gpu = await gpuOrSkip();
if (gpu && !gpu.subgroupSize) {
  console.log(`skipped: o_proj fold tests (${gpu.adapterName} has no fixed subgroup size)`);
}
const ignore = gpu === null || !gpu.subgroupSize;
const MAX_SEQ = 96;

/** The decode attention's inputs (random q, k, v and caches) for a step of T tokens at pos; `out` zeroed. */
function attentionInputs(heads: number, kv: number, hd: number, T: number, pos: number, seed: number) {
  const g = gpu!;
  const step = createStepBuffer(g);
  writeStep(g, step, { pos0: pos, T, tokOut: 0 });
  return {
    step,
    table: upload(g, ropeTable(ropeInvFreq(hd, 10000, null), MAX_SEQ)),
    qkv: upload(g, randoms(T * (heads + 2 * kv) * hd, seed, 2)),
    kcache: upload(g, randoms(kv * MAX_SEQ * hd, seed + 1)),
    vcache: upload(g, randoms(kv * MAX_SEQ * hd, seed + 2)),
    out: upload(g, new Float32Array(T * heads * hd)),
  };
}

Deno.test({ name: "decode attention folds o_proj into the residual (split K by head)", ignore }, async () => {
  const g = gpu!;
  let seed = 0;
  const cases = [
    // heads, kv heads, head_dim, N, weights, T, splits, row splits, the fold's loads early
    [4, 2, 64, 160, "q4", 1, 1, undefined, false],
    [4, 2, 64, 160, "q4", 1, 1, undefined, true],
    [4, 2, 64, 160, "q8", 3, 1, 5, false],
    [2, 1, 32, 96, "f16", 1, 3, 2, true],
    [3, 3, 32, 100, "f32", 2, 2, 5, false],
    [8, 2, 128, 64, "q4", 2, 3, 1, true],
    [4, 4, 32, 96, "f32", 3, 1, 1, true],
  ] as const;
  for (const [heads, kv, hd, N, wt, T, splits, rowSplits, early] of cases) {
    if (wt === "f16" && !g.hasF16) continue;
    seed += 10;
    const what = `heads ${heads}/${kv} hd ${hd} N ${N} ${wt} T${T} splits ${splits} rows ${
      rowSplits ?? "default"
    }${early ? ", early tail" : ""}`;
    const d = { heads, kvHeads: kv, headDim: hd, maxSeq: MAX_SEQ, T };
    if (!attentionOProjFits(g, d, { weights: wt, N })) throw new Error(`${what}: does not fit`);
    const K = heads * hd;
    const w = packedWeights(wt, randoms(N * K, seed, 0.3), N, K);
    const wb = uploadBuffer(g, w.bytes);
    const y0 = randoms(T * N, seed + 1, 1);
    const y = upload(g, y0);
    const inputs = attentionInputs(heads, kv, hd, T, 70, seed + 2);
    const out = inputs.out;
    g.tuning.attentionOEarlyTail = early;
    const calls = attentionDecodeCalls(
      g,
      { ...inputs, oProj: { w: wb, weights: wt, N, y, ...(rowSplits ? { rowSplits } : {}) } },
      d,
      { splits },
    );
    delete g.tuning.attentionOEarlyTail;
    // Twice: the second run must add the same again (the fold leaves its accumulator and count zeroed).
    await runCalls(g, calls);
    const once = await readF32(g, y, T * N);
    const o = await readF32(g, out, T * K);
    if (!o.every(Number.isFinite) || o.every((v) => v === 0)) {
      throw new Error(`${what}: out is not finite and nonzero`);
    }
    const prod = new Float32Array(T * N);
    for (let t = 0; t < T; t++) {
      for (let n = 0; n < N; n++) {
        let s = 0;
        for (let k = 0; k < K; k++) s += w.deq[n * K + k] * o[t * K + k];
        prod[t * N + n] = s;
      }
    }
    assertClose(once, y0.map((v, i) => v + prod[i]), 1e-5, 1e-5, `${what}: y`);
    await runCalls(g, calls);
    const twice = await readF32(g, y, T * N);
    assertClose(twice, y0.map((v, i) => v + 2 * prod[i]), 2e-5, 1e-5, `${what}: y after a second run`);
    for (const c of calls) for (const b of c.owned ?? []) b.destroy();
  }
});

Deno.test({
  name: "decode attention with o_proj folded in writes the next RMSNorm GEMV's int8 input copy",
  ignore: ignore || !gpu?.hasDp4,
}, async () => {
  // The consumer (a gate/up-like RMSNorm GEMV, q4 / q8) takes the int8 direct mode where K is a multiple of
  // its units times the subgroup size; q8 from 4 tokens.
  const g = gpu!;
  const S = g.subgroupSize!;
  let seed = 100;
  // weights, tokens, norm weights, flash-decoding splits, o_proj row splits (each folding its own blocks)
  // ... and the fold's loads issued early (the default with a copy) or not (gpu.tuning.attentionOEarlyTail).
  const cases = [
    ["q4", 1, "f32", 1, 2, true],
    ["q4", 1, "f32", 1, 2, false],
    ["q4", 2, "f16", 2, 1, true],
    ["q8", 4, "f32", 1, 2, true],
    ["q4", 1, "f32", 3, 4, true],
    ["q4", 1, "f16", 3, 4, false],
  ] as const;
  for (const [wt, T, nwt, splits, rowSplits, early] of cases) {
    if (nwt === "f16" && !g.hasF16) continue;
    seed += 10;
    const heads = 4, kv = 2, hd = 64, K = heads * hd;
    const N = (wt === "q4" ? 32 : 16) * S * (wt === "q4" ? 1 : 2);
    const what = `copy ${wt} T${T} N${N} ${nwt} norm weights, splits ${splits}, row splits ${rowSplits}` +
      (early ? "" : ", late tail");
    const consumer = {
      K: N,
      N: 40,
      T,
      weights: wt,
      transform: "rmsnorm" as const,
      normWeights: nwt,
      eps: 1e-5,
      int8One: true,
    };
    const nw = randoms(N, seed, 1);
    const nwb = upload(g, nwt === "f16" ? f32ToF16(nw) : nw);
    const nwv = nwt === "f16" ? f16ToF32(f32ToF16(nw)) : nw;
    const copy = int8CopyFor(g, consumer, nwb);
    if (!copy?.ssq || !copy.norm) throw new Error(`${what}: the consumer takes no norm copy`);
    const d = { heads, kvHeads: kv, headDim: hd, maxSeq: MAX_SEQ, T };
    const y = upload(g, randoms(T * N, seed + 1, 1));
    if (!early) g.tuning.attentionOEarlyTail = false;
    const calls = attentionDecodeCalls(
      g,
      {
        ...attentionInputs(heads, kv, hd, T, 50, seed + 2),
        oProj: {
          w: uploadBuffer(g, packedWeights(wt, randoms(N * K, seed + 5, 0.3), N, K).bytes),
          weights: wt,
          N,
          y,
          copy,
          rowSplits,
        },
      },
      d,
      { splits },
    );
    delete g.tuning.attentionOEarlyTail;
    await runCalls(g, calls);
    const got = await readF32(g, y, T * N);
    const u = got.map((v, i) => v * nwv[i % N]);
    await assertCopyIsPass(g, copy, upload(g, u), { K: N, T, wt }, what);
    const ssqWant = new Float32Array((T * N) / 32).map((_, b) =>
      got.slice(32 * b, 32 * b + 32).reduce((s, v) => s + v * v, 0)
    );
    assertClose(await readF32(g, copy.ssq!, (T * N) / 32), ssqWant, 1e-6, 1e-5, `${what}: sums of squares`);
  }
});

Deno.test({ name: "o_proj cannot fold into the grouped decode attention or beside copyOut", ignore }, () => {
  const g = gpu!;
  const d = { heads: 4, kvHeads: 1, headDim: 64, maxSeq: MAX_SEQ };
  const b = () => ({
    ...attentionInputs(4, 1, 64, 1, 10, 1),
    oProj: {
      w: upload(g, new Float32Array(64 * 256)),
      weights: "f32" as const,
      N: 64,
      y: upload(g, new Float32Array(64)),
    },
  });
  const refusal = (f: () => unknown): string => {
    try {
      f();
    } catch (e) {
      return String(e);
    }
    return "";
  };
  const grouped = refusal(() => attentionDecodeCalls(g, b(), d, { grouped: true }));
  if (!grouped.includes("grouped")) {
    throw new Error(`grouped kernel: expected a RangeError naming it, got "${grouped}"`);
  }
  const copyOut = {
    q: upload(g, new Uint32Array(64)),
    s: upload(g, new Float32Array(16)),
    weights: "q4" as const,
  };
  const both = refusal(() => attentionDecodeCalls(g, { ...b(), copyOut }, d, { grouped: false }));
  if (!both.includes("copyOut")) {
    throw new Error(`copyOut beside the fold: expected a RangeError naming it, got "${both}"`);
  }
});
