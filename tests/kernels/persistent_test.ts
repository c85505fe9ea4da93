// kernels/persistent.ts: composing kernel calls into one persistent dispatch. The composer's text (names
// prefixed, struct members and member accesses left alone, a narrower view's accesses rewritten, the refusals
// with what they name) is checked without a GPU; on the adapter, composed calls must give the dispatch path's
// results bit for bit, and a grid that cannot be all resident must raise the flag rather than pass a barrier
// early. lavapipe runs one or two workgroups of a grid at a time (residentGroups), so the GPU cases compose
// over one workgroup: every phase's virtual grid loops on it, which is what renaming, the views and the
// workgroup-memory zeroing are tested by; the barrier's waiting itself was checked on the H200
// (scripts/bench/gridsync.ts, docs/BENCHMARKS.md).
import assert from "node:assert/strict";
import {
  composePersistent,
  createStepBuffer,
  kernelCall,
  persistentCall,
  persistentRuns,
  pipeline,
  readBack,
  residentGroups,
  runCalls,
  sampleCalls,
  storageBuffer,
  SYNC_BYTES,
  syncFlag,
  uploadBuffer,
  writeStep,
} from "../../kernels/mod.ts";
import { scanWgsl } from "../../kernels/wgsl_scan.ts";
import { generate, loadEngine } from "../../models/engine.ts";
import { fixtureDir } from "../fixtures.ts";
import { gpuOrSkip, randoms } from "./harness.ts";

// Reads x as vec4 and writes y as scalars; relies on its workgroup memory starting at zero.
const SCALE = `struct P { n: u32, k: f32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
const TH = 64u; // a const the workgroup size names
/* a block comment /* nested */ */
var<workgroup> part: array<f32, TH>;
@compute @workgroup_size(TH)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32,
        @builtin(num_workgroups) ng: vec3<u32>) {
  let i = wg.x * TH + li;
  part[li] = part[li] + 1.0;
  workgroupBarrier();
  if (i < p.n) { let v = x[i / 4u]; y[i] = v[i % 4u] * p.k + part[(li + 1u) % TH] + f32(ng.x) * 0.0; }
}`;
// Reads its input as vec4 (the buffer SCALE wrote as scalars) and uses arrayLength of it.
const SHIFT = `struct P { n: u32, k: f32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> y: array<vec4<f32>>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let i = gid.x;
  if (i < p.n / 4u) { y[i] = x[i] * p.k + vec4<f32>(f32(arrayLength(&x))); }
}`;
// Adds into y with an atomic counter (the arrive pattern's signature).
const ARRIVE = `@group(0) @binding(0) var<storage, read_write> y: array<f32>;
@group(0) @binding(1) var<storage, read_write> count: array<atomic<u32>>;
@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>) { y[wg.x] += 1.0; atomicAdd(&count[0], 1u); }`;
const READ = `@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>) { y[wg.x] = x[wg.x]; }`;

const phase = (code: string, buffers: string[], groups = 4) => ({
  code,
  buffers,
  workgroups: [groups, 1, 1] as [number, number, number],
});

Deno.test("the WGSL scanner keeps numbers whole and turns comments into spaces", () => {
  const t = scanWgsl("let a = 1.5e-3f + 0x1fu; // note\n/* x /* y */ z */ b.x");
  const texts = t.filter((x) => x.kind !== "space").map((x) => x.text);
  assert.deepEqual(texts, ["let", "a", "=", "1.5e-3f", "+", "0x1fu", ";", "b", ".", "x"]);
  assert.throws(() => scanWgsl("/* open"), /block comment is not closed/);
});

