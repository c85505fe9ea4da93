// A persistent dispatch: several kernel calls run as phases of one dispatch whose workgroups meet at a grid
// barrier between phases instead of at a dispatch boundary (docs/KERNELS.md, "A persistent step"). Each call
// keeps its own WGSL: composePersistent takes the modules apart (kernels/wgsl_scan.ts), prefixes each one's
// names, turns its entry point into a function of a virtual workgroup id, merges the bindings by buffer, and
// writes one entry point that runs every phase's virtual grid over a grid of `groups` workgroups, a barrier
// between phases. This file is the one place that knows the barrier.
//
// What a caller must give it:
//  - Residency: the barrier is sound only if all `groups` workgroups are resident at once; WebGPU promises no
//    forward progress between workgroups. residentGroups() finds a grid that was resident at load, and every
//    spin is bounded: a barrier that waits too long raises the sync buffer's flag and goes on, so a caller
//    reads the flag (syncFlag) and re-runs the work when it is set (the engine: on half the grid).
//  - Fresh addresses: an SM's L1 is not kept coherent with other SMs' stores inside a dispatch, so no
//    workgroup may read an address that another workgroup wrote after its SM had read it in the same
//    dispatch. The composer refuses what could (staleRead; atomics and uniforms are exempt), or with
//    `hazards: "atomic"` binds such a buffer as atomic words read and written with atomicLoad / atomicStore,
//    which no L1 keeps; `hazards: "allow"` composes anyway (tests, and probes that read nothing).
//  - One workgroup size: barriers need uniform control flow, so every phase runs at the same size.
// What it does by itself: the phase's workgroup memory is zeroed before each virtual workgroup after the
// first (a dispatch zeroes it once), `num_workgroups` and `workgroup_id` are the phase's own grid, and a
// buffer one phase reads as array<f32> and another as array<vec4<f32>> is bound once as the wider type, the
// scalar phase's accesses rewritten to index its components.
import { closing, type Decl, moduleDecls, nextSig, prevSig, scanWgsl, type Token } from "./wgsl_scan.ts";
import {
  type Gpu,
  type KernelCall,
  kernelCall,
  pipeline,
  pipelineSource,
  readBack,
  runCalls,
  storageBuffer,
} from "./gpu.ts";

export type Hazards = "refuse" | "atomic" | "allow";

/** One call as the composer sees it: its module, its buffers by binding (0..n-1), its grid. */
export interface Phase<B> {
  code: string;
  buffers: readonly B[];
  workgroups: readonly [number, number, number];
  label?: string;
  /** The entry point's name where the module has several (default: its one @compute function). */
  entryPoint?: string;
}

export interface ComposeOptions<B> {
  /** Workgroups of the persistent grid (all must be resident at once). */
  groups: number;
  /** The sync buffer (kernels: storageBuffer of SYNC_BYTES), bound at 0. */
  sync: B;
  /**
   * Where a buffer could be read stale: "refuse" (default) throws; "atomic" binds it as atomic words every
   * phase reads and writes with atomicLoad / atomicStore (no L1); "allow" composes as it is.
   */
  hazards?: Hazards;
  /** Spins of a barrier before it gives up and raises the flag (default 1 << 20). */
  spinBound?: number;
  /** Names B in errors (default String). */
  name?: (b: B) => string;
  /** Only check that the phases compose and return their bindings (no code): persistentRuns's trials. */
  checkOnly?: boolean;
  /**
   * Workgroup memory the device allows (maxComputeWorkgroupStorageSize). Every phase keeps its own
   * workgroup variables, so their sum must fit: Deno's wgpu does not check it, and past it lavapipe
   * corrupted the process's memory. Default: no check.
   */
  workgroupBytes?: number;
}

export interface Composed<B> {
  code: string;
  /** Buffers by binding, the sync buffer first. */
  buffers: B[];
  workgroupSize: [number, number, number];
}

/** Bytes of the sync buffer: [0] arrivals, [1] the give-up flag, [2] workgroups out. */
export const SYNC_BYTES = 16;

const BUILTINS = new Set([
  "workgroup_id",
  "num_workgroups",
  "local_invocation_id",
  "local_invocation_index",
  "global_invocation_id",
  "subgroup_invocation_id",
  "subgroup_size",
]);

interface Binding {
  name: string;
  /** Index among the phase's buffers (its @binding). */
  index: number;
  space: "uniform" | "storage";
  write: boolean;
  type: string;
}

interface Parsed {
  tokens: Token[];
  decls: Decl[];
  entry: Decl;
  bindings: Binding[];
  size: [number, number, number];
  /** Names of the module's structs to their bodies' text (for comparing binding types across phases). */
  structs: Map<string, string>;
  /** Its integer consts whose value is a literal (workgroup sizes and array lengths name them). */
  consts: Map<string, number>;
}

const body = (tokens: readonly Token[], d: Decl) =>
  tokens.slice(d.keyword, d.end).map((t) => t.text).join("");

/**
 * parse's results by module and entry point: persistentRuns composes each growing run again as it adds a
 * call, so a program's modules are parsed many times (kept for the last 256, the kernels of a few programs).
 */
const parsedModules = new Map<string, Parsed>();

