// Reading GPU buffers back, without Deno's 10 ms map floor where that is safe.
//
// Deno 2.9's `GPUBuffer.mapAsync` (ext/webgpu/buffer.rs) first polls the device with a *blocking* wait,
// which completes the mapping in wgpu before the call returns, and then sleeps 10 ms before its promise
// resolves. `getMappedRange` reads from wgpu directly, so right after the map call returns the data can be
// read and the buffer unmapped, ~10 ms before the promise says so. One catch: getMappedRange unwraps the
// buffer's last map mode, which Deno records only when a map promise resolves, so on a buffer that has
// never completed a map it panics (an abort, not an exception). Hence staging buffers here are *primed*
// (one ordinary map, awaited, when created) and pooled by size. If the early read fails (the mapping was not
// complete: another Deno's map), it falls back to awaiting the promise. The early read is used only on the
// Deno versions it was checked on (the pinned 2.9.x), and only after a self-check on this device (two early
// reads of known data, `checkEarlyRead`) passed; SWACTOR_FAST_READBACK=0 turns it off.
import type { Gpu } from "./gpu.ts";

/** Whether early reads are on for this process. */
export const FAST_READBACK = /^2\.9\./.test(Deno.version.deno) &&
  Deno.env.get("SWACTOR_FAST_READBACK") !== "0";

/**
 * How reads completed in this process: early (as the map call returned) or by awaiting Deno's promise; and
 * how many staging buffers were primed (each an awaited map: it waits for the GPU's queued work and 10 ms).
 */
export const readbackStats = { early: 0, awaited: 0, primed: 0 };

/** Buffers above this are not pooled (a logits dump): created, mapped and awaited, then destroyed. */
const MAX_POOLED = 16 << 20;
/**
 * Free buffers kept per size class: a buffer comes back ~10 ms after its read, so a stage reading every
 * 0.5 ms needs ~20 of them; at most 32 MiB a class, between 4 and 64 buffers.
 */
function keep(size: number): number {
  return Math.max(4, Math.min(64, Math.floor((32 << 20) / size)));
}

interface Pool {
  free: Map<number, GPUBuffer[]>;
}

const pools = new WeakMap<GPUDevice, Pool>();
/** Per device: the self-check, and its verdict once it ran (early reads only where it is true). */
interface EarlyRead {
  check: Promise<boolean>;
  ok: boolean;
  /** The check has finished (`ok` is its verdict). */
  done: boolean;
}
const early = new WeakMap<GPUDevice, EarlyRead>();
/** Buffers that have completed a map (only those may be read early; see the top of this file). */
const primedSet = new WeakSet<GPUBuffer>();

function poolOf(gpu: Gpu): Pool {
  let p = pools.get(gpu.device);
  if (!p) pools.set(gpu.device, p = { free: new Map() });
  return p;
}

function sizeClass(bytes: number): number {
  let s = 256;
  while (s < bytes) s *= 2;
  return s;
}

async function primed(gpu: Gpu, size: number): Promise<GPUBuffer> {
  const b = gpu.device.createBuffer({ size, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST });
  readbackStats.primed++;
  await b.mapAsync(GPUMapMode.READ);
  b.unmap();
  primedSet.add(b);
  return b;
}

/**
 * Whether early reads are right on this device: copies known words into a primed staging buffer twice and
 * reads each early; any mismatch or failure turns early reads off for the device. Runs once (~35 ms).
 */
export function checkEarlyRead(gpu: Gpu): Promise<boolean> {
  if (!FAST_READBACK) return Promise.resolve(false);
  let e = early.get(gpu.device);
  if (!e) {
    const state: EarlyRead = { check: Promise.resolve(false), ok: false, done: false };
    state.check = selfCheck(gpu).catch(() => false).then((ok) => {
      state.ok = ok;
      state.done = true;
      if (!ok) {
        console.error("swactor: early GPU readback failed its self-check here; using Deno's map promise");
      }
      return ok;
    });
    early.set(gpu.device, e = state);
  }
  return e.check;
}

