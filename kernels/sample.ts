// Sampling on the GPU, so a decode step needs no readback: the chosen token is written into the token
// buffer at `step.tok_out`, where the next step's embedding reads it.
// temperature <= 0: argmax (lowest index on ties, like torch.argmax).
// Otherwise: p_i ∝ exp((l_i - max) / T); top-p keeps the smallest set of most likely tokens whose mass
// reaches top_p (found by bisection on a probability threshold, no sort); then inverse-CDF sampling in
// index order with a uniform number hashed from (seed, tok_out), so a seed gives a reproducible sequence.
import {
  type Gpu,
  type KernelCall,
  kernelCall,
  packWords,
  pipeline,
  storageBuffer,
  uniformBuffer,
} from "./gpu.ts";
import { STEP_WGSL } from "./step.ts";
import { argmaxGroups, argmaxPartialCall } from "./argmax_rows.ts";

const WG = 256;

const SOURCE = `${STEP_WGSL}
struct P { V: u32, row: u32, groups: u32 }
struct S { temperature: f32, top_p: f32, seed: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<uniform> s: S;
@group(0) @binding(2) var<storage, read> step: Step;
@group(0) @binding(3) var<storage, read> logits: array<f32>;
@group(0) @binding(4) var<storage, read_write> tokens: array<u32>;
@group(0) @binding(5) var<storage, read> partial: array<vec2<u32>>;
const WG = ${WG}u;
var<workgroup> rv: array<f32, ${WG}>;
var<workgroup> ri: array<u32, ${WG}>;
var<workgroup> bisect: array<f32, 2>;

fn pcg(v: u32) -> u32 {
  let state = v * 747796405u + 2891336453u;
  let word = ((state >> ((state >> 28u) + 4u)) ^ state) * 277803737u;
  return (word >> 22u) ^ word;
}

fn sum_all(tid: u32, v: f32) -> f32 {
  rv[tid] = v;
  workgroupBarrier();
  for (var s = WG / 2u; s > 0u; s >>= 1u) {
    if (tid < s) { rv[tid] += rv[tid + s]; }
    workgroupBarrier();
  }
  let total = rv[0];
  workgroupBarrier();
  return total;
}

@compute @workgroup_size(${WG})
fn main(@builtin(local_invocation_id) lid: vec3<u32>) {
  let tid = lid.x;
  let base = p.row * p.V;
  var bv = -3.4e38;
  var bi = 0xffffffffu;
  for (var g = tid; g < p.groups; g += WG) {
    let v = bitcast<f32>(partial[g].x);
    if (v > bv) { bv = v; bi = partial[g].y; }
  }
  rv[tid] = bv;
  ri[tid] = bi;
  workgroupBarrier();
  for (var s = WG / 2u; s > 0u; s >>= 1u) {
    if (tid < s) {
      let ov = rv[tid + s];
      let oi = ri[tid + s];
      if (ov > rv[tid] || (ov == rv[tid] && oi < ri[tid])) { rv[tid] = ov; ri[tid] = oi; }
    }
    workgroupBarrier();
  }
  let best = ri[0];
  let mx = rv[0];
  workgroupBarrier();
  if (tid == 0u) { tokens[step.tok_out] = best; }
  if (s.temperature <= 0.0) { return; }
  let inv_t = 1.0 / s.temperature;
  // Threshold tau on the relative probability e_i = exp((l_i - max) / T) in (0, 1].
  var tau = 0.0;
  if (s.top_p < 1.0) {
    var z = 0.0;
    for (var i = tid; i < p.V; i += WG) { z += exp((logits[base + i] - mx) * inv_t); }
    let target_mass = sum_all(tid, z) * s.top_p;
    var lo = 0.0;
    var hi = 1.0;
    for (var it = 0u; it < 32u; it++) {
      let mid = 0.5 * (lo + hi);
      var s = 0.0;
      for (var i = tid; i < p.V; i += WG) {
        let e = exp((logits[base + i] - mx) * inv_t);
        if (e >= mid) { s += e; }
      }
      if (sum_all(tid, s) >= target_mass) { lo = mid; } else { hi = mid; }
    }
    tau = lo;
  }
  // Inverse CDF over contiguous chunks, one per thread, in index order.
  let chunk = (p.V + WG - 1u) / WG;
  let start = min(p.V, tid * chunk);
  let end = min(p.V, start + chunk);
  var mine = 0.0;
  for (var i = start; i < end; i++) {
    let e = exp((logits[base + i] - mx) * inv_t);
    if (e >= tau) { mine += e; }
  }
  rv[tid] = mine;
  workgroupBarrier();
  if (tid == 0u) {
    var acc = 0.0;
    for (var k = 0u; k < WG; k++) { let v = rv[k]; rv[k] = acc; acc += v; }
    bisect[0] = acc;
  }
  workgroupBarrier();
  let u = f32(pcg(pcg(s.seed) ^ pcg(step.tok_out + 0x9e3779b9u)) >> 8u) / 16777216.0 * bisect[0];
  let before = rv[tid];
  if (u >= before && u < before + mine) {
    var acc = before;
    for (var i = start; i < end; i++) {
      let e = exp((logits[base + i] - mx) * inv_t);
      if (e >= tau) {
        acc += e;
        if (u < acc) { tokens[step.tok_out] = i; break; }
      }
    }
  }
}`;

