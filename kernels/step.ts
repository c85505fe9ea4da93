// The step record that every position-dependent kernel reads: where this step's tokens start, how many
// there are, and where the sampled token goes. A small storage buffer: the CPU writes it with
// queue.writeBuffer (prefill, pipeline stages), and in a decode batch the `advance` kernel moves it on
// by one token on the GPU, so a whole batch of tokens is one submit with no CPU work between tokens.
// A step's kernel calls (bind groups, dispatch sizes) are built once and reused for every token.
import { type Gpu, type KernelCall, kernelCall, pipeline } from "./gpu.ts";

/** WGSL declaration of the step uniform; kernels bind it as `step`. */
export const STEP_WGSL = `struct Step { pos0: u32, T: u32, tok_out: u32, pad: u32 }`;

export interface StepValues {
  /** Position of the first token of this step (also its index in the token buffer). */
  pos0: number;
  /** Number of tokens in this step (1 when decoding). */
  T: number;
  /** Index in the token buffer where the sampled token is written. */
  tokOut: number;
}

export function createStepBuffer(gpu: Gpu): GPUBuffer {
  // COPY_SRC: tests read it back.
  const usage = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST | GPUBufferUsage.COPY_SRC;
  return gpu.device.createBuffer({ size: 16, usage });
}

const ADVANCE = `${STEP_WGSL}
@group(0) @binding(0) var<storage, read_write> step: Step;
@compute @workgroup_size(1)
fn main() {
  step.pos0 += step.T;
  step.tok_out += step.T;
}`;

/** What advanceCall does, on the CPU (the reference its test checks): pos0 and tok_out move on by T. */
export function advanceRef(s: StepValues): StepValues {
  return { pos0: (s.pos0 + s.T) >>> 0, T: s.T, tokOut: (s.tokOut + s.T) >>> 0 };
}

/** Moves the step on by its T tokens (decode: one), on the GPU. */
export function advanceCall(gpu: Gpu, step: GPUBuffer): KernelCall {
  return kernelCall(gpu, pipeline(gpu, ADVANCE), [step], [1], "advance");
}

export function writeStep(gpu: Gpu, buf: GPUBuffer, s: StepValues): void {
  gpu.device.queue.writeBuffer(buf, 0, new Uint32Array([s.pos0, s.T, s.tokOut, 0]));
}
