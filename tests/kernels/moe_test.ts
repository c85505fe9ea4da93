// The mixture-of-experts kernels against their CPU references: the router for each family's scoring
// (softmax with and without renormalising, sigmoid with correction bias, groups and scaling) including
// exact ties; the expert GEMVs for each weight type, input, transform and output, on awkward shapes and
// split over buffers; and the whole block (moeFfnCalls) against moeFfnRef.
// Tolerances: ids exactly; router weights |err| <= 1e-6 + 1e-5 |ref| (f32 exp and sums vs f64); GEMVs and
// the block 1e-4 + 1e-4 |ref| against an f64 reference on the very weights the GPU reads (f16-rounded or
// quantise -> dequantise), as matmul_quant_test.ts argues: only f32 summation order differs.
// Random router logits can put two experts within f32 rounding of each other, where the GPU and the f64
// reference may rightly order them differently; `stableRows` redraws such rows (the reference's choice
// must survive 1e-5 perturbations), and exact ties are tested on purpose instead.
import {
  createMoeScratch,
  GEMV_MAX_T,
  gemvInt8InputCall,
  int8TileFits,
  isQuant,
  moeCombineCall,
  moeCombineRef,
  moeFfnCalls,
  moeFfnRef,
  moeGemvCall,
  type MoeGemvDims,
  moeGemvRef,
  moeGroupCall,
  moeGroupedMatmulCall,
  moeGroupRef,
  moeMaxTiles,
  moeRouterCall,
  moeRouterRef,
  type MoeRouting,
  type QuantType,
  runCalls,
  storageBuffer,
  uploadBuffer,
  type WeightType,
} from "../../kernels/mod.ts";
import assert from "node:assert/strict";
import { join } from "node:path";
import { readSafetensorsHeader, readTensorBytes } from "../../models/safetensors.ts";
import { toF32 } from "../../models/dtype.ts";
import { seededRandom } from "../../node/random.ts";
import { fixtureDir } from "../fixtures.ts";
import {
  assertClose,
  checkDp4,
  gpuOrSkip,
  inputRows,
  packedWeights,
  randoms,
  readF32,
  readU32,
  upload,
} from "./harness.ts";

const gpu = await gpuOrSkip();
const ignore = gpu === null;
const TYPES: (WeightType | QuantType)[] = ["f32", "f16", "q8", "q4"];

function assertIds(got: Uint32Array, want: Uint32Array, what: string): void {
  for (let i = 0; i < want.length; i++) {
    if (got[i] !== want[i]) {
      throw new Error(`${what}: slot ${i}: got expert ${got[i]}, want ${want[i]} (all: ${got} vs ${want})`);
    }
  }
}

/** Whether the reference's choice for `row` is the same under small perturbations of the logits. */
function stable(row: Float32Array, r: MoeRouting & { bias?: Float32Array }, seed: number): boolean {
  const want = moeRouterRef(row, r).ids.join();
  const next = seededRandom(seed);
  for (let trial = 0; trial < 4; trial++) {
    const p = row.map((v) => v + (next() * 2 - 1) * 1e-5 * (1 + Math.abs(v)));
    if (moeRouterRef(p, r).ids.join() !== want) return false;
  }
  return true;
}

/** T rows of E random logits in [-scale, scale), each redrawn until its routing is not a near-tie. */
function stableRows(
  T: number,
  r: MoeRouting & { bias?: Float32Array },
  seed: number,
  scale = 4,
): Float32Array {
  const E = r.experts;
  const out = new Float32Array(T * E);
  for (let t = 0; t < T; t++) {
    for (let s = seed * 1000 + t * 17;; s++) {
      const row = randoms(E, s, scale);
      if (stable(row, r, s)) {
        out.set(row, t * E);
        break;
      }
    }
  }
  return out;
}

async function routeOnGpu(logits: Float32Array, r: MoeRouting & { T: number }, bias?: Float32Array) {
  const g = gpu!;
  const ids = storageBuffer(g, r.T * r.topK * 4);
  const routeWeights = storageBuffer(g, r.T * r.topK * 4);
  const biasBuf = bias ? upload(g, bias) : undefined;
  await runCalls(g, [moeRouterCall(g, { logits: upload(g, logits), ids, routeWeights, bias: biasBuf }, r)]);
  return { ids: await readU32(g, ids, r.T * r.topK), weights: await readF32(g, routeWeights, r.T * r.topK) };
}

