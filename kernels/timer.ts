// GPU time of compute passes, from timestamp queries (no readback floor in the number): the benchmarks
// (scripts/bench/) and the node's self-measurement (node/measure.ts) time kernels with it.
import {
  encodeCalls,
  type Gpu,
  type KernelCall,
  kernelCall,
  pipeline,
  readBack,
  storageBuffer,
  uniformBuffer,
} from "./gpu.ts";

/**
 * Encodes `passes` compute passes, pass i holding what `fill(pass, i)` encodes between two timestamps, in one
 * submit; returns each pass's GPU ms.
 */
async function timePasses(
  gpu: Gpu,
  passes: number,
  fill: (pass: GPUComputePassEncoder, i: number) => void,
): Promise<number[]> {
  if (!gpu.hasTimestamps) throw new Error(`${gpu.adapterName} has no timestamp-query`);
  const n = passes * 2;
  if (n > 4096) throw new RangeError(`${n} timestamps exceed a query set's 4096`);
  const dev = gpu.device;
  const qs = dev.createQuerySet({ type: "timestamp", count: n });
  const resolve = dev.createBuffer({
    size: n * 8,
    usage: GPUBufferUsage.QUERY_RESOLVE | GPUBufferUsage.COPY_SRC,
  });
  try {
    const enc = dev.createCommandEncoder();
    for (let i = 0; i < passes; i++) {
      const pass = enc.beginComputePass({
        timestampWrites: { querySet: qs, beginningOfPassWriteIndex: 2 * i, endOfPassWriteIndex: 2 * i + 1 },
      });
      fill(pass, i);
      pass.end();
    }
    enc.resolveQuerySet(qs, 0, n, resolve, 0);
    dev.queue.submit([enc.finish()]);
    const t = new BigInt64Array(await readBack(gpu, resolve, n * 8));
    return Array.from({ length: passes }, (_, i) => Number(t[2 * i + 1] - t[2 * i]) / 1e6);
  } finally {
    qs.destroy();
    resolve.destroy();
  }
}

/** Encodes `calls` `repeat` times in one pass between two timestamps; returns GPU ms per repeat. */
export async function gpuMs(gpu: Gpu, calls: readonly KernelCall[], repeat: number): Promise<number> {
  const [ms] = await timePasses(gpu, 1, (pass) => {
    for (let i = 0; i < repeat; i++) encodeCalls(pass, calls);
  });
  return ms / repeat;
}

/**
 * What each kind of dispatch adds to a step (`kind` names a call's kind): the step timed without that
 * kind's calls, alternating with the whole step, `rounds` rounds of `repeat` each (the rest read what they
 * find; their work does not depend on the values). Returns each kind's mean GPU ms and its number of calls.
 */
export async function marginalMs(
  gpu: Gpu,
  calls: readonly KernelCall[],
  kind: (c: KernelCall) => string,
  rounds = 3,
  repeat = 5,
): Promise<Map<string, { ms: number; calls: number }>> {
  const out = new Map<string, { ms: number; calls: number }>();
  for (const k of new Set(calls.map(kind))) {
    const without = calls.filter((c) => kind(c) !== k);
    let whole = 0, less = 0;
    for (let r = 0; r < rounds; r++) {
      whole += await gpuMs(gpu, calls, repeat);
      less += await gpuMs(gpu, without, repeat);
    }
    out.set(k, { ms: (whole - less) / rounds, calls: calls.length - without.length });
  }
  return out;
}

/**
 * GPU ms per pass of `calls` as a microbenchmark takes it (scripts/bench/gemm.ts, gemm_parts.ts): compiled and
 * estimated, repeated so one timing lasts about `targetMs`, ~`warmMs` of such timings first (the H200 idles at
 * 345 MHz and lowers its clocks while the host is busy; no warm-up on a software adapter), then the best of
 * three.
 */
export async function settledGpuMs(
  gpu: Gpu,
  calls: readonly KernelCall[],
  targetMs = 25,
  warmMs = 300,
): Promise<number> {
  await gpuMs(gpu, calls, 3); // compiles
  const est = await gpuMs(gpu, calls, 3);
  const repeat = Math.max(3, Math.min(200, Math.round(targetMs / Math.max(est, 0.01))));
  for (let spent = 0; spent < warmMs && !gpu.isSoftware;) spent += await gpuMs(gpu, calls, repeat) * repeat;
  let best = Infinity;
  for (let i = 0; i < 3; i++) best = Math.min(best, await gpuMs(gpu, calls, repeat));
  return best;
}

/**
 * GPU ms of each call inside the real sequence: `calls` run `repeat` times in order, each dispatch in its
 * own pass between two timestamps, so every call sees the caches and clocks the sequence leaves it (a
 * call timed alone and repeated would find its weights in L2). Returns the mean ms of each call.
 */
export async function gpuMsPerCall(
  gpu: Gpu,
  calls: readonly KernelCall[],
  repeat: number,
): Promise<number[]> {
  const ms = await timePasses(
    gpu,
    calls.length * repeat,
    (pass, i) => encodeCalls(pass, [calls[i % calls.length]]),
  );
  const out = new Array<number>(calls.length).fill(0);
  ms.forEach((m, i) => (out[i % calls.length] += m / repeat));
  return out;
}

