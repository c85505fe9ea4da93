// The subgroup expert GEMVs (kernels/moe_sg.ts) against the CPU references (moe_gemv.ts's moeGemvRef,
// rmsnorm and silu_mul written out): gate_up with and without the fused RMSNorm, SiLU * up fused; down with
// the weighted combine and the residual add; every storage; awkward shapes (rows not a multiple of the
// warp's, slots whose rows do not fill a warp, T > 1, experts outside the stack skipped).
// Tolerance 1e-4 + 1e-4 |ref| against f64 on the very weights the GPU reads (moe_test.ts's argument).
import {
  createMoeScratch,
  moeDecodeCalls,
  moeFfnRef,
  moeGemvRef,
  moeRouterGemvCall,
  moeRouterRef,
  type MoeRouting,
  moeSgCall,
  type MoeSgDims,
  moeSgFits,
  type MoeTuning,
  type QuantType,
  readBack,
  runCalls,
  storageBuffer,
  uploadBuffer,
  type WeightType,
} from "../../kernels/mod.ts";
import { assertClose, gpuOrSkip, packedWeights, randoms, readF32, upload } from "./harness.ts";

const gpu = await gpuOrSkip();
const ignore = gpu === null || gpu.subgroupSize === null;
const TYPES: (WeightType | QuantType)[] = ["f32", "f16", "q8", "q4"];

function silu(v: number): number {
  return v / (1 + Math.exp(-v));
}

/**
 * How far a dot product of w and x may move when x is quantised to int8 per block of 32 (dp4: scale
 * amax / 127, so each value within half a step): sum over blocks of amax / 254 * sum |w| (harness's checkDp4).
 */
function dp4Slack(x: Float32Array, w: Float32Array): number {
  let bound = 0;
  for (let b = 0; b < x.length; b += 32) {
    let amax = 0, wsum = 0;
    for (let i = b; i < b + 32; i++) {
      amax = Math.max(amax, Math.abs(x[i]));
      wsum += Math.abs(w[i]);
    }
    bound += (amax / 127 / 2) * wsum * 1.001;
  }
  return bound;
}

/** Each storage with and without prefetch; the quantised ones also with dp4 where the adapter has it. */
function variants(wt: WeightType | QuantType): { dp4: boolean; prefetch: boolean }[] {
  const dp4 = wt === "q8" || wt === "q4" ? (gpu!.hasDp4 ? [false, true] : [false]) : [false];
  return dp4.flatMap((q) => [false, true].map((prefetch) => ({ dp4: q, prefetch })));
}

/** ids [T, k]: distinct experts per token, some (when `outside`) beyond the stack. */
function pickIds(T: number, k: number, E: number, seed: number, outside = false): Uint32Array {
  const ids = new Uint32Array(T * k);
  for (let t = 0; t < T; t++) {
    for (let j = 0; j < k; j++) ids[t * k + j] = (seed + t * 7 + j * 3) % E;
    if (outside && k > 1) ids[t * k + 1] = E + 5;
  }
  return ids;
}