function parse(code: string, label: string, entryPoint?: string): Parsed {
  const key = `${entryPoint ?? ""}\n${code}`;
  let p = parsedModules.get(key);
  if (!p) {
    p = parseModule(code, label, entryPoint);
    if (parsedModules.size >= 256) parsedModules.delete(parsedModules.keys().next().value!);
    parsedModules.set(key, p);
  }
  return p;
}

/** An integer a module writes as a literal, a const's name, or a product of those (`TH * R`); NaN otherwise. */
function countOf(text: string, consts: Map<string, number>): number {
  return text.split("*").map((f) => f.trim()).reduce(
    (n, f) => n * (consts.get(f) ?? Number(f.replace(/[iu]$/, ""))),
    1,
  );
}

function parseModule(code: string, label: string, entryPoint?: string): Parsed {
  const tokens = scanWgsl(code);
  const decls = moduleDecls(tokens);
  const entries = decls.filter((d) =>
    d.kind === "fn" && d.attrs.has("compute") && (!entryPoint || d.name === entryPoint)
  );
  if (entries.length !== 1) throw new Error(`${label}: ${entries.length} compute entry points (want one)`);
  const entry = entries[0];
  const consts = new Map<string, number>();
  for (const d of decls) {
    if (d.kind !== "const") continue;
    const m = /=\s*([0-9]+)[iu]?\s*;$/.exec(body(tokens, d));
    if (m) consts.set(d.name, Number(m[1]));
  }
  const dim = (s: string) => {
    const v = countOf(s, consts);
    if (!Number.isInteger(v) || v < 1) {
      throw new Error(`${label}: workgroup size '${s}' is not a number it can read`);
    }
    return v;
  };
  const ws = entry.attrs.get("workgroup_size")!.split(",").map(dim);
  const size: [number, number, number] = [ws[0], ws[1] ?? 1, ws[2] ?? 1];
  const bindings: Binding[] = [];
  for (const d of decls) {
    if (!d.attrs.has("binding")) continue;
    if (d.attrs.get("group") !== "0") throw new Error(`${label}: binding ${d.name} is not in group 0`);
    const [space, access] = d.template!.split(",");
    if (space !== "uniform" && space !== "storage") {
      throw new Error(`${label}: binding ${d.name} is ${space} (only uniform and storage buffers compose)`);
    }
    bindings.push({
      name: d.name,
      index: Number(d.attrs.get("binding")),
      space,
      write: access === "read_write",
      type: d.type!,
    });
  }
  const structs = new Map<string, string>();
  for (const d of decls) if (d.kind === "struct") structs.set(d.name, body(tokens, d).replace(/\s+/g, ""));
  return { tokens, decls, entry, bindings, size, structs, consts };
}

/** Bytes of a phase's workgroup variables (WGSL's sizes and alignments); throws for a type it cannot size. */
function workgroupBytes(p: Parsed, label: string): number {
  let total = 0;
  for (const d of p.decls) {
    if (d.kind !== "var" || d.template !== "workgroup") continue;
    const t = typeLayout(d.type!, p.consts);
    if (!t) {
      throw new Error(`composePersistent: ${label}: cannot size workgroup variable ${d.name}: ${d.type}`);
    }
    total = Math.ceil(total / t.align) * t.align + t.size;
  }
  return total;
}

/** Size and alignment of a WGSL type written without spaces, or undefined for one it does not know. */
function typeLayout(type: string, consts: Map<string, number>): { size: number; align: number } | undefined {
  const scalar: Record<string, number> = { f32: 4, u32: 4, i32: 4, f16: 2, bool: 4 };
  if (type in scalar) return { size: scalar[type], align: scalar[type] };
  if (/^atomic<(u32|i32)>$/.test(type)) return { size: 4, align: 4 };
  let m = /^vec([234])<(f32|u32|i32|f16|bool)>$/.exec(type);
  if (m) {
    const n = Number(m[1]), s = scalar[m[2]];
    return { size: n * s, align: (n === 3 ? 4 : n) * s };
  }
  m = /^array<(.+),([A-Za-z0-9_*]+)>$/.exec(type);
  if (!m) return undefined;
  const el = typeLayout(m[1], consts);
  const count = countOf(m[2], consts);
  if (!el || !Number.isInteger(count)) return undefined;
  return { size: count * Math.ceil(el.size / el.align) * el.align, align: el.align };
}

/** The element of an array type: width 1, 2 or 4 of a base scalar, or undefined for other types. */
function element(type: string): { base: string; width: number } | undefined {
  const m = /^array<(?:vec([234])<(f32|u32|i32|f16)>|(f32|u32|i32|f16))(,.*)?>$/.exec(type);
  if (!m) return undefined;
  return { base: m[2] ?? m[3], width: m[1] ? Number(m[1]) : 1 };
}

/** A type's text with each of the phase's struct names replaced by the struct's body, for comparison. */
function typeKey(p: Parsed, type: string): string {
  return type.replace(/[A-Za-z_][A-Za-z0-9_]*/g, (id) => p.structs.get(id) ?? id);
}

/**
 * The WGSL and bindings of one dispatch running `phases` in order, a grid barrier between consecutive ones.
 * Pure: B is whatever names a buffer (GPUBuffer in persistentCall, strings in tests).
 */