Deno.test(
  { name: "moe router: each family's scoring, groups, bias and scale match the reference", ignore },
  async () => {
    // [T, E, k, groups, topKGroups]
    const shapes = [[1, 1, 1, 1, 1], [3, 8, 2, 1, 1], [2, 16, 4, 4, 2], [5, 60, 6, 1, 1], [1, 64, 6, 8, 3]];
    shapes.push([2, 128, 8, 1, 1], [3, 256, 8, 8, 4], [2, 384, 8, 1, 1], [1, 384, 16, 2, 1], [2, 7, 7, 1, 1]);
    let seed = 1;
    for (const [T, E, topK, groups, topKGroups] of shapes) {
      const variants: (MoeRouting & { bias?: Float32Array; name: string })[] = [
        { name: "mixtral", experts: E, topK, scoring: "softmax", normTopK: true },
        { name: "qwen3_moe norm off", experts: E, topK, scoring: "softmax", normTopK: false },
        {
          name: "deepseek_v3",
          experts: E,
          topK,
          scoring: "sigmoid",
          normTopK: true,
          groups,
          topKGroups,
          scale: 2.5,
          // Biases around -0.3: some biased scores negative (a dropped group's experts must still lose).
          bias: randoms(E, E + 5, 0.6).map((v) => v - 0.3),
        },
        {
          name: "sigmoid, no bias, norm off",
          experts: E,
          topK,
          scoring: "sigmoid",
          normTopK: false,
          groups,
          topKGroups,
        },
      ];
      for (const v of variants) {
        const logits = stableRows(T, v, seed++);
        const got = await routeOnGpu(logits, { ...v, T }, v.bias);
        const want = moeRouterRef(logits, v);
        const what = `router ${v.name} T${T} E${E} k${topK} groups ${v.groups ?? 1}/${v.topKGroups ?? 1}`;
        assertIds(got.ids, want.ids, what);
        assertClose(got.weights, want.weights, 1e-6, 1e-5, what);
      }
    }
  },
);

Deno.test(
  { name: "moe router: ties go to the lowest index; dropped groups never chosen", ignore },
  async () => {
    // All logits equal: the first k experts, each 1/k (renormalised) or 1/E.
    for (const normTopK of [true, false]) {
      const r: MoeRouting = { experts: 10, topK: 3, scoring: "softmax", normTopK };
      const got = await routeOnGpu(new Float32Array(2 * 10).fill(0.25), { ...r, T: 2 });
      assertIds(got.ids, Uint32Array.from([0, 1, 2, 0, 1, 2]), "all equal");
      assertClose(got.weights, new Float32Array(6).fill(normTopK ? 1 / 3 : 1 / 10), 1e-7, 1e-6, "all equal");
    }
    // A tie at the boundary: experts 2 and 5 share the second-best logit; 2 wins.
    {
      const logits = Float32Array.from([0, 1, 3, 0, 0, 3, 4, 0]);
      const r: MoeRouting = { experts: 8, topK: 3, scoring: "softmax", normTopK: true };
      const got = await routeOnGpu(logits, { ...r, T: 1 });
      assertIds(got.ids, Uint32Array.from([6, 2, 5]), "boundary tie");
      assertIds(moeRouterRef(logits, r).ids, Uint32Array.from([6, 2, 5]), "reference boundary tie");
    }
    // Equal groups: the lowest-index groups are kept. 4 groups of 4 with identical scores, keep 2: the
    // experts come from groups 0 and 1 only, best first within them.
    {
      const row = Float32Array.from({ length: 16 }, (_, e) => [0.5, 2, -1, 1][e % 4]);
      const r: MoeRouting = {
        experts: 16,
        topK: 4,
        scoring: "sigmoid",
        normTopK: true,
        groups: 4,
        topKGroups: 2,
      };
      const got = await routeOnGpu(row, { ...r, T: 1 });
      assertIds(got.ids, Uint32Array.from([1, 5, 3, 7]), "equal groups");
      const s = (v: number) => 1 / (1 + Math.exp(-v));
      const sum = 2 * s(2) + 2 * s(1);
      assertClose(
        got.weights,
        Float32Array.from([s(2), s(2), s(1), s(1)].map((v) => v / sum)),
        1e-7,
        1e-6,
        "equal groups",
      );
    }
    // transformers 5.17 masks the dropped groups with -inf (older versions with 0.0, which would let them win
    // here): with every biased score negative, the top 4 of the two kept groups are still chosen.
    {
      const logits = randoms(16, 3);
      const bias = new Float32Array(16).fill(-1);
      const r: MoeRouting = {
        experts: 16,
        topK: 4,
        scoring: "sigmoid",
        normTopK: false,
        groups: 4,
        topKGroups: 2,
        scale: 2,
      };
      // Expected by hand: the two best groups by the sum of their top-2 (s - 1), then their best 4.
      const sig = Array.from(logits, (v) => 1 / (1 + Math.exp(-v)));
      const gsum = [0, 1, 2, 3].map((g) => {
        const [a, b] = sig.slice(4 * g, 4 * g + 4).sort((p, q) => q - p);
        return a + b - 2;
      });
      const kept = [0, 1, 2, 3].sort((p, q) => gsum[q] - gsum[p]).slice(0, 2);
      const ids = Array.from({ length: 16 }, (_, e) => e).filter((e) => kept.includes(Math.floor(e / 4)))
        .sort((p, q) => sig[q] - sig[p]).slice(0, 4);
      const want = { ids: Uint32Array.from(ids), weights: Float32Array.from(ids, (e) => 2 * sig[e]) };
      assertIds(
        moeRouterRef(logits, { ...r, bias }).ids,
        want.ids,
        "reference: negative scores, dropped groups",
      );
      const got = await routeOnGpu(logits, { ...r, T: 1 }, bias);
      assertIds(got.ids, want.ids, "negative scores, dropped groups");
      assertClose(got.weights, want.weights, 1e-6, 1e-5, "negative scores, dropped groups");
    }
  },
);

