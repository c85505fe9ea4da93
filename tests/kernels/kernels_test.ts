// Each kernel against its CPU reference, on random data and awkward shapes (size 1, odd sizes,
// non-multiples of the vector width). Skips, saying so, where there is no WebGPU adapter.
import {
  attentionCall,
  attentionRef,
  createStepBuffer,
  embedCall,
  embedRef,
  gemvFusedCall,
  type Gpu,
  kvQ8Decode,
  kvQ8Encode,
  kvRowBytes,
  type KvType,
  matmulCall,
  matmulRef,
  rmsnormCall,
  rmsnormRef,
  ropeInvFreq,
  ropeKvCall,
  ropeRef,
  ropeTable,
  runCalls,
  sampleCalls,
  sampleRef,
  siluMulCall,
  siluMulRef,
  storageBuffer,
  uniformBuffer,
  withSharedUniforms,
  writeStep,
} from "../../kernels/mod.ts";
import { f16ToF32, f32ToF16 as f32ToF16Bits } from "../../models/dtype.ts";
import { readBack } from "../../kernels/mod.ts";
import { assertClose, assertQ8Rows, gpuOrSkip, randoms, readF32, readU32, upload } from "./harness.ts";

const gpu = await gpuOrSkip();
const ignore = gpu === null;

// A sequence's programs share uniform parameter buffers by contents (withSharedUniforms): the same words give
// the same buffer inside the scope (u32 3 and f32 3.0 are different words), and outside it every call gets its own.
Deno.test(
  { name: "uniform buffers: one per distinct contents while shared, one a call otherwise", ignore },
  () => {
    const g = gpu!;
    const shared = new Map<string, GPUBuffer>();
    const [a, b, c, d] = withSharedUniforms(g, shared, () => [
      uniformBuffer(g, [1, 2, 3]),
      uniformBuffer(g, [1, 2, 3]),
      uniformBuffer(g, [1, 2, 3], [2]),
      uniformBuffer(g, [1, 2, 3, 0]),
    ]);
    if (a !== b || a === c) throw new Error("equal words share one buffer, other words get their own");
    if (a !== d) throw new Error("words are padded to 4 before they are compared");
    if (shared.size !== 2) throw new Error(`2 distinct blocks, got ${shared.size}`);
    if (g.sharedUniforms !== undefined) throw new Error("the scope ends with the build");
    if (uniformBuffer(g, [1, 2, 3]) === a) throw new Error("outside the scope a call gets its own buffer");
    let thrown = false;
    try {
      withSharedUniforms(g, shared, () => {
        throw new Error("build failed");
      });
    } catch {
      thrown = true;
    }
    if (!thrown || g.sharedUniforms !== undefined) throw new Error("a failed build ends the scope too");
    for (const x of shared.values()) x.destroy();
  },
);

Deno.test({ name: "embed gathers rows by token id at step positions", ignore }, async () => {
  const g = gpu!;
  for (const [V, H] of [[1, 1], [7, 3], [50, 300]]) {
    const table = randoms(V * H, V);
    const toks = Uint32Array.from({ length: 9 }, (_, i) => (i * 5 + 3) % V);
    const step = createStepBuffer(g);
    const x = storageBuffer(g, 4 * 4 * H);
    const call = embedCall(g, { step, tokens: upload(g, toks), table: upload(g, table), x }, {
      hidden: H,
      vocab: V,
      T: 4,
      weights: "f32",
    });
    writeStep(g, step, { pos0: 5, T: 4, tokOut: 0 });
    await runCalls(g, [call]);
    assertClose(await readF32(g, x, 4 * H), embedRef(table, toks.slice(5, 9), H), 0, 0, `embed ${V}x${H}`);
  }
});