export function composePersistent<B>(phases: readonly Phase<B>[], opts: ComposeOptions<B>): Composed<B> {
  const G = opts.groups;
  if (!(Number.isInteger(G) && G >= 1)) {
    throw new Error(`composePersistent: groups ${G} is not a whole number >= 1`);
  }
  if (phases.length === 0) throw new Error("composePersistent: no phases");
  const nameOf = opts.name ?? String;
  const parsed = phases.map((ph, i) => parse(ph.code, ph.label ?? `phase ${i}`, ph.entryPoint));
  const size = parsed[0].size;
  parsed.forEach((p, i) => {
    if (p.size.join() !== size.join()) {
      throw new Error(
        `composePersistent: ${phases[i].label ?? `phase ${i}`} has workgroup size ${p.size.join("x")}, ` +
          `the first ${size.join("x")}: every phase runs at one size`,
      );
    }
  });

  // Bindings merged by buffer: the sync buffer at 0, then buffers in order of first use.
  interface Global {
    buffer: B;
    slot: number;
    uses: { phase: number; b: Binding }[];
  }
  const globals: Global[] = [];
  const byBuffer = new Map<B, Global>();
  parsed.forEach((p, i) => {
    for (const b of p.bindings) {
      const buffer = phases[i].buffers[b.index];
      if (buffer === undefined) {
        throw new Error(`${phases[i].label ?? `phase ${i}`}: no buffer for binding ${b.index}`);
      }
      let g = byBuffer.get(buffer);
      if (!g) byBuffer.set(buffer, g = { buffer, slot: globals.length + 1, uses: [] }), globals.push(g);
      g.uses.push({ phase: i, b });
    }
  });
  if (byBuffer.has(opts.sync)) throw new Error("composePersistent: the sync buffer is also a phase's buffer");

  // One declaration a buffer; a phase reading a narrower view of it gets its accesses rewritten.
  const decl: string[] = [];
  const helpers = new Map<string, string>();
  const views = parsed.map(() => new Map<string, View>());
  const arrive = (k: number) =>
    parsed[k].bindings.some((x) => x.space === "storage" && x.type.includes("atomic<"));
  for (const g of globals) {
    const gname = `sw_b${g.slot}`;
    const first = g.uses[0];
    const label = () => `buffer ${nameOf(g.buffer)}`;
    if (g.uses.some((u) => u.b.space !== first.b.space)) {
      throw new Error(`composePersistent: ${label()} is both uniform and storage`);
    }
    let type = first.b.type, owner = first.phase;
    if (first.b.space === "uniform") {
      if (g.uses.length > 1) throw new Error(`composePersistent: ${label()} is the uniform of two phases`);
    } else {
      const keys = new Set(g.uses.map((u) => typeKey(parsed[u.phase], u.b.type)));
      if (keys.size > 1) {
        const els = g.uses.map((u) => element(u.b.type));
        const widest = els.reduce((a, e) => (e && a && e.width > a.width ? e : a), els[0]);
        if (
          !widest ||
          els.some((e) => !e || e.base !== widest.base || (e.width !== 1 && e.width !== widest.width))
        ) {
          throw new Error(
            `composePersistent: ${label()} is declared ${g.uses.map((u) => u.b.type).join(" and ")}: ` +
              "phases may differ only as scalars against vectors of one scalar type",
          );
        }
        const at = els.indexOf(widest);
        type = g.uses[at].b.type;
        owner = g.uses[at].phase;
      }
    }
    // A buffer that could be read stale: refused, or (hazards "atomic") bound as atomic<u32> words that every
    // phase reads and writes with atomicLoad / atomicStore, which no SM's L1 keeps.
    const mode = opts.hazards ?? "refuse";
    const stale = first.b.space === "storage" && !type.includes("atomic<") && mode !== "allow"
      ? staleRead(g.uses, arrive, label, phases)
      : undefined;
    let atomic = false;
    if (stale) {
      const els = g.uses.map((u) => /^array<[^,]*>$/.test(u.b.type) ? element(u.b.type) : undefined);
      if (mode === "refuse" || els.some((e) => !e || e.base === "f16" || e.base !== els[0]!.base)) {
        throw stale;
      }
      atomic = true;
    }
    const write = atomic || g.uses.some((u) => u.b.write);
    const space = first.b.space === "uniform" ? "uniform" : `storage, ${write ? "read_write" : "read"}`;
    const declared = atomic ? "array<atomic<u32>>" : renameType(parsed[owner], type, owner);
    decl.push(`@group(0) @binding(${g.slot}) var<${space}> ${gname}: ${declared};`);
    const wide = element(type)?.width ?? 1;
    for (const u of g.uses) {
      const e = element(u.b.type);
      const w = e?.width ?? wide;
      if (atomic) {
        views[u.phase].set(u.b.name, { global: gname, factor: 1, atomic: { width: w, scalar: e!.base } });
        helpers.set(`${gname}/${w}`, atomicHelpers(gname, w, e!.base));
        helpers.set(`${gname}/1`, atomicHelpers(gname, 1, e!.base));
      } else views[u.phase].set(u.b.name, { global: gname, factor: w === wide ? 1 : wide });
    }
  }

  if (opts.workgroupBytes !== undefined) {
    const used = parsed.reduce((sum, p, i) => sum + workgroupBytes(p, phases[i].label ?? `phase ${i}`), 0);
    if (used > opts.workgroupBytes) {
      throw new Error(
        `composePersistent: the phases' workgroup memory is ${used} bytes, more than the ${opts.workgroupBytes} allowed`,
      );
    }
  }
  if (opts.checkOnly) {
    return {
      code: "",
      buffers: [opts.sync, ...globals.map((g) => g.buffer)],
      workgroupSize: size,
    };
  }

  const directives = new Set<string>();
  const parts: string[] = [];
  const calls: string[] = [];
  const usedBuiltins = new Set<string>(["workgroup_id", "local_invocation_index"]);
  parsed.forEach((p, i) => {
    const prefix = `k${i}_`;
    const rename = new Map<string, string>();
    for (const d of p.decls) if (d.name && !views[i].has(d.name)) rename.set(d.name, prefix + d.name);
    for (const [name, v] of views[i]) rename.set(name, v.global);
    const out: string[] = [];
    for (const d of p.decls) {
      if (d.kind === "directive") directives.add(body(p.tokens, d).replace(/\s+/g, " "));
      else if (d.attrs.has("binding")) continue;
      else if (d === p.entry) out.push(entryFunction(p, d, rename, views[i], prefix));
      else out.push(emit(p.tokens, d.start, d.end, rename, views[i], d.kind === "struct"));
    }
    const zero = zeroFunction(p, prefix);
    if (zero) out.push(zero.fn);
    parts.push(`// ---- phase ${i}: ${phases[i].label ?? ""}\n${out.join("\n")}`);
    const params = entryParams(p);
    for (const b of params) usedBuiltins.add(b);
    const [X, Y, Z] = phases[i].workgroups;
    const total = X * Y * Z;
    const vwg = `vec3<u32>(v % ${X}u, (v / ${X}u) % ${Y}u, v / ${X * Y}u)`;
    const args = params.map((b) => {
      switch (b) {
        case "workgroup_id":
          return vwg;
        case "num_workgroups":
          return `vec3<u32>(${X}u, ${Y}u, ${Z}u)`;
        case "global_invocation_id":
          return `${vwg} * vec3<u32>(${size[0]}u, ${size[1]}u, ${size[2]}u) + sw_lid`;
        case "local_invocation_id":
          return "sw_lid";
        case "local_invocation_index":
          return "sw_li";
        case "subgroup_invocation_id":
          return "sw_sgid";
        default:
          return "sw_sgsize";
      }
    });
    const again = zero
      ? `    if (v != sw_wg.x) { workgroupBarrier(); ${prefix}sw_zero(sw_li); workgroupBarrier(); }\n`
      : "";
    if (i > 0) calls.push(`  sw_grid(${i}u, sw_li);`);
    calls.push(
      `  for (var v = sw_wg.x; v < ${total}u; v += ${G}u) {\n${again}    ${prefix}main(${
        args.join(", ")
      });\n  }`,
    );
  });

  const bound = opts.spinBound ?? 1 << 20;
  const builtinParam: Record<string, string> = {
    workgroup_id: "@builtin(workgroup_id) sw_wg: vec3<u32>",
    local_invocation_index: "@builtin(local_invocation_index) sw_li: u32",
    local_invocation_id: "@builtin(local_invocation_id) sw_lid: vec3<u32>",
    global_invocation_id: "@builtin(local_invocation_id) sw_lid: vec3<u32>",
    subgroup_invocation_id: "@builtin(subgroup_invocation_id) sw_sgid: u32",
    subgroup_size: "@builtin(subgroup_size) sw_sgsize: u32",
  };
  const entryParamsText = [
    ...new Set([...usedBuiltins].filter((b) => b !== "num_workgroups").map((b) => builtinParam[b])),
  ];
  const code = `${[...directives].join("\n")}
// A persistent dispatch of ${phases.length} phases over ${G} workgroups (kernels/persistent.ts).
@group(0) @binding(0) var<storage, read_write> sw_sync: array<atomic<u32>, 4>;
${decl.join("\n")}
${[...helpers.values()].join("\n")}

// Every workgroup at the n-th barrier: its first thread counts it in and spins until all ${G} have, or
// gives up after ~${bound} spins and raises sw_sync[1] (the grid was not all resident). Whether it gave up
// is read from the count after the spin, whatever ended it: lavapipe ends any loop after 65,535
// iterations, so the spin is two nested loops of at most 4,096 and the flag does not trust its own bound.
fn sw_grid(n: u32, li: u32) {
  storageBarrier();
  if (li == 0u) {
    atomicAdd(&sw_sync[0], 1u);
    for (var outer = 0u; outer < ${Math.max(1, Math.ceil(bound / 4096))}u; outer++) {
      var done = false;
      for (var spin = 0u; spin < 4096u; spin++) {
        if (atomicLoad(&sw_sync[0]) >= n * ${G}u) { done = true; break; }
      }
      if (done) { break; }
    }
    if (atomicLoad(&sw_sync[0]) < n * ${G}u) { atomicStore(&sw_sync[1], 1u); }
  }
  storageBarrier();
}

${parts.join("\n\n")}

@compute @workgroup_size(${size.join(", ")})
fn main(${entryParamsText.join(", ")}) {
${calls.join("\n")}
  // The last workgroup out resets the count for the next dispatch (the flag stays for the host to read).
  storageBarrier();
  if (sw_li == 0u && atomicAdd(&sw_sync[2], 1u) == ${G - 1}u) {
    atomicStore(&sw_sync[0], 0u);
    atomicStore(&sw_sync[2], 0u);
  }
}
`;
  return { code, buffers: [opts.sync, ...globals.map((g) => g.buffer)], workgroupSize: size };
}

