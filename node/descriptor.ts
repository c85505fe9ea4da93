// This node's descriptor, shared in membership metadata so the planner can place work: GPU adapter name,
// usable memory, addresses, version, and, once the node has measured itself (node/measure.ts), what it
// measured and when. `descriptorView` turns a member's descriptor and its link row into the shape
// `status --json` prints and planner/live.ts reads.
import { getGpu, gpuSlowdown } from "../kernels/gpu.ts";
import { dirname } from "node:path";
import type { LiveDescriptor } from "../planner/live.ts";
import type { Links } from "./links.ts";
import { measureNode, type MeasureOptions } from "./measure.ts";
import { validateMeasurement } from "./membership/messages.ts";
import type { Member, Membership, NodeDescriptor, NodeMeasurement } from "./membership/mod.ts";

export const SWACTOR_VERSION = "0.1.0";

export interface DescribeOptions {
  /** Node name (default: the host name). */
  name?: string;
  /** Skip WebGPU probing (default false; SWACTOR_NO_GPU=1 also skips it). */
  noGpu?: boolean;
  /** Give up probing the adapter after this long (default 3000 ms). */
  gpuTimeoutMs?: number;
  /** Most memory this node offers, bytes (`--memory`; default: no cap). */
  memoryCap?: number;
  /** The node will measure itself: the descriptor says so until it has (default false). */
  measuring?: boolean;
}

/** Whether this process may touch the GPU (SWACTOR_NO_GPU=1 says no). */
export function gpuAllowed(opts: { noGpu?: boolean } = {}): boolean {
  return !opts.noGpu && Deno.env.get("SWACTOR_NO_GPU") !== "1";
}

/**
 * Builds the descriptor. Until the node has measured itself, the memory figure is the cap when there is one,
 * else the adapter's maxBufferSize (WebGPU reports no memory size; that is a lower bound of one allocation);
 * 0 when there is no adapter and no cap.
 */
export async function describeNode(addrs: string[], opts: DescribeOptions = {}): Promise<NodeDescriptor> {
  const gpu = gpuAllowed(opts) ? await probeAdapter(opts.gpuTimeoutMs ?? 3000) : undefined;
  const cap = opts.memoryCap ?? 0;
  const d: NodeDescriptor = {
    name: opts.name ?? Deno.hostname(),
    version: SWACTOR_VERSION,
    adapter: gpu?.name ?? "",
    gpuMemoryBytes: cap > 0 ? cap : gpu?.bytes ?? 0,
    addrs,
    pid: Deno.pid,
  };
  if (opts.measuring && gpu) d.measuring = true;
  return d;
}

export interface SelfMeasureOptions extends MeasureOptions {
  /** Progress lines (default: stderr). */
  log?: (msg: string) => void;
  /**
   * A file another process on this machine writes its measurement to (`writeSharedMeasurement`): wait for it
   * and publish that instead of measuring the same GPU again. `--local N` gives it to its workers. Measures
   * after all when the file says there is none, is not a measurement, was made under another memory cap, or
   * has not come after `adoptWaitMs` (default 30 s).
   */
  adoptFrom?: string;
  adoptWaitMs?: number;
  /**
   * This machine's last measurement, kept in `path` (`--local N` keeps one: cli/local_cluster.ts): published
   * instead of measuring again when this swactor version made it of the same adapter, under the same memory
   * cap and SWACTOR_SLOWDOWN, at most `maxAgeMs` ago, and `changed` (when given) finds no reason to doubt
   * it; else the node measures and writes it there.
   */
  reuse?: {
    path: string;
    maxAgeMs: number;
    /** Why `m` may no longer hold (another process may have taken GPU memory since), or undefined. */
    changed?: (m: NodeMeasurement) => Promise<string | undefined>;
  };
}

/**
 * Measures this node (node/measure.ts), or adopts a measurement of the same GPU (`adoptFrom`) or reuses this
 * machine's recent one (`reuse`), and publishes the result in its descriptor (a new incarnation that
 * membership gossips). Resolves with the measurement, or undefined when there is no GPU or it failed (the
 * descriptor then stops saying `measuring`, so no planner waits for it). Never throws.
 */
export async function selfMeasure(
  membership: Membership,
  opts: SelfMeasureOptions = {},
): Promise<NodeMeasurement | undefined> {
  const log = opts.log ?? ((m: string) => console.error(`swactor: ${m}`));
  let measured: NodeMeasurement | undefined;
  if (opts.adoptFrom) {
    const cap = opts.memoryCap ?? 0;
    const shared = await readSharedMeasurement(opts.adoptFrom, opts.adoptWaitMs ?? 30_000);
    if (shared && shared.memoryCapBytes === cap) {
      measured = shared;
      log(`adopted the measurement of this machine's GPU from ${opts.adoptFrom}: ${measurementLine(shared)}`);
    }
  }
  try {
    const { reuse } = opts;
    const key = reuse && reuseKey(membership.member(membership.id)?.meta.adapter ?? "", opts.memoryCap ?? 0);
    if (!measured && reuse && key) {
      measured = await readReusable(reuse, key);
      const why = measured && reuse.changed && await reuse.changed(measured);
      if (why) {
        log(`measuring again: ${why}`);
        measured = undefined;
      } else if (measured) {
        const age = Math.round((Date.now() - measured.at) / 1000);
        log(
          `measured ${age} s ago: ${measurementLine(measured)} (${reuse.path}; remove it to measure again)`,
        );
      }
    }
    if (!measured) {
      measured = await measureNode(await getGpu(), opts);
      log(`measured: ${measurementLine(measured)}`);
      if (reuse && key) await writeReusable(reuse.path, key, measured).catch(() => {});
    }
  } catch (e) {
    log(`self-measurement failed, planners will use defaults for this node: ${(e as Error).message}`);
  }
  const me = membership.member(membership.id);
  if (!me || me.state !== "alive") return measured; // leaving: say nothing more
  const { measuring: _, ...meta } = me.meta;
  membership.setMetadata(measured ? { ...meta, gpuMemoryBytes: measured.memoryBytes, measured } : meta);
  return measured;
}