Deno.test({ name: "moe router rejects bad routing with the field named", ignore }, () => {
  const b = upload(gpu!, new Float32Array(4));
  const bad: [Partial<MoeRouting>, RegExp][] = [
    [{ topK: 9 }, /topK/],
    [{ groups: 3 }, /groups must divide/],
    [{ groups: 8 }, /2 experts/],
    [{ groups: 2, topKGroups: 3 }, /topKGroups/],
    [{ groups: 4, topKGroups: 1, topK: 3 }, /kept groups/],
    [{ experts: 2000, topK: 1 }, /experts/],
    [{ scoring: "softplus" as "softmax" }, /scoring/],
  ];
  for (const [patch, re] of bad) {
    const r = { experts: 8, topK: 2, scoring: "softmax" as const, normTopK: true, ...patch };
    let err: unknown;
    try {
      moeRouterCall(gpu!, { logits: b, ids: b, routeWeights: b }, { ...r, T: 1 });
    } catch (e) {
      err = e;
    }
    if (!(err instanceof RangeError) || !re.test(err.message)) {
      throw new Error(`${JSON.stringify(patch)}: got ${err}`);
    }
  }
});

/** Random expert ids [T, k] in [0, E): distinct per token, as a router gives. */
function randomIds(T: number, k: number, E: number, seed: number): Uint32Array {
  const next = seededRandom(seed);
  const ids = new Uint32Array(T * k);
  for (let t = 0; t < T; t++) {
    const all = Array.from({ length: E }, (_, e) => e);
    for (let j = 0; j < k; j++) ids[t * k + j] = all.splice(Math.floor(next() * all.length), 1)[0];
  }
  return ids;
}

Deno.test(
  { name: "moe expert GEMVs match the reference for every weight type, input and output", ignore },
  async () => {
    const g = gpu!;
    // [T, K, N, E, k]: size 1 everywhere, odd N, k == E, K not a multiple of 4 / 8 (floats), long rows.
    const shapes = [[1, 32, 1, 1, 1], [3, 64, 7, 5, 2], [2, 96, 33, 8, 3], [1, 256, 40, 16, 4], [
      5,
      32,
      3,
      3,
      3,
    ]];
    const oddK = [[2, 13, 9, 4, 2], [1, 12, 5, 3, 1], [3, 1, 2, 2, 2]];
    const tunings = [undefined, { team: 4, rows: 1 }, { team: 32, rows: 2 }, { team: 256, rows: 3 }];
    const modes: Pick<MoeGemvDims, "input" | "transform" | "output" | "accumulate">[] = [
      { input: "token" }, // gate_up
      { input: "slot", transform: "silu_mul", output: "combine", accumulate: true }, // down + combine
      { input: "slot", output: "combine" },
      { input: "token", transform: "silu_mul", accumulate: true },
    ];
    let c = 0;
    for (const wt of TYPES) {
      for (const [T, K, N, E, k] of wt === "q8" || wt === "q4" ? shapes : [...shapes, ...oddK]) {
        for (const mode of modes) {
          const tuning = tunings[c++ % tunings.length];
          const d: MoeGemvDims = { K, N, T, topK: k, experts: E, weights: wt, tuning, ...mode };
          const width = (mode.transform === "silu_mul" ? 2 : 1) * K;
          const x = randoms((mode.input === "slot" ? T * k : T) * width, c, 2);
          const w = packedWeights(wt, randoms(E * N * K, c + 100, 0.5), E * N, K);
          const ids = randomIds(T, k, E, c);
          const routeWeights = randoms(T * k, c + 7);
          const outRows = mode.output === "combine" ? T : T * k;
          const y0 = randoms(outRows * N, c + 9);
          const y = upload(g, y0);
          const bufs = {
            x: upload(g, x),
            w: uploadBuffer(g, w.bytes),
            y,
            ids: upload(g, ids),
            routeWeights: upload(g, routeWeights),
          };
          await runCalls(g, [moeGemvCall(g, bufs, d)]);
          assertClose(
            await readF32(g, y, outRows * N),
            moeGemvRef({ x, w: w.deq, ids, routeWeights, y0 }, d),
            1e-4,
            1e-4,
            `moe gemv ${wt} T${T} K${K} N${N} E${E} k${k} ${JSON.stringify(mode)} ${JSON.stringify(tuning)}`,
          );
        }
      }
    }
  },
);