/**
 * Throws where a phase could read a line of a buffer that its SM read before another SM wrote it:
 *  - read in phase i, written in j > i, read in k > j;
 *  - read in phase i, written in j > i by a phase with an atomic counter: such a kernel's last workgroup
 *    reads what the others wrote (the arrive pattern), so its writes are read in the phase that makes them.
 * A read_write binding counts as a read too (accumulating outputs read), so the check is conservative.
 */
function staleRead<B>(
  uses: { phase: number; b: Binding }[],
  arrive: (phase: number) => boolean,
  label: () => string,
  phases: readonly Phase<B>[],
): Error | undefined {
  let firstRead = -1, writtenAfter = -1;
  const n = (k: number) => phases[k].label ?? `phase ${k}`;
  const stale = (by: number, at: number) =>
    new Error(
      `composePersistent: ${label()} is read by ${n(firstRead)}, written by ${n(by)}, then read by ${
        n(at)
      } ` +
        "in one dispatch: that read may see a stale L1 line; give the write a buffer of its own",
    );
  for (const { phase, b } of uses) {
    if (writtenAfter >= 0 && phase > writtenAfter) return stale(writtenAfter, phase);
    if (b.write && firstRead >= 0 && phase > firstRead) {
      if (arrive(phase)) return stale(phase, phase);
      if (writtenAfter < 0) writtenAfter = phase;
    }
    if (firstRead < 0) firstRead = phase;
  }
  return undefined;
}