Deno.test({ name: "rmsnorm matches reference (f32 and f16 weights)", ignore }, async () => {
  const g = gpu!;
  for (const [rows, H] of [[1, 1], [3, 5], [2, 257], [1, 2048]]) {
    for (const wt of g.hasF16 ? ["f32", "f16"] as const : ["f32"] as const) {
      const x = randoms(rows * H, H, 3);
      let w = randoms(H, H + 1);
      const wbuf = wt === "f16" ? upload(g, f32ToF16Bits(w)) : upload(g, w);
      if (wt === "f16") w = new Float32Array(new Float32Array(w.length).map((_, i) => f16Round(w[i])));
      const y = storageBuffer(g, rows * H * 4);
      await runCalls(g, [
        rmsnormCall(g, { x: upload(g, x), w: wbuf, y }, { hidden: H, rows, eps: 1e-5, weights: wt }),
      ]);
      assertClose(
        await readF32(g, y, rows * H),
        rmsnormRef(x, w, H, 1e-5),
        1e-6,
        1e-5,
        `rmsnorm ${rows}x${H} ${wt}`,
      );
    }
  }
});

Deno.test({
  name: `rmsnorm writes f16 (half) as the f32 result rounded${g16()}`,
  ignore: ignore || !gpu?.hasF16,
}, async () => {
  const g = gpu!;
  for (const [rows, H] of [[3, 4], [2, 260], [1, 2048]]) {
    const x = randoms(rows * H, H, 3);
    const w = randoms(H, H + 1);
    const y = storageBuffer(g, Math.ceil((rows * H) / 2) * 4);
    await runCalls(g, [
      rmsnormCall(g, { x: upload(g, x), w: upload(g, w), y }, {
        hidden: H,
        rows,
        eps: 1e-5,
        weights: "f32",
        half: true,
      }),
    ]);
    const got = f16ToF32(new Uint16Array(await readBack(g, y, rows * H * 2)));
    const want = rmsnormRef(x, w, H, 1e-5).map(f16Round);
    // One f16 step of either rounding (the GPU's f32 sum differs from the f64 reference in the last bits).
    assertClose(got, want, 1e-6, 2 ** -10, `rmsnorm half ${rows}x${H}`);
  }
});

function g16(): string {
  return gpu?.hasF16 ? "" : " [ignored: no shader-f16]";
}

function f16Round(v: number): number {
  return f16ToF32(f32ToF16Bits(new Float32Array([v])))[0];
}

Deno.test(
  { name: "matmul (gemv and tiled) matches reference, with accumulate and row offset", ignore },
  async () => {
    const g = gpu!;
    const shapes = [[1, 1, 1], [1, 5, 3], [3, 7, 9], [4, 64, 33], [5, 13, 17], [17, 40, 31], [33, 128, 70]];
    for (const [T, K, N] of shapes) {
      for (const wt of g.hasF16 ? ["f32", "f16"] as const : ["f32"] as const) {
        for (const accumulate of [false, true]) {
          const x = randoms((T + 1) * K, T * 1000 + K);
          let w = randoms(N * K, N);
          const wbuf = wt === "f16" ? upload(g, f32ToF16Bits(w)) : upload(g, w);
          if (wt === "f16") w = w.map(f16Round);
          const y0 = randoms(T * N, 7);
          const y = upload(g, y0);
          const d = { K, N, T, accumulate, xRow0: 1, weights: wt };
          await runCalls(g, [matmulCall(g, { x: upload(g, x), w: wbuf, y }, d)]);
          const want = matmulRef(x, w, d, y0);
          assertClose(
            await readF32(g, y, T * N),
            want,
            1e-5,
            1e-5,
            `matmul T${T} K${K} N${N} ${wt} acc=${accumulate}`,
          );
        }
      }
    }
  },
);

