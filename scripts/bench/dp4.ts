// How fast this adapter runs WGSL's dot4I8Packed, against f32 FMAs and against the same dot product
// spelled out in shifts, multiplies and adds (what a shader compiler emits where the driver's integer dot
// product instruction is not enabled: naga uses SPIR-V's OpSDot only where the device enables
// shaderIntegerDotProduct), and against a plain integer op on the same words (xor, accumulated by adds).
// Every thread runs ITER rounds of 8 independent chains, each round UNROLL copies of them (each copy on a
// word of its own, so the loop's own instructions are 1 / UNROLL of a round's: at --unroll 1 they are
// over a fifth, and the rates read low); one JSON line with each variant's rate (G operations a second: a
// dot4I8Packed, a spelled-out dot, an xor-and-add or an FMA each count one).
//   deno run -A scripts/bench/dp4.ts [--iter N] [--groups N] [--unroll U]
import { parseArgs } from "node:util";
import { countArg, scriptArgs } from "../args.ts";
import { UsageError } from "../../cli/command.ts";
import { getGpu, kernelCall, pipeline, storageBuffer } from "../../kernels/mod.ts";
import { gpuMs } from "../../kernels/timer.ts";

const { values } = scriptArgs(import.meta.url, (args) => {
  const parsed = parseArgs({
    args,
    options: {
      iter: { type: "string", default: "2048" },
      groups: { type: "string" },
      unroll: { type: "string", default: "4" },
    },
  });
  countArg("iter", parsed.values.iter);
  if (parsed.values.groups !== undefined) countArg("groups", parsed.values.groups);
  const u = Number(parsed.values.unroll);
  if (!(Number.isInteger(u) && u >= 1 && u <= 16)) {
    throw new UsageError(
      `--unroll takes a positive integer up to 16, got ${JSON.stringify(parsed.values.unroll)}`,
    );
  }
  return parsed;
});
const gpu = await getGpu();
const ITER = Number(values.iter);
const WG = 256;
const groups = Number(values.groups ?? (gpu.isSoftware ? 8 : 132 * 8));
const UNROLL = Number(values.unroll);
if (!gpu.hasDp4) throw new Error(`${gpu.adapterName} has no packed_4x8_integer_dot_product`);

const CHAINS = 8;
const range = (n: number) => Array.from({ length: n }, (_, i) => i);
// The dot spelled out: each byte sign-extended by a shift pair, multiplied and summed.
const spelled = `fn dot_spelled(a: u32, b: u32) -> i32 {
  let x = vec4<i32>(bitcast<i32>(a << 24u), bitcast<i32>(a << 16u), bitcast<i32>(a << 8u), bitcast<i32>(a)) >> vec4<u32>(24u);
  let y = vec4<i32>(bitcast<i32>(b << 24u), bitcast<i32>(b << 16u), bitcast<i32>(b << 8u), bitcast<i32>(b)) >> vec4<u32>(24u);
  return x.x * y.x + x.y * y.y + x.z * y.z + x.w * y.w;
}`;
type Variant = "dp4" | "spelled" | "xor" | "fma";
function source(v: Variant): string {
  const int = v !== "fma";
  const op = (a: string, b: string) =>
    v === "dp4"
      ? `dot4I8Packed(${a}, ${b})`
      : v === "spelled"
      ? `dot_spelled(${a}, ${b})`
      : `bitcast<i32>(${a} ^ ${b})`;
  // Copy u of the chains reads b + u (xb + u): U words made once a round, so the products are not shared.
  const words = range(UNROLL).map((u) =>
    int ? `let b${u} = b + ${u * 0x01020304}u;` : `let xb${u} = xb + ${u}.0;`
  );
  const body = [
    ...words,
    ...range(UNROLL).flatMap((u) =>
      range(CHAINS).map((c) =>
        int ? `acc${c} += ${op(`a${c}`, `b${u}`)};` : `acc${c} = fma(acc${c}, xa${c}, xb${u});`
      )
    ),
  ].join("\n    ");
  return `@group(0) @binding(0) var<storage, read_write> io: array<u32>;
${v === "spelled" ? spelled : ""}
@compute @workgroup_size(${WG})
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
  let seed = io[g.x % 64u];
  ${
    int
      ? range(CHAINS).map((c) => `let a${c} = seed * ${2 * c + 3}u + ${c}u; var acc${c} = 0i;`).join("\n  ")
      : range(CHAINS).map((c) => `let xa${c} = bitcast<f32>(seed) + ${c}.0; var acc${c} = f32(${c});`).join(
        "\n  ",
      )
  }
  var b = seed ^ g.x;
  var xb = f32(g.x);
  for (var i = 0u; i < ${ITER}u; i++) {
    ${body}
    b += 0x01010101u;
    xb += 1.0;
  }
  let s = ${range(CHAINS).map((c) => int ? `acc${c}` : `i32(acc${c})`).join(" + ")};
  if (s == 123456789i) { io[64u + g.x % 64u] = 1u; }
}`;
}

const io = storageBuffer(gpu, 512, "dp4 bench io");
gpu.device.queue.writeBuffer(io, 0, new Uint32Array(128).fill(0x7f3e2d1c));
const ops = groups * WG * ITER * CHAINS * UNROLL;
const rates: Record<string, number> = {};
for (const v of ["fma", "dp4", "spelled", "xor", "dp4", "fma"] as Variant[]) {
  const call = kernelCall(gpu, pipeline(gpu, source(v)), [io], [groups]);
  await gpuMs(gpu, [call], 3);
  let best = Infinity;
  for (let r = 0; r < 3; r++) best = Math.min(best, await gpuMs(gpu, [call], 5));
  const g = ops / (best * 1e6);
  rates[v] = Math.max(rates[v] ?? 0, Number(g.toFixed(1)));
}
console.log(JSON.stringify({
  bench: "dp4-rate",
  adapter: gpu.adapterName,
  groups,
  threads: groups * WG,
  iter: ITER,
  unroll: UNROLL,
  g_ops_s: rates,
  dp4_over_fma: Number((rates.dp4 / rates.fma).toFixed(3)),
  dp4_over_xor: Number((rates.dp4 / rates.xor).toFixed(3)),
  dp4_over_spelled: Number((rates.dp4 / rates.spelled).toFixed(2)),
}));