Deno.test(
  { name: "moe sg gate_up: silu(gate) * up of the chosen experts, with and without rmsnorm", ignore },
  async () => {
    const shapes = [
      { K: 64, N: 12, k: 2, E: 3, T: 1 },
      { K: 128, N: 40, k: 3, E: 5, T: 2 },
      { K: 256, N: 7, k: 1, E: 2, T: 1 },
    ];
    let ran = 0;
    for (const wt of TYPES) {
      if (wt === "f16" && !gpu!.hasF16) continue;
      for (const { K, N, k, E, T } of shapes) {
        for (
          const [norm, { dp4, prefetch }] of [false, true].flatMap((n) =>
            variants(wt).map((v) => [n, v] as const)
          )
        ) {
          const d: MoeSgDims = { kind: "gate_up", K, N, T, topK: k, experts: E, weights: wt, dp4, prefetch };
          if (norm) d.rmsnorm = { eps: 1e-6, weights: "f32" };
          if (!moeSgFits(gpu!, d)) continue;
          const x = randoms(T * K, K + N + 1);
          const nw = randoms(K, 5, 1);
          const w = randoms(E * 2 * N * K, E + K, 0.2);
          const { bytes, deq } = packedWeights(wt, w, E * 2 * N, K);
          const ids = pickIds(T, k, E, N, T > 1);
          // The input the experts see: rmsnorm(x) * nw, or x.
          const xn = new Float32Array(T * K);
          for (let t = 0; t < T; t++) {
            let ss = 0;
            for (let i = 0; i < K; i++) ss += x[t * K + i] ** 2;
            const inv = norm ? 1 / Math.sqrt(ss / K + 1e-6) : 1;
            for (let i = 0; i < K; i++) xn[t * K + i] = norm ? x[t * K + i] * inv * nw[i] : x[t * K + i];
          }
          const gu = moeGemvRef({ x: xn, w: deq, ids }, {
            K,
            N: 2 * N,
            T,
            topK: k,
            experts: E,
            weights: "f32",
          });
          const want = new Float32Array(T * k * N);
          for (let s = 0; s < T * k; s++) {
            for (let n = 0; n < N; n++) want[s * N + n] = silu(gu[s * 2 * N + n]) * gu[s * 2 * N + N + n];
          }
          const out = storageBuffer(gpu!, T * k * N * 4);
          const bufs = {
            x: upload(gpu!, x),
            w: uploadBuffer(gpu!, bytes),
            out,
            ids: upload(gpu!, ids),
            norm: upload(gpu!, nw),
          };
          await runCalls(gpu!, [moeSgCall(gpu!, bufs, d)]);
          const got = await readF32(gpu!, out, T * k * N);
          // Slots of experts outside the stack are left alone (zero here).
          for (let s = 0; s < T * k; s++) if (ids[s] >= E) want.fill(0, s * N, s * N + N);
          const what = `gate_up ${wt} K${K} N${N} k${k} T${T} norm ${norm} dp4 ${dp4} prefetch ${prefetch}`;
          if (dp4) {
            // The gate and up dot products each move by at most their dp4 slack; act = silu(g) * u
            // (|silu'| < 1.1) by at most the propagated amount.
            for (let s = 0; s < T * k; s++) {
              if (ids[s] >= E) continue;
              const xt = xn.subarray(Math.floor(s / k) * K, Math.floor(s / k) * K + K);
              for (let n = 0; n < N; n++) {
                const row = (r: number) =>
                  deq.subarray((ids[s] * 2 * N + r) * K, (ids[s] * 2 * N + r + 1) * K);
                const g = gu[s * 2 * N + n], u = gu[s * 2 * N + N + n];
                const bg = dp4Slack(xt, row(n)), bu = dp4Slack(xt, row(N + n));
                const want1 = want[s * N + n];
                const bound = 1e-4 + 1e-4 * Math.abs(want1) + 1.1 * bg * (Math.abs(u) + bu) +
                  (Math.abs(silu(g)) + 1.1 * bg) * bu;
                const err = Math.abs(got[s * N + n] - want1);
                if (!(err <= bound)) {
                  throw new Error(
                    `${what}: slot ${s} row ${n}: got ${got[s * N + n]}, want ${want1} (> ${bound})`,
                  );
                }
              }
            }
          } else assertClose(got, want, 1e-4, 1e-4, what);
          ran++;
        }
      }
    }
    if (ran < 12) throw new Error(`only ${ran} gate_up cases fit this adapter`);
  },
);

