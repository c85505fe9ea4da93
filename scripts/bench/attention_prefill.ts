// Prefill attention microbenchmark (kernels/flash_attention.ts) at Llama-3.2-1B's shape (32 q heads, 8 KV
// heads, head_dim 64): GPU ms of one layer's attention over a whole prompt run in chunks (each chunk's
// queries attend to the cache before it and causally among themselves, as the prefill runs them), for the
// "lanes" variant and the "blocked" one with a few tiles, times the model's layers, and the TFLOP/s of
// the causal work (4 hd FLOP a query-key pair). One JSON line per (prompt, variant).
//   deno run -A scripts/bench/attention_prefill.ts [--prompts 512,2048] [--chunk 512] [--heads 32] [--kv 8]
//     [--hd 64] [--layers 16] [--repeat 5] [--quick]
import { parseArgs } from "node:util";
import { scriptArgs } from "../args.ts";
import {
  createStepBuffer,
  flashAttentionCall,
  type FlashBlockTile,
  type FlashVariant,
  getGpu,
  type KernelCall,
  storageBuffer,
  uploadBuffer,
  writeStep,
} from "../../kernels/mod.ts";
import { gpuMs } from "../../kernels/timer.ts";

const { values } = scriptArgs(import.meta.url, (args) =>
  parseArgs({
    args,
    options: {
      prompts: { type: "string", default: "512,2048" },
      chunk: { type: "string", default: "512" },
      heads: { type: "string", default: "32" },
      kv: { type: "string", default: "8" },
      hd: { type: "string", default: "64" },
      layers: { type: "string", default: "16" },
      repeat: { type: "string", default: "5" },
      quick: { type: "boolean", default: false },
    },
  }));
const gpu = await getGpu();
const heads = Number(values.heads), kvHeads = Number(values.kv), headDim = Number(values.hd);
const chunk = Number(values.chunk), layers = Number(values.layers), repeat = Number(values.repeat);
const variants: [string, FlashVariant, Partial<FlashBlockTile>][] = [
  ["lanes", "lanes", {}],
  ["blocked", "blocked", {}],
];
if (!values.quick) {
  variants.push(
    ["blocked-noprefetch", "blocked", { prefetch: false }],
    ["blocked-bq32", "blocked", { bq: 32 }],
    ["blocked-bkv16", "blocked", { bkv: 16 }],
    [
      "blocked-bkv64",
      "blocked",
      { bkv: 64 },
    ],
  );
}
console.error(
  `# ${gpu.adapterName}, subgroup ${gpu.subgroupSize}, workgroup memory ${gpu.maxWorkgroupStorage}`,
);
for (const P of values.prompts!.split(",").map(Number)) {
  const maxSeq = P + 1;
  const fill = (n: number) => new Float32Array(n).map((_, i) => Math.sin(i * 0.37));
  const C = Math.min(chunk, P);
  const qkv = uploadBuffer(gpu, fill(C * (heads + 2 * kvHeads) * headDim));
  const kcache = uploadBuffer(gpu, fill(kvHeads * maxSeq * headDim));
  const vcache = uploadBuffer(gpu, fill(kvHeads * maxSeq * headDim));
  const out = storageBuffer(gpu, C * heads * headDim * 4);
  let flop = 0;
  const steps: GPUBuffer[] = [];
  for (let pos0 = 0; pos0 < P; pos0 += C) {
    const T = Math.min(C, P - pos0);
    const step = createStepBuffer(gpu);
    writeStep(gpu, step, { pos0, T, tokOut: 0 });
    steps.push(step);
    for (let t = 0; t < T; t++) flop += heads * (pos0 + t + 1) * headDim * 4;
  }
  for (const [name, variant, tile] of variants) {
    let calls: KernelCall[];
    try {
      calls = steps.map((step) =>
        flashAttentionCall(gpu, { step, qkv, kcache, vcache, out }, {
          heads,
          kvHeads,
          headDim,
          maxSeq,
          T: C,
        }, { variant, tile })
      );
    } catch (e) {
      console.log(JSON.stringify({ prompt: P, chunk: C, variant: name, error: (e as Error).message }));
      continue;
    }
    await gpuMs(gpu, calls, 1); // compiles and warms
    const ms = await gpuMs(gpu, calls, repeat);
    console.log(JSON.stringify({
      adapter: gpu.adapterName,
      prompt: P,
      chunk: C,
      variant: name,
      layerMs: +ms.toFixed(3),
      modelMs: +(ms * layers).toFixed(2),
      tflops: +(flop / (ms * 1e9)).toPrecision(3),
    }));
  }
}