/** How a phase's binding name is written in the composed module. */
interface View {
  global: string;
  /** Components per element of the global's type where the phase declares scalars of it (1: the same type). */
  factor: number;
  /** An atomic global (hazards "atomic"): the phase's element width and scalar type. */
  atomic?: { width: number; scalar: string };
}

/** Load and store functions of `width` consecutive words of atomic global `g`, as `scalar`s. */
function atomicHelpers(g: string, width: number, scalar: string): string {
  const t = width === 1 ? scalar : `vec${width}<${scalar}>`;
  const word = (k: number) => `bitcast<${scalar}>(atomicLoad(&${g}[b + ${k}u]))`;
  const loads = Array.from({ length: width }, (_, k) => word(k));
  const stores = Array.from(
    { length: width },
    (_, k) => `atomicStore(&${g}[b + ${k}u], bitcast<u32>(v${width === 1 ? "" : `[${k}]`}));`,
  );
  const value = width === 1 ? loads[0] : `${t}(${loads.join(", ")})`;
  // Clamped into the buffer as a plain access is (WebGPU's robust access): a kernel may read past its row
  // and rely on that, and an atomic out of bounds is not clamped for it everywhere (on lavapipe it
  // corrupted the process's memory).
  const b = `let b = min(${width}u * i, arrayLength(&${g}) - ${width}u);`;
  return `fn sw_ld${width}_${g}(i: u32) -> ${t} { ${b} return ${value}; }
fn sw_st${width}_${g}(i: u32, v: ${t}) { ${b} ${stores.join(" ")} }`;
}

function renameType(p: Parsed, type: string, phase: number): string {
  return type.replace(/[A-Za-z_][A-Za-z0-9_]*/g, (id) => (p.structs.has(id) ? `k${phase}_${id}` : id));
}

/**
 * An access `name[i]` of an atomic global, its `[` at tokens[open]: a read becomes a load of the
 * element (a suffix like `.x` or `[j]` follows it as it was); `name[i] = e;` and `name[i] op= e;` (op one of
 * + - * /), also of one component (`name[i][j]`, `name[i].x`), become stores up to the `;`. `last`: the last
 * token consumed.
 */
function atomicAccess(
  tokens: readonly Token[],
  open: number,
  g: string,
  width: number,
  text: (a: number, b: number) => string,
): { text: string; last: number } {
  const end = closing(tokens, open);
  const idx = `u32(${text(open + 1, end)})`;
  // One component of a vector element, for stores to it.
  let comp: string | undefined, suffixEnd = end;
  const after = nextSig(tokens, end + 1);
  if (width > 1 && tokens[after]?.text === "[") {
    suffixEnd = closing(tokens, after);
    comp = `u32(${text(after + 1, suffixEnd)})`;
  } else if (width > 1 && tokens[after]?.text === ".") {
    const letter = nextSig(tokens, after + 1);
    const k = "xyzw".indexOf(tokens[letter]?.text ?? "");
    if (tokens[letter]?.text.length === 1 && k >= 0) comp = `${k}u`, suffixEnd = letter;
  }
  const op = nextSig(tokens, suffixEnd + 1);
  const t1 = tokens[op]?.text, t2 = tokens[nextSig(tokens, op + 1)]?.text;
  const assign = t1 === "=" && t2 !== "=";
  const compound = ["+", "-", "*", "/"].includes(t1 ?? "") && t2 === "=";
  if (!assign && !compound) return { text: `sw_ld${width}_${g}(${idx})`, last: end };
  const rhs = assign ? op + 1 : nextSig(tokens, op + 1) + 1;
  let semi = rhs;
  while (semi < tokens.length && tokens[semi].text !== ";") {
    semi = "([{".includes(tokens[semi].text) ? closing(tokens, semi) + 1 : semi + 1;
  }
  const [w, where] = comp !== undefined ? [1, `${width}u * ${idx} + ${comp}`] : [width, idx];
  const e = text(rhs, semi).trim();
  const value = compound ? `sw_ld${w}_${g}(${where}) ${t1} (${e})` : e;
  return { text: `sw_st${w}_${g}(${where}, ${value})`, last: semi - 1 };
}