/**
 * How n tiny dispatches are ordered in a pass (dispatchCostUs):
 * - "chain": each reads what the one before wrote (two buffers in turn), as a model step's kernels do;
 * - "shared": each writes words of its own in one buffer that every dispatch binds read_write: no data
 *   flows between them, but WebGPU tracks the buffer, not the words, and must order the dispatches;
 * - "independent": each writes a buffer of its own, used once in the pass: nothing orders them.
 */
export type DispatchOrder = "chain" | "shared" | "independent";

/**
 * GPU µs a dispatch of `groups` workgroups of 256 threads (each thread one load and one store) when `n` of
 * them (default 512; "shared" fewer where their words would pass 64 MiB) run in one pass ordered as `order`
 * says: the floor under every kernel of a step. The best of five warmed-up passes, less an empty pass's time.
 */
export async function dispatchCostUs(
  gpu: Gpu,
  order: DispatchOrder,
  opts: { groups?: number; n?: number } = {},
): Promise<number> {
  const { groups = 1 } = opts;
  const words = groups * 256;
  // The shared buffer holds every dispatch's words: at most 64 MiB (a software adapter binds 128 MiB).
  const n = order === "shared" ? Math.min(opts.n ?? 512, Math.floor(2 ** 24 / words)) : opts.n ?? 512;
  if (!(Number.isInteger(groups) && groups >= 1 && Number.isInteger(n) && n >= 2)) {
    throw new RangeError(`dispatchCostUs: groups ${groups} and n ${n} must be integers >= 1 and >= 2`);
  }
  const buffers: GPUBuffer[] = [];
  const buffer = (size: number) => {
    const b = storageBuffer(gpu, size * 4, "dispatch probe");
    buffers.push(b);
    return b;
  };
  const src = (body: string, bindings: string) =>
    `${bindings}
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) g: vec3<u32>) { ${body} }`;
  let calls: KernelCall[];
  if (order === "chain") {
    const p = pipeline(
      gpu,
      src(
        "dst[g.x] = src[g.x] + 1u;",
        `@group(0) @binding(0) var<storage, read> src: array<u32>;
@group(0) @binding(1) var<storage, read_write> dst: array<u32>;`,
      ),
    );
    const a = buffer(words), b = buffer(words);
    const ab = kernelCall(gpu, p, [a, b], [groups]), ba = kernelCall(gpu, p, [b, a], [groups]);
    calls = Array.from({ length: n }, (_, i) => (i % 2 ? ba : ab));
  } else {
    // Dispatch i adds one to words [i * words, (i + 1) * words) of the shared buffer, or to its own buffer.
    const p = pipeline(
      gpu,
      src(
        "io[p.base + g.x] = io[p.base + g.x] + 1u;",
        `struct P { base: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read_write> io: array<u32>;`,
      ),
    );
    const shared = order === "shared" ? buffer(words * n) : undefined;
    calls = Array.from({ length: n }, (_, i) => {
      const params = uniformBuffer(gpu, [shared ? i * words : 0]);
      buffers.push(params);
      return kernelCall(gpu, p, [params, shared ?? buffer(words)], [groups]);
    });
  }
  try {
    await gpuMs(gpu, calls, 4); // the clocks ramp up under load
    let best = Infinity, empty = Infinity;
    for (let r = 0; r < 5; r++) {
      best = Math.min(best, await gpuMs(gpu, calls, 1));
      empty = Math.min(empty, await gpuMs(gpu, [], 1));
    }
    return ((best - empty) / n) * 1000;
  } finally {
    for (const b of buffers) b.destroy();
  }
}

/** The CPU's side of one program (cpuMs): ms a repeat, by phase. */
export interface CpuMs {
  /** The encoder, the compute pass and its setPipeline / setBindGroup / dispatch calls, pass.end(). */
  record: number;
  /** GPUCommandEncoder.finish(): where wgpu tracks the bound buffers' uses and places the barriers. */
  finish: number;
  /** queue.submit() of the finished buffer. */
  submit: number;
}

/**
 * CPU ms to record, finish and submit `calls` as one command buffer, each phase timed apart over `repeat`
 * buffers (all finished before the first is submitted, so the submits' times are not the recording's). The
 * GPU runs the submitted buffers; this waits for them before returning.
 */
export async function cpuMs(gpu: Gpu, calls: readonly KernelCall[], repeat: number): Promise<CpuMs> {
  const round = async (): Promise<CpuMs> => {
    let record = 0, finish = 0;
    const cmds: GPUCommandBuffer[] = [];
    for (let i = 0; i < repeat; i++) {
      const t0 = performance.now();
      const enc = gpu.device.createCommandEncoder();
      const pass = enc.beginComputePass();
      encodeCalls(pass, calls);
      pass.end();
      const t1 = performance.now();
      cmds.push(enc.finish());
      finish += performance.now() - t1;
      record += t1 - t0;
    }
    const t2 = performance.now();
    for (const c of cmds) gpu.device.queue.submit([c]);
    const submit = performance.now() - t2;
    await gpu.device.queue.onSubmittedWorkDone();
    return { record: record / repeat, finish: finish / repeat, submit: submit / repeat };
  };
  // A first round is not counted: wgpu makes a command pool for each buffer held unsubmitted, once, and a
  // round paid for that (on llvmpipe, 2026-12-04: finish 8.7 us a dispatch against 2.5-2.9 in the rounds after).
  await round();
  return await round();
}