Deno.test({ name: "moe sg down: the weighted sum of the chosen experts added into y", ignore }, async () => {
  const shapes = [
    { K: 64, N: 20, k: 2, E: 3, T: 1 },
    { K: 96, N: 33, k: 3, E: 4, T: 2 },
    { K: 32, N: 9, k: 5, E: 6, T: 1 },
  ];
  let ran = 0;
  for (const wt of TYPES) {
    if (wt === "f16" && !gpu!.hasF16) continue;
    for (
      const [{ K, N, k, E, T }, { dp4, prefetch }] of shapes.flatMap((sh) =>
        variants(wt).map((v) => [sh, v] as const)
      )
    ) {
      const d: MoeSgDims = { kind: "down", K, N, T, topK: k, experts: E, weights: wt, dp4, prefetch };
      if (!moeSgFits(gpu!, d)) continue;
      const act = randoms(T * k * K, K + 3);
      const w = randoms(E * N * K, E * K, 0.2);
      const { bytes, deq } = packedWeights(wt, w, E * N, K);
      const ids = pickIds(T, k, E, K, T > 1);
      const rw = randoms(T * k, 9, 1);
      const y0 = randoms(T * N, 4);
      const want = moeGemvRef({ x: act, w: deq, ids, routeWeights: rw, y0 }, {
        K,
        N,
        T,
        topK: k,
        experts: E,
        weights: "f32",
        input: "slot",
        output: "combine",
        accumulate: true,
      });
      const y = upload(gpu!, y0);
      const bufs = { x: upload(gpu!, act), w: uploadBuffer(gpu!, bytes), out: y, ids: upload(gpu!, ids) };
      await runCalls(gpu!, [moeSgCall(gpu!, { ...bufs, routeWeights: upload(gpu!, rw) }, d)]);
      const got = await readF32(gpu!, y, T * N);
      const what = `down ${wt} K${K} N${N} k${k} T${T} dp4 ${dp4} prefetch ${prefetch}`;
      if (dp4) {
        // Each slot's input is quantised after its route weight is applied.
        for (let t = 0; t < T; t++) {
          for (let h = 0; h < N; h++) {
            let bound = 1e-4 + 1e-4 * Math.abs(want[t * N + h]);
            for (let j = 0; j < k; j++) {
              const e = ids[t * k + j];
              if (e >= E) continue;
              const xin = act.subarray((t * k + j) * K, (t * k + j + 1) * K).map((v) => v * rw[t * k + j]);
              bound += dp4Slack(xin, deq.subarray((e * N + h) * K, (e * N + h + 1) * K));
            }
            const err = Math.abs(got[t * N + h] - want[t * N + h]);
            if (!(err <= bound)) {
              throw new Error(`${what}: ${t},${h}: got ${got[t * N + h]}, want ${want[t * N + h]}`);
            }
          }
        }
      } else assertClose(got, want, 1e-4, 1e-4, what);
      ran++;
    }
  }
  if (ran < 6) throw new Error(`only ${ran} down cases fit this adapter`);
});

Deno.test({
  name: "moe sg gate_up with the routing fused: the router's choice, weights and activations",
  ignore,
}, async () => {
  const K = 64, N = 24, T = 2;
  // 16 experts; 128 (Qwen3) and 384 (Kimi K2): the subgroup router's lanes hold several experts each (past
  // 32 a lane, its chosen flags are an array instead of a bit mask).
  const routings: MoeRouting[] = [
    { experts: 16, topK: 4, scoring: "softmax", normTopK: true },
    { experts: 16, topK: 3, scoring: "softmax", normTopK: false },
    { experts: 16, topK: 4, scoring: "sigmoid", normTopK: true, groups: 4, topKGroups: 2, scale: 2.5 },
    { experts: 16, topK: 5, scoring: "sigmoid", normTopK: true, scale: 1.5 },
    { experts: 128, topK: 8, scoring: "softmax", normTopK: true },
    { experts: 384, topK: 8, scoring: "sigmoid", normTopK: true, scale: 2.5 },
  ];
  for (const routing of routings) {
    const E = routing.experts;
    // The last: RMSNorm fused (its sum of squares overlaps the routing) and dp4.
    // prefetch: without groups every warp routes on its own and loads before staging.
    const cases = [["f32", false], ["q4", false], ["q4", true]] as const;
    // rank: routerWgsl's ranking (the softmax by the first warp) instead of the subgroup router.
    const modes = [[false, false], [true, false], [false, true]] as const;
    for (const [[wt, norm], [prefetch, rank]] of cases.flatMap((c) => modes.map((m) => [c, m] as const))) {
      const dp4 = norm && gpu!.hasDp4;
      const k = routing.topK;
      // Logits well apart (a permutation of a spaced ramp): no near-ties for f32 and f64 to order differently.
      const logits = Float32Array.from(
        { length: T * E },
        (_, i) => (((i * 7) % E) - E / 2) * 0.37 * (16 / E) + (i >= E ? 0.11 : 0),
      );
      // Token 1 of the plain softmax case is all ties: the lowest indices win, in order.
      if (routing.scoring === "softmax" && routing.normTopK) logits.fill(0.5, E, 2 * E);
      const bias = routing.scoring === "sigmoid" ? randoms(E, 3, 0.2) : undefined;
      const want = moeRouterRef(logits, { ...routing, bias });
      const x = randoms(T * K, 17);
      const nw = randoms(K, 6, 1);
      const xn = x.slice();
      for (let t = 0; norm && t < T; t++) {
        let ss = 0;
        for (let i = 0; i < K; i++) ss += x[t * K + i] ** 2;
        const inv = 1 / Math.sqrt(ss / K + 1e-6);
        for (let i = 0; i < K; i++) xn[t * K + i] = x[t * K + i] * inv * nw[i];
      }
      const w = randoms(E * 2 * N * K, 5, 0.2);
      const { bytes, deq } = packedWeights(wt, w, E * 2 * N, K);
      const gu = moeGemvRef({ x: xn, w: deq, ids: want.ids }, {
        K,
        N: 2 * N,
        T,
        topK: k,
        experts: E,
        weights: "f32",
      });
      const act = new Float32Array(T * k * N);
      for (let s = 0; s < T * k; s++) {
        for (let n = 0; n < N; n++) act[s * N + n] = silu(gu[s * 2 * N + n]) * gu[s * 2 * N + N + n];
      }
      const d: MoeSgDims = {
        kind: "gate_up",
        K,
        N,
        T,
        topK: k,
        experts: E,
        weights: wt,
        route: { routing, bias: !!bias, rank },
        dp4,
        prefetch,
        ...(norm ? { rmsnorm: { eps: 1e-6, weights: "f32" as const } } : {}),
      };
      const out = storageBuffer(gpu!, T * k * N * 4);
      const ids = storageBuffer(gpu!, T * k * 4);
      const rw = storageBuffer(gpu!, T * k * 4);
      await runCalls(gpu!, [
        moeSgCall(gpu!, {
          x: upload(gpu!, x),
          w: uploadBuffer(gpu!, bytes),
          out,
          ids,
          routeWeights: rw,
          logits: upload(gpu!, logits),
          bias: bias && upload(gpu!, bias),
          norm: upload(gpu!, nw),
        }, d),
      ]);
      const what =
        `${routing.scoring} E${E} k${k} ${wt} norm ${norm} dp4 ${dp4} prefetch ${prefetch} rank ${rank}`;
      const gotIds = new Uint32Array(await readBack(gpu!, ids, T * k * 4));
      if (gotIds.join() !== want.ids.join()) throw new Error(`${what}: ids ${gotIds} != ${want.ids}`);
      assertClose(await readF32(gpu!, rw, T * k), want.weights, 1e-6, 1e-5, `${what}: weights`);
      const tol = dp4 ? 0.02 * Math.max(...act.map(Math.abs)) : 1e-4;
      assertClose(await readF32(gpu!, out, T * k * N), act, tol, dp4 ? 0 : 1e-4, `${what}: activations`);
    }
  }
});