/**
 * Tokens [a, b) as text: names in `rename` replaced (not after `.`, not a struct's member names), and a
 * narrower view's `name[i]` rewritten as `global[(i) / w][(i) % w]`, `arrayLength(&name)` as w times the
 * global's.
 */
function emit(
  tokens: readonly Token[],
  a: number,
  b: number,
  rename: Map<string, string>,
  view: Map<string, View>,
  struct = false,
): string {
  let s = "";
  let depth = 0;
  for (let i = a; i < b; i++) {
    const t = tokens[i];
    if (struct && t.text === "{") depth++;
    if (struct && t.text === "}") depth--;
    if (t.kind !== "id") {
      s += t.text;
      continue;
    }
    if (t.text === "arrayLength") {
      // arrayLength(&name) of a narrower view: the global's length times its width.
      const o = nextSig(tokens, i + 1), amp = nextSig(tokens, o + 1);
      const name = nextSig(tokens, amp + 1), c = nextSig(tokens, name + 1);
      const v = view.get(tokens[name]?.text);
      if (tokens[o]?.text === "(" && tokens[amp]?.text === "&" && tokens[c]?.text === ")" && v) {
        if (v.atomic) s += `(arrayLength(&${v.global}) / ${v.atomic.width}u)`;
        else if (v.factor > 1) s += `(arrayLength(&${v.global}) * ${v.factor}u)`;
        else s += `arrayLength(&${v.global})`;
        i = c;
        continue;
      }
    }
    const prev = tokens[prevSig(tokens, i)]?.text;
    const next = nextSig(tokens, i + 1);
    if (prev === "." || (struct && depth === 1 && tokens[next]?.text === ":")) {
      s += t.text;
      continue;
    }
    const v = view.get(t.text);
    if (v?.atomic) {
      if (tokens[next]?.text !== "[") {
        throw new Error(
          `composePersistent: ${t.text} (atomic in the composed module) is used other than by index`,
        );
      }
      const r = atomicAccess(
        tokens,
        next,
        v.global,
        v.atomic.width,
        (a, b) => emit(tokens, a, b, rename, view),
      );
      s += r.text;
      i = r.last;
      continue;
    }
    if (v && v.factor > 1) {
      const { global: g, factor: w } = v;
      if (tokens[next]?.text === "[") {
        const end = closing(tokens, next);
        const inner = emit(tokens, next + 1, end, rename, view);
        s += `${g}[(${inner}) / ${w}u][(${inner}) % ${w}u]`;
        i = end;
        continue;
      }
      throw new Error(`composePersistent: ${t.text} (a narrower view of ${g}) is used other than by index`);
    }
    s += rename.get(t.text) ?? t.text;
  }
  return s;
}

/** The builtins the entry point takes, in parameter order. */
function entryParams(p: Parsed): string[] {
  const { tokens, entry } = p;
  const open = nextSig(tokens, nextSig(tokens, entry.keyword + 1) + 1);
  const end = closing(tokens, open);
  const out: string[] = [];
  for (let i = open + 1; i < end; i++) {
    if (tokens[i].text !== "@") continue;
    const name = nextSig(tokens, i + 1);
    if (tokens[name].text !== "builtin") {
      throw new Error(`entry parameter with @${tokens[name].text} cannot compose`);
    }
    const arg = nextSig(tokens, name + 1);
    const b = tokens[nextSig(tokens, arg + 1)].text;
    if (!BUILTINS.has(b)) throw new Error(`entry parameter @builtin(${b}) cannot compose`);
    out.push(b);
    i = closing(tokens, arg);
  }
  return out;
}

/** The entry point as `fn <prefix>main(params)`: attributes dropped, the body renamed. */
function entryFunction(
  p: Parsed,
  d: Decl,
  rename: Map<string, string>,
  view: Map<string, View>,
  prefix: string,
): string {
  const { tokens } = p;
  const open = nextSig(tokens, nextSig(tokens, d.keyword + 1) + 1);
  const end = closing(tokens, open);
  let params = "";
  for (let i = open + 1; i < end; i++) {
    if (tokens[i].text === "@") {
      const name = nextSig(tokens, i + 1);
      const arg = nextSig(tokens, name + 1);
      i = tokens[arg].text === "(" ? closing(tokens, arg) : name;
      continue;
    }
    params += tokens[i].text;
  }
  const bodyOpen = nextSig(tokens, end + 1);
  if (tokens[bodyOpen].text !== "{") throw new Error("composePersistent: an entry point with a return type");
  const ptoks = scanWgsl(params);
  return `fn ${prefix}main(${emit(ptoks, 0, ptoks.length, rename, view)}) ${
    emit(tokens, bodyOpen, d.end, rename, view)
  }`;
}