Deno.test(
  { name: "rope writes rotated q in place and rotated k / plain v into the cache (f32, f16 and q8)", ignore },
  async () => {
    const g = gpu!;
    // head_dim 256: a thread takes two rotation pairs.
    const cases = [[1, 1, 2, 1, 0], [4, 2, 16, 3, 5], [3, 1, 6, 2, 1], [2, 1, 256, 2, 3], [3, 1, 12, 2, 1]];
    const types: KvType[] = [
      "f32",
      ...(g.hasF16 ? ["f16" as const] : []),
      ...(g.hasDp4 ? ["q8" as const] : []),
    ];
    for (const kvType of types) {
      for (const [heads, kv, hd, T, pos0] of cases) {
        if (kvType === "q8" && hd % 4 !== 0) continue;
        await ropeCase(g, kvType, heads, kv, hd, T, pos0);
      }
    }
  },
);

/**
 * One ropeKvCall against ropeRef; an f16 cache holds the references rounded to f16, a q8 one quantised a row
 * (a step either way).
 */
async function ropeCase(
  g: Gpu,
  kvType: KvType,
  heads: number,
  kv: number,
  hd: number,
  T: number,
  pos0: number,
) {
  const maxSeq = pos0 + T + 2;
  const inv = ropeInvFreq(hd, 500000, {
    type: "llama3",
    factor: 32,
    lowFreqFactor: 1,
    highFreqFactor: 4,
    originalMaxPositionEmbeddings: 8192,
  });
  const table = ropeTable(inv, maxSeq);
  const row = (heads + 2 * kv) * hd;
  const qkv0 = randoms(T * row, heads * 100 + hd);
  const qkv = upload(g, qkv0);
  const n = kv * maxSeq * hd;
  const h16 = kvType === "f16";
  const bytes = (n / hd) * kvRowBytes(kvType, hd);
  const kc = storageBuffer(g, bytes), vc = storageBuffer(g, bytes);
  const step = createStepBuffer(g);
  writeStep(g, step, { pos0, T, tokOut: 0 });
  await runCalls(g, [
    ropeKvCall(g, { step, table: upload(g, table), qkv, kcache: kc, vcache: vc }, {
      heads,
      kvHeads: kv,
      headDim: hd,
      maxSeq,
      T,
      kv: kvType,
    }),
  ]);
  const readKv = async (b: GPUBuffer) =>
    h16
      ? f16ToF32(new Uint16Array((await readU32(g, b, n / 2)).buffer))
      : kvType === "q8"
      ? kvQ8Decode(await readU32(g, b, bytes / 4), hd)
      : await readF32(g, b, n);
  const round = (a: Float32Array) =>
    h16 ? f16ToF32(f32ToF16Bits(a)) : kvType === "q8" ? kvQ8Decode(kvQ8Encode(a, hd), hd) : a;
  // `copy`: v, copied (exact in f32).
  const check = (got: Float32Array, raw: Float32Array, what: string, copy = false) =>
    kvType === "q8"
      ? assertQ8Rows(got, round(raw), raw, hd, what)
      : assertClose(got, round(raw), h16 ? 1e-4 : copy ? 0 : 1e-6, h16 ? 2e-3 : copy ? 0 : 1e-5, what);
  const gotQ = await readF32(g, qkv, T * row), gotK = await readKv(kc);
  const gotV = await readKv(vc);
  for (let t = 0; t < T; t++) {
    for (let h = 0; h < heads; h++) {
      const v = qkv0.slice(t * row + h * hd, t * row + (h + 1) * hd);
      ropeRef(v, table, pos0 + t);
      assertClose(gotQ.slice(t * row + h * hd), v, 1e-6, 1e-5, `rope q t${t} h${h}`);
    }
    for (let h = 0; h < kv; h++) {
      const k = qkv0.slice(t * row + (heads + h) * hd, t * row + (heads + h + 1) * hd);
      ropeRef(k, table, pos0 + t);
      const at = (h * maxSeq + pos0 + t) * hd;
      check(gotK.slice(at, at + hd), k, `rope ${kvType} k t${t} h${h}`);
      const v = qkv0.slice(t * row + (heads + kv + h) * hd, t * row + (heads + kv + h + 1) * hd);
      check(gotV.slice(at, at + hd), v, `${kvType} v copy t${t} h${h}`, true);
    }
  }
}