export interface SamplingOptions {
  /** 0 means greedy (argmax). */
  temperature: number;
  /** Nucleus mass in (0, 1]; 1 keeps every token. */
  topP: number;
  /** Seed of the per-position random numbers. */
  seed: number;
}

/** The sampling words a sampler's `s` uniform holds: temperature, top-p, seed (checked). */
function samplingWords(o: SamplingOptions): Uint32Array<ArrayBuffer> {
  if (!(o.topP > 0 && o.topP <= 1)) throw new RangeError(`top-p must be in (0, 1], got ${o.topP}`);
  if (!(o.temperature >= 0)) throw new RangeError(`temperature must be >= 0, got ${o.temperature}`);
  return packWords([o.temperature, o.topP, o.seed >>> 0], [0, 1], 4);
}

/**
 * A uniform buffer of sampling options for sampleCalls' `sampling`, which writeSampling may rewrite between
 * steps: a sequence reused by another request (models/engine.ts) keeps its programs and takes the new
 * request's temperature, top-p and seed this way.
 */
export function samplingBuffer(gpu: Gpu, o: SamplingOptions): GPUBuffer {
  const buf = gpu.device.createBuffer({ size: 16, usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST });
  writeSampling(gpu, buf, o);
  return buf;
}

/** Writes sampling options into a samplingBuffer (in queue order: steps submitted before it keep the old). */
export function writeSampling(gpu: Gpu, buf: GPUBuffer, o: SamplingOptions): void {
  gpu.device.queue.writeBuffer(buf, 0, samplingWords(o));
}

/**
 * The two dispatches that sample a token from logits row `row`: a partial argmax over many workgroups,
 * then one workgroup that finishes the argmax and (temperature > 0) samples. The options come from
 * `bufs.sampling` (a samplingBuffer) where given, else from `d` (a samplingBuffer of the call's own, which
 * releaseCalls frees with its other uniforms). The partials buffer is the second call's `owned` scratch.
 */
export function sampleCalls(
  gpu: Gpu,
  bufs: { step: GPUBuffer; logits: GPUBuffer; tokens: GPUBuffer; sampling?: GPUBuffer },
  d: { vocab: number; row?: number } & SamplingOptions,
): KernelCall[] {
  const groups = argmaxGroups(gpu, d.vocab);
  const partial = storageBuffer(gpu, groups * 8, "argmax partials");
  const params = uniformBuffer(gpu, [d.vocab, d.row ?? 0, groups]);
  const first = argmaxPartialCall(gpu, { logits: bufs.logits, partial }, {
    vocab: d.vocab,
    T: 1,
    row0: d.row ?? 0,
    label: "argmax_partial",
  });
  const second = kernelCall(gpu, pipeline(gpu, SOURCE), [
    params,
    bufs.sampling ?? samplingBuffer(gpu, d),
    bufs.step,
    bufs.logits,
    bufs.tokens,
    partial,
  ], [
    1,
  ], "sample");
  second.owned = [partial];
  return [first, second];
}

function pcg(v: number): number {
  const state = (Math.imul(v >>> 0, 747796405) + 2891336453) >>> 0;
  const word = Math.imul(((state >>> ((state >>> 28) + 4)) ^ state) >>> 0, 277803737) >>> 0;
  return ((word >>> 22) ^ word) >>> 0;
}

/** The uniform number in [0, 1) the GPU sampler draws for (seed, tokOut). */
export function sampleUniform(seed: number, tokOut: number): number {
  return (pcg(pcg(seed) ^ pcg((tokOut + 0x9e3779b9) >>> 0)) >>> 8) / 16777216;
}

/** Reference sampler: same rule, f64 arithmetic. */
export function sampleRef(logits: Float32Array, o: SamplingOptions & { tokOut: number }): number {
  let best = 0;
  for (let i = 1; i < logits.length; i++) if (logits[i] > logits[best]) best = i;
  if (o.temperature <= 0) return best;
  const mx = logits[best];
  const e = Array.from(logits, (l) => Math.exp((l - mx) / o.temperature));
  let tau = 0;
  if (o.topP < 1) {
    const sorted = [...e].sort((a, b) => b - a);
    const target = e.reduce((a, b) => a + b, 0) * o.topP;
    let acc = 0;
    for (const v of sorted) {
      acc += v;
      tau = v;
      if (acc >= target) break;
    }
  }
  const kept = e.map((v) => (v >= tau ? v : 0));
  const u = sampleUniform(o.seed, o.tokOut) * kept.reduce((a, b) => a + b, 0);
  let acc = 0;
  for (let i = 0; i < kept.length; i++) {
    acc += kept[i];
    if (kept[i] > 0 && u < acc) return i;
  }
  return best;
}