Deno.test("composePersistent prefixes each module's names and leaves members alone", () => {
  const c = composePersistent([phase(SCALE, ["u1", "x", "y"]), phase(SHIFT, ["u2", "y", "z"])], {
    groups: 2,
    sync: "sync",
  });
  assert.deepEqual(c.buffers, ["sync", "u1", "x", "y", "u2", "z"]);
  assert.deepEqual(c.workgroupSize, [64, 1, 1]);
  assert.equal(c.code.match(/@compute/g)?.length, 1);
  assert.match(c.code, /struct k0_P \{ n: u32, k: f32 \}/);
  assert.match(c.code, /struct k1_P \{ n: u32, k: f32 \}/);
  assert.match(c.code, /var<uniform> sw_b1: k0_P;/);
  assert.match(c.code, /var<workgroup> k0_part: array<f32, k0_TH>;/);
  // Member accesses keep their names; the phase's uniform is its global binding.
  assert.match(c.code, /sw_b1\.n/);
  // y is SCALE's scalars and SHIFT's vec4s: bound once as vec4, SCALE's stores indexing components.
  assert.match(c.code, /var<storage, read_write> sw_b3: array<vec4<f32>>;/);
  assert.match(c.code, /sw_b3\[\(i\) \/ 4u\]\[\(i\) % 4u\] = /);
  // x is only ever vec4: SHIFT's arrayLength of y (its x) counts vec4s, so it stays as it was.
  assert.match(c.code, /arrayLength\(&sw_b3\)/);
  // The phases run over their own grids on the persistent one, a barrier between.
  assert.match(c.code, /for \(var v = sw_wg\.x; v < 4u; v \+= 2u\)/);
  assert.match(c.code, /sw_grid\(1u, sw_li\);/);
  assert.match(
    c.code,
    /k0_main\(vec3<u32>\(v % 4u, \(v \/ 4u\) % 1u, v \/ 4u\), sw_li, vec3<u32>\(4u, 1u, 1u\)\)/,
  );
});

