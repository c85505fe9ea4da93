// The loader's tensor upload (models/upload.ts): converting on the GPU gives the very bytes the CPU
// conversion gives, for every tensor of real checkpoints (bf16 and f32 fixtures) in every storage, rows
// concatenated as the blocks ask; and a model made from a config alone (models/random_weights.ts) loads
// through the same path, equals its CPU twin, and decodes to finite logits; a load read ahead (fp8, expert
// stacks, dense) gives the logits of one that reads each tensor as asked.
import assert from "node:assert/strict";
import { fixtureDir } from "../fixtures.ts";
import { needs } from "../support/needs.ts";
import { getGpu, NoGpuError, readBack, requestGpu } from "../../kernels/mod.ts";
import { Checkpoint } from "../../models/checkpoint.ts";
import { Engine, wholeModel } from "../../models/engine.ts";
import { Model } from "../../models/model.ts";
import { RandomWeights } from "../../models/random_weights.ts";
import { tensorShapes } from "../../models/tensors.ts";
import { type WeightSource, WeightUploader } from "../../models/upload.ts";
import type { ConvertTarget } from "../../kernels/convert.ts";
import { DEMO_CONFIG_JSON } from "../../models/demo.ts";

const gpu = await getGpu().catch((e) => {
  if (e instanceof NoGpuError) return null;
  throw e;
});

/** Every upload the loader makes of `src` (matrices with their K, vectors without), GPU vs CPU, byte for byte. */
async function compareAll(src: WeightSource, targets: ConvertTarget[]): Promise<number> {
  const shapes = tensorShapes(src.config);
  // Row-wise concatenations like the blocks' (gate+up of each expert, q/k/v), and single tensors.
  const groups: string[][] = [];
  const names = [...shapes.keys()];
  for (let i = 0; i < names.length; i++) {
    const n = names[i];
    const up = n.replace("gate_proj", "up_proj");
    if (n.includes("gate_proj") && shapes.has(up)) groups.push([n, up]);
    else groups.push([n]);
  }
  let compared = 0;
  for (const to of targets) {
    const g = new WeightUploader(gpu!, src), c = new WeightUploader(gpu!, src, { on: "cpu" });
    for (const group of groups) {
      const shape = shapes.get(group[0])!;
      const K = shape.length === 2 ? shape[1] : undefined;
      const as = K === undefined || (to !== "f32" && to !== "f16" && K % 32 !== 0) ? "f32" : to;
      const [a, b] = [await g.upload(group, as, K), await c.upload(group, as, K)];
      const bytes = Math.ceil(Math.min(a.size, b.size) / 4) * 4;
      const [x, y] = [
        new Uint8Array(await readBack(gpu!, a, bytes)),
        new Uint8Array(await readBack(gpu!, b, bytes)),
      ];
      const at = x.findIndex((v, i) => v !== y[i]);
      assert.equal(at, -1, `${group.join("+")} as ${as}: byte ${at} differs`);
      a.destroy();
      b.destroy();
      compared++;
    }
    await g.finish();
    await c.finish();
  }
  return compared;
}

for (const name of ["kimi-k2-tiny", "mixtral-tiny", "qwen3-moe-norm"]) {
  const dir = fixtureDir(name);
  Deno.test(
    needs(`upload: ${name}'s tensors converted on the GPU equal the CPU's, f32/f16/q8/q4`, {
      "a WebGPU adapter": gpu,
      [`the ${name} fixture`]: dir,
    }),
    async () => {
      const ckpt = await Checkpoint.open(dir!);
      const n = await compareAll(ckpt, gpu!.hasF16 ? ["f32", "f16", "q8", "q4"] : ["f32", "q8", "q4"]);
      assert.ok(n > 10);
    },
  );
}