Deno.test(
  {
    name: "attention over the cache matches reference (GQA, long and short contexts, f32, f16 and q8)",
    ignore,
  },
  async () => {
    const g = gpu!;
    const types: KvType[] = [
      "f32",
      ...(g.hasF16 ? ["f16" as const] : []),
      ...(g.hasDp4 ? ["q8" as const] : []),
    ];
    for (const kvType of types) {
      for (
        const [heads, kv, hd, T, pos0] of [[1, 1, 1, 1, 0], [4, 2, 16, 3, 0], [4, 1, 8, 1, 130], [
          2,
          2,
          80,
          5,
          60,
        ]]
      ) {
        if (kvType === "q8" && hd % 4 !== 0) continue;
        const maxSeq = pos0 + T + 3;
        const row = (heads + 2 * kv) * hd;
        const qkv0 = randoms(T * row, hd + T, 2);
        // An f16 or q8 cache: the reference reads the same values, widened.
        const h16 = kvType === "f16", q8 = kvType === "q8";
        const round = (a: Float32Array) =>
          h16 ? f16ToF32(f32ToF16Bits(a)) : q8 ? kvQ8Decode(kvQ8Encode(a, hd), hd) : a;
        const toGpu = (a: Float32Array) => upload(g, h16 ? f32ToF16Bits(a) : q8 ? kvQ8Encode(a, hd) : a);
        const kc0 = round(randoms(kv * maxSeq * hd, 11)), vc0 = round(randoms(kv * maxSeq * hd, 12));
        const out = storageBuffer(g, T * heads * hd * 4);
        const step = createStepBuffer(g);
        writeStep(g, step, { pos0, T, tokOut: 0 });
        const d = { heads, kvHeads: kv, headDim: hd, maxSeq, T, kv: kvType };
        await runCalls(g, [
          attentionCall(
            g,
            { step, qkv: upload(g, qkv0), kcache: toGpu(kc0), vcache: toGpu(vc0), out },
            d,
          ),
        ]);
        const q = new Float32Array(T * heads * hd);
        for (let t = 0; t < T; t++) q.set(qkv0.subarray(t * row, t * row + heads * hd), t * heads * hd);
        const want = attentionRef(q, kc0, vc0, { ...d, pos0 });
        assertClose(
          await readF32(g, out, T * heads * hd),
          want,
          1e-5,
          1e-4,
          `attention ${kvType} h${heads} kv${kv} hd${hd} T${T} @${pos0}`,
        );
      }
    }
  },
);

Deno.test({ name: "silu_mul matches reference", ignore }, async () => {
  const g = gpu!;
  for (const [T, I] of [[1, 1], [3, 7], [2, 300]]) {
    const gu = randoms(T * 2 * I, I, 6);
    const a = storageBuffer(g, T * I * 4);
    await runCalls(g, [siluMulCall(g, { gu: upload(g, gu), a }, { intermediate: I, T })]);
    assertClose(await readF32(g, a, T * I), siluMulRef(gu, I), 1e-6, 1e-5, `silu_mul ${T}x${I}`);
  }
});