Deno.test(
  { name: "moe expert GEMVs and grouped matmuls over a layer split into two buffers (firstExpert)", ignore },
  async () => {
    const g = gpu!;
    const [T, K, N, E, k, split] = [3, 64, 24, 7, 3, 3];
    for (const wt of TYPES) {
      for (const output of ["slots", "combine", "grouped"] as const) {
        const stack = randoms(E * N * K, 11, 0.5);
        const parts = [[0, split], [split, E]].map(([e0, e1]) => ({
          e0,
          n: e1 - e0,
          w: packedWeights(wt, stack.slice(e0 * N * K, e1 * N * K), (e1 - e0) * N, K),
        }));
        const deq = new Float32Array(E * N * K);
        parts.forEach((p) => deq.set(p.w.deq, p.e0 * N * K));
        const x = randoms(T * K, 12);
        const ids = randomIds(T, k, E, 13);
        const routeWeights = randoms(T * k, 14);
        const rows = output === "combine" ? T : T * k;
        const y0 = randoms(rows * N, 15);
        const y = upload(g, y0);
        const base = {
          K,
          N,
          T,
          topK: k,
          weights: wt,
          output: output === "combine" ? output : "slots" as const,
          accumulate: output === "combine",
        };
        const bufs = { x: upload(g, x), y, ids: upload(g, ids), routeWeights: upload(g, routeWeights) };
        // The grouped path groups over the whole layer, then each buffer's matmul takes its experts' tiles.
        const order = storageBuffer(g, T * k * 4);
        const tiles = storageBuffer(g, moeMaxTiles(T, k, E) * 16);
        await runCalls(g, [
          ...output === "grouped"
            ? [moeGroupCall(g, { ids: bufs.ids, order, tiles }, { T, topK: k, experts: E })]
            : [],
          ...parts.map((p) => {
            const w = uploadBuffer(g, p.w.bytes);
            const d = { ...base, experts: p.n, firstExpert: p.e0 };
            return output === "grouped"
              ? moeGroupedMatmulCall(g, { x: bufs.x, w, y, order, tiles }, { ...d, layerExperts: E })
              : moeGemvCall(g, { ...bufs, w }, d);
          }),
        ]);
        assertClose(
          await readF32(g, y, rows * N),
          moeGemvRef({ x, w: deq, ids, routeWeights, y0 }, { ...base, experts: E }),
          1e-4,
          1e-4,
          `split ${wt} ${output}`,
        );
      }
    }
  },
);

Deno.test({ name: "moe expert GEMV and grouped matmul reject what they cannot serve", ignore }, () => {
  const b = upload(gpu!, new Float32Array(4));
  const cases: [Partial<MoeGemvDims>, RegExp, ErrorConstructor][] = [
    [{ weights: "q4", K: 48 }, /K % 32/, RangeError],
    [{ topK: 0 }, /topK/, RangeError],
    [{ output: "combine" }, /routeWeights/, TypeError],
  ];
  for (const [patch, re, kind] of cases) {
    let err: unknown;
    try {
      moeGemvCall(gpu!, { x: b, w: b, y: b, ids: b }, {
        K: 32,
        N: 4,
        T: 1,
        topK: 2,
        experts: 4,
        weights: "f32",
        ...patch,
      });
    } catch (e) {
      err = e;
    }
    if (!(err instanceof kind) || !re.test(err.message)) {
      throw new Error(`${JSON.stringify(patch)}: got ${err}`);
    }
  }
  // The grouped matmul's int8 inputs: only for q8 / q4 weights, into a copy big enough for its rows.
  const grouped = () => {
    try {
      moeGroupedMatmulCall(gpu!, { x: b, w: b, y: b, order: b, tiles: b, int8: { xq: b, xqs: b } }, {
        K: 32,
        N: 4,
        T: 1,
        topK: 2,
        experts: 4,
        weights: "f16",
      });
    } catch (e) {
      return e;
    }
  };
  const small = () => {
    try {
      gemvInt8InputCall(gpu!, { x: b, out: { xq: b, xqs: b } }, {
        K: 64,
        T: 2,
        wt: "q4",
        transform: "none",
        normWeights: "f32",
      });
    } catch (e) {
      return e;
    }
  };
  for (
    const [what, err, re] of [["f16 int8", grouped(), /q8 \/ q4/], [
      "small copy",
      small(),
      /needs 128/,
    ]] as const
  ) {
    if (!(err instanceof RangeError) || !re.test(err.message)) throw new Error(`${what}: got ${err}`);
  }
});

