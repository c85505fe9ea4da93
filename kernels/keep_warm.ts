// Keeping a chain stage's GPU clock up between its steps (docs/PIPELINE.md, "A stage's GPU clock").
//
// A stage's one-token steps leave its GPU idle most of each token, and the driver's governor then drops the
// SM clock (an H100: 1,980 to ~350 MHz within 3-4 s), so each step takes about twice as long as at full clock.
// WebGPU gives no clock control; what holds the clock is work. After a step, a filler (one workgroup of 32
// threads in an FMA chain: one SM of a hundred, no memory traffic) is queued over a fraction of the gap the
// stage expects before its next step. A queued filler cannot be interrupted, so a step that comes early
// waits for the rest of it: the filler covers only part of the shortest recent gap, and shrinks when steps
// run slow (a filler sized at full clock runs ~5x longer at the lowest clock; a slow step is how that
// shows). WarmController decides (pure, any clock); KeepWarm submits. One KeepWarm serves every stage and
// expert host on a GPU (keepWarmFor): a gap is the GPU's, from any step's end to any step's start.
import {
  commandBuffer,
  type Gpu,
  type KernelCall,
  kernelCall,
  pipeline,
  storageBuffer,
  writeBytes,
} from "./gpu.ts";
import { gpuMs } from "./timer.ts";
import { EnvError } from "./env.ts";
import { clearImmediate, setImmediate } from "node:timers";

/** How a WarmController sizes its fillers; every field has a default (WARM_DEFAULTS). */
export interface WarmSettings {
  /**
   * Share of the expected gap a filler covers, at full clock. Default 0.5: it held 1,850-1,980 MHz at 1-8 ms
   * gaps on an H200 and an H100, where 0.3 held 650-1,100 (H200) and 0.7 did no better (docs/BENCHMARKS.md,
   * the fifty-fifth session).
   */
  fraction: number;
  /** Longest filler, ms at full clock. Default 5. */
  maxFillMs: number;
  /**
   * A gap longer than this (ms) is a pause, not a step's rhythm (a user reading, a slow link): it clears the
   * history, and no filler is queued until `history` short gaps are seen again. Default 25.
   */
  idleMs: number;
  /** Shortest filler worth queuing (ms). Default 0.05. */
  minFillMs: number;
  /** Gaps remembered; the filler is sized to the shortest of them. Default 4. */
  history: number;
}

export const WARM_DEFAULTS: WarmSettings = {
  fraction: 0.5,
  maxFillMs: 5,
  idleMs: 25,
  minFillMs: 0.05,
  history: 4,
};

/**
 * Decides, after each step, how much filler to queue. `start` and `end` bracket each step (`now` in ms, any
 * clock); steps may overlap (several requests), and the gap counted is from the last step's end to the next
 * start while none runs. The clock's state is read from the steps themselves: a step slower than the fastest
 * of its kind seen (`kind`: what the step does, its caller and token count; the fastest at full clock, soon
 * after loading) means a lower clock or a filler that ran into it, and either way the filler shrinks by that
 * ratio.
 */
export class WarmController {
  readonly settings: WarmSettings;
  #gaps: number[] = [];
  #lastEnd: number | undefined;
  #running = 0;
  #best = new Map<string, number>();
  #slow = 1;

  constructor(settings: Partial<WarmSettings> = {}) {
    this.settings = { ...WARM_DEFAULTS, ...settings };
    const s = this.settings;
    if (!(s.fraction > 0 && s.fraction < 1)) {
      throw new RangeError(`fraction must be in (0, 1), got ${s.fraction}`);
    }
    if (!(s.history >= 1) || !Number.isInteger(s.history)) {
      throw new RangeError(`history must be a positive integer, got ${s.history}`);
    }
  }

