// How fast a checkpoint's weights reach the GPU: Model.load of a whole model, in one process, the read-ahead
// settings alternating run by run (models/read_ahead.ts), each load's model freed before the next.
//   deno run -A scripts/bench/load.ts --dir DIR [--weights q4,f16] [--read-ahead 0,512] [--reads 4] [--runs 3]
//     [--drop-caches] [--reads-only]
// --read-ahead: MiB read ahead of the uploads, a list (0: each tensor read as the loader asks for it).
// --reads: reads in flight at once when reading ahead. --drop-caches: before each load, empties the kernel's
// page cache (needs root), so every byte comes from the disk; without it the first load may read from the
// disk and the others from memory. --reads-only: no GPU; reads every tensor of the checkpoint into fresh
// buffers, --reads at once, a line a run (bytes, ms, gb_s): the reads' own ceiling.
// One JSON line a load: weights, read_ahead_mib, bytes (the checkpoint's, read) and gb, ms, gb_s, and where the
// host's time went: read_wait_ms (while a read the loader asked for was outstanding), write_ms
// (queue.writeBuffer: copying into the GPU's staging), submit_ms (queue.submit of the conversions) and
// drain_ms (waiting for the GPU at the end). Then one line per setting with the medians.
import { parseArgs } from "node:util";
import { countArg, scriptArgs } from "../args.ts";
import { UsageError } from "../../cli/command.ts";
import { getGpu } from "../../kernels/mod.ts";
import { Checkpoint } from "../../models/checkpoint.ts";
import { Model, type WeightsOption } from "../../models/model.ts";
import { readTensorBytes } from "../../models/safetensors.ts";
import { median } from "./stats.ts";

const { dir, weights, aheads, reads, runs, dropCaches, readsOnly } = scriptArgs(import.meta.url, (args) => {
  const { values } = parseArgs({
    args,
    options: {
      dir: { type: "string" },
      weights: { type: "string", default: "q4,f16" },
      "read-ahead": { type: "string", default: "0,512" },
      reads: { type: "string", default: "4" },
      runs: { type: "string", default: "3" },
      "drop-caches": { type: "boolean", default: false },
      "reads-only": { type: "boolean", default: false },
    },
  });
  if (!values.dir) throw new UsageError("--dir DIR (a checkpoint folder) is required");
  const weights = values.weights.split(",");
  for (const w of weights) {
    if (!["f32", "f16", "q8", "q4"].includes(w)) {
      throw new UsageError(`--weights: "${w}" is not f32, f16, q8 or q4`);
    }
  }
  return {
    dir: values.dir,
    weights: weights as WeightsOption[],
    aheads: values["read-ahead"].split(",").map((v) => countArg("read-ahead", v, 0)),
    reads: countArg("reads", values.reads),
    runs: countArg("runs", values.runs),
    dropCaches: values["drop-caches"],
    readsOnly: values["reads-only"],
  };
});

if (readsOnly) {
  const infos = [...(await Checkpoint.open(dir)).tensors.values()];
  for (let run = 1; run <= runs; run++) {
    if (dropCaches) await dropPageCache();
    let next = 0, bytes = 0;
    const t0 = performance.now();
    const lane = async () => {
      while (next < infos.length) {
        const got = await readTensorBytes(infos[next++]);
        bytes += got.byteLength; // after the await: `bytes += await ...` would add to a stale total
      }
    };
    await Promise.all(Array.from({ length: reads }, lane));
    const ms = performance.now() - t0;
    console.log(
      JSON.stringify({
        reads_only: true,
        reads,
        bytes,
        ms: Math.round(ms),
        gb_s: +(bytes / 1e6 / ms).toFixed(2),
        run,
      }),
    );
  }
  Deno.exit(0);
}

const gpu = await getGpu();
const queue = gpu.device.queue;
/** Host ms spent in each timed call since the last reset. */
const spent = { read_wait_ms: 0, write_ms: 0, submit_ms: 0, drain_ms: 0 };
function timed<A extends unknown[], R>(key: keyof typeof spent, f: (...a: A) => R): (...a: A) => R {
  return (...a) => {
    const t = performance.now();
    const r = f(...a);
    if (r instanceof Promise) return r.finally(() => spent[key] += performance.now() - t) as R;
    spent[key] += performance.now() - t;
    return r;
  };
}
queue.writeBuffer = timed("write_ms", queue.writeBuffer.bind(queue));
queue.submit = timed("submit_ms", queue.submit.bind(queue));
queue.onSubmittedWorkDone = timed("drain_ms", queue.onSubmittedWorkDone.bind(queue));

async function dropPageCache(): Promise<void> {
  await Deno.writeTextFile("/proc/sys/vm/drop_caches", "3").catch((e) => {
    throw new Error(`--drop-caches: cannot write /proc/sys/vm/drop_caches (${e.message}); run as root`);
  });
}

async function oneLoad(w: WeightsOption, aheadMiB: number): Promise<Record<string, unknown>> {
  if (dropCaches) await dropPageCache();
  const ckpt = await Checkpoint.open(dir);
  // The time some read the loader asked for was outstanding: a stack's reads overlap, so their union.
  const read = ckpt.read.bind(ckpt);
  let outstanding = 0, since = 0;
  ckpt.read = (...a) => {
    if (outstanding++ === 0) since = performance.now();
    return read(...a).finally(() => {
      if (--outstanding === 0) spent.read_wait_ms += performance.now() - since;
    });
  };
  for (const k of Object.keys(spent) as (keyof typeof spent)[]) spent[k] = 0;
  let bytes = 0;
  const t0 = performance.now();
  const model = await Model.load(gpu, ckpt, {
    weights: w,
    readAhead: { bytes: aheadMiB * 2 ** 20, reads },
    onProgress: (done) => bytes = done,
  });
  const ms = performance.now() - t0;
  const phases = Object.fromEntries(Object.entries(spent).map(([k, v]) => [k, Math.round(v)]));
  model.destroy();
  await queue.onSubmittedWorkDone();
  return {
    weights: w,
    read_ahead_mib: aheadMiB,
    bytes,
    gb: +(bytes / 1e9).toFixed(3),
    ms: Math.round(ms),
    gb_s: +(bytes / 1e6 / ms).toFixed(2),
    ...phases,
    adapter: gpu.adapterName,
  };
}

const rows: Record<string, unknown>[] = [];
for (let run = 1; run <= runs; run++) {
  for (const w of weights) {
    for (const a of aheads) {
      const row = { ...await oneLoad(w, a), run };
      rows.push(row);
      console.log(JSON.stringify(row));
    }
  }
}
for (const w of weights) {
  for (const a of aheads) {
    const mine = rows.filter((r) => r.weights === w && r.read_ahead_mib === a);
    const med = (k: string) => Math.round(median(mine.map((r) => r[k] as number)));
    console.log(JSON.stringify({
      summary: true,
      weights: w,
      read_ahead_mib: a,
      ms: med("ms"),
      gb_s: +median(mine.map((r) => r.gb_s as number)).toFixed(2),
      read_wait_ms: med("read_wait_ms"),
      write_ms: med("write_ms"),
      submit_ms: med("submit_ms"),
      runs: mine.length,
    }));
  }
}