async function selfCheck(gpu: Gpu): Promise<boolean> {
  const src = gpu.device.createBuffer({
    size: 256,
    usage: GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST,
  });
  const stg = await primed(gpu, 256);
  try {
    for (let round = 1; round <= 2; round++) {
      const want = Uint32Array.from({ length: 64 }, (_, i) => (i * 2654435761 + round * 40503) >>> 0);
      gpu.device.queue.writeBuffer(src, 0, want);
      const enc = gpu.device.createCommandEncoder();
      enc.copyBufferToBuffer(src, 0, stg, 0, 256);
      gpu.device.queue.submit([enc.finish()]);
      const mapped = stg.mapAsync(GPUMapMode.READ);
      let got: Uint32Array | undefined;
      try {
        got = new Uint32Array(stg.getMappedRange(0, 256).slice(0));
        stg.unmap();
      } catch {
        got = undefined;
      }
      await mapped.catch(() => {});
      if (!got || got.some((v, i) => v !== want[i])) return false;
    }
    return true;
  } finally {
    src.destroy();
    stg.destroy();
  }
}

/**
 * Makes sure `count` primed staging buffers of at least `bytes` are free. Where fewer are, it primes enough
 * for 2 count (together: ~11 ms, the cost of one). An early read's buffer comes back to the pool only when
 * its map promise settles, which on an H200 was not before the next prime's map call (the pool lost one a
 * request until it was short; docs/BENCHMARKS.md, the sixty-first session), so requests prime every few.
 * A prime's map call blocks until the GPU's queued work is done, so the map calls are made here, before this
 * function first awaits (once the device's early-read check has run): a caller that submits its work after
 * calling, as a request's prefill does, then waits for none of it. (Made after the prefill's first submit,
 * the first held the host 89-117 ms, until the whole prefill was done, its program build no longer
 * overlapping the GPU: 2,048-token prompts' first tokens 12-13 ms later on the H200.)
 */
export function reserveStaging(gpu: Gpu, bytes: number, count: number): Promise<void> {
  const e = early.get(gpu.device);
  if (!e?.done) return checkEarlyRead(gpu).then(() => reserveStaging(gpu, bytes, count));
  if (!e.ok || bytes > MAX_POOLED) return Promise.resolve();
  const size = sizeClass(bytes);
  const free = poolOf(gpu).free.get(size) ?? [];
  const short = free.length < count;
  const made = Array.from(
    { length: short ? Math.max(count, Math.min(2 * count, keep(size))) - free.length : 0 },
    () => primed(gpu, size), // each makes its map call now, synchronously
  );
  return Promise.all(made).then((bs) => bs.forEach((b) => release(gpu, b)));
}

/** A staging buffer of at least `bytes` now: a primed one from the pool, else a fresh (unprimed) one. */
export function takeStaging(gpu: Gpu, bytes: number): GPUBuffer {
  if (FAST_READBACK && bytes <= MAX_POOLED) {
    const b = poolOf(gpu).free.get(sizeClass(bytes))?.pop();
    if (b) return b;
  }
  const size = bytes <= MAX_POOLED ? sizeClass(bytes) : Math.ceil(bytes / 4) * 4;
  return gpu.device.createBuffer({ size, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST });
}

function release(gpu: Gpu, b: GPUBuffer): void {
  if (!FAST_READBACK || b.size > MAX_POOLED) return b.destroy();
  const pool = poolOf(gpu);
  const list = pool.free.get(b.size) ?? [];
  if (list.length >= keep(b.size)) return b.destroy();
  list.push(b);
  pool.free.set(b.size, list);
}

/**
 * Maps `staging` (a copy into it already submitted) and returns its first `bytes`; the buffer goes back to
 * the pool once Deno's map promise settles. On Deno 2.9 the map call blocks until the GPU is done. The map
 * call is made before this function first awaits, so a caller may submit more work right after calling it
 * (the decode loop does); reads are early only once `checkEarlyRead` has passed on this device.
 */
export async function readStaging(gpu: Gpu, staging: GPUBuffer, bytes: number): Promise<ArrayBuffer> {
  const mapped = staging.mapAsync(GPUMapMode.READ);
  if (early.get(gpu.device)?.ok && primedSet.has(staging)) {
    let out: ArrayBuffer | undefined;
    try {
      out = staging.getMappedRange(0, staging.size).slice(0, bytes);
      staging.unmap();
    } catch {
      out = undefined; // not mapped yet: wait for the promise like anyone else
    }
    if (out) {
      readbackStats.early++;
      mapped.then(() => release(gpu, staging), () => staging.destroy());
      return out;
    }
  }
  try {
    await mapped;
    readbackStats.awaited++;
    const out = staging.getMappedRange(0, staging.size).slice(0, bytes);
    staging.unmap();
    primedSet.add(staging);
    release(gpu, staging);
    return out;
  } catch (e) {
    staging.destroy();
    throw e;
  }
}