Deno.test(
  { name: "moe sg with the shared expert folded in as extra slots of weight 1", ignore },
  async () => {
    const K = 64, I = 32, E = 4, k = 2, NSH = 2, T = 1, H = K;
    const Is = NSH * I;
    for (const [wt, { dp4, prefetch }] of TYPES.flatMap((w) => variants(w).map((v) => [w, v] as const))) {
      if (wt === "f16" && !gpu!.hasF16) continue;
      const x = randoms(T * K, 3);
      const ids = Uint32Array.from([2, 0]);
      const rw = Float32Array.from([0.7, 0.3]);
      const w = packedWeights(wt, randoms(E * 2 * I * K, 4, 0.2), E * 2 * I, K);
      const sw = packedWeights(wt, randoms(2 * Is * K, 5, 0.2), 2 * Is, K);
      const dw = packedWeights(wt, randoms(E * H * I, 6, 0.2), E * H, I);
      const sdw = packedWeights(wt, randoms(H * Is, 7, 0.2), H, Is);
      // The reference: the routed slots, then the shared MLP cut into NSH slots.
      const act = new Float32Array((k + NSH) * I);
      const dotRow = (m: Float32Array, row: number, len: number, v: Float32Array, at = 0) => {
        let s = 0;
        for (let i = 0; i < len; i++) s += m[row * len + i] * v[at + i];
        return s;
      };
      for (let j = 0; j < k; j++) {
        for (let n = 0; n < I; n++) {
          act[j * I + n] = silu(dotRow(w.deq, ids[j] * 2 * I + n, K, x)) *
            dotRow(w.deq, ids[j] * 2 * I + I + n, K, x);
        }
      }
      for (let js = 0; js < NSH; js++) {
        for (let n = 0; n < I; n++) {
          act[(k + js) * I + n] = silu(dotRow(sw.deq, js * I + n, K, x)) *
            dotRow(sw.deq, Is + js * I + n, K, x);
        }
      }
      const y0 = randoms(H, 8);
      const want = y0.slice();
      for (let h = 0; h < H; h++) {
        let s = 0;
        for (let j = 0; j < k; j++) s += rw[j] * dotRow(dw.deq, ids[j] * H + h, I, act, j * I);
        for (let i = 0; i < Is; i++) s += sdw.deq[h * Is + i] * act[k * I + i];
        want[h] += s;
      }
      const actBuf = storageBuffer(gpu!, act.length * 4);
      const idsBuf = upload(gpu!, ids), rwBuf = upload(gpu!, rw), y = upload(gpu!, y0);
      const common = { T, topK: k, experts: E, weights: wt, sharedSlots: NSH, dp4, prefetch };
      await runCalls(gpu!, [
        moeSgCall(gpu!, {
          x: upload(gpu!, x),
          w: uploadBuffer(gpu!, w.bytes),
          out: actBuf,
          ids: idsBuf,
          shared: uploadBuffer(gpu!, sw.bytes),
        }, { kind: "gate_up", K, N: I, ...common }),
        moeSgCall(gpu!, {
          x: actBuf,
          w: uploadBuffer(gpu!, dw.bytes),
          out: y,
          ids: idsBuf,
          routeWeights: rwBuf,
          shared: uploadBuffer(gpu!, sdw.bytes),
        }, { kind: "down", K: I, N: H, ...common }),
      ]);
      // dp4: within 2% of the largest value (a wrong slot, order or scale is off by far more).
      const [tol, rel] = dp4 ? [0.02 * Math.max(...act.map(Math.abs)), 0.02] : [1e-4, 1e-4];
      assertClose(await readF32(gpu!, actBuf, act.length), act, tol, rel, `${wt} dp4 ${dp4} shared gate_up`);
      const dy = want.map((v, i) => Math.abs(v - y0[i]));
      const ytol = dp4 ? 0.02 * Math.max(...dy) : 1e-4;
      assertClose(await readF32(gpu!, y, H), want, ytol, dp4 ? 0 : 1e-4, `${wt} dp4 ${dp4} shared down`);
    }
  },
);

