// What a node measures about itself when it starts, so that plans rest on this machine's numbers instead of
// defaults (docs/NODE.md, "Self-measurement"):
// - usable GPU memory: storage buffers allocated until the adapter refuses one, the cap (`--memory`) is
//   reached or, on a software adapter (whose "GPU memory" is host memory, committed only when touched), the
//   host's available memory is; then all freed;
// - weight-read bandwidth: the decode GEMV (kernels/gemv_fused.ts with RMSNorm folded in, the weight type
//   the engine would choose) at a few input widths K, twice: streaming (rotating over copies that together
//   are several times any cache: what a real model's layers see) and cached (one small matrix read again
//   and again: what a stage whose weights fit the cache sees), and how large a working set still reads at
//   the cached rate; timed with GPU timestamps where the adapter has them (kernels/timer.ts), else by the
//   wall clock;
// - what a chain stage pays per step besides reading weights: the fixed part (upload the input, submit, read
//   a small result back), what each further dispatch adds, and the host's encode time for a layer's
//   dispatches. Each step follows a short idle gap, as a stage's steps do.
// It is bounded (the probes of bandwidth and steps about 1.5 s on a software adapter, two on a GPU; the
// memory probe as long as the GPU takes to commit and free its memory, ~4 s for an H100's, at most
// MEMORY_PROBE_MS to find it) and cut into GPU work of a few tens of ms with the event loop free in between,
// so membership keeps answering meanwhile. Processes on one machine share its GPU, so they measure in turn
// (a lock file); measuring together, each would measure the others.
import {
  encodeCalls,
  gemvFusedCall,
  type Gpu,
  gpuSlowdown,
  type KernelCall,
  readBack,
  releaseCalls,
  storageBuffer,
  writeBytes,
  yieldToEventLoop,
} from "../kernels/mod.ts";
import { gpuMs } from "../kernels/timer.ts";
import type { NodeMeasurement } from "./membership/mod.ts";
import { LAYER_DISPATCHES } from "../planner/live.ts";

export interface MeasureOptions {
  /** Most memory this node offers, bytes (`--memory`); 0 or absent: no cap. */
  memoryCap?: number;
  /** Rough time budget of the bandwidth and step probes, ms (default: software adapter 1500, GPU 2000). */
  budgetMs?: number;
  /**
   * Most time the memory probe takes, ms (default MEMORY_PROBE_MS). A GPU commits what it allocates:
   * ~25 ms a GiB on an H100, so its 76 GiB take ~2 s (a tenth of the budget, its limit before, found 6-8).
   */
  memoryMs?: number;
  /** Input widths K of the bandwidth GEMVs (default [64, 512, 4096]). */
  widths?: number[];
  /**
   * A file whose lock makes the measurements of one machine take turns (default
   * $TMPDIR/swactor-measure.lock, /tmp when TMPDIR is unset); "" measures without waiting for a turn.
   */
  lockPath?: string;
  /**
   * The clock the probes' deadlines are read from (default performance.now). Only deadlines: GPU time is
   * always timed with the real clock. Tests pass a frozen or a racing one to show the probes end either way.
   */
  clock?: () => number;
}

const MiB = 2 ** 20;
/** The memory probe's time limit, ms: an H200's 141 GB at an H100's ~25 ms a GiB take ~3.5 s. */
export const MEMORY_PROBE_MS = 10_000;
const DEFAULT_WIDTHS = [64, 512, 4096];
/** Weights a streaming probe rotates over (4 copies): 1.5 x a 32 MiB L3, several times a 50-72 MB GPU L2. */
const STREAM_BYTES = { software: 48 * MiB, gpu: 256 * MiB };
/** Working sets of the cache probe (one matrix read again and again), smallest first. */
const CACHE_SIZES = [8 * MiB, 16 * MiB, 32 * MiB, 64 * MiB];
/** A working set still counts as cached while it reads at this fraction of the smallest one's rate. */
const CACHED_FRACTION = 0.75;
/** Timed pieces of a bandwidth probe: at least MIN_PIECES, then more until its deadline or MAX_PIECES. */
const MIN_PIECES = 2, MAX_PIECES = 16;
/** GPU work per piece, ms: the event loop is blocked at most this long at a time. */
const PIECE_MS = 20;
/**
 * Idle gap before each timed step, ms: a chain stage's steps follow a wait for the other stages, and after it
 * a software adapter's threads have parked (a step after 20 ms idle costs ~0.5 ms there, back to back ~0.2).
 */
const STEP_GAP_MS = 20;
/** Extra dispatches in the long steps of the step probe. */
const EXTRA_DISPATCHES = 24;

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));
const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
};
const round = (x: number, digits: number) => Number(x.toFixed(digits));