Deno.test(
  { name: "sampling: argmax (ties to lowest), temperature and top-p match the reference", ignore },
  async () => {
    const g = gpu!;
    const step = createStepBuffer(g);
    const tokens = storageBuffer(g, 64 * 4);
    async function sample(
      logits: Float32Array,
      o: { temperature: number; topP: number; seed: number },
      tokOut: number,
    ) {
      writeStep(g, step, { pos0: 0, T: 1, tokOut });
      await runCalls(
        g,
        sampleCalls(g, { step, logits: upload(g, logits), tokens }, { vocab: logits.length, ...o }),
      );
      return (await readU32(g, tokens, 64))[tokOut];
    }
    // Greedy, ties resolved to the lowest index; sizes 1, odd, larger than the workgroup.
    for (const V of [1, 3, 1000, 128256]) {
      const l = randoms(V, V, 5);
      const want = sampleRef(l, { temperature: 0, topP: 1, seed: 0, tokOut: 1 });
      if ((await sample(l, { temperature: 0, topP: 1, seed: 0 }, 1)) !== want) {
        throw new Error(
          `argmax V=${V}`,
        );
      }
    }
    // Ties across the partial-argmax chunks (4096 logits each) resolve to the lowest index too.
    const wide = new Float32Array(10000).fill(-1);
    wide[9000] = wide[5000] = 2;
    if ((await sample(wide, { temperature: 0, topP: 1, seed: 0 }, 2)) !== 5000) {
      throw new Error("argmax tie across chunks");
    }
    wide[9999] = 3;
    if ((await sample(wide, { temperature: 0, topP: 1, seed: 0 }, 2)) !== 9999) {
      throw new Error("argmax last");
    }
    const tie = new Float32Array([0, 3, 1, 3, 3]);
    if ((await sample(tie, { temperature: 0, topP: 1, seed: 0 }, 2)) !== 1) throw new Error("argmax tie");
    // Sampling: same token as the reference for many (seed, position) draws.
    const l = randoms(777, 3, 4);
    for (const [temperature, topP] of [[1, 1], [0.7, 0.9], [1.3, 0.5], [1, 0.05]]) {
      for (let k = 0; k < 12; k++) {
        const o = { temperature, topP, seed: 1234 + k };
        const want = sampleRef(l, { ...o, tokOut: 3 + k });
        const got = await sample(l, o, 3 + k);
        if (got !== want) {
          throw new Error(
            `sample T=${temperature} p=${topP} seed ${o.seed}: got ${got}, want ${want}`,
          );
        }
      }
    }
  },
);

Deno.test(
  { name: "fused GEMV (none / rmsnorm / silu_mul, f32 and packed f16) matches reference", ignore },
  async () => {
    const g = gpu!;
    const tunings = [undefined, { team: 4, rows: 1, groups: 2 }, { team: 32, rows: 2 }, {
      team: 256,
      rows: 4,
      groups: 1,
    }];
    const shapes = [[1, 8, 1], [3, 16, 5], [2, 72, 33], [1, 256, 300], [4, 64, 7]];
    let k = 0;
    for (const [T, K, N] of shapes) {
      for (const wt of ["f32", "f16"] as const) {
        for (const transform of ["none", "rmsnorm", "silu_mul"] as const) {
          const tuning = tunings[k++ % tunings.length];
          const accumulate = k % 2 === 0;
          const width = transform === "silu_mul" ? 2 * K : K;
          const x = randoms((T + 1) * width, k, 2);
          let w = randoms(N * K, N + k);
          let nw = randoms(K, K + 3);
          const pack = (a: Float32Array) => (wt === "f16" ? upload(g, f32ToF16Bits(a)) : upload(g, a));
          const wbuf = pack(w), nbuf = pack(nw);
          if (wt === "f16") [w, nw] = [w.map(f16Round), nw.map(f16Round)];
          const y0 = randoms(T * N, 9);
          const y = upload(g, y0);
          await runCalls(g, [
            gemvFusedCall(g, { x: upload(g, x), w: wbuf, y, normWeight: nbuf }, {
              K,
              N,
              T,
              accumulate,
              xRow0: 1,
              weights: wt,
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
          const want = matmulRef(input, w, { K, N, T, accumulate, weights: wt }, y0);
          assertClose(
            await readF32(g, y, T * N),
            want,
            1e-5,
            1e-4,
            `gemv ${transform} T${T} K${K} N${N} ${wt} ${JSON.stringify(tuning)}`,
          );
        }
      }
    }
  },
);