Deno.test("composePersistent refuses what it cannot compose, naming it", () => {
  const sync = "sync";
  const at128 = SHIFT.replace("@workgroup_size(64)", "@workgroup_size(128)");
  assert.throws(
    () =>
      composePersistent([phase(SCALE, ["u1", "x", "y"]), phase(at128, ["u2", "y", "z"])], {
        groups: 1,
        sync,
      }),
    /phase 1 has workgroup size 128x1x1, the first 64x1x1/,
  );
  const asU32 = READ.replace("array<f32>;\n@group(0) @binding(1)", "array<u32>;\n@group(0) @binding(1)");
  assert.throws(
    () => composePersistent([phase(READ, ["a", "b"]), phase(asU32, ["a", "c"])], { groups: 1, sync }),
    /buffer a is declared array<f32> and array<u32>/,
  );
  assert.throws(
    () =>
      composePersistent([phase(SCALE, ["u", "x", "y"]), phase(SCALE, ["u", "x", "z"])], { groups: 1, sync }),
    /buffer u is the uniform of two phases/,
  );
  // Read, written by another phase, read again: the last read could hit a stale L1 line.
  const rwr = [phase(READ, ["a", "b"]), phase(READ, ["c", "a"]), phase(READ, ["a", "d"])];
  assert.throws(
    () => composePersistent(rwr, { groups: 1, sync }),
    /buffer a is read by phase 0, written by phase 1, then read by phase 2/,
  );
  assert.doesNotThrow(() => composePersistent(rwr, { groups: 1, sync, hazards: "allow" }));
  // A kernel with an atomic counter reads its own writes (the last workgroup): one read before is enough.
  assert.throws(
    () => composePersistent([phase(READ, ["y", "b"]), phase(ARRIVE, ["y", "n"])], { groups: 1, sync }),
    /buffer y is read by phase 0, written by phase 1, then read by phase 1/,
  );
  // hazards "atomic": the buffer bound as atomic words, every access through load / store helpers.
  const atomic = composePersistent(rwr, { groups: 1, sync, hazards: "atomic" }).code;
  assert.match(atomic, /var<storage, read_write> sw_b1: array<atomic<u32>>;/);
  assert.match(atomic, /sw_st1_sw_b1\(u32\(wg\.x\), sw_b3\[wg\.x\]\);/);
  assert.match(atomic, /sw_b4\[wg\.x\] = sw_ld1_sw_b1\(u32\(wg\.x\)\);/);
  assert.doesNotMatch(atomic, /sw_b1\[wg/);
  const forms = `@group(0) @binding(0) var<storage, read_write> y: array<vec4<f32>>;
@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>) {
  let a = y[wg.x].x + y[wg.x][1];
  y[wg.x] = vec4<f32>(a);
  y[wg.x].z = a;
  y[wg.x][3] += a;
  y[wg.x] *= 2.0;
  if (y[wg.x].x == a) { y[0] = y[1]; }
}`;
  const c = composePersistent([phase(READ, ["y", "b"]), phase(ARRIVE, ["y", "n"]), phase(forms, ["y"])], {
    groups: 1,
    sync,
    hazards: "atomic",
  }).code;
  for (
    const line of [
      "let a = sw_ld4_sw_b1(u32(wg.x)).x + sw_ld4_sw_b1(u32(wg.x))[1];",
      "sw_st4_sw_b1(u32(wg.x), vec4<f32>(a));",
      "sw_st1_sw_b1(4u * u32(wg.x) + 2u, a);",
      "sw_st1_sw_b1(4u * u32(wg.x) + u32(3), sw_ld1_sw_b1(4u * u32(wg.x) + u32(3)) + (a));",
      "sw_st4_sw_b1(u32(wg.x), sw_ld4_sw_b1(u32(wg.x)) * (2.0));",
      "if (sw_ld4_sw_b1(u32(wg.x)).x == a) { sw_st4_sw_b1(u32(0), sw_ld4_sw_b1(u32(1))); }",
    ]
  ) assert.ok(c.includes(line), `${line}\n${c}`);
  // The arrive kernel's scalar view of the same words: its own width's helpers.
  assert.match(c, /sw_st1_sw_b1\(u32\(wg\.x\), sw_ld1_sw_b1\(u32\(wg\.x\)\) \+ \(1\.0\)\);/);
  // Each phase keeps its workgroup memory (SCALE: 64 f32), and the sum must fit the device's.
  const twice = [phase(SCALE, ["u1", "x", "y"]), phase(SCALE, ["u2", "y", "z"])];
  assert.throws(
    () => composePersistent(twice, { groups: 1, sync, workgroupBytes: 511 }),
    /workgroup memory is 512 bytes, more than the 511 allowed/,
  );
  assert.doesNotThrow(() => composePersistent(twice, { groups: 1, sync, workgroupBytes: 512 }));
  // Written first, then read: fresh, composes.
  assert.doesNotThrow(() =>
    composePersistent([phase(READ, ["a", "b"]), phase(READ, ["b", "c"])], { groups: 1, sync })
  );
  assert.throws(() => composePersistent([phase(READ, ["a", "b"])], { groups: 0, sync }), /groups 0/);
});

const gpu = await gpuOrSkip();
const onGpu = { ignore: gpu === null };

Deno.test({ name: "a composed dispatch gives the calls' results bit for bit", ...onGpu }, async () => {
  const g = gpu!;
  const N = 1000;
  const uni = (n: number, k: number) => {
    const u = g.device.createBuffer({ size: 16, usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST });
    const f = new Float32Array([0, k, 0, 0]);
    new Uint32Array(f.buffer)[0] = n;
    g.device.queue.writeBuffer(u, 0, f);
    return u;
  };
  const x = uploadBuffer(g, randoms(N, 7));
  const outs = () => [storageBuffer(g, N * 4), storageBuffer(g, N * 4)];
  const calls = ([y, z]: GPUBuffer[]) => [
    kernelCall(g, pipeline(g, SCALE), [uni(N, 2), x, y], [Math.ceil(N / 64)], "scale"),
    kernelCall(g, pipeline(g, SHIFT), [uni(N, 3), y, z], [Math.ceil(N / 256)], "shift"),
  ];
  const ref = outs(), got = outs();
  await runCalls(g, calls(ref));
  // One workgroup: 16 virtual workgroups of SCALE in turn, each starting from zeroed workgroup memory.
  const composed = persistentCall(g, calls(got), { groups: 1 });
  await runCalls(g, [composed]);
  assert.deepEqual(
    new Float32Array(await readBack(g, got[1], N * 4)),
    new Float32Array(await readBack(g, ref[1], N * 4)),
  );
  assert.equal(await syncFlag(g, composed.sync), false);
  // One call alone composes too (its sync binding kept, though no barrier waits on it).
  const alone = outs();
  await runCalls(g, [persistentCall(g, [calls(alone)[0]], { groups: 3 })]);
  assert.deepEqual(
    new Float32Array(await readBack(g, alone[0], N * 4)),
    new Float32Array(await readBack(g, ref[0], N * 4)),
  );

  // The engine's sampler: an argmax over 4 workgroups, then one workgroup finishing it.
  const V = 4096;
  const logits = uploadBuffer(g, randoms(V, 9));
  const step = createStepBuffer(g);
  writeStep(g, step, { pos0: 0, T: 1, tokOut: 5 });
  const tokens = storageBuffer(g, 64);
  const sample = sampleCalls(g, { step, logits, tokens }, { vocab: V, temperature: 0, topP: 1, seed: 1 });
  await runCalls(g, sample);
  const want = new Uint32Array(await readBack(g, tokens, 64))[5];
  g.device.queue.writeBuffer(tokens, 0, new Uint32Array(16));
  const runs = persistentRuns(g, sample, { groups: 1, sync: storageBuffer(g, SYNC_BYTES) });
  assert.deepEqual(runs.runs, [2]);
  await runCalls(g, runs.calls);
  assert.equal(new Uint32Array(await readBack(g, tokens, 64))[5], want);
});

Deno.test({ name: "a grid that is not all resident raises the flag", ...onGpu }, async () => {
  const g = gpu!;
  const groups = 16384; // 1M threads: more than any adapter here holds at once (the H200: ~270k)
  const out = storageBuffer(g, groups * 4);
  const sync = storageBuffer(g, SYNC_BYTES);
  const c = composePersistent([phase(READ, ["out", "out2"], groups), phase(READ, ["out2", "out3"], groups)], {
    groups,
    sync: "sync",
    spinBound: 4096,
  });
  const bufs = {
    sync,
    out,
    out2: storageBuffer(g, groups * 4),
    out3: storageBuffer(g, groups * 4),
  } as Record<
    string,
    GPUBuffer
  >;
  await runCalls(g, [kernelCall(g, pipeline(g, c.code), c.buffers.map((b) => bufs[b]), [groups])]);
  assert.equal(await syncFlag(g, sync), true);
  assert.equal(await syncFlag(g, sync), false, "syncFlag clears the flag it read");
  const resident = await residentGroups(g, 64, [8, 2, 1]);
  assert.ok(resident >= 1, `resident ${resident}`);
});

Deno.test({
  name: "decode with tuning.persistent keeps the tokens, and falls back when the grid gives up",
  ...onGpu,
}, async () => {
  const g = gpu!;
  for (
    const [dir, weights] of [["llama-micro", "q4"], ["llama-micro", "f32"], ["kimi-k2-tiny", "q4"]] as const
  ) {
    const engine = await loadEngine(fixtureDir(dir)!, { gpu: g, weights });
    const run = async () =>
      (await generate(engine, [1, 2, 3, 4, 5], {
        maxTokens: 6,
        sampling: { temperature: 0, topP: 1, seed: 1 },
      }))
        .tokens;
    try {
      g.tuning.persistent = undefined;
      const want = await run();
      g.tuning.persistent = 1;
      assert.deepEqual(await run(), want, `${dir} ${weights}`);
      // Runs that go on through the residual and scratch buffers, bound as atomic words.
      g.tuning.persistentHazards = "atomic";
      assert.deepEqual(await run(), want, `${dir} ${weights}, hazards atomic`);
      g.tuning.persistentHazards = undefined;
      if (dir !== "llama-micro" || weights !== "q4") continue;
      // A grid of 8 is not all resident here: the first batch with a step raises the flag, the engine goes
      // back to a dispatch a kernel and runs the request again, passing on each token once.
      g.tuning.persistent = 8;
      const streamed: number[] = [];
      const r = await generate(engine, [1, 2, 3, 4, 5], {
        maxTokens: 6,
        sampling: { temperature: 0, topP: 1, seed: 1 },
        onTokens: (ids) => streamed.push(...ids),
      });
      assert.deepEqual(r.tokens, want);
      assert.deepEqual(streamed, want);
    } finally {
      g.tuning.persistent = undefined;
      g.tuning.persistentHazards = undefined;
    }
  }
});
