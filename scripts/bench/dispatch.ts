// What a dispatch costs on this stack (Deno's WebGPU, the adapter's driver) apart from its work, and what
// makes WebGPU order two dispatches (kernels/timer.ts dispatchCostUs): tiny dispatches in one compute pass
// as a chain (each reads what the one before wrote, as a model step's kernels do), sharing one read_write
// buffer without sharing data, and independent (a buffer each). One grid is a single workgroup, the other a
// full wave of the GPU, so the second also pays a grid's ramp and drain. One JSON line, GPU µs a dispatch.
//   deno run -A scripts/bench/dispatch.ts [--n 512] [--groups G]
import { parseArgs } from "node:util";
import { scriptArgs } from "../args.ts";
import { getGpu } from "../../kernels/mod.ts";
import { dispatchCostUs, type DispatchOrder } from "../../kernels/timer.ts";

const { values } = scriptArgs(
  import.meta.url,
  (args) =>
    parseArgs({ args, options: { n: { type: "string", default: "512" }, groups: { type: "string" } } }),
);
const gpu = await getGpu();
if (!gpu.hasTimestamps) throw new Error(`${gpu.adapterName} has no timestamp-query: nothing to time`);
const n = Number(values.n);
// A full wave: the H200 holds 132 SMs x 2,048 threads, 8 workgroups of 256 an SM.
const wave = Number(values.groups ?? (gpu.isSoftware ? 4 : 132 * 8));
if (!(Number.isInteger(n) && n >= 2 && Number.isInteger(wave) && wave >= 1)) {
  console.error(
    `dispatch.ts: --n takes an integer >= 2 and --groups one >= 1 (got ${values.n}, ${values.groups})`,
  );
  Deno.exit(2);
}
const result: Record<string, number | string> = {
  bench: "swactor-dispatch",
  adapter: gpu.adapterName,
  n,
  wave,
};
for (const order of ["chain", "shared", "independent"] as DispatchOrder[]) {
  for (const [name, groups] of [["1wg", 1], ["wave", wave]] as const) {
    result[`${order}_${name}_us`] = Number((await dispatchCostUs(gpu, order, { groups, n })).toFixed(3));
  }
}
console.log(JSON.stringify(result));