Deno.test({ name: "moe router GEMV: rmsnorm(x) @ router^T, one workgroup a row", ignore }, async () => {
  for (const [K, E, T] of [[64, 8, 1], [2048, 128, 2], [36, 5, 3]]) {
    for (const nwt of ["f32", "f16"] as const) {
      if (nwt === "f16" && !gpu!.hasF16) continue;
      const x = randoms(T * K, K + E), router = randoms(E * K, 7, 0.1);
      const nw = packedWeights(nwt, randoms(K, 3, 1), 1, K);
      const want = new Float32Array(T * E);
      for (let t = 0; t < T; t++) {
        let ss = 0;
        for (let i = 0; i < K; i++) ss += x[t * K + i] ** 2;
        const inv = 1 / Math.sqrt(ss / K + 1e-6);
        for (let e = 0; e < E; e++) {
          let s = 0;
          for (let i = 0; i < K; i++) s += router[e * K + i] * x[t * K + i] * inv * nw.deq[i];
          want[t * E + e] = s;
        }
      }
      const logits = storageBuffer(gpu!, T * E * 4);
      await runCalls(gpu!, [
        moeRouterGemvCall(gpu!, {
          x: upload(gpu!, x),
          router: upload(gpu!, router),
          norm: uploadBuffer(gpu!, nw.bytes),
          logits,
        }, { K, experts: E, T, eps: 1e-6, normWeights: nwt }),
      ]);
      assertClose(await readF32(gpu!, logits, T * E), want, 1e-5, 1e-4, `router K${K} E${E} T${T} ${nwt}`);
    }
  }
});

