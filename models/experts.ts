// Routed experts held apart from their layer's stage (expert parallelism): a node holds, per MoE layer, a
// set of that layer's experts and runs them for the tokens a stage sends it. The stage routed on its own GPU
// and read back only the chosen ids and weights with the normalised activations (models/engine.ts);
// this computes, for every token, the weighted sum of the chosen experts that live here:
//   y[t] = sum over slots j of token t whose expert ids[t, j] is held here: w[t, j] * expert(xn[t])
// Slots of experts held elsewhere add nothing (their ids are past the stack and their weights 0, which both
// of kernels/moe_ffn.ts moeRoutedCalls' paths skip), so the stage's sum over every host's reply is the
// layer's whole routed output. A step of up to 16 tokens runs a GEMV per token and slot; a prefill chunk groups
// its slots by expert (each held expert's weights read once per 16 of its tokens), as a stage's own layers do.
import { type ConvertOn, type WeightSource, WeightUploader } from "./upload.ts";
import type { MoeFfn } from "./config.ts";
import { RequestError } from "./errors.ts";
import { layerPrefix } from "./tensors.ts";
import {
  createMoeRoutedScratch,
  GEMV_MULTI_MAX_T,
  type Gpu,
  KeepWarm,
  MOE_GROUP_MAX_SLOTS,
  moeRoutedCalls,
  type MoeRoutedScratch,
  readBack,
  releaseCalls,
  storageBuffer,
  type WeightType,
  writeBytes,
} from "../kernels/mod.ts";
import { matrixStorage, type WeightsOption } from "./model.ts";

/** Slot id meaning "not held here" (outside every stack, so the kernels skip it). */
const NOT_HERE = 0xffffffff;

/** Runs one MoE layer's routed experts wherever they are held and returns their sum, [T, H]. */
export type ExpertFanout = (layer: number, input: ExpertInput) => Promise<Float32Array>;

/** One request to a host: T tokens of one MoE layer. */
export interface ExpertInput {
  /** The request the step belongs to (for the node's per-request fan-out record). */
  request?: string;
  T: number;
  /** The layer's normalised input (post_attention_layernorm), [T, H]. */
  xn: Float32Array;
  /** The router's choices, global expert ids [T, k]. */
  ids: Uint32Array;
  /** Their weights [T, k]. */
  weights: Float32Array;
  /** How long the stage took to read back xn, ids and weights, ms (for the fan-out's timings). */
  readbackMs?: number;
}

interface LayerStack {
  spec: MoeFfn;
  /** The experts held, ascending; slot in the stack = index here. */
  experts: number[];
  local: Map<number, number>;
  gateUp: GPUBuffer;
  down: GPUBuffer;
  gateUpType: WeightsOption;
  downType: WeightsOption;
}

/** A host's activations for up to T tokens of top-k routing (grown when a bigger step comes). */
interface Scratch {
  T: number;
  k: number;
  I: number;
  experts: number;
  xn: GPUBuffer;
  y: GPUBuffer;
  routed: MoeRoutedScratch;
}

/** Sorted distinct ids, checked against the layer's expert count. */
function checkExperts(layer: number, ids: readonly number[], E: number): number[] {
  const out = [...new Set(ids)].sort((a, b) => a - b);
  const bad = out.find((e) => !Number.isInteger(e) || e < 0 || e >= E);
  if (bad !== undefined) {
    throw new RequestError(`layer ${layer} has experts 0..${E - 1}; asked to hold ${bad}`);
  }
  return out;
}

export class ExpertHost {
  #layers = new Map<number, LayerStack>();
  #scratch: Scratch | undefined;
  #bytes = 0;
  /** Holds the GPU's clock between this host's calls (kernels/keep_warm.ts), where set. */
  keepWarm: KeepWarm | undefined;

  private constructor(readonly gpu: Gpu, readonly hidden: number) {}

