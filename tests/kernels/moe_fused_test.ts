// The fused decode expert MLP (kernels/moe_fused.ts): one dispatch for gate/up, SiLU, down and the weighted
// combine, through moeDecodeCalls (the router GEMV writing its int8 normalised x first). Checked against the
// CPU reference of the block (moeFfnRef, f64 on the very weights the GPU reads) within the int8
// activations' error, and against the two-dispatch subgroup path (gpu.tuning.moe.fused false, the same int8
// inputs) much more tightly; awkward shapes (intermediate not a multiple of the default rows, one slot, T >
// 1, experts beyond a partial stack, group-limited sigmoid routing with a bias); a second step on the same
// scratch (the accumulator and counts must be left zeroed) and bit-for-bit repeatability.
import {
  createMoeScratch,
  gemvFusedCalls,
  int8CopyFor,
  moeDecodeCalls,
  moeFfnCalls,
  moeFfnRef,
  moeFusedCall,
  moeFusedPlan,
  moeInputCopy,
  moeInputFor,
  moeRouterGemvCall,
  type MoeRouting,
  packColumnBlocksCall,
  type QuantType,
  readBack,
  rmsnormRef,
  runCalls,
  uploadBuffer,
} from "../../kernels/mod.ts";
import assert from "node:assert/strict";
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
const ignore = gpu === null || gpu.subgroupSize === null || !gpu.hasDp4;

interface Case {
  H: number;
  I: number;
  E: number;
  k: number;
  T: number;
  wt: QuantType;
  routing: "softmax" | "softmax-raw" | "sigmoid-groups";
  /** gpu.tuning.moe.fused's rows and threads (default the kernel's). */
  fused?: { rows: number; threads?: number };
  /** A shared expert of this many times I rows (deepseek_v3 / kimi_k2), stored like the routed ones. */
  shared?: number;
}

const CASES: Case[] = [
  { H: 128, I: 64, E: 8, k: 2, T: 1, wt: "q4", routing: "softmax" },
  { H: 96, I: 64, E: 8, k: 2, T: 2, wt: "q4", routing: "softmax" },
  { H: 256, I: 96, E: 16, k: 4, T: 3, wt: "q4", routing: "softmax-raw" },
  { H: 128, I: 192, E: 8, k: 3, T: 2, wt: "q8", routing: "sigmoid-groups" },
  { H: 384, I: 128, E: 32, k: 8, T: 1, wt: "q4", routing: "softmax", fused: { rows: 32 } },
  { H: 128, I: 192, E: 16, k: 2, T: 2, wt: "q4", routing: "softmax", fused: { rows: 64, threads: 256 } },
  { H: 256, I: 64, E: 8, k: 8, T: 1, wt: "q8", routing: "softmax-raw", fused: { rows: 32, threads: 1024 } },
  { H: 128, I: 32, E: 4, k: 1, T: 2, wt: "q8", routing: "softmax" },
  { H: 128, I: 64, E: 8, k: 2, T: 1, wt: "q4", routing: "softmax", shared: 1 },
  { H: 256, I: 64, E: 16, k: 3, T: 2, wt: "q8", routing: "sigmoid-groups", shared: 2 },
  { H: 96, I: 96, E: 8, k: 2, T: 3, wt: "q4", routing: "softmax-raw", shared: 2, fused: { rows: 32 } },
];

function routingOf(c: Case): MoeRouting {
  switch (c.routing) {
    case "softmax":
      return { experts: c.E, topK: c.k, scoring: "softmax", normTopK: true };
    case "softmax-raw":
      return { experts: c.E, topK: c.k, scoring: "softmax", normTopK: false };
    case "sigmoid-groups":
      return {
        experts: c.E,
        topK: c.k,
        scoring: "sigmoid",
        normTopK: true,
        scale: 2.5,
        groups: 4,
        topKGroups: 2,
      };
  }
}