/** A function zeroing the phase's workgroup variables, threads striding over arrays; undefined if none. */
function zeroFunction(p: Parsed, prefix: string): { fn: string } | undefined {
  const { consts } = p;
  const threads = p.size[0] * p.size[1] * p.size[2];
  const lines: string[] = [];
  for (const d of p.decls) {
    if (d.kind !== "var" || d.template !== "workgroup") continue;
    const name = prefix + d.name;
    const type = renameType(p, d.type!, Number(prefix.slice(1, -1)));
    const arr = /^array<(.*),([A-Za-z0-9_*]+)>$/.exec(type);
    const len = arr ? countOf(arr[2], consts) : NaN;
    if (arr && Number.isInteger(len) && !arr[1].startsWith("array<")) {
      const zero = arr[1].startsWith("atomic<") ? `atomicStore(&${name}[i], 0)` : `${name}[i] = ${arr[1]}()`;
      lines.push(`  for (var i = li; i < ${len}u; i += ${threads}u) { ${zero}; }`);
    } else if (type.startsWith("atomic<")) {
      lines.push(`  if (li == 0u) { atomicStore(&${name}, 0); }`);
    } else {
      lines.push(`  if (li == 0u) { ${name} = ${type}(); }`);
    }
  }
  if (lines.length === 0) return undefined;
  return { fn: `fn ${prefix}sw_zero(li: u32) {\n${lines.join("\n")}\n}` };
}

/**
 * One KernelCall running `calls` as phases of a persistent dispatch over `groups` workgroups. Consecutive
 * persistent dispatches may share one sync buffer (`sync`): each resets the count as it ends.
 */
export function persistentCall(
  gpu: Gpu,
  calls: readonly KernelCall[],
  opts: {
    groups: number;
    hazards?: Hazards;
    spinBound?: number;
    label?: string;
    sync?: GPUBuffer;
  },
): KernelCall & { sync: GPUBuffer } {
  const sync = opts.sync ?? storageBuffer(gpu, SYNC_BYTES, `${opts.label ?? "persistent"} sync`);
  const phases = calls.map((c, i) => {
    const src = pipelineSource(c.pipeline);
    if (!src) throw new Error(`persistentCall: call ${c.label ?? i} was not built by kernels' pipeline()`);
    return { ...src, buffers: c.buffers, workgroups: c.workgroups, label: c.label ?? `call ${i}` };
  });
  const composed = composePersistent(phases, {
    groups: opts.groups,
    sync,
    hazards: opts.hazards,
    spinBound: opts.spinBound,
    name: (b) => b.label || "(unlabelled)",
    workgroupBytes: gpu.device.limits.maxComputeWorkgroupStorageSize,
  });
  const over = bindingsOver(gpu, composed.buffers);
  if (over) throw new Error(`persistentCall: ${over}`);
  const call = kernelCall(
    gpu,
    pipeline(gpu, composed.code),
    composed.buffers,
    [opts.groups],
    opts.label ?? "persistent",
  );
  // The calls' uniform buffers stay theirs (released with them): the composed call owns only its own sync
  // buffer, and is dropped, not passed to releaseCalls.
  return { ...call, buffers: [], owned: opts.sync ? [] : [sync], sync };
}

/** What of a composed dispatch's `buffers` (its sync buffer, storage, first) the adapter cannot bind to one stage. */
function bindingsOver(gpu: Gpu, buffers: readonly GPUBuffer[]): string | undefined {
  const uniforms = buffers.filter((b) => (b.usage & GPUBufferUsage.UNIFORM) !== 0).length;
  const storage = buffers.length - uniforms;
  const l = gpu.device.limits;
  if (storage > l.maxStorageBuffersPerShaderStage) {
    return `${storage} storage buffers, more than the adapter binds to a stage (${l.maxStorageBuffersPerShaderStage})`;
  }
  if (uniforms > l.maxUniformBuffersPerShaderStage) {
    return `${uniforms} uniform buffers, more than the adapter binds to a stage (${l.maxUniformBuffersPerShaderStage})`;
  }
  return undefined;
}

/** Whether a persistent dispatch gave up waiting at a barrier since the flag was last cleared (then clears it). */
export async function syncFlag(gpu: Gpu, sync: GPUBuffer): Promise<boolean> {
  const raised = new Uint32Array(await readBack(gpu, sync, SYNC_BYTES))[1] !== 0;
  if (raised) gpu.device.queue.writeBuffer(sync, 4, new Uint32Array([0]));
  return raised;
}

/**
 * The largest grid of `size` threads a workgroup, from `candidates` (descending), whose workgroups were all
 * resident at once: a barrier-only dispatch of that grid, run `repeats` times in one submit, never raises
 * its flag. A measurement at load, not a promise (another process's work can take SMs later; callers still
 * read each dispatch's flag). 0 if not even the last candidate passes.
 */
export async function residentGroups(
  gpu: Gpu,
  size: number,
  candidates: readonly number[] = [1056, 528, 264, 132, 64, 32, 16, 8, 4, 2, 1],
  repeats = 3,
): Promise<number> {
  const probe = `@group(0) @binding(0) var<storage, read_write> o: array<u32>;
@compute @workgroup_size(${size})
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
  if (li == 0u) { o[wg.x] = 1u; }
}`;
  for (const groups of candidates) {
    const sync = storageBuffer(gpu, SYNC_BYTES, "residency probe");
    const out = storageBuffer(gpu, 4 * groups, "residency probe out");
    const phase = { code: probe, buffers: [out], workgroups: [groups, 1, 1] as const };
    const { code } = composePersistent([phase, phase], {
      groups,
      sync,
      spinBound: 1 << 22,
      hazards: "allow",
    });
    const call = kernelCall(gpu, pipeline(gpu, code), [sync, out], [groups], "residency probe");
    await runCalls(gpu, Array.from({ length: repeats }, () => call));
    const ok = !(await syncFlag(gpu, sync));
    sync.destroy();
    out.destroy();
    if (ok) return groups;
  }
  return 0;
}