interface Family {
  name: string;
  routing: MoeRouting;
  H: number;
  I: number;
  sharedI: number;
  bias: boolean;
}

const FAMILIES: Family[] = [
  {
    name: "mixtral",
    routing: { experts: 8, topK: 2, scoring: "softmax", normTopK: true },
    H: 64,
    I: 96,
    sharedI: 0,
    bias: false,
  },
  {
    name: "qwen3_moe",
    routing: { experts: 12, topK: 3, scoring: "softmax", normTopK: false },
    H: 96,
    I: 32,
    sharedI: 0,
    bias: false,
  },
  {
    name: "deepseek_v3",
    routing: {
      experts: 16,
      topK: 4,
      scoring: "sigmoid",
      normTopK: true,
      groups: 4,
      topKGroups: 2,
      scale: 2.827,
    },
    H: 64,
    I: 32,
    sharedI: 64,
    bias: true,
  },
  {
    name: "kimi_k2",
    routing: {
      experts: 24,
      topK: 6,
      scoring: "sigmoid",
      normTopK: true,
      groups: 1,
      topKGroups: 1,
      scale: 2.5,
    },
    H: 64,
    I: 64,
    sharedI: 32,
    bias: true,
  },
];

Deno.test(
  { name: "moe FFN block (router, experts, combine, shared expert) matches moeFfnRef", ignore },
  async () => {
    const g = gpu!;
    let seed = 0;
    for (const f of FAMILIES) {
      const { H, I, sharedI: Is, routing } = f;
      const E = routing.experts;
      for (const wt of TYPES) {
        // [T, grouped]: the default (per-token GEMVs up to T = 4, grouped above), and each path forced.
        const runs: [number, boolean | undefined][] = [[1, undefined], [3, true], [6, false], [
          17,
          undefined,
        ]];
        for (const [T, grouped] of runs) {
          seed++;
          const router = randoms(E * H, seed + 1, 0.3);
          const bias = f.bias ? randoms(E, seed + 2, 0.1) : undefined;
          // Redraw x until no token's routing is a near-tie (see the file's comment).
          let x: Float32Array;
          for (let s = seed * 100;; s++) {
            x = randoms(T * H, s);
            const rows = Array.from({ length: T }, (_, t) => x.subarray(t * H, t * H + H));
            if (rows.every((row, t) => stable(logitsOf(row, router, E), { ...routing, bias }, s + t))) break;
          }
          const gateUp = packedWeights(wt, randoms(E * 2 * I * H, seed + 3, 0.3), E * 2 * I, H);
          const down = packedWeights(wt, randoms(E * H * I, seed + 4, 0.3), E * H, I);
          const sharedType = wt === "f16" ? "f16" : "f32";
          const sGu = Is
            ? packedWeights(sharedType, randoms(2 * Is * H, seed + 5, 0.3), 2 * Is, H)
            : undefined;
          const sDown = Is ? packedWeights(sharedType, randoms(H * Is, seed + 6, 0.3), H, Is) : undefined;
          const y0 = randoms(T * H, seed + 7);
          const y = upload(g, y0);
          const dims = { hidden: H, intermediate: I, sharedIntermediate: Is, routing };
          const scratch = createMoeScratch(g, { ...dims, T });
          const calls = moeFfnCalls(g, {
            x: upload(g, x!),
            y,
            router: upload(g, router),
            bias: bias && upload(g, bias),
            gateUp: uploadBuffer(g, gateUp.bytes),
            down: uploadBuffer(g, down.bytes),
            sharedGateUp: sGu && uploadBuffer(g, sGu.bytes),
            sharedDown: sDown && uploadBuffer(g, sDown.bytes),
            scratch,
          }, {
            ...dims,
            T,
            grouped,
            weights: {
              router: "f32",
              gateUp: wt,
              down: wt,
              sharedGateUp: sharedType,
              sharedDown: sharedType,
            },
          });
          await runCalls(g, calls);
          const want = moeFfnRef({
            x: x!,
            router,
            bias,
            gateUp: gateUp.deq,
            down: down.deq,
            sharedGateUp: sGu?.deq,
            sharedDown: sDown?.deq,
          }, dims);
          const what = `moe block ${f.name} ${wt} T${T} grouped ${grouped}`;
          assertIds(await readU32(g, scratch.ids, T * routing.topK), want.ids, what);
          assertClose(
            await readF32(g, scratch.routeWeights, T * routing.topK),
            want.weights,
            1e-6,
            1e-5,
            what,
          );
          // The grouped path multiplies q8 / q4 experts with int8 inputs where it can (int8TileFits):
          // within their error then (moe_fused_test.ts's bound; the kernel's own test bounds each output).
          const int8 = isQuant(wt) && (grouped ?? T > GEMV_MAX_T) && int8TileFits(g, wt);
          const big = int8 ? Math.max(...want.out.map(Math.abs)) : 0;
          assertClose(
            await readF32(g, y, T * H),
            y0.map((v, i) => v + want.out[i]),
            int8 ? 0.02 * big : 1e-4,
            1e-4,
            what,
          );
        }
      }
    }
  },
);