/** The block's decode calls with the fused kernel on or off; its buffers, and x's starting value. */
function program(c: Case, fused: boolean, seed: number) {
  const g = gpu!;
  const { H, I, E, T, wt } = c;
  const routing = routingOf(c);
  const x = randoms(T * H, seed, 1);
  const nw = randoms(H, seed + 1, 1);
  const router = randoms(E * H, seed + 2, 0.4);
  const bias = c.routing === "sigmoid-groups" ? randoms(E, seed + 3, 0.1) : undefined;
  const gu = packedWeights(wt, randoms(E * 2 * I * H, seed + 4, 0.1), E * 2 * I, H);
  const dn = packedWeights(wt, randoms(E * H * I, seed + 5, 0.1), E * H, I);
  const Is = (c.shared ?? 0) * I;
  const sgu = Is ? packedWeights(wt, randoms(2 * Is * H, seed + 6, 0.1), 2 * Is, H) : undefined;
  const sdn = Is ? packedWeights(wt, randoms(H * Is, seed + 7, 0.1), H, Is) : undefined;
  const dims = { hidden: H, intermediate: I, sharedIntermediate: Is, routing };
  const xb = upload(g, x);
  const scratch = createMoeScratch(g, { ...dims, T });
  g.tuning.moe = { fused: fused ? c.fused ?? true : false, fusedShared: true };
  let calls;
  try {
    calls = moeDecodeCalls(g, {
      x: xb,
      norm: upload(g, nw),
      router: upload(g, router),
      bias: bias && upload(g, bias),
      gateUp: uploadBuffer(g, gu.bytes),
      down: uploadBuffer(g, dn.bytes),
      sharedGateUp: sgu && uploadBuffer(g, sgu.bytes),
      sharedDown: sdn && uploadBuffer(g, sdn.bytes),
      scratch,
    }, {
      ...dims,
      T,
      eps: 1e-6,
      normWeights: "f32",
      weights: {
        router: "f32",
        gateUp: wt,
        down: wt,
        ...(Is ? { sharedGateUp: wt, sharedDown: wt } : {}),
      },
    });
  } finally {
    delete g.tuning.moe;
  }
  if (!calls) throw new Error("the decode path does not apply");
  const labels = calls.map((k) => k.label).join(",");
  if (fused !== (labels === "moe_router_gemv,moe_fused")) throw new Error(`fused ${fused}: ran ${labels}`);
  const xn = rmsnormRef(x, nw, H, 1e-6);
  const ref = moeFfnRef({
    x: xn,
    router,
    bias,
    gateUp: gu.deq,
    down: dn.deq,
    sharedGateUp: sgu?.deq,
    sharedDown: sdn?.deq,
  }, dims);
  return { calls, xb, x, ref, scratch };
}

Deno.test({
  name: "moe fused: the expert MLP in one dispatch equals the reference and the two-dispatch path",
  ignore,
}, async () => {
  const g = gpu!;
  for (const c of CASES) {
    const what = JSON.stringify(c);
    const on = program(c, true, 11);
    const off = program(c, false, 11);
    await runCalls(g, on.calls);
    await runCalls(g, off.calls);
    const n = c.T * c.H;
    const got = await readF32(g, on.xb, n);
    const two = await readF32(g, off.xb, n);
    const want = on.x.map((v, i) => v + on.ref.out[i]);
    const big = Math.max(...on.ref.out.map(Math.abs));
    // Against f64 on unquantised activations: the int8 activations' error (moe_sg_test.ts's bound).
    assertClose(got, want, 0.02 * big, 0, `${what} against moeFfnRef`);
    // Against the two dispatches on the same int8 inputs: only summation order differs (and with it, rarely,
    // an int8 rounding of h).
    assertClose(got, two, 2e-3 * big, 0, `${what} against the two-dispatch path`);
    // The routing the fused kernel wrote for readers after it.
    const ids = new Uint32Array(await readBack(g, on.scratch.ids, c.T * c.k * 4));
    const idsTwo = new Uint32Array(await readBack(g, off.scratch.ids, c.T * c.k * 4));
    if (ids.join() !== idsTwo.join() || ids.join() !== Array.from(on.ref.ids).join()) {
      throw new Error(`${what}: ids ${ids} against ${idsTwo} / reference ${on.ref.ids}`);
    }
    // The accumulator and counts are left zeroed; a second step adds the same again, bit for bit.
    const acc = new Int32Array(await readBack(g, on.scratch.acc, c.T * 2 * c.H * 4));
    const count = new Uint32Array(await readBack(g, on.scratch.count, c.T * 4));
    if (acc.some((v) => v !== 0) || count.some((v) => v !== 0)) {
      throw new Error(`${what}: the accumulator or counts were not left zeroed`);
    }
    g.device.queue.writeBuffer(on.xb, 0, new Float32Array(on.x));
    await runCalls(g, on.calls);
    const again = await readF32(g, on.xb, n);
    for (let i = 0; i < n; i++) {
      if (Object.is(again[i], got[i]) === false) {
        throw new Error(`${what}: the second step differs at ${i}: ${again[i]} against ${got[i]}`);
      }
    }
  }
});