/** Measures this process's GPU, taking its turn on this machine. Throws only on a GPU failure. */
export async function measureNode(gpu: Gpu, opts: MeasureOptions = {}): Promise<NodeMeasurement> {
  const cap = opts.memoryCap ?? 0;
  if (!(Number.isSafeInteger(cap) && cap >= 0)) {
    throw new RangeError(`memoryCap must be a whole number of bytes >= 0, got ${cap}`);
  }
  const widths = opts.widths ?? DEFAULT_WIDTHS;
  if (widths.length === 0 || widths.some((k) => !(Number.isInteger(k) && k >= 8 && k % 8 === 0))) {
    throw new RangeError(`widths must be multiples of 8, at least 8, got [${widths}]`);
  }
  const budget = opts.budgetMs ?? (gpu.isSoftware ? 1500 : 2000);
  const lockPath = opts.lockPath ?? `${Deno.env.get("TMPDIR") ?? "/tmp"}/swactor-measure.lock`;
  const clock = opts.clock ?? (() => performance.now());
  return await inTurn(lockPath, async () => {
    const t0 = performance.now();
    const memory = await probeMemory(gpu, cap, clock() + (opts.memoryMs ?? MEMORY_PROBE_MS), clock);
    const wt = gpu.hasF16 ? "f16" : "f32";
    const stream = gpu.isSoftware ? STREAM_BYTES.software : STREAM_BYTES.gpu;
    const each = (budget * 0.7) / (2 * widths.length + CACHE_SIZES.length - 1);
    const readGbps: [number, number][] = [], cachedGbps: [number, number][] = [];
    for (const k of [...widths].sort((a, b) => a - b)) {
      readGbps.push([
        k,
        round(await probeBandwidth(gpu, k, wt, each, clock, { bytes: stream / 4, copies: 4 }), 3),
      ]);
      cachedGbps.push([
        k,
        round(await probeBandwidth(gpu, k, wt, each, clock, { bytes: CACHE_SIZES[0], copies: 1 }), 3),
      ]);
    }
    const cacheBytes = await probeCacheSize(gpu, wt, each, clock, readGbps, cachedGbps);
    const steps = await probeSteps(gpu);
    return {
      at: Date.now(),
      memoryBytes: memory.bytes,
      memoryCapBytes: cap,
      memoryBound: memory.bound,
      readGbps,
      cachedGbps,
      cacheBytes,
      readWeights: wt,
      timestamps: gpu.hasTimestamps && gpuSlowdown() === 1,
      dispatchMs: round(steps.dispatchMs, 4),
      readbackMs: round(steps.readbackMs, 4),
      encodeLayerMs: round(steps.encodeLayerMs, 4),
      tookMs: Math.round(performance.now() - t0),
    };
  });
}

/** Runs `fn` holding the exclusive lock of `path` (none when ""); the lock goes with the process, too. */
async function inTurn<T>(path: string, fn: () => Promise<T>): Promise<T> {
  let file: Deno.FsFile | undefined;
  if (path) {
    try {
      file = await Deno.open(path, { create: true, write: true, mode: 0o666 });
      await file.lock(true);
    } catch {
      // Someone else's lock file we may not open, or no file locks here: measure without a turn.
      file?.close();
      file = undefined;
    }
  }
  try {
    return await fn();
  } finally {
    if (file) {
      await file.unlock().catch(() => {});
      file.close();
    }
  }
}

/**
 * Allocates storage buffers until the adapter refuses one (a refused chunk is halved down to 64 MiB to
 * find the edge), the cap or the host's available memory (software adapters) is reached, or time runs out.
 */
async function probeMemory(
  gpu: Gpu,
  cap: number,
  deadline: number,
  clock: () => number,
): Promise<{ bytes: number; bound: NodeMeasurement["memoryBound"] }> {
  const dev = gpu.device;
  const host = gpu.isSoftware ? Deno.systemMemoryInfo().available : Infinity;
  const ceiling = Math.min(cap > 0 ? cap : Infinity, host);
  let chunk = Math.min(Number(dev.limits.maxBufferSize), gpu.isSoftware ? 256 * MiB : 1024 * MiB);
  chunk -= chunk % 256;
  const held: GPUBuffer[] = [];
  let total = 0;
  let bound: NodeMeasurement["memoryBound"] = "device";
  try {
    for (;;) {
      if (total >= ceiling) {
        bound = cap > 0 && cap <= host ? "cap" : "host";
        break;
      }
      if (clock() > deadline) {
        bound = "time";
        break;
      }
      const size = Math.min(chunk, ceiling - total);
      const rounded = Math.max(256, size - (size % 4));
      dev.pushErrorScope("out-of-memory");
      dev.pushErrorScope("validation");
      const b = dev.createBuffer({ size: rounded, usage: GPUBufferUsage.STORAGE, label: "memory probe" });
      const invalid = await dev.popErrorScope();
      const oom = await dev.popErrorScope();
      if (invalid || oom) {
        b.destroy();
        if (chunk <= 64 * MiB) break;
        chunk = Math.floor(chunk / 2);
        continue;
      }
      held.push(b);
      total += rounded;
      await yieldToEventLoop(); // error scopes resolve as microtasks: without this, timers wait for the whole probe
    }
  } finally {
    // A GPU takes about as long to free a committed GiB as to commit it (~25 ms on an H100): one at a time,
    // with the event loop's turn in between (freed in one go, an H100's 76 GiB held it ~2 s).
    for (const b of held) {
      b.destroy();
      await yieldToEventLoop();
    }
  }
  return { bytes: Math.min(total, ceiling), bound };
}