function logitsOf(x: Float32Array, router: Float32Array, E: number): Float32Array {
  const H = x.length;
  return Float32Array.from({ length: E }, (_, e) => {
    let s = 0;
    for (let h = 0; h < H; h++) s += x[h] * router[e * H + h];
    return s;
  });
}

Deno.test({ name: "moe grouping: slots by expert, one tile per 16, other ids skipped", ignore }, async () => {
  const g = gpu!;
  // [T, k, E]: one slot; runs over 16 (several tiles an expert); the largest prefill; ids >= E skipped.
  const shapes = [[1, 1, 1], [5, 3, 7], [33, 4, 6], [128, 8, 128], [128, 16, 384], [9, 2, 5]];
  for (const [T, k, E] of shapes) {
    const ids = randomIds(T, k, E, T + k + E);
    if (E === 5) ids.forEach((_, i) => i % 5 === 2 && (ids[i] = E + i)); // another buffer's or garbage
    const tilesN = moeMaxTiles(T, k, E);
    const order = storageBuffer(g, T * k * 4);
    const tiles = storageBuffer(g, tilesN * 16);
    await runCalls(g, [moeGroupCall(g, { ids: upload(g, ids), order, tiles }, { T, topK: k, experts: E })]);
    const want = moeGroupRef(ids, E);
    const gotTiles = await readU32(g, tiles, tilesN * 4);
    const gotOrder = await readU32(g, order, want.order.length);
    for (let i = 0; i < tilesN; i++) {
      const got = [...gotTiles.subarray(4 * i, 4 * i + 3)].join();
      const w = i < want.tiles.length ? want.tiles[i].join() : String([0xffffffff, 0, 0]);
      if (got !== w) throw new Error(`group T${T} k${k} E${E}: tile ${i}: got ${got}, want ${w}`);
    }
    // Within an expert's run the order is the atomics'; as a set it must be the reference's. (A run's
    // tiles share its end; the first one starts it.)
    const runs = new Map(want.tiles.toReversed().map(([, begin, end]) => [end, begin]));
    for (const [end, begin] of runs) {
      const a = [...gotOrder.subarray(begin, end)].sort((p, q) => p - q).join();
      const b = [...want.order.subarray(begin, end)].join();
      if (a !== b) throw new Error(`group T${T} k${k} E${E}: run at ${begin}: got ${a}, want ${b}`);
    }
  }
});