/**
 * `calls` with each run of consecutive calls that can share a persistent dispatch (one workgroup size, no
 * stale-read hazard, within the adapter's binding limits) replaced by one persistentCall over `groups`
 * workgroups, all sharing `sync` (read its flag with the step's results: syncFlag); runs of one call stay as
 * they are. `runs`: the calls in each dispatch, in order; `cuts`: why each run ended (what adding the next
 * call was refused for, or "the end").
 */
export function persistentRuns(
  gpu: Gpu,
  calls: readonly KernelCall[],
  opts: { groups: number; sync: GPUBuffer; hazards?: Hazards },
): { calls: KernelCall[]; runs: number[]; cuts: string[] } {
  const out: KernelCall[] = [];
  const runs: number[] = [];
  const cuts: string[] = [];
  const phaseOf = (c: KernelCall) => {
    const src = pipelineSource(c.pipeline);
    return src && { ...src, buffers: c.buffers, workgroups: c.workgroups, label: c.label };
  };
  /** Why `run` does not compose, or undefined where it does. */
  const refusal = (run: KernelCall[]): string | undefined => {
    const phases = run.map(phaseOf);
    if (phases.some((p) => !p)) return "a call not built by pipeline()";
    try {
      const c = composePersistent(phases as Phase<GPUBuffer>[], {
        groups: opts.groups,
        sync: SYNC_SENTINEL,
        hazards: opts.hazards,
        name: (b) => b.label || "(unlabelled)",
        checkOnly: true,
        workgroupBytes: gpu.device.limits.maxComputeWorkgroupStorageSize,
      });
      return bindingsOver(gpu, c.buffers);
    } catch (e) {
      return (e as Error).message.replace(/^composePersistent: /, "");
    }
  };
  let run: KernelCall[] = [];
  const close = (why: string) => {
    if (run.length === 1) out.push(run[0]);
    else if (run.length > 1) {
      const label = `persistent x${run.length}`;
      out.push(
        persistentCall(gpu, run, { groups: opts.groups, hazards: opts.hazards, label, sync: opts.sync }),
      );
    }
    runs.push(run.length);
    cuts.push(why);
    run = [];
  };
  const most = gpu.isSoftware ? SOFTWARE_MAX_PHASES : Infinity;
  for (const c of calls) {
    const why = run.length >= most
      ? `${most} phases, the most a run takes on a software adapter`
      : run.length > 0
      ? refusal([...run, c])
      : undefined;
    if (why !== undefined) close(why);
    run.push(c);
  }
  close("the end");
  return { calls: out, runs, cuts };
}

/**
 * The most phases persistentRuns puts in a run on a software adapter. On lavapipe, runs of 13-14 of the
 * engine's kernels crashed the process (heap corruption) in about half the runs, runs of up to 8 in one of
 * four test runs, runs of up to 4 in none of 14 (2026-12-05; most likely its per-invocation stacks, which
 * the inlined phases' private arrays overflow; the workgroup memory was within its limit).
 */
const SOFTWARE_MAX_PHASES = 4;

/** Stands for the sync buffer while persistentRuns tries a composition (never bound). */
const SYNC_SENTINEL = { usage: 0, label: "sync" } as unknown as GPUBuffer;

const autoGrids = new WeakMap<Gpu, Promise<number>>();

/**
 * The persistent grid gpu.tuning.persistent asks for: its number, or for "auto" the grid residentGroups
 * finds at the adapter's largest workgroup (fewer threads a workgroup fit at least as many), measured once a
 * device; 0 when persistent dispatches are off.
 */
export function persistentGroups(gpu: Gpu): Promise<number> {
  const t = gpu.tuning.persistent;
  if (t !== "auto") return Promise.resolve(t ?? 0);
  let grid = autoGrids.get(gpu);
  if (!grid) {
    const size = Math.min(1024, gpu.device.limits.maxComputeInvocationsPerWorkgroup);
    autoGrids.set(gpu, grid = residentGroups(gpu, size));
  }
  return grid;
}

/**
 * A one-token step's `calls` as Engine.generate runs them under gpu.tuning.persistent (composed, with a
 * sync buffer of their own to read with syncFlag and destroy), or as they are when it is off: what the
 * benchmarks time, so their GPU ms are the engine's.
 */
export async function persistentStep(
  gpu: Gpu,
  calls: KernelCall[],
): Promise<{ calls: KernelCall[]; groups: number; sync?: GPUBuffer; runs?: number[]; cuts?: string[] }> {
  const groups = await persistentGroups(gpu);
  if (groups === 0) return { calls, groups };
  const sync = storageBuffer(gpu, SYNC_BYTES, "persistent step sync");
  const { calls: composed, runs, cuts } = persistentRuns(gpu, calls, {
    groups,
    sync,
    hazards: persistentHazards(gpu),
  });
  return { calls: composed, groups, sync, runs, cuts };
}

/** What gpu.tuning.persistentHazards asks persistentRuns to do with a buffer that could be read stale. */
export function persistentHazards(gpu: Gpu): Hazards {
  return gpu.tuning.persistentHazards === "atomic" ? "atomic" : "refuse";
}