Deno.test(
  { name: "moeDecodeCalls: the whole decode block from the residual equals moeFfnRef", ignore },
  async () => {
    const g = gpu!;
    const H = 64, E = 8, k = 4;
    // I small: both subgroup kernels; I large: k * I floats exceed workgroup memory, so down is the team kernel.
    const bigI = Math.ceil((g.maxWorkgroupStorage / 4 / k + 1) / 32) * 32;
    // The settings that change the decode kernels (gpu.tuning.moe: moe_ffn.ts MoeTuning); group-limited
    // routing (routerWgsl, not the subgroup router) with them on.
    const switchSets: [MoeTuning, boolean][] = [
      [{}, false],
      [{ xn: true }, false],
      [{ scaled: true }, false],
      [{ xn: true, scaled: true }, false],
      [{ xn: true, scaled: true }, true],
      [{ xn: true, scaled: true, prefetch: [true, true] }, false],
      [{ xn: true, scaled: true, groups: [1, 1] }, false],
      [{ groups: [1, 1], prefetch: [true, true] }, true],
      [{ rank: true, xn: true, scaled: true }, false],
      [{ prefetch: [false, true], xn: true, scaled: true }, false],
    ];
    for (const [moe, grouped] of switchSets) {
      for (const I of [32, bigI]) {
        for (const shared of [0, I]) {
          for (
            const [wt, dp4] of [["f32", false], ["q4", false], ...(g.hasDp4 ? [["q4", true]] : [])] as [
              "f32" | "q4",
              boolean,
            ][]
          ) {
            const routing: MoeRouting = shared
              ? { experts: E, topK: k, scoring: "sigmoid", normTopK: true, scale: 1.5 }
              : { experts: E, topK: k, scoring: "softmax", normTopK: true };
            if (grouped) Object.assign(routing, { groups: 2, topKGroups: 1 });
            // Two tokens: each stages its own row (and its own normalised copy from the router GEMV).
            const T = 2;
            const x = randoms(T * H, I + shared + 1);
            const nw = randoms(H, 2, 1);
            const router = randoms(E * H, 3, 0.3);
            const bias = shared ? randoms(E, 4, 0.1) : undefined;
            const gu = packedWeights(wt, randoms(E * 2 * I * H, 5, 0.1), E * 2 * I, H);
            const dn = packedWeights(wt, randoms(E * H * I, 6, 0.1), E * H, I);
            const sgu = shared
              ? packedWeights(wt, randoms(2 * shared * H, 7, 0.1), 2 * shared, H)
              : undefined;
            const sdn = shared ? packedWeights(wt, randoms(H * shared, 8, 0.1), H, shared) : undefined;
            const xn = x.slice();
            for (let t = 0; t < T; t++) {
              let ss = 0;
              for (let i = 0; i < H; i++) ss += x[t * H + i] ** 2;
              const inv = 1 / Math.sqrt(ss / H + 1e-6);
              for (let i = 0; i < H; i++) xn[t * H + i] = x[t * H + i] * inv * nw[i];
            }
            const dims = { hidden: H, intermediate: I, sharedIntermediate: shared, routing };
            const ref = moeFfnRef({
              x: xn,
              router,
              bias,
              gateUp: gu.deq,
              down: dn.deq,
              sharedGateUp: sgu?.deq,
              sharedDown: sdn?.deq,
            }, dims);
            const xb = upload(g, x);
            // The two-dispatch kernels (moe_fused_test.ts checks the one-dispatch path against them).
            g.tuning.moe = { ...moe, dp4, fused: false };
            const calls = moeDecodeCalls(g, {
              x: xb,
              norm: upload(g, nw),
              router: upload(g, router),
              bias: bias && upload(g, bias),
              gateUp: uploadBuffer(g, gu.bytes),
              down: uploadBuffer(g, dn.bytes),
              sharedGateUp: sgu && uploadBuffer(g, sgu.bytes),
              sharedDown: sdn && uploadBuffer(g, sdn.bytes),
              scratch: createMoeScratch(g, { ...dims, T }),
            }, {
              ...dims,
              T,
              eps: 1e-6,
              normWeights: "f32",
              weights: { router: "f32", gateUp: wt, down: wt, sharedGateUp: wt, sharedDown: wt },
            });
            delete g.tuning.moe;
            if (!calls) throw new Error(`I ${I}: the decode path does not apply`);
            const downLabel = calls.at(-1)!.label;
            // With dp4 the long down row fits (1.25 bytes a value staged, not 4).
            if (downLabel !== (I === bigI && !dp4 ? "moe_gemv_combine" : "moe_sg_down")) {
              throw new Error(`I ${I}: down ran as ${downLabel}`);
            }
            await runCalls(g, calls);
            const want = x.map((v, i) => v + ref.out[i]);
            const what = `I${I} shared ${shared} ${wt} dp4 ${dp4} ${
              JSON.stringify(moe)
            } grouped ${grouped}: ${calls.map((c) => c.label).join(",")}`;
            // dp4: the block's output within 2% of its largest (int8 activations, twice quantised).
            const tol = dp4 ? 0.02 * Math.max(...ref.out.map(Math.abs)) : 1e-4;
            assertClose(await readF32(g, xb, T * H), want, tol, dp4 ? 0 : 1e-4, what);
          }
        }
      }
    }
  },
);