Deno.test(
  needs("upload: random weights from a config alone equal their CPU twin and decode finitely", {
    "a WebGPU adapter": gpu,
  }),
  async () => {
    const src = new RandomWeights({ ...DEMO_CONFIG_JSON, num_hidden_layers: 2 }, 7);
    await compareAll(src, ["f32", "q4"]);
    const model = await Model.load(gpu!, src, { weights: "f32" });
    const engine = new Engine(wholeModel(2), model);
    const logits = await engine.logits([1, 2, 3]);
    assert.ok(logits.every(Number.isFinite), "finite logits");
    assert.ok(new Set(logits).size > 100, "logits vary");
    engine.close();
  },
);

Deno.test(
  needs(
    "a load the GPU cannot allocate stops with GpuMemoryError naming the adapter, and frees what it made",
    {
      "a WebGPU adapter": gpu,
    },
  ),
  async () => {
    const ckpt = await Checkpoint.open(fixtureDir("llama-micro")!);
    // WebGPU reports a failed allocation as an uncaptured out-of-memory error, not an exception: this one
    // comes with the fifth buffer the load makes, as the device would report a real one.
    const device = gpu!.device;
    const made: GPUBuffer[] = [];
    const createBuffer = device.createBuffer;
    device.createBuffer = function (d: GPUBufferDescriptor) {
      const b = createBuffer.call(device, d);
      made.push(b);
      if (made.length === 5) {
        const error = new GPUOutOfMemoryError("not enough memory left");
        device.dispatchEvent(new GPUUncapturedErrorEvent("uncapturederror", { error }));
      }
      return b;
    };
    try {
      await assert.rejects(
        () => Model.load(gpu!, ckpt, { weights: "f32" }),
        (e: Error) =>
          e.name === "GpuMemoryError" && e.message.includes(gpu!.adapterName) &&
          /ran out of memory loading the model's layers 0-\d+ as f32 \(not enough memory left; .*--weights q8 \/ q4/
            .test(e.message),
      );
    } finally {
      device.createBuffer = createBuffer;
    }
    // The weights it had made are freed: using one now is a validation error.
    device.pushErrorScope("validation");
    const enc = device.createCommandEncoder();
    enc.clearBuffer(made[0]);
    device.queue.submit([enc.finish()]);
    assert.ok(await device.popErrorScope(), "the first weight buffer was destroyed");
    // A load after it is whole again.
    const model = await Model.load(gpu!, ckpt, { weights: "f32" });
    model.destroy();
  },
);

Deno.test(
  needs("a load whose GPU device is lost stops with GpuMemoryError saying so", { "a WebGPU adapter": gpu }),
  async () => {
    const ckpt = await Checkpoint.open(fixtureDir("llama-micro")!);
    // A device of its own, lost with the fifth buffer of the load, as an H100 short of memory lost its.
    const own = await requestGpu();
    let n = 0;
    const createBuffer = own.device.createBuffer;
    own.device.createBuffer = function (d: GPUBufferDescriptor) {
      if (++n === 5) own.device.destroy();
      return createBuffer.call(own.device, d);
    };
    await assert.rejects(
      () => Model.load(own, ckpt, { weights: "f32" }),
      (e: Error) =>
        e.name === "GpuMemoryError" && /\(its device was lost: .*; .*--weights q8 \/ q4/.test(e.message),
    );
  },
);

for (const name of ["kimi-k2-fp8", "mixtral-tiny", "llama-micro"]) {
  const dir = fixtureDir(name);
  Deno.test(
    needs(
      `upload: ${name} read ahead (the default) loads to the logits a load reading each tensor as asked gives`,
      {
        "a WebGPU adapter": gpu,
        [`the ${name} fixture`]: dir,
      },
    ),
    async () => {
      const logits = async (readAhead?: { bytes: number }) => {
        const ckpt = await Checkpoint.open(dir!);
        const model = await Model.load(gpu!, ckpt, { weights: "f32", readAhead });
        const engine = new Engine(wholeModel(ckpt.config.numLayers), model);
        try {
          return await engine.logits([1, 2, 3]);
        } finally {
          engine.close();
        }
      };
      const [plain, ahead] = [await logits({ bytes: 0 }), await logits()];
      assert.ok(plain.every(Number.isFinite));
      assert.deepEqual(ahead, plain);
    },
  );
}
