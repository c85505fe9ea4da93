// Flash prefill attention (kernels/flash_attention.ts) against attentionRef (f64) for the head sizes of
// both tiles (32, 64 | 80, 96, 128), GQA groups of 1..8, step sizes that are not a multiple of the query
// block (1, 5, 37, 70), later chunks (pos0 > 0, keys not a multiple of the key tile) and finite garbage
// in the cache past the last position, which must be ignored. The workgroup-memory reductions run on every
// adapter; the subgroup ones where subgroups are 32 lanes (the H200). Tolerance: f32 sums over <= 150
// keys and <= 128 dims of values in [-1, 1]: atol 2e-5 + rtol 1e-4 (a wrong mask or index misses it).
import {
  attentionRef,
  createStepBuffer,
  flashAttentionCall,
  flashSource,
  flashTile,
  runCalls,
  storageBuffer,
  writeStep,
} from "../../kernels/mod.ts";
import { assertClose, gpuOrSkip, randoms, readF32, upload } from "./harness.ts";

const gpu = await gpuOrSkip();
const ignore = gpu === null;
const MAX_SEQ = 160;

// [heads, kvHeads, headDim, pos0, T]
const CASES = [
  [4, 1, 64, 0, 37],
  [8, 2, 32, 0, 1],
  [2, 2, 64, 70, 70],
  [4, 1, 128, 0, 5],
  [3, 3, 80, 41, 37],
  [8, 1, 96, 100, 33],
  [2, 1, 128, 64, 70],
];

for (const sg of [false, true]) {
  const skip = ignore || (sg && gpu!.subgroupSize !== 32);
  Deno.test({
    name: `flash attention matches the reference (${sg ? "subgroup" : "workgroup-memory"} reductions)${
      skip && !ignore ? " [ignored: needs 32-lane subgroups]" : ""
    }`,
    ignore: skip,
  }, async () => {
    const g = gpu!;
    let seed = 1;
    for (const [heads, kvHeads, hd, pos0, T] of CASES) {
      const width = (heads + 2 * kvHeads) * hd;
      const qkv = randoms(T * width, seed++);
      // The cache holds positions 0..pos0+T-1 and garbage after them.
      const kc = randoms(kvHeads * MAX_SEQ * hd, seed++);
      const vc = randoms(kvHeads * MAX_SEQ * hd, seed++);
      const step = createStepBuffer(g);
      writeStep(g, step, { pos0, T, tokOut: 0 });
      const out = storageBuffer(g, T * heads * hd * 4);
      const d = { heads, kvHeads, headDim: hd, maxSeq: MAX_SEQ, T };
      await runCalls(g, [
        flashAttentionCall(
          g,
          { step, qkv: upload(g, qkv), kcache: upload(g, kc), vcache: upload(g, vc), out },
          d,
          {
            subgroups: sg,
          },
        ),
      ]);
      const q = new Float32Array(T * heads * hd);
      for (let t = 0; t < T; t++) q.set(qkv.subarray(t * width, t * width + heads * hd), t * heads * hd);
      const want = attentionRef(q, kc, vc, { ...d, pos0 });
      assertClose(
        await readF32(g, out, T * heads * hd),
        want,
        2e-5,
        1e-4,
        `h${heads}/${kvHeads} hd${hd} pos${pos0} T${T}`,
      );
    }
  });
}

// Regression: the subgroup variant once began with `enable subgroups;`, which naga rejects, so on the H200 the
// pipeline was invalid and every prefill attention silently wrote nothing. Compiling it needs only an adapter
// with the subgroups feature (lavapipe has it, with 8-lane subgroups it cannot run this variant on).
Deno.test({
  name: `flash attention's subgroup variant compiles${gpu?.subgroupSize ? "" : " [ignored: no subgroups]"}`,
  ignore: ignore || !gpu?.subgroupSize,
}, async () => {
  const g = gpu!;
  for (const hd of [64, 128]) {
    const module = g.device.createShaderModule({ code: flashSource(hd, flashTile(hd), true) });
    const errors = (await module.getCompilationInfo()).messages.filter((m) => m.type === "error");
    if (errors.length > 0) throw new Error(`head_dim ${hd}: ${errors.map((e) => e.message).join("; ")}`);
  }
});
