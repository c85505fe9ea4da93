// What a test needs from the machine it runs on (a GPU, a fixture, root), decided once at module load, so
// that a test which cannot run here is reported as ignored with the reason in its name, never run and
// passed as if it had checked something:
//
//   const hasGpu = await gpuAvailable();
//   const tiny = fixtureDir("llama3-tiny", { needs: "reference.safetensors" });
//   Deno.test({ ...needs("llama3-tiny on 5 nodes", { "a WebGPU adapter": hasGpu, [SHARED_TINY]: tiny }) }, fn);
import { getGpu, NoGpuError } from "../../kernels/gpu.ts";

/**
 * Deno.test's `name` and `ignore` for a test that runs only when every value of `requires` is truthy;
 * when one is not, the test is ignored and its name ends "(skipped: needs <the keys that failed>)".
 */
export function needs(name: string, requires: Record<string, unknown>): { name: string; ignore: boolean } {
  const missing = Object.entries(requires).filter(([, have]) => !have).map(([what]) => what);
  if (missing.length === 0) return { name, ignore: false };
  return { name: `${name} (skipped: needs ${missing.join(", ")})`, ignore: true };
}

/** Whether this process gets a WebGPU device: false on NoGpuError, any other failure is thrown. */
export function gpuAvailable(): Promise<boolean> {
  return getGpu().then(() => true, (e) => {
    if (e instanceof NoGpuError) return false;
    throw e;
  });
}
