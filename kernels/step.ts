// The per-step uniform that every position-dependent kernel reads: where this step's tokens start,
// how many there are, and where the sampled token goes. Written once per step with queue.writeBuffer,
// so a step's kernel calls (bind groups, dispatch sizes) are built once and reused for every token.
import type { Gpu } from "./gpu.ts";

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
  return gpu.device.createBuffer({ size: 16, usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST });
}

export function writeStep(gpu: Gpu, buf: GPUBuffer, s: StepValues): void {
  gpu.device.queue.writeBuffer(buf, 0, new Uint32Array([s.pos0, s.T, s.tokOut, 0]));
}
