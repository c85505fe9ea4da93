// The subgroup kernels are written for any subgroup size: GPUs have 4 lanes (older Mali) to 64 (AMD), the
// H200 32, the software adapter 8 (256-bit vectors). llvmpipe takes LP_NATIVE_VECTOR_WIDTH=128 for 4 lanes:
// the kernel tests that lean on the size most (the MoE kernels with the routing fused, the fused expert MLP, top-k past the
// subgroup; MLA's warps per chunk; the decode attention, grouped included) run again at 4 lanes in a child
// process. Both bugs this found (a fifth top-5 choice never written, MLA scores of no warp) gave zeros or
// expert 0 silently. Skipped where the adapter is not llvmpipe or does not take the width.
import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
import { getGpu, NoGpuError } from "../../kernels/gpu.ts";
import { needs } from "../support/needs.ts";

const ROOT = fileURLToPath(new URL("../..", import.meta.url));
const FILES = ["moe_sg_test.ts", "moe_fused_test.ts", "mla_test.ts", "attention_decode_test.ts"].map((f) =>
  `tests/kernels/${f}`
);
const env = { LP_NATIVE_VECTOR_WIDTH: "128", NO_COLOR: "1" };

const gpu = await getGpu().then((g) => g, (e) => {
  if (e instanceof NoGpuError) return null;
  throw e;
});
const llvmpipe = gpu !== null && gpu.adapterName.startsWith("llvmpipe");
/** The subgroup size a child process sees with `env`, or null. */
async function childLanes(): Promise<number | null> {
  const out = await new Deno.Command(Deno.execPath(), {
    args: [
      "eval",
      "--quiet",
      'import { getGpu } from "./kernels/gpu.ts"; console.log((await getGpu()).subgroupSize)',
    ],
    env,
    cwd: ROOT,
    stderr: "null",
  }).output();
  return out.code === 0 ? Number(new TextDecoder().decode(out.stdout).trim()) : null;
}
const fourLanes = llvmpipe && (await childLanes()) === 4;

Deno.test({
  ...needs("subgroup kernels at 4 lanes: the MoE, MLA and decode-attention kernel tests pass there too", {
    "the llvmpipe software adapter": llvmpipe,
    "llvmpipe with LP_NATIVE_VECTOR_WIDTH=128 (4 lanes)": fourLanes,
  }),
  async fn() {
    // Deno has aborted in its own teardown after a summary of every test passed ("corrupted size vs.
    // prev_size in fastbins", the CI run of stop 52, 2026-12-04; scripts/tests.sh says more): such a child
    // runs again, saying so, up to twice (as scripts/tests.sh's passes). Any other failure, or a third abort,
    // fails.
    for (let attempt = 1;; attempt++) {
      const out = await new Deno.Command(Deno.execPath(), {
        args: ["test", "-A", "--quiet", ...FILES],
        env,
        cwd: ROOT,
      }).output();
      const text = new TextDecoder().decode(out.stdout) + new TextDecoder().decode(out.stderr);
      const summary = text.split("\n").filter((l) => /passed|FAILED|error:/.test(l)).slice(-12).join("\n");
      console.log(summary);
      if (attempt < 3 && out.code > 128 && /^ok \| \d+ passed.* \| 0 failed/m.test(text)) {
        console.log(
          `the child died by signal ${out.code - 128} after reporting every test passed: again`,
        );
        continue;
      }
      assert.equal(out.code, 0, text.slice(-4000));
      return;
    }
  },
});