Deno.test(
  { name: "moe fused: slots whose expert is not in a partial stack add nothing", ignore },
  async () => {
    const g = gpu!;
    const H = 128, I = 64, E = 8, k = 4, T = 2;
    const routing: MoeRouting = { experts: E, topK: k, scoring: "softmax", normTopK: true };
    const x = randoms(T * H, 5, 1);
    const nw = randoms(H, 6, 1);
    const router = randoms(E * H, 7, 0.5);
    const first = 2, held = 3; // the stack holds experts 2, 3, 4
    const all = randoms(E * 2 * I * H, 8, 0.1), allDown = randoms(E * H * I, 9, 0.1);
    const gu = packedWeights("q4", all.slice(first * 2 * I * H, (first + held) * 2 * I * H), held * 2 * I, H);
    const dn = packedWeights("q4", allDown.slice(first * H * I, (first + held) * H * I), held * H, I);
    const xb = upload(g, x);
    const s = createMoeScratch(g, { hidden: H, intermediate: I, routing, T });
    await runCalls(g, [
      moeRouterGemvCall(g, {
        x: xb,
        router: upload(g, router),
        norm: upload(g, nw),
        logits: s.logits,
        xn: s.xn,
        xnScales: s.xnScales,
      }, {
        K: H,
        experts: E,
        T,
        eps: 1e-6,
        normWeights: "f32",
        xn: "q4",
      }),
      moeFusedCall(g, {
        xn: s.xn,
        xnScales: s.xnScales,
        gateUp: uploadBuffer(g, gu.bytes),
        down: uploadBuffer(g, dn.bytes),
        logits: s.logits,
        ids: s.ids,
        routeWeights: s.routeWeights,
        acc: s.acc,
        count: s.count,
        y: xb,
      }, {
        hidden: H,
        intermediate: I,
        T,
        routing,
        weights: "q4",
        bias: false,
        experts: held,
        firstExpert: first,
      }),
    ]);
    // The reference: every expert outside [2, 5) zeroed (it then adds nothing), the same routing.
    const zeroGu = new Float32Array(E * 2 * I * H), zeroDn = new Float32Array(E * H * I);
    zeroGu.set(gu.deq, first * 2 * I * H);
    zeroDn.set(dn.deq, first * H * I);
    const xn = rmsnormRef(x, nw, H, 1e-6);
    const ref = moeFfnRef({ x: xn, router, gateUp: zeroGu, down: zeroDn }, {
      hidden: H,
      intermediate: I,
      routing,
    });
    const inStack = Array.from(ref.ids).filter((e) => e >= first && e < first + held).length;
    if (inStack === 0 || inStack === ref.ids.length) {
      throw new Error(
        `the case must mix held and other experts: ${ref.ids}`,
      );
    }
    const big = Math.max(...ref.out.map(Math.abs));
    assertClose(await readF32(g, xb, T * H), x.map((v, i) => v + ref.out[i]), 0.02 * big, 0, "partial stack");
  },
);