Deno.test(
  { name: "moe grouped matmul and combine match the reference for every weight type", ignore },
  async () => {
    const g = gpu!;
    // [T, K, N, E, k]: size 1; an expert with more than 16 tokens; odd N; odd K (floats); more than one
    // workgroup of features (64) and more than one staged slice of k (32).
    const shapes = [[1, 32, 1, 1, 1], [20, 64, 7, 3, 2], [7, 96, 33, 8, 3], [40, 32, 18, 16, 4], [
      37,
      96,
      130,
      4,
      2,
    ]];
    const oddK = [[9, 13, 9, 4, 2], [3, 1, 2, 2, 2]];
    let c = 0;
    for (const wt of TYPES) {
      for (const [T, K, N, E, k] of wt === "q8" || wt === "q4" ? shapes : [...shapes, ...oddK]) {
        for (
          const mode of [{ input: "token" }, {
            input: "slot",
            transform: "silu_mul",
            accumulate: true,
          }] as const
        ) {
          c++;
          const d = { K, N, T, topK: k, experts: E, weights: wt, ...mode };
          const width = (d.transform === "silu_mul" ? 2 : 1) * K;
          const x = randoms((d.input === "slot" ? T * k : T) * width, c, 2);
          const w = packedWeights(wt, randoms(E * N * K, c + 100, 0.5), E * N, K);
          const ids = randomIds(T, k, E, c);
          const tilesN = moeMaxTiles(T, k, E);
          const order = storageBuffer(g, T * k * 4);
          const tiles = storageBuffer(g, tilesN * 16);
          const y0 = randoms(T * k * N, c + 9);
          const y = upload(g, y0);
          const idsBuf = upload(g, ids);
          // Both widths of the matmul's workgroups (64 features, and 128: the default), alternating.
          const groupedWidth = c % 2 === 0 ? 64 : 128;
          g.tuning.moe = { groupedWidth };
          try {
            await runCalls(g, [
              moeGroupCall(g, { ids: idsBuf, order, tiles }, { T, topK: k, experts: E }),
              moeGroupedMatmulCall(g, { x: upload(g, x), w: uploadBuffer(g, w.bytes), y, order, tiles }, d),
            ]);
          } finally {
            delete g.tuning.moe;
          }
          const want = moeGemvRef({ x, w: w.deq, ids, y0 }, d);
          const what = `grouped ${wt} T${T} K${K} N${N} E${E} k${k} ${
            JSON.stringify(mode)
          } width ${groupedWidth}`;
          assertClose(await readF32(g, y, T * k * N), want, 1e-4, 1e-4, what);
          if (isQuant(wt) && int8TileFits(g, wt)) {
            // The int8 path: the input pass quantises f(x)'s rows once, the matmul multiplies packed dots
            // (staging one or two quantisation groups a slice), each slot within its int8 inputs' error.
            const rows = d.input === "slot" ? T * k : T;
            const int8 = { xq: storageBuffer(g, rows * K), xqs: storageBuffer(g, (rows * K) / 32 * 8) };
            const yq = upload(g, y0);
            const xBuf = upload(g, x);
            g.tuning.moe = { groupedWidth, groupedBlocks: c % 3 === 0 ? 1 : 2, groupedPrefetch: c % 4 < 2 };
            try {
              await runCalls(g, [
                moeGroupCall(g, { ids: idsBuf, order, tiles }, { T, topK: k, experts: E }),
                gemvInt8InputCall(g, { x: xBuf, out: int8 }, {
                  K,
                  T: rows,
                  wt,
                  transform: d.transform ?? "none",
                  normWeights: "f32",
                }).call,
                moeGroupedMatmulCall(
                  g,
                  { x: xBuf, w: uploadBuffer(g, w.bytes), y: yq, order, tiles, int8 },
                  d,
                ),
              ]);
            } finally {
              delete g.tuning.moe;
            }
            const got = await readF32(g, yq, T * k * N);
            for (let slot = 0; slot < T * k; slot++) {
              const e = ids[slot];
              const f = inputRows(
                x,
                d.input === "slot" ? slot : Math.floor(slot / k),
                1,
                K,
                d.transform === "silu_mul",
              );
              const at = slot * N;
              checkDp4(
                got.subarray(at, at + N),
                want.subarray(at, at + N),
                f,
                w.deq.subarray(e * N * K, (e + 1) * N * K),
                { T: 1, N, K },
                `${what} slot ${slot} int8`,
              );
            }
          }
          // Combine the slots into a residual.
          const routeWeights = randoms(T * k, c + 3);
          const r0 = randoms(T * N, c + 4);
          const res = upload(g, r0);
          const cd = { N, T, topK: k, accumulate: c % 2 === 0 };
          await runCalls(g, [
            moeCombineCall(g, { src: y, routeWeights: upload(g, routeWeights), y: res }, cd),
          ]);
          const comb = moeCombineRef({ src: want, routeWeights, y0: r0 }, cd);
          assertClose(await readF32(g, res, T * N), comb, 1e-4, 1e-4, `combine after ${what}`);
        }
      }
    }
  },
);

