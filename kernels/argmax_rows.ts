// Greedy choice of every row of a logits block at once: out[t] = argmax_v logits[t, v] for t < T (lowest
// index on ties, like torch.argmax and sample.ts's sampler). What speculative verification reads back: k
// token ids instead of k x vocab logits. Two passes: workgroups of (chunk, row) reduce a chunk of logits
// each to (max, index), then one workgroup per row finishes.
import {
  ceilDiv,
  type Gpu,
  type KernelCall,
  kernelCall,
  pipeline,
  storageBuffer,
  uniformBuffer,
} from "./gpu.ts";

const WG = 256;

/**
 * Logits per workgroup of the first (partial argmax) pass: gpu.tuning.argmaxChunk, default 1024 (4 a
 * thread: a 128k vocabulary is 126 workgroups, about one per H200 SM; 4096, the first choice, left 32
 * workgroups each thread of which waited on 16 loads in a row).
 */
export function argmaxChunk(gpu: Gpu): number {
  const c = gpu.tuning.argmaxChunk ?? WG * 4;
  if (!(Number.isInteger(c) && c >= WG && c % WG === 0)) {
    throw new RangeError(`argmaxChunk must be a positive multiple of ${WG}, got ${c}`);
  }
  return c;
}

/** Workgroups (partials) a row of `vocab` logits has in the first pass. */
export function argmaxGroups(gpu: Gpu, vocab: number): number {
  return ceilDiv(vocab, argmaxChunk(gpu));
}

const BETTER =
  `fn better(av: f32, ai: u32, bv: f32, bi: u32) -> bool { return bv > av || (bv == av && bi < ai); }`;

// Pass 1 (also sample.ts's): each workgroup reduces CHUNK logits of row row0 + wg.y to (max, lowest index
// of the max), so the argmax of a 128k vocabulary is spread over many workgroups a row instead of one (one
// workgroup took ~95 us on the H200).
const partialSource = (CHUNK: number) => `
struct P { V: u32, groups: u32, row0: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> logits: array<f32>;
@group(0) @binding(2) var<storage, read_write> partial: array<vec2<u32>>;
var<workgroup> rv: array<f32, ${WG}>;
var<workgroup> ri: array<u32, ${WG}>;
${BETTER}
@compute @workgroup_size(${WG})
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  let tid = lid.x;
  let row = wg.y;
  let start = wg.x * ${CHUNK}u;
  let end = min(p.V, start + ${CHUNK}u);
  var bv = -3.4e38;
  var bi = 0xffffffffu;
  for (var i = start + tid; i < end; i += ${WG}u) {
    let v = logits[(p.row0 + row) * p.V + i];
    if (better(bv, bi, v, i)) { bv = v; bi = i; }
  }
  rv[tid] = bv;
  ri[tid] = bi;
  workgroupBarrier();
  for (var s = ${WG / 2}u; s > 0u; s >>= 1u) {
    if (tid < s && better(rv[tid], ri[tid], rv[tid + s], ri[tid + s])) {
      rv[tid] = rv[tid + s];
      ri[tid] = ri[tid + s];
    }
    workgroupBarrier();
  }
  if (tid == 0u) { partial[row * p.groups + wg.x] = vec2<u32>(bitcast<u32>(rv[0]), ri[0]); }
}`;

const FINAL = `
struct P { V: u32, groups: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> partial: array<vec2<u32>>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;
var<workgroup> rv: array<f32, ${WG}>;
var<workgroup> ri: array<u32, ${WG}>;
${BETTER}
@compute @workgroup_size(${WG})
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  let tid = lid.x;
  let row = wg.x;
  var bv = -3.4e38;
  var bi = 0xffffffffu;
  for (var i = tid; i < p.groups; i += ${WG}u) {
    let e = partial[row * p.groups + i];
    let v = bitcast<f32>(e.x);
    if (better(bv, bi, v, e.y)) { bv = v; bi = e.y; }
  }
  rv[tid] = bv;
  ri[tid] = bi;
  workgroupBarrier();
  for (var s = ${WG / 2}u; s > 0u; s >>= 1u) {
    if (tid < s && better(rv[tid], ri[tid], rv[tid + s], ri[tid + s])) {
      rv[tid] = rv[tid + s];
      ri[tid] = ri[tid + s];
    }
    workgroupBarrier();
  }
  // A row of NaNs keeps index 0xffffffff: the caller sees an id outside the vocabulary.
  if (tid == 0u) { out[row] = ri[0]; }
}`;

/**
 * The two dispatches writing argmax of logits rows 0..T-1 ([T, vocab] f32) into `out` (T u32). The
 * partials buffer is owned by the second call (freed by releaseCalls).
 */
export function argmaxRowsCalls(
  gpu: Gpu,
  bufs: { logits: GPUBuffer; out: GPUBuffer },
  d: { vocab: number; T: number },
): KernelCall[] {
  if (!(Number.isInteger(d.T) && d.T >= 1)) throw new RangeError(`argmax rows: T must be >= 1, got ${d.T}`);
  const groups = argmaxGroups(gpu, d.vocab);
  const partial = storageBuffer(gpu, groups * d.T * 8, "argmax rows partials");
  const first = argmaxPartialCall(gpu, { logits: bufs.logits, partial }, {
    vocab: d.vocab,
    T: d.T,
    label: "argmax",
  });
  const params = uniformBuffer(gpu, [d.vocab, groups]);
  const second = kernelCall(gpu, pipeline(gpu, FINAL), [params, partial, bufs.out], [d.T], "argmax");
  second.owned = [partial];
  return [first, second];
}

/**
 * The first pass alone: the (max, index) of every argmaxChunk logits of rows row0 .. row0 + T - 1 into
 * `partial` ([T, argmaxGroups] vec2<u32>), for a second pass to finish (argmaxRowsCalls',
 * or sample.ts's sampler).
 */
export function argmaxPartialCall(
  gpu: Gpu,
  bufs: { logits: GPUBuffer; partial: GPUBuffer },
  d: { vocab: number; T: number; row0?: number; label: string },
): KernelCall {
  const chunk = argmaxChunk(gpu);
  const groups = ceilDiv(d.vocab, chunk);
  const params = uniformBuffer(gpu, [d.vocab, groups, d.row0 ?? 0]);
  return kernelCall(gpu, pipeline(gpu, partialSource(chunk)), [params, bufs.logits, bufs.partial], [
    groups,
    d.T,
  ], d.label);
}

/** Reference: argmax of each row (lowest index on ties). */
export function argmaxRowsRef(logits: Float32Array, vocab: number): Uint32Array {
  const T = logits.length / vocab;
  const out = new Uint32Array(T);
  for (let t = 0; t < T; t++) {
    let best = 0;
    for (let v = 1; v < vocab; v++) if (logits[t * vocab + v] > logits[t * vocab + best]) best = v;
    out[t] = best;
  }
  return out;
}