Deno.test({
  name:
    "moe fused: down in column blocks (the loader's packing) gives the same bits in decode and in the grouped prefill",
  ignore,
}, async () => {
  const g = gpu!;
  for (const [H, I, E, k, wt] of [[128, 192, 8, 3, "q4"], [96, 64, 6, 2, "q8"]] as const) {
    const routing: MoeRouting = { experts: E, topK: k, scoring: "softmax", normTopK: true };
    const dims = { hidden: H, intermediate: I, routing };
    const weights = { router: "f32", gateUp: wt, down: wt } as const;
    const plan = moeFusedPlan(g, { ...dims, weights }, false);
    if (!plan) throw new Error("the fused plan does not apply");
    const nw = upload(g, randoms(H, 2, 1));
    const router = upload(g, randoms(E * H, 3, 0.4));
    const gu = uploadBuffer(g, packedWeights(wt, randoms(E * 2 * I * H, 4, 0.1), E * 2 * I, H).bytes);
    const rowMajor = uploadBuffer(g, packedWeights(wt, randoms(E * H * I, 5, 0.1), E * H, I).bytes);
    const packed = g.device.createBuffer({ size: rowMajor.size, usage: rowMajor.usage });
    const pack = { matrices: E, N: H, K: I, C: plan.rows };
    await runCalls(g, [packColumnBlocksCall(g, { src: rowMajor, out: packed }, { ...pack, type: wt })]);
    // Decode (T = 2, the fused kernel) and a grouped step of 5 tokens, each on both layouts.
    for (const T of [2, 5]) {
      const x = randoms(T * H, 7 + T, 1);
      const outs: Float32Array[] = [];
      for (const [down, downBlock] of [[rowMajor, undefined], [packed, plan.rows]] as const) {
        const xb = upload(g, x);
        const scratch = createMoeScratch(g, { ...dims, T });
        const b = { router, gateUp: gu, down, scratch };
        const calls = T <= 2
          ? moeDecodeCalls(g, { ...b, x: xb, norm: nw }, {
            ...dims,
            T,
            eps: 1e-6,
            normWeights: "f32",
            weights,
            downBlock,
          })
          : moeFfnCalls(g, { ...b, x: upload(g, x.map((v) => v * 0.5)), y: xb }, {
            ...dims,
            T,
            weights,
            downBlock,
            grouped: true,
          });
        if (!calls) throw new Error("no decode path");
        await runCalls(g, calls);
        outs.push(await readF32(g, xb, T * H));
      }
      for (let i = 0; i < T * H; i++) {
        if (!Object.is(outs[0][i], outs[1][i])) {
          throw new Error(`${wt} T ${T}: packed ${outs[1][i]} against row-major ${outs[0][i]} at ${i}`);
        }
      }
    }
    // A program that would read the packed stack some other way says so.
    g.tuning.moe = { fused: false };
    try {
      const scratch = createMoeScratch(g, { ...dims, T: 1 });
      assert.throws(
        () =>
          moeDecodeCalls(g, {
            router,
            gateUp: gu,
            down: packed,
            scratch,
            x: upload(g, randoms(H, 1)),
            norm: nw,
          }, {
            ...dims,
            T: 1,
            eps: 1e-6,
            normWeights: "f32",
            weights,
            downBlock: plan.rows,
          }),
        /packed in column blocks/,
      );
    } finally {
      delete g.tuning.moe;
    }
  }
});