Deno.test(
  {
    name: "moe combine: a slot of weight 0 adds nothing, not even a NaN row (an expert host's unheld slots)",
    ignore,
  },
  async () => {
    const g = gpu!;
    const T = 3, k = 4, N = 37;
    const src = randoms(T * k * N, 5);
    const routeWeights = randoms(T * k, 6);
    // Slots (0, 1), (1, 0), (1, 3) and all of token 2 are held elsewhere: weight 0, rows never written.
    for (const slot of [1, 4, 7, 8, 9, 10, 11]) {
      routeWeights[slot] = 0;
      src.fill(NaN, slot * N, (slot + 1) * N);
    }
    const y = upload(g, new Float32Array(T * N).fill(1));
    const d = { N, T, topK: k, accumulate: false };
    await runCalls(g, [
      moeCombineCall(g, { src: upload(g, src), routeWeights: upload(g, routeWeights), y }, d),
    ]);
    const got = await readF32(g, y, T * N);
    const want = moeCombineRef({ src, routeWeights }, d);
    assert.ok(want.every(Number.isFinite) && got.every(Number.isFinite), "no NaN from a slot of weight 0");
    assertClose(got, want, 1e-5, 1e-5, "combine over held slots");
    assert.ok(got.subarray(2 * N).every((v) => v === 0), "a token with no held slot sums to 0");
  },
);

// transformers' own MoE blocks (scripts/fixtures/make_moe_blocks.py: one-layer models loaded from hub-named
// checkpoints, each block called in float64): moeFfnRef must agree to f32 rounding, and the GPU block to
// the kernels' tolerance, for T = 7 (the prefill path) and the first 1 and 3 rows (decode).
const blocksDir = fixtureDir("moe-blocks", { needs: "cases.json" });
if (!blocksDir) console.log("skipped: transformers MoE block tests (no moe-blocks fixture)");

interface BlockCase {
  routing: MoeRouting;
  H: number;
  I: number;
  Is: number;
  T: number;
}

async function loadBlock(name: string): Promise<Record<string, Float32Array>> {
  const header = await readSafetensorsHeader(join(blocksDir!, `${name}.safetensors`));
  const out: Record<string, Float32Array> = {};
  for (const [k, info] of header) out[k] = new Float32Array(toF32(await readTensorBytes(info), info.dtype));
  return out;
}

function blockCases(): [string, BlockCase][] {
  return Object.entries(JSON.parse(Deno.readTextFileSync(join(blocksDir!, "cases.json"))));
}

Deno.test(
  { name: "moeFfnRef matches transformers' MoE blocks (fixture moe-blocks)", ignore: !blocksDir },
  async () => {
    for (const [name, c] of blockCases()) {
      const t = await loadBlock(name);
      for (let i = 0; i < c.T; i++) {
        const logits = logitsOf(t.x.subarray(i * c.H, i * c.H + c.H), t.router, c.routing.experts);
        if (!stable(logits, { ...c.routing, bias: t.bias }, i)) {
          throw new Error(
            `${name}: token ${i}'s routing is a near-tie; regenerate the fixture with other seeds`,
          );
        }
      }
      const got = moeFfnRef({
        x: t.x,
        router: t.router,
        bias: t.bias,
        gateUp: t.gate_up,
        down: t.down,
        sharedGateUp: t.shared_gate_up,
        sharedDown: t.shared_down,
      }, { hidden: c.H, intermediate: c.I, sharedIntermediate: c.Is, routing: c.routing });
      assertClose(got.out, t.out, 1e-6, 1e-5, `moeFfnRef vs transformers ${name}`);
    }
  },
);

Deno.test(
  { name: "moe FFN block on the GPU matches transformers' MoE blocks", ignore: ignore || !blocksDir },
  async () => {
    const g = gpu!;
    for (const [name, c] of blockCases()) {
      const t = await loadBlock(name);
      for (const [T, grouped] of [[1, false], [3, true], [c.T, false], [c.T, true]] as const) {
        const y0 = randoms(T * c.H, T);
        const y = upload(g, y0);
        const dims = { hidden: c.H, intermediate: c.I, sharedIntermediate: c.Is, routing: c.routing };
        const calls = moeFfnCalls(g, {
          x: upload(g, t.x.slice(0, T * c.H)),
          y,
          router: upload(g, t.router),
          bias: t.bias && upload(g, t.bias),
          gateUp: upload(g, t.gate_up),
          down: upload(g, t.down),
          sharedGateUp: t.shared_gate_up && upload(g, t.shared_gate_up),
          sharedDown: t.shared_down && upload(g, t.shared_down),
          scratch: createMoeScratch(g, { ...dims, T }),
        }, {
          ...dims,
          T,
          grouped,
          weights: { router: "f32", gateUp: "f32", down: "f32", sharedGateUp: "f32", sharedDown: "f32" },
        });
        await runCalls(g, calls);
        const want = y0.map((v, i) => v + t.out[i]);
        assertClose(
          await readF32(g, y, T * c.H),
          want,
          1e-4,
          1e-4,
          `GPU moe block vs transformers ${name} T${T} grouped ${grouped}`,
        );
      }
    }
  },
);
