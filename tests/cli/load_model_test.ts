// What generate and logits tell a user about their adapter.
import assert from "node:assert/strict";
import { softwareAdapterNote } from "../../cli/load_model.ts";

Deno.test("a software adapter without Vulkan's software driver gets the line that installs it", () => {
  const name = "llvmpipe (LLVM 15.0.6, 256 bits)";
  const vulkan = softwareAdapterNote(name, true);
  assert.equal(vulkan, `swactor: GPU: ${name} (software adapter: correct but slow)`);
  const gl = softwareAdapterNote(name, false).split("\n");
  assert.equal(gl[0], vulkan);
  assert.match(gl.slice(1).join(" "), /OpenGL.*apt-get install mesa-vulkan-drivers/s);
});