Deno.test({
  name:
    "moe fused: the last workgroup writes the next RMSNorm GEMV's int8 input copy, as that GEMV's own pass makes it",
  ignore,
}, async () => {
  // The consumer (qkv- or LM-head-like: RMSNorm, q4 / q8, one token or a k-step) takes the int8 direct mode
  // for K a multiple of its units times the subgroup size (H is chosen so), and q8 from 4 tokens.
  const g = gpu!;
  const S = g.subgroupSize!;
  let seed = 40;
  for (
    const [wt, T, nwt, k] of [["q4", 1, "f32", 2], ["q4", 3, "f16", 4], ["q8", 4, "f32", 3]] as const
  ) {
    if (nwt === "f16" && !g.hasF16) continue;
    seed += 10;
    const H = (wt === "q4" ? 32 : 16) * S * (wt === "q4" ? 1 : 2), I = 64, E = 8;
    const routing: MoeRouting = { experts: E, topK: k, scoring: "softmax", normTopK: true };
    const dims = { hidden: H, intermediate: I, routing };
    const weights = { router: "f32", gateUp: wt, down: wt } as const;
    const consumer = {
      K: H,
      N: 40,
      T,
      weights: wt,
      transform: "rmsnorm" as const,
      normWeights: nwt,
      eps: 1e-5,
      int8One: true,
    };
    const what = `copy ${wt} T${T} H${H} ${nwt} norm weights`;
    const nw2 = randoms(H, seed + 9, 1);
    const nw2b = upload(g, nwt === "f16" ? f32ToF16(nw2) : nw2);
    const nw2v = nwt === "f16" ? f16ToF32(f32ToF16(nw2)) : nw2;
    const copy = int8CopyFor(g, consumer, nw2b);
    if (!copy?.ssq || !copy.norm) throw new Error(`${what}: the consumer takes no int8 norm copy`);
    const x = randoms(T * H, seed, 1);
    const nw = upload(g, randoms(H, seed + 1, 1));
    const router = upload(g, randoms(E * H, seed + 2, 0.4));
    const gu = uploadBuffer(g, packedWeights(wt, randoms(E * 2 * I * H, seed + 3, 0.1), E * 2 * I, H).bytes);
    const dn = uploadBuffer(g, packedWeights(wt, randoms(E * H * I, seed + 4, 0.1), E * H, I).bytes);
    const run = async (copyOut?: typeof copy) => {
      const xb = upload(g, x);
      const calls = moeDecodeCalls(g, {
        x: xb,
        norm: nw,
        router,
        gateUp: gu,
        down: dn,
        scratch: createMoeScratch(g, { ...dims, T }),
        copyOut,
      }, { ...dims, T, eps: 1e-6, normWeights: "f32", weights });
      if (calls?.map((c) => c.label).join() !== "moe_router_gemv,moe_fused") {
        throw new Error(`${what}: not the fused path`);
      }
      await runCalls(g, calls);
      return { xb, y: await readF32(g, xb, T * H) };
    };
    const plain = await run();
    const withCopy = await run(copy);
    // The residual is the same bits with or without the copy.
    for (let i = 0; i < T * H; i++) {
      if (!Object.is(withCopy.y[i], plain.y[i])) throw new Error(`${what}: y differs at ${i}`);
    }
    // The copy: y times the norm weights quantised as the consumer's own pass would, and y's block sums of
    // squares.
    const u = withCopy.y.map((v, i) => v * nw2v[i % H]);
    await assertCopyIsPass(g, copy, upload(g, u), { K: H, T, wt }, what);
    const ssqWant = new Float32Array((T * H) / 32).map((_, b) =>
      withCopy.y.slice(32 * b, 32 * b + 32).reduce((s, v) => s + v * v, 0)
    );
    assertClose(await readF32(g, copy.ssq, (T * H) / 32), ssqWant, 1e-6, 1e-5, `${what}: sums of squares`);
    // The consumer on the copy matches the consumer normalising y itself.
    const cw = uploadBuffer(
      g,
      packedWeights(wt, randoms(consumer.N * H, seed + 5, 0.5), consumer.N, H).bytes,
    );
    const consume = async (copyIn?: typeof copy) => {
      const cy = upload(g, new Float32Array(T * consumer.N));
      const calls = gemvFusedCalls(g, { x: withCopy.xb, w: cw, y: cy, normWeight: nw2b, copyIn }, consumer);
      if (calls.length !== (copyIn ? 1 : 2)) {
        throw new Error(`${what}: the consumer made ${calls.length} calls`);
      }
      await runCalls(g, calls);
      return await readF32(g, cy, T * consumer.N);
    };
    const want = await consume();
    const got = await consume(copy);
    const scale = want.reduce((m, v) => Math.max(m, Math.abs(v)), 0);
    assertClose(got, want, 1e-3 * scale, 0, `${what}: the consumer on the copy`);
  }
});

