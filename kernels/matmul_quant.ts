// WGSL of the linear layers over q8 / q4 weights (kernels/quant.ts has the format), dequantised in the
// kernel as the weights are read, accumulating in f32; nothing is ever expanded to floats in memory.
//   gemvQuantSource   the decode GEMV (gemv_fused.ts picks it for quantised weights): the same teams,
//                     transforms and reduction as the float one, but a 16-byte load is a unit of 16 (q8)
//                     or 32 (q4) weights, times its group's bf16 scale
//   tiledQuantSource  the 16x16 tiled prefill matmul (matmul.ts), dequantising as it fills the W tile
import type { GemvTuning, InputTransform } from "./gemv_fused.ts";
import {
  QUANT_DECODE_WGSL,
  RMS_PROLOGUE,
  siluMulVec4,
  TEAM_REDUCE_STORE,
  tiledMatmulSource,
} from "./wgsl.ts";

export { QUANT_DECODE_WGSL };
import type { WeightType } from "./gpu.ts";
import { QUANT_GROUP, quantElementWgsl, type QuantType } from "./quant.ts";

const THREADS = 256;

/** Weights per 16-byte load. */
export function quantUnit(t: QuantType): number {
  return t === "q8" ? 16 : 32;
}

export function gemvQuantSource(t: QuantType, f: InputTransform, tune: GemvTuning, nwt: WeightType): string {
  const { team, rows } = tune;
  const U = quantUnit(t);
  const V4 = U / 4; // x vec4s per unit
  const upg = QUANT_GROUP / U; // units per group
  const xs: string[] = [];
  for (let i = 0; i < V4; i++) {
    let v = `x[xrow + ${V4}u * j + ${i}u]`;
    if (f === "silu_mul") {
      xs.push(`let g${i} = ${v};`);
      v = siluMulVec4(`g${i}`, `x[xrow + k4 + ${V4}u * j + ${i}u]`);
    }
    if (f === "rmsnorm") {
      if (nwt === "f16") {
        if (i % 2 === 0) xs.push(`let n${i} = nw[${V4 / 2}u * j + ${i / 2}u];`);
        const [a, b] = i % 2 === 0 ? [`n${i}.x`, `n${i}.y`] : [`n${i - 1}.z`, `n${i - 1}.w`];
        v += ` * inv * vec4<f32>(unpack2x16float(${a}), unpack2x16float(${b}))`;
      } else v += ` * inv * nw[${V4}u * j + ${i}u]`;
    }
    xs.push(`let x${i} = ${v};`);
  }
  const xsum = Array.from({ length: V4 }, (_, i) => `x${i}`).join(" + ");
  const dots = Array.from(
    { length: V4 },
    (_, i) => t === "q8" ? `dot(q8v(wv[${i}]), x${i})` : `dot(q4v(wv[${i >> 1}], ${16 * (i & 1)}u), x${i})`,
  ).join(" + ");
  // q4 codes are q + 8: sum (c - 8) x = dot(c, x) - 8 sum(x), the sum shared by the team's rows.
  const body = t === "q8" ? dots : `${dots} - 8.0 * xsum`;
  const norm = f !== "rmsnorm" ? "" : RMS_PROLOGUE;
  return `
struct P { K: u32, N: u32, T: u32, acc: u32, x_row0: u32, eps: f32, soff: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> W: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
${
    f === "rmsnorm"
      ? `@group(0) @binding(4) var<storage, read> nw: array<vec4<${nwt === "f16" ? "u32" : "f32"}>>;`
      : ""
  }
const TH = ${THREADS}u;
const TEAM = ${team}u;
const R = ${rows}u;
var<workgroup> part: array<f32, ${Math.max(THREADS * rows, THREADS)}>;
${QUANT_DECODE_WGSL}
@compute @workgroup_size(${THREADS})
fn main(
  @builtin(workgroup_id) wg: vec3<u32>,
  @builtin(local_invocation_id) lid: vec3<u32>,
  @builtin(num_workgroups) ng: vec3<u32>,
) {
  let tid = lid.x;
  let team = tid / TEAM;
  let lane = tid % TEAM;
  let t = wg.y;
  let k4 = p.K / 4u;
  let ku = p.K / ${U}u;
  let gpr = p.K / ${QUANT_GROUP}u;
  let xrow = (p.x_row0 + t) * ${f === "silu_mul" ? "2u * k4" : "k4"};
  ${norm}
  let nblk = (p.N + TH / TEAM * R - 1u) / (TH / TEAM * R);
  for (var blk = wg.x; blk < nblk; blk += ng.x) {
  let n0 = (blk * (TH / TEAM) + team) * R;
  var acc: array<f32, ${rows}>;
  for (var j = lane; j < ku; j += TEAM) {
    ${xs.join("\n    ")}
    ${t === "q4" ? `let xsum = dot(${xsum}, vec4<f32>(1.0));` : ""}
    for (var r = 0u; r < R; r++) {
      let row = min(n0 + r, p.N - 1u);
      let wv = W[row * ku + j];
      let g = row * gpr + j / ${upg}u;
      acc[r] += group_scale(g) * (${body});
    }
  }
${TEAM_REDUCE_STORE}
  }
}`;
}

export function tiledQuantSource(t: QuantType): string {
  return tiledMatmulSource({
    params: `struct P { K: u32, N: u32, T: u32, acc: u32, x_row0: u32, soff: u32 }`,
    wDecl: "array<u32>",
    helpers: quantElementWgsl(t, "W"),
    wAt: (e) => `W_at(${e}, p.soff)`,
  });
}
