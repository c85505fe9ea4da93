// This node's descriptor, shared in membership metadata so the planner can place work: GPU adapter name, a
// usable-memory estimate, addresses, version.
import type { NodeDescriptor } from "./membership/mod.ts";

export const SWACTOR_VERSION = "0.1.0";

export interface DescribeOptions {
  /** Node name (default: the host name). */
  name?: string;
  /** Skip WebGPU probing (default false; SWACTOR_NO_GPU=1 also skips it). */
  noGpu?: boolean;
  /** Give up probing the adapter after this long (default 3000 ms). */
  gpuTimeoutMs?: number;
}

/**
 * Builds the descriptor. WebGPU reports no memory size, so the estimate is the adapter's maxBufferSize (a
 * lower bound of what one allocation may use); 0 when there is no adapter.
 */
export async function describeNode(addrs: string[], opts: DescribeOptions = {}): Promise<NodeDescriptor> {
  const gpu = opts.noGpu || Deno.env.get("SWACTOR_NO_GPU") === "1"
    ? undefined
    : await probeAdapter(opts.gpuTimeoutMs ?? 3000);
  return {
    name: opts.name ?? Deno.hostname(),
    version: SWACTOR_VERSION,
    adapter: gpu?.name ?? "",
    gpuMemoryBytes: gpu?.bytes ?? 0,
    addrs,
  };
}

async function probeAdapter(timeoutMs: number): Promise<{ name: string; bytes: number } | undefined> {
  const gpu = (navigator as { gpu?: GPU }).gpu;
  if (!gpu) return undefined;
  let timer: ReturnType<typeof setTimeout> | undefined;
  try {
    const adapter = await Promise.race([
      gpu.requestAdapter(),
      new Promise<null>((r) => (timer = setTimeout(() => r(null), timeoutMs))),
    ]);
    if (!adapter) return undefined;
    const info = adapter.info;
    const name = info.description || [info.vendor, info.device].filter(Boolean).join(" ") ||
      "unknown adapter";
    return { name, bytes: Number(adapter.limits.maxBufferSize) };
  } catch {
    return undefined;
  } finally {
    clearTimeout(timer);
  }
}
