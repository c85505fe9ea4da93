// What generate and logits tell a user about their adapter.
import assert from "node:assert/strict";
import { loadLine, softwareAdapterNote } from "../../cli/load_model.ts";

Deno.test("a software adapter without Vulkan's software driver gets the line that installs it", () => {
  const name = "llvmpipe (LLVM 15.0.6, 256 bits)";
  const vulkan = softwareAdapterNote(name, true);
  assert.equal(vulkan, `swactor: GPU: ${name} (software adapter: correct but slow)`);
  const gl = softwareAdapterNote(name, false).split("\n");
  assert.equal(gl[0], vulkan);
  assert.match(gl.slice(1).join(" "), /OpenGL.*apt-get install mesa-vulkan-drivers/s);
});

Deno.test("the load's line: GB (MB below one), seconds and the rate", () => {
  assert.equal(loadLine({ bytes: 2.471e9, ms: 1860 }), "2.47 GB of weights read in 1.86 s (1.33 GB/s)");
  assert.equal(loadLine({ bytes: 34.4e6, ms: 158 }), "34.4 MB of weights read in 0.16 s (0.22 GB/s)");
  assert.equal(loadLine({ bytes: 0, ms: 0 }), "0.0 MB of weights read in 0.00 s");
});