/**
 * The largest working set (of CACHE_SIZES) that reads at CACHED_FRACTION of the smallest one's rate, at the
 * width nearest 1024; 0 when the smallest reads no faster than streaming (no cache to speak of).
 */
async function probeCacheSize(
  gpu: Gpu,
  wt: "f16" | "f32",
  budgetMs: number,
  clock: () => number,
  stream: [number, number][],
  cached: [number, number][],
): Promise<number> {
  let i = 0;
  for (let j = 1; j < cached.length; j++) {
    if (Math.abs(Math.log(cached[j][0] / 1024)) < Math.abs(Math.log(cached[i][0] / 1024))) i = j;
  }
  const [k, fast] = cached[i];
  if (fast < 1.25 * stream[i][1]) return 0;
  let size = CACHE_SIZES[0];
  for (const s of CACHE_SIZES.slice(1)) {
    if (await probeBandwidth(gpu, k, wt, budgetMs, clock, { bytes: s, copies: 1 }) < CACHED_FRACTION * fast) {
      break;
    }
    size = s;
  }
  return size;
}

/**
 * GB/s of weights read by the decode GEMV with input width `k`: pieces of back-to-back dispatches rotating
 * over `copies` weight matrices of about `bytes` each (warmed by one untimed round); the upper quartile of
 * the pieces.
 */
async function probeBandwidth(
  gpu: Gpu,
  k: number,
  wt: "f16" | "f32",
  budgetMs: number,
  clock: () => number,
  shape: { bytes: number; copies: number },
): Promise<number> {
  const bpw = wt === "f16" ? 2 : 4;
  const target = shape.bytes;
  const copies = shape.copies;
  const maxRows = Math.floor(Number(gpu.device.limits.maxStorageBufferBindingSize) / (k * bpw));
  let n = Math.min(Math.floor(target / (k * bpw)), maxRows);
  n = Math.max(64, n - (n % 64));
  const x = storageBuffer(gpu, k * 4, "probe x");
  writeBytes(gpu, x, 0, new Float32Array(k).fill(1));
  const norm = storageBuffer(gpu, k * bpw, "probe norm");
  const y = storageBuffer(gpu, n * 4, "probe y");
  const weights = Array.from({ length: copies }, () => storageBuffer(gpu, n * k * bpw, "probe weights"));
  const calls = weights.map((w) =>
    gemvFusedCall(gpu, { x, w, y, normWeight: norm }, {
      K: k,
      N: n,
      T: 1,
      weights: wt,
      transform: "rmsnorm",
      eps: 1e-5,
    })
  );
  const bytes = n * k * bpw * copies;
  try {
    await clearInPieces(gpu, weights);
    await timeCalls(gpu, calls, 1, y); // compiles the pipeline
    const rates: number[] = [];
    let reps = 1;
    const end = clock() + budgetMs;
    while ((clock() < end && rates.length < MAX_PIECES) || rates.length < MIN_PIECES) {
      const ms = await timeCalls(gpu, calls, reps, y);
      rates.push((bytes * reps) / (ms * 1e6));
      if (ms < PIECE_MS / 2 && reps < 1024) reps *= 2;
      await yieldToEventLoop();
    }
    // The upper quartile: a piece that shared the machine with another process (on a software adapter the
    // GPU is the CPU) shows less than the adapter can do; the best piece alone would promise more than a
    // shared machine gives.
    const sorted = rates.sort((a, b) => a - b);
    return sorted[Math.floor(sorted.length * 0.75)];
  } finally {
    releaseCalls(calls);
    for (const b of [x, norm, y, ...weights]) b.destroy();
  }
}