Deno.test({
  name:
    "moe fused: o_proj writes the block's int8 input and its router's partial logits (no router GEMV), as the router GEMV's path computes it",
  ignore,
}, async () => {
  // The producer (an o_proj-like GEMV adding into the residual) in both ways it writes a copy: workgroups
  // widened to whole blocks of 32 rows, and the last workgroup of a block (arrive); one token and k-steps;
  // q4 and q8; experts not a multiple of the lanes that share one (E = 12), and many experts (E = 72).
  const g = gpu!;
  const S = g.subgroupSize!;
  const saved = g.tuning;
  let seed = 90;
  for (
    const [wt, T, arrive, nwt, E, k] of [
      ["q4", 1, false, "f32", 12, 3],
      ["q4", 1, true, "f16", 72, 8],
      ["q4", 3, true, "f32", 12, 2],
      ["q4", 2, false, "f32", 72, 4],
      ["q8", 4, false, "f32", 12, 3],
      ["q8", 4, true, "f32", 8, 2],
    ] as const
  ) {
    if (nwt === "f16" && !g.hasF16) continue;
    seed += 10;
    const what = `${wt} T${T} ${arrive ? "arrive" : "widened"} ${nwt} norm weights E${E} k${k}`;
    const unit = wt === "q4" ? 32 : 16;
    const H = 64 * Math.max(1, unit * S / 64), KA = 2 * unit * S, I = 64;
    const routing: MoeRouting = { experts: E, topK: k, scoring: "softmax", normTopK: true };
    const dims = { hidden: H, intermediate: I, routing };
    const weights = { router: "f32", gateUp: wt, down: wt } as const;
    const producer = { K: KA, N: H, T, weights: wt, accumulate: true, int8One: true };
    const nwv = randoms(H, seed + 1, 1);
    const norm = upload(g, nwt === "f16" ? f32ToF16(nwv) : nwv);
    const nw = nwt === "f16" ? f16ToF32(f32ToF16(nwv)) : nwv;
    const routerF = randoms(E * H, seed + 2, 0.4);
    const router = upload(g, routerF);
    const att = upload(g, randoms(T * KA, seed + 3, 1));
    const ow = uploadBuffer(g, packedWeights(wt, randoms(H * KA, seed + 4, 0.2), H, KA).bytes);
    const gu = uploadBuffer(g, packedWeights(wt, randoms(E * 2 * I * H, seed + 5, 0.1), E * 2 * I, H).bytes);
    const dn = uploadBuffer(g, packedWeights(wt, randoms(E * H * I, seed + 6, 0.1), E * H, I).bytes);
    const x0 = randoms(T * H, seed + 7, 1);
    const run = async (viaCopy: boolean) => {
      g.tuning = { ...saved, multiInt8CopyArrive: arrive };
      try {
        const m = viaCopy
          ? moeInputFor(g, { ...dims, T, weights, normWeights: nwt }, { norm, router, bias: false })
          : undefined;
        if (viaCopy && !m) throw new Error(`${what}: the block takes no input copy`);
        const copy = m && moeInputCopy(g, producer, m);
        if (viaCopy && !copy) throw new Error(`${what}: the producer cannot write the block's input`);
        const xb = upload(g, x0);
        const scratch = createMoeScratch(g, { ...dims, T });
        const oCalls = gemvFusedCalls(g, { x: att, w: ow, y: xb, copyOut: copy }, producer);
        const moe = moeDecodeCalls(g, { x: xb, norm, router, gateUp: gu, down: dn, scratch, copyIn: copy }, {
          ...dims,
          T,
          eps: 1e-6,
          normWeights: nwt,
          weights,
        });
        const labels = [...oCalls, ...moe!].map((c) => c.label).join();
        if (labels.includes("moe_router_gemv") === viaCopy || !labels.includes("moe_fused")) {
          throw new Error(`${what}: ${viaCopy ? "the copy's" : "the router GEMV's"} path ran ${labels}`);
        }
        if (copy) {
          // The producer alone, to read the residual and the partials it wrote.
          await runCalls(g, oCalls);
          const y = await readF32(g, xb, T * H);
          const parts = await readF32(g, copy.router!.parts, (T * H / 32) * E);
          const want = matmulRows(rmsnormRef(y, nw, H, 1e-6), routerF, H, E);
          const ssq = await readF32(g, copy.ssq!, (T * H) / 32);
          const got = new Float32Array(T * E).map((_, i) => {
            const t = Math.floor(i / E), e = i % E;
            let s = 0, q = 0;
            for (let b = 0; b < H / 32; b++) s += parts[(t * (H / 32) + b) * E + e];
            for (let b = 0; b < H / 32; b++) q += ssq[t * (H / 32) + b];
            return s / Math.sqrt(q / H + 1e-6);
          });
          assertClose(got, want, 1e-5, 1e-4, `${what}: the router logits from the partials`);
          g.device.queue.writeBuffer(xb, 0, new Float32Array(x0));
        }
        await runCalls(g, [...oCalls, ...moe!]);
        const ids = new Uint32Array(await readBack(g, scratch.ids, T * k * 4));
        return { y: await readF32(g, xb, T * H), ids };
      } finally {
        g.tuning = saved;
      }
    };
    const viaCopy = await run(true);
    const viaRouter = await run(false);
    if (viaCopy.ids.join() !== viaRouter.ids.join()) {
      throw new Error(`${what}: ids ${viaCopy.ids} against the router GEMV's ${viaRouter.ids}`);
    }
    const big = Math.max(...viaRouter.y.map((v, i) => Math.abs(v - x0[i])));
    assertClose(viaCopy.y, viaRouter.y, 2e-3 * big, 0, `${what}: the block's output`);
  }
});

/** x [T, K] times W [N, K]^T, in f64. */
function matmulRows(x: Float32Array, w: Float32Array, K: number, N: number): Float32Array {
  const T = x.length / K;
  return new Float32Array(T * N).map((_, i) => {
    const t = Math.floor(i / N), n = i % N;
    let s = 0;
    for (let j = 0; j < K; j++) s += x[t * K + j] * w[n * K + j];
    return s;
  });
}