  /** Reads the given experts of each MoE layer (only their tensors) and uploads them stacked. */
  static async load(
    gpu: Gpu,
    ckpt: WeightSource,
    hold: ReadonlyMap<number, readonly number[]>,
    opts: {
      weights?: WeightsOption;
      convert?: ConvertOn;
      onProgress?: (done: number, total: number) => void;
    } = {},
  ): Promise<ExpertHost> {
    const c = ckpt.config;
    const host = new ExpertHost(gpu, c.hiddenSize);
    const wt: WeightsOption = opts.weights ?? (gpu.hasF16 ? "f16" : "f32");
    const floatType: WeightType = gpu.hasF16 ? "f16" : "f32";
    const H = c.hiddenSize;
    const jobs: { layer: number; spec: MoeFfn; experts: number[] }[] = [];
    for (const [layer, ids] of hold) {
      if (!(Number.isInteger(layer) && layer >= 0 && layer < c.numLayers)) {
        throw new RequestError(`expert layer ${layer} is outside the model's ${c.numLayers} layers`);
      }
      const spec = c.layer(layer).ffn;
      if (spec.kind !== "moe") throw new RequestError(`layer ${layer} has no experts (it is a dense MLP)`);
      jobs.push({ layer, spec, experts: checkExperts(layer, ids, spec.routing.experts) });
    }
    const total = jobs.reduce((s, j) => s + j.experts.length, 0);
    let done = 0;
    const uploader = new WeightUploader(gpu, ckpt, { on: opts.convert });
    const read = async (names: string[], K: number) => {
      const as = matrixStorage(wt, K, floatType);
      return { buf: await uploader.upload(names, as, K), as };
    };
    const stacks = jobs.map(({ layer, spec, experts }) => {
      const p = layerPrefix(layer);
      const names = experts.map((e) => spec.names.expert(e));
      return { gateUp: names.flatMap((n) => [p + n.gate, p + n.up]), down: names.map((n) => p + n.down) };
    });
    ckpt.readAhead?.(stacks.flatMap((s) => [...s.gateUp, ...s.down]));
    for (const [i, { layer, spec, experts }] of jobs.entries()) {
      const gu = await read(stacks[i].gateUp, H);
      const dn = await read(stacks[i].down, spec.intermediate);
      host.#layers.set(layer, {
        spec,
        experts,
        local: new Map(experts.map((e, i) => [e, i])),
        gateUp: gu.buf,
        down: dn.buf,
        gateUpType: gu.as,
        downType: dn.as,
      });
      done += experts.length;
      opts.onProgress?.(done, total);
    }
    ckpt.stopReadAhead?.();
    await uploader.finish();
    host.#bytes = uploader.bytes;
    return host;
  }

  /** What is held: layer -> expert ids (ascending). */
  held(): Map<number, number[]> {
    return new Map([...this.#layers].map(([l, s]) => [l, s.experts]));
  }

  /** Bytes of expert weights on the GPU. */
  get weightBytes(): number {
    return this.#bytes;
  }

  /** The weighted sum of the chosen experts held here, [T, H] (zero rows where none is). */
  compute(layer: number, input: ExpertInput): Promise<Float32Array> {
    return KeepWarm.around(this.keepWarm, "experts", input.T, () => this.#compute(layer, input));
  }

  async #compute(layer: number, input: ExpertInput): Promise<Float32Array> {
    const s = this.#layers.get(layer);
    if (!s) throw new RequestError(`this node holds no experts of layer ${layer}`);
    const { T } = input;
    const H = this.hidden, k = s.spec.routing.topK, I = s.spec.intermediate;
    if (input.xn.length !== T * H || input.ids.length !== T * k || input.weights.length !== T * k) {
      throw new RequestError(
        `layer ${layer}: expected [${T}, ${H}] activations and [${T}, ${k}] ids and weights; got ${input.xn.length}, ${input.ids.length}, ${input.weights.length} values`,
      );
    }
    const gpu = this.gpu;
    const { xn, y, routed } = this.#buffers(T, k, I, s.experts.length);
    const local = new Uint32Array(T * k);
    const weights = new Float32Array(T * k);
    for (let i = 0; i < T * k; i++) {
      const slot = s.local.get(input.ids[i]);
      local[i] = slot ?? NOT_HERE;
      weights[i] = slot === undefined ? 0 : input.weights[i];
    }
    writeBytes(gpu, xn, 0, input.xn);
    writeBytes(gpu, routed.ids, 0, local);
    writeBytes(gpu, routed.routeWeights, 0, weights);
    const calls = moeRoutedCalls(gpu, { scratch: routed, x: xn, y, gateUp: s.gateUp, down: s.down }, {
      hidden: H,
      intermediate: I,
      T,
      topK: k,
      experts: s.experts.length,
      weights: { gateUp: s.gateUpType, down: s.downType },
      // A GEMV per token and slot up to a k-step's 16 tokens, grouped by expert past that, within the
      // grouping's limit. H100, Qwen3-30B-A3B q4, 64 of 128 experts held (ms a step, upload and read back
      // included; the forty-ninth session): 8 tokens 0.46-0.62 per slot against 0.66-0.87 grouped, 32 tokens
      // 1.14-1.29 against 0.96-1.01, 128 3.0-3.4 against 1.7-1.8, 512 11.8-12.2 against 2.8-4.4.
      grouped: T > GEMV_MULTI_MAX_T && T * k <= MOE_GROUP_MAX_SLOTS,
      accumulate: false,
    });
    const enc = gpu.device.createCommandEncoder();
    const pass = enc.beginComputePass();
    for (const c of calls) {
      pass.setPipeline(c.pipeline);
      pass.setBindGroup(0, c.bindGroup);
      pass.dispatchWorkgroups(...c.workgroups);
    }
    pass.end();
    gpu.device.queue.submit([enc.finish()]);
    try {
      return new Float32Array(await readBack(gpu, y, T * H * 4));
    } finally {
      releaseCalls(calls);
    }
  }

  /** Scratch for T tokens (grown when a bigger step, topK, intermediate or stack comes). */
  #buffers(T: number, k: number, I: number, experts: number): Scratch {
    const s = this.#scratch;
    if (s && s.T >= T && s.k >= k && s.I >= I && s.experts >= experts) return s;
    if (s) destroyScratch(s);
    const n = { T: Math.max(T, s?.T ?? 0), k: Math.max(k, s?.k ?? 0), I: Math.max(I, s?.I ?? 0) };
    const e = Math.max(experts, s?.experts ?? 0);
    const H = this.hidden;
    this.#scratch = {
      ...n,
      experts: e,
      xn: storageBuffer(this.gpu, n.T * H * 4, "experts xn"),
      y: storageBuffer(this.gpu, n.T * H * 4, "experts y"),
      routed: createMoeRoutedScratch(this.gpu, {
        T: n.T,
        hidden: H,
        intermediate: n.I,
        topK: n.k,
        experts: e,
      }),
    };
    return this.#scratch;
  }

  close(): void {
    for (const s of this.#layers.values()) {
      s.gateUp.destroy();
      s.down.destroy();
    }
    if (this.#scratch) destroyScratch(this.#scratch);
    this.#scratch = undefined;
    this.#layers.clear();
  }
}

function destroyScratch(s: Scratch): void {
  for (const b of [s.xn, s.y, ...Object.values(s.routed)]) b.destroy();
}