/** A member's descriptor in the shape of `status --json` (../shared/CLI.md), with its row of links. */
export function descriptorView(member: Member, links: Links): LiveDescriptor & {
  measuring: boolean;
  memory_cap_bytes: number | null;
  memory_bound: NodeMeasurement["memoryBound"] | null;
  read_weights: "f16" | "f32" | null;
  timestamps: boolean | null;
  measure_ms: number | null;
} {
  const m = member.meta.measured;
  const out: LiveDescriptor["links"] = {};
  for (const [to, l] of links.of(member.id)) {
    out[to] = { rtt_ms: round(l.rttMs, 3), mbps: l.mbps, age_ms: Math.round(l.ageMs), samples: l.samples };
  }
  return {
    measured_at: m ? new Date(m.at).toISOString() : null,
    measuring: member.meta.measuring === true,
    memory_bytes: member.meta.gpuMemoryBytes,
    memory_cap_bytes: m ? (m.memoryCapBytes || null) : null,
    memory_bound: m?.memoryBound ?? null,
    read_gbps: m && m.readGbps.length ? m.readGbps[m.readGbps.length - 1][1] : null,
    read_gbps_by_width: m ? Object.fromEntries(m.readGbps.map(([k, v]) => [String(k), v])) : {},
    cached_gbps_by_width: m ? Object.fromEntries(m.cachedGbps.map(([k, v]) => [String(k), v])) : {},
    cache_bytes: m?.cacheBytes ?? 0,
    read_weights: m?.readWeights ?? null,
    timestamps: m?.timestamps ?? null,
    dispatch_ms: m?.dispatchMs ?? null,
    readback_ms: m?.readbackMs ?? null,
    encode_layer_ms: m?.encodeLayerMs ?? null,
    measure_ms: m?.tookMs ?? null,
    links: out,
  };
}

const round = (x: number, d: number) => Number(x.toFixed(d));

/** One line for a person: "1.0 GiB (cap), 4.80 GB/s at K=4096 (2.25 at 64), step 0.260 ms, ...". */
export function measurementLine(m: NodeMeasurement): string {
  const gib = (m.memoryBytes / 2 ** 30).toFixed(1);
  const [k0, g0] = m.readGbps[0] ?? [0, 0];
  const [k1, g1] = m.readGbps[m.readGbps.length - 1] ?? [0, 0];
  return `${gib} GiB (${m.memoryBound}), ${g1.toFixed(2)} GB/s at K=${k1} (${g0.toFixed(2)} at ${k0}), ` +
    `step ${m.readbackMs.toFixed(3)} ms, dispatch ${m.dispatchMs.toFixed(4)} ms, in ${m.tookMs} ms`;
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

/**
 * Writes a measurement (or that there is none) for `selfMeasure({ adoptFrom })` of other processes on this
 * machine, whole (replaceJson: a reader never sees half a file).
 */
export async function writeSharedMeasurement(path: string, m: NodeMeasurement | undefined): Promise<void> {
  await replaceJson(path, { measured: m ?? null });
}

/** What a reused measurement must have been made under (selfMeasure's `reuse`). */
function reuseKey(adapter: string, memoryCapBytes: number): string {
  return JSON.stringify({ version: SWACTOR_VERSION, adapter, memoryCapBytes, slowdown: gpuSlowdown() });
}

/** The measurement kept at `reuse.path` if it was made under `key` at most `reuse.maxAgeMs` ago. */
async function readReusable(
  reuse: { path: string; maxAgeMs: number },
  key: string,
): Promise<NodeMeasurement | undefined> {
  try {
    const v = JSON.parse(await Deno.readTextFile(reuse.path));
    const m = v?.key === key ? validateMeasurement(v.measured) : undefined;
    const age = m ? Date.now() - m.at : Infinity;
    return age >= 0 && age <= reuse.maxAgeMs ? m : undefined;
  } catch {
    return undefined; // none yet, or not ours to read
  }
}

/** Keeps a fresh measurement for selfMeasure's `reuse`. */
async function writeReusable(path: string, key: string, m: NodeMeasurement): Promise<void> {
  await replaceJson(path, { key, measured: m });
}

/**
 * Writes `value` as JSON to `path`, owner-only, in its folder (made if missing): to a temporary name first,
 * then renamed over it, so a reader sees the old file or the new one whole.
 */
async function replaceJson(path: string, value: unknown): Promise<void> {
  await Deno.mkdir(dirname(path), { recursive: true, mode: 0o700 });
  const tmp = `${path}.${Deno.pid}.tmp`;
  await Deno.writeTextFile(tmp, JSON.stringify(value), { mode: 0o600 });
  await Deno.rename(tmp, path);
}

/** The measurement at `path` once it is there; undefined when it says none, is not one, or `waitMs` passed. */
async function readSharedMeasurement(path: string, waitMs: number): Promise<NodeMeasurement | undefined> {
  const until = Date.now() + waitMs;
  for (;;) {
    try {
      const v = JSON.parse(await Deno.readTextFile(path));
      return validateMeasurement(v?.measured);
    } catch (e) {
      if (!(e instanceof Deno.errors.NotFound) || Date.now() >= until) return undefined;
    }
    await new Promise((r) => setTimeout(r, 50));
  }
}
