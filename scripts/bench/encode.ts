// Host cost of encoding dispatches (Deno's WebGPU): what a decode token's setPipeline / setBindGroup /
// dispatchWorkgroups calls and the command encoder's finish() cost on this machine's CPU, per dispatch, for
// trivial kernels with 1..9 bindings, each dispatch on buffers of its own (no barriers) or reading the buffer
// the one before wrote (chained, as a model's layers are: a barrier between dispatches). Prints one JSON line
// per case (encode_us: the pass's calls and end(); finish_us: finish(), where wgpu records the commands and
// its barriers). The GPU's time is not measured; `scripts/bench/decode.ts` and `moe.ts` report a real
// program's host cost as cpu_encode_ms_per_token, split by phase in cpu_ms_per_token (kernels/timer.ts cpuMs).
//   deno run -A scripts/bench/encode.ts [--dispatches 300] [--rounds 60] [--bindings 1,3,6,9]
import { parseArgs } from "node:util";
import { scriptArgs } from "../args.ts";
import { getGpu } from "../../kernels/mod.ts";

const { values } = scriptArgs(import.meta.url, (args) =>
  parseArgs({
    args,
    options: {
      dispatches: { type: "string", default: "300" },
      rounds: { type: "string", default: "60" },
      bindings: { type: "string", default: "1,3,6,9" },
    },
  }));
const D = Number(values.dispatches), R = Number(values.rounds), WARM = Math.min(10, R - 1);
const counts = values.bindings!.split(",").map(Number);
if (!(D >= 1 && R >= 2 && counts.every((n) => Number.isInteger(n) && n >= 1 && n <= 16))) {
  console.error("encode.ts: --dispatches >= 1, --rounds >= 2, --bindings 1..16 each");
  Deno.exit(2);
}
const gpu = await getGpu();
const dev = gpu.device;

for (const nb of counts) {
  // Bindings 0..nb-2 read, the last is written; ten pipelines in turn, as a model's kernels alternate.
  const decl = Array.from(
    { length: nb },
    (_, i) =>
      `@group(0) @binding(${i}) var<storage, ${i === nb - 1 ? "read_write" : "read"}> b${i}: array<u32>;`,
  ).join(
    "\n",
  );
  const sum = Array.from({ length: nb - 1 }, (_, i) => `b${i}[0]`).join(" + ") || "1u";
  const pipes = Array.from({ length: 10 }, (_, i) =>
    dev.createComputePipeline({
      layout: "auto",
      compute: {
        module: dev.createShaderModule({
          code: `${decl}\n@compute @workgroup_size(1) fn main() { b${nb - 1}[0] = ${sum} + ${i}u; }`,
        }),
        entryPoint: "main",
      },
    }));
  const bufs = Array.from(
    { length: D * nb },
    () => dev.createBuffer({ size: 256, usage: GPUBufferUsage.STORAGE }),
  );
  for (const chained of [false, true]) {
    const calls = Array.from({ length: D }, (_, d) => {
      const pipe = pipes[d % pipes.length];
      const entries = Array.from({ length: nb }, (_, i) => ({
        binding: i,
        // Chained: binding 0 is the buffer the dispatch before wrote.
        resource: {
          buffer: chained && i === 0 && d > 0 && nb > 1 ? bufs[(d - 1) * nb + nb - 1] : bufs[d * nb + i],
        },
      }));
      return { pipe, group: dev.createBindGroup({ layout: pipe.getBindGroupLayout(0), entries }) };
    });
    let encode = 0, finish = 0;
    for (let r = 0; r < R; r++) {
      const t0 = performance.now();
      const enc = dev.createCommandEncoder();
      const pass = enc.beginComputePass();
      for (const c of calls) {
        pass.setPipeline(c.pipe);
        pass.setBindGroup(0, c.group);
        pass.dispatchWorkgroups(1);
      }
      pass.end();
      const t1 = performance.now();
      const cmd = enc.finish();
      const t2 = performance.now();
      dev.queue.submit([cmd]);
      if (r >= WARM) (encode += t1 - t0, finish += t2 - t1);
      if (r % 10 === 9) await dev.queue.onSubmittedWorkDone();
    }
    await dev.queue.onSubmittedWorkDone();
    const us = (ms: number) => Number((ms / (R - WARM) / D * 1000).toFixed(2));
    console.log(JSON.stringify({
      bench: "swactor-encode",
      adapter: gpu.adapterName,
      bindings: nb,
      chained,
      dispatches: D,
      encode_us: us(encode),
      finish_us: us(finish),
    }));
  }
  for (const b of bufs) b.destroy();
}