/**
 * Zeroes `buffers` a piece at a time, yielding between pieces. A buffer's first use makes wgpu zero it, all at
 * once and in the submit: 64 MiB on a software adapter held the event loop for ~300 ms.
 */
async function clearInPieces(gpu: Gpu, buffers: GPUBuffer[]): Promise<void> {
  const piece = 8 * MiB;
  for (const b of buffers) {
    for (let at = 0; at < b.size; at += piece) {
      const enc = gpu.device.createCommandEncoder();
      enc.clearBuffer(b, at, Math.min(piece, b.size - at));
      gpu.device.queue.submit([enc.finish()]);
      await gpu.device.queue.onSubmittedWorkDone();
      await yieldToEventLoop();
    }
  }
}

/**
 * ms of `reps` rounds of `calls`: GPU time from timestamps where there are any, else (or when the node is
 * throttled with SWACTOR_SLOWDOWN, which stretches waits, not GPU work) the wall clock to the readback.
 */
async function timeCalls(gpu: Gpu, calls: KernelCall[], reps: number, out: GPUBuffer): Promise<number> {
  if (gpu.hasTimestamps && gpuSlowdown() === 1) return (await gpuMs(gpu, calls, reps)) * reps;
  const t0 = performance.now();
  const enc = gpu.device.createCommandEncoder();
  const pass = enc.beginComputePass();
  for (let i = 0; i < reps; i++) encodeCalls(pass, calls);
  pass.end();
  gpu.device.queue.submit([enc.finish()]);
  await readBack(gpu, out, 4);
  return performance.now() - t0;
}

/**
 * A stage's costs besides weight bytes, from steps shaped like the engine's (upload the input, one submit,
 * read a small result back): steps of one small GEMV give the fixed part; steps with EXTRA_DISPATCHES more
 * give what each dispatch adds. The host's encode time of a layer is timed apart, without a submit.
 */
async function probeSteps(
  gpu: Gpu,
): Promise<{ readbackMs: number; dispatchMs: number; encodeLayerMs: number }> {
  const k = 64, n = 64;
  const wt = gpu.hasF16 ? "f16" : "f32";
  const x = storageBuffer(gpu, 2 * k * 4, "probe x");
  const norm = storageBuffer(gpu, k * 4, "probe norm");
  const w = storageBuffer(gpu, n * k * 4, "probe weights");
  const y = storageBuffer(gpu, n * 4, "probe y");
  const record = storageBuffer(gpu, 16, "probe step record");
  // A layer's dispatches switch pipelines: cycle through three GEMV variants, as its kernels do.
  const calls = (["rmsnorm", "none", "silu_mul"] as const).map((transform) =>
    gemvFusedCall(gpu, { x, w, y, normWeight: norm }, { K: k, N: n, T: 1, weights: wt, transform, eps: 1e-5 })
  );
  const input = new Float32Array(k).fill(0.5);
  const stepRecord = new Uint32Array([0, 1, 1, 0]);
  const encode = (pass: GPUComputePassEncoder, dispatches: number) => {
    for (let i = 0; i < dispatches; i++) encodeCalls(pass, [calls[i % calls.length]]);
  };
  // As Engine.run: upload the input and the step record, encode, one submit, read a small result back.
  const step = async (dispatches: number) => {
    const t0 = performance.now();
    writeBytes(gpu, x, 0, input);
    writeBytes(gpu, record, 0, stepRecord);
    const enc = gpu.device.createCommandEncoder();
    const pass = enc.beginComputePass();
    encode(pass, dispatches);
    pass.end();
    gpu.device.queue.submit([enc.finish()]);
    await readBack(gpu, y, 4);
    return performance.now() - t0;
  };
  try {
    await step(1);
    await step(1 + EXTRA_DISPATCHES);
    const short: number[] = [], long: number[] = [];
    for (let r = 0; r < 5; r++) {
      await sleep(STEP_GAP_MS);
      short.push(await step(1));
      await sleep(STEP_GAP_MS);
      long.push(await step(1 + EXTRA_DISPATCHES));
    }
    const reps = 100;
    const t0 = performance.now();
    const enc = gpu.device.createCommandEncoder();
    const pass = enc.beginComputePass();
    encode(pass, reps * LAYER_DISPATCHES);
    pass.end();
    enc.finish(); // encoded and finished like a step, never submitted
    const encodeLayerMs = (performance.now() - t0) / reps;
    return {
      readbackMs: median(short),
      dispatchMs: Math.max(0, (median(long) - median(short)) / EXTRA_DISPATCHES),
      encodeLayerMs,
    };
  } finally {
    releaseCalls(calls);
    for (const b of [x, norm, w, y, record]) b.destroy();
  }
}