  /** A step starts at `now`. */
  start(now: number): void {
    if (this.#running++ > 0 || this.#lastEnd === undefined) return;
    const gap = now - this.#lastEnd;
    if (gap > this.settings.idleMs) this.#gaps = [];
    else {
      this.#gaps.push(gap);
      if (this.#gaps.length > this.settings.history) this.#gaps.shift();
    }
  }

  /**
   * A step of `kind` that took `ms` ends at `now`. Returns the filler to queue now, in ms at full clock (0:
   * none): `fraction` of the shortest recent gap, over the steps' slowness, at most `maxFillMs`.
   */
  end(now: number, kind: string, ms: number): number {
    this.#running = Math.max(0, this.#running - 1);
    this.#lastEnd = now;
    const best = Math.min(this.#best.get(kind) ?? Infinity, ms);
    this.#best.set(kind, best);
    const ratio = best > 0 ? ms / best : 1;
    this.#slow = 0.5 * this.#slow + 0.5 * ratio;
    const s = this.settings;
    if (this.#running > 0 || this.#gaps.length < s.history) return 0;
    const fill = Math.min(s.maxFillMs, s.fraction * Math.min(...this.#gaps)) / this.#slow;
    return fill >= s.minFillMs ? fill : 0;
  }

  /** Whether a step runs now (a filler decided before it must not be queued after it). */
  get running(): boolean {
    return this.#running > 0;
  }
}

/** What a KeepWarm did: fillers queued and their total length, ms at full clock. */
export interface WarmStats {
  fills: number;
  fillMs: number;
}

/** Iterations of the filler's FMA chain in the calibration dispatch. */
const CALIBRATION_ITERS = 20_000;

const FILLER_WGSL = `struct Params { iters: u32 }
@group(0) @binding(0) var<storage, read_write> sink: array<f32>;
@group(0) @binding(1) var<uniform> params: Params;
@compute @workgroup_size(32) fn main(@builtin(local_invocation_index) i: u32) {
  var x = sink[i] + f32(i) * 1e-3;
  for (var k = 0u; k < params.iters; k++) { x = fma(x, 0.9999, 1e-4); }
  sink[i] = x;
}`;

/** Queues the filler a WarmController asks for on one GPU (see the top of this file). */
export class KeepWarm {
  readonly stats: WarmStats = { fills: 0, fillMs: 0 };
  #pending: ReturnType<typeof setImmediate> | undefined;

  private constructor(
    readonly gpu: Gpu,
    readonly controller: WarmController,
    /** GPU ms of one FMA iteration at the calibration's clock. */
    readonly msPerIter: number,
    /** One filler dispatch; its uniform (binding 1) holds the iterations. */
    private readonly call: KernelCall,
  ) {}

  /**
   * Builds the filler and times it (timestamp queries; best of three) while the clock is still up from
   * loading. Undefined where the GPU has no timestamps (nothing to size a filler by).
   */
  static async create(gpu: Gpu, settings: Partial<WarmSettings> = {}): Promise<KeepWarm | undefined> {
    if (!gpu.hasTimestamps) return undefined;
    const controller = new WarmController(settings);
    const pipe = pipeline(gpu, FILLER_WGSL);
    const sink = storageBuffer(gpu, 32 * 4, "keep-warm sink");
    // Its own uniform (never one shared by contents): each filler rewrites it.
    const params = gpu.device.createBuffer({
      size: 16,
      usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST,
      label: "keep-warm iterations",
    });
    writeBytes(gpu, params, 0, Uint32Array.of(CALIBRATION_ITERS));
    const call = kernelCall(gpu, pipe, [sink, params], [1], "keep-warm");
    let ms = Infinity;
    for (let i = 0; i < 3; i++) ms = Math.min(ms, await gpuMs(gpu, [call], 1));
    if (!(ms > 0 && Number.isFinite(ms))) {
      sink.destroy();
      params.destroy();
      return undefined;
    }
    return new KeepWarm(gpu, controller, ms / CALIBRATION_ITERS, call);
  }

  /** Call as a step starts (before its submit). */
  start(now = performance.now()): void {
    this.controller.start(now);
  }

  /**
   * Call as a step of `kind` (WarmController.end) that took `ms` ends (its result read). The filler it
   * decides is queued by setImmediate, after the caller has sent the step's result on, unless another step
   * started meanwhile (not a zero setTimeout: Deno runs those ~2 ms late, most of a short gap).
   */
  end(kind: string, ms: number, now = performance.now()): void {
    const fillMs = this.controller.end(now, kind, ms);
    if (fillMs <= 0 || this.#pending !== undefined) return;
    this.#pending = setImmediate(() => {
      this.#pending = undefined;
      if (!this.controller.running) this.#queue(fillMs);
    });
  }

  #queue(fillMs: number): void {
    const iters = Math.max(1, Math.round(fillMs / this.msPerIter));
    writeBytes(this.gpu, this.call.buffers[1], 0, Uint32Array.of(iters));
    this.gpu.device.queue.submit([commandBuffer(this.gpu, [this.call])]);
    this.stats.fills++;
    this.stats.fillMs += fillMs;
  }

  /**
   * Brackets `step` (a step of `T` tokens by `caller`: its kind is both) with start and end. Where `warm` is
   * undefined, just runs it: the callers' one line for either case, and nothing more done a step when off.
   */
  static around<R>(
    warm: KeepWarm | undefined,
    caller: string,
    T: number,
    step: () => Promise<R>,
  ): Promise<R> {
    return warm ? warm.#around(`${caller} T${T}`, step) : step();
  }

  async #around<R>(kind: string, step: () => Promise<R>): Promise<R> {
    const t0 = performance.now();
    this.start(t0);
    try {
      return await step();
    } finally {
      const now = performance.now();
      this.end(kind, now - t0, now);
    }
  }

  /** Frees the filler's buffers (a timer still pending is dropped). */
  destroy(): void {
    clearImmediate(this.#pending);
    this.#pending = undefined;
    for (const b of this.call.buffers) b.destroy();
  }
}

/**
 * SWACTOR_KEEP_WARM: "auto" (the default) keeps a chain stage's clock up on a hardware GPU (on a software
 * adapter the filler would only burn CPU), "1" on any GPU with timestamps, "0" never. Nodes that share one
 * GPU (`up --peers`, `--local`, the lab) default to "0" (cli/workers.ts shareOneGpu).
 */
export function keepWarmFromEnv(text = Deno.env.get("SWACTOR_KEEP_WARM") ?? ""): boolean | "auto" {
  if (text === "" || text === "auto") return "auto";
  if (text === "0" || text === "1") return text === "1";
  throw new EnvError(`SWACTOR_KEEP_WARM must be 0, 1 or auto, got "${text.slice(0, 20)}"`);
}

const shared = new WeakMap<GPUDevice, Promise<KeepWarm | undefined>>();

/**
 * The KeepWarm of `gpu` (one a device, shared by its stages and expert hosts, never destroyed), where
 * `setting` turns it on (`auto`: hardware GPUs only); undefined where off.
 */
export function keepWarmFor(gpu: Gpu, setting: boolean | "auto"): Promise<KeepWarm | undefined> {
  const on = setting === "auto" ? !gpu.isSoftware : setting;
  if (!on) return Promise.resolve(undefined);
  let warm = shared.get(gpu.device);
  if (!warm) shared.set(gpu.device, warm = KeepWarm.create(gpu));
  return warm;
}
