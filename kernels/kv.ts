// The KV cache's element types, in one place: what a row costs, the WGSL that reads and writes each type, and
// the int8 format's CPU reference (tests; docs/KERNELS.md "The 8-bit KV cache").
//
// A cache holds [rows, width] values, a row per (kv head, position): GQA's K or V rows of head_dim values.
// f32 and f16 store the values. q8 stores each row symmetric: q = round(v / s), s = max|v| / 127, four values
// a u32 word (the word of values 4i..4i+3 at the index where f16 keeps vec4 i), and after all the rows'
// words, one f32 scale a row (as its u32 bits). A vec4 read is one word and one scale (the same for the
// whole row, so it stays in cache); the error is at most s / 2, 0.4% of the row's largest value.

/**
 * Element type of the KV cache: "f16" halves the bytes the decode attention reads (values are rounded to f16
 * when written, widened to f32 when read; arithmetic stays f32); "q8" about halves f16's (int8 with a scale a
 * row; GQA caches whose rows are whole words only, see kvTypeOf).
 */
export type KvType = "f32" | "f16" | "q8";

/** The types a user may name (--kv, SWACTOR_KV, `gpu.tuning.kv`, scripts' --kv). */
export const KV_TYPES: readonly KvType[] = ["f32", "f16", "q8"];

/** Whether `v` names a KV cache type (one of KV_TYPES). */
export function isKvType(v: string): v is KvType {
  return (KV_TYPES as readonly string[]).includes(v);
}

/** Bytes of one cache row of `width` values (q8: the int8 values and the row's f32 scale). */
export function kvRowBytes(kv: KvType, width: number): number {
  return kv === "q8" ? width + 4 : kv === "f16" ? 2 * width : 4 * width;
}

/**
 * The type a cache of rows `width` wide takes when the model's is `kv`: q8 only for GQA rows of whole words
 * (width % 4 == 0), whose kernels read it; MLA's latent rows and odd head sizes keep f16 then.
 */
export function kvTypeOf(kv: KvType, cache: { gqa: boolean; width: number }): KvType {
  return kv === "q8" && !(cache.gqa && cache.width % 4 === 0) ? "f16" : kv;
}

/** WGSL of one KV element type (kvWgsl). Expressions are f32 unless said. */
export interface KvWgsl {
  /** Directives the module starts with (f16: `enable f16;`). */
  enable: string;
  q8: boolean;
  /** The storage type of a vector of n (1: scalar); q8: u32, a word of 4 values, for n of 4 or 1. */
  vec: (n: number) => string;
  /**
   * A vector of 4 (or n for f32 / f16) values of cache array `arr` at word / vector `idx`, in row `row`
   * (q8 reads the row's scale there).
   */
  load: (n: number, arr: string, idx: string, row: string) => string;
  /** One value of `arr` at element index `idx`, in row `row`. */
  load1: (arr: string, idx: string, row: string) => string;
  /**
   * A vector of 4 (or n) values of `arr` at `idx` without their row's scale (q8: the int8 values; f32 / f16:
   * load's), for kernels that apply a key's scale once (rowScale) instead of to every value, and for the MLA
   * caches, which have no scales.
   */
  loadUnscaled: (n: number, arr: string, idx: string) => string;
  /** q8: row `row`'s scale in `arr` (f32 / f16 have none). */
  rowScale: (arr: string, row: string) => string;
  /** The row's scale pair `vec2(s, 1 / s)` from its largest magnitude `mx` (q8 only). */
  scaleOf: (mx: string) => string;
  /**
   * A vector of n values converted for storing (f16: clamped to f16's finite range, then rounded to nearest;
   * q8: n = 4, quantised with the row's scale pair `si` and packed into a word).
   */
  store: (n: number, e: string, si?: string) => string;
  /** q8: the statement storing row `row`'s scale (from the pair `si`) into `arr`. */
  storeScale: (arr: string, row: string, si: string) => string;
  /** A vector of n values rounded as storing and reading them would (q8: with the row's scale pair `si`). */
  round: (n: number, e: string, si?: string) => string;
}

/**
 * WGSL for a KV cache of `kv` elements. `scales`: q8's WGSL u32 expression of the word where the rows' scales
 * start (the rows' count times width / 4), in the kernel's own names.
 */
export function kvWgsl(kv: KvType | undefined, scales = ""): KvWgsl {
  const t = (n: number, s: string) => n === 1 ? s : `vec${n}<${s}>`;
  if (kv === "q8") {
    if (!scales) throw new Error("kvWgsl: a q8 cache needs the WGSL expression of where its scales start");
    const need = (si: string | undefined, what: string): string => {
      if (si === undefined) throw new Error(`kvWgsl: q8 ${what} needs the row's scale pair`);
      return si;
    };
    const four = (n: number) => {
      if (n !== 4) throw new Error(`kvWgsl: a q8 cache has no vector of ${n}`);
    };
    const scale = (arr: string, row: string) => `bitcast<f32>(${arr}[${scales} + (${row})])`;
    // A word's four int8 values as f32, each shifted to the top of an i32 and back (arithmetic: sign-extended),
    // then converted. On the H100 the decode attention alone at 8,192 keys took 17.8-17.9 us a layer so, against
    // 23.0 with unpack4xI8 and 19.2 through f32 bits (2^23 + u); f16's took 15.9 (docs/BENCHMARKS.md, the
    // fifty-ninth session).
    const widen = (word: string) =>
      `vec4<f32>((vec4<i32>(bitcast<i32>(${word})) << vec4<u32>(24u, 16u, 8u, 0u)) >> vec4<u32>(24u))`;
    const quant = (n: number, e: string, si: string) =>
      `clamp(round((${e}) * (${si}).y), ${t(n, "f32")}(-127.0), ${t(n, "f32")}(127.0))`;
    return {
      enable: "",
      q8: true,
      vec: (n) => {
        if (n !== 4 && n !== 1) throw new Error(`kvWgsl: a q8 cache has no vector of ${n}`);
        return "u32";
      },
      load: (n, arr, idx, row) => (four(n), `(${widen(`${arr}[${idx}]`)} * ${scale(arr, row)})`),
      load1: (arr, idx, row) => `(${widen(`${arr}[(${idx}) / 4u]`)}[(${idx}) % 4u] * ${scale(arr, row)})`,
      loadUnscaled: (n, arr, idx) => (four(n), widen(`${arr}[${idx}]`)),
      rowScale: scale,
      scaleOf: (mx) => `vec2<f32>((${mx}) / 127.0, select(0.0, 127.0 / (${mx}), (${mx}) > 0.0))`,
      store: (n, e, si) => (four(n), `pack4xI8(vec4<i32>(${quant(4, e, need(si, "store"))}))`),
      storeScale: (arr, row, si) => `${arr}[${scales} + (${row})] = bitcast<u32>((${si}).x);`,
      round: (n, e, si) => `(${quant(n, e, need(si, "round"))} * (${si}).x)`,
    };
  }
  const h = kv === "f16";
  const read = (n: number, e: string) => h ? `${t(n, "f32")}(${e})` : `(${e})`;
  const noScales = () => {
    throw new Error(`kvWgsl: an ${kv ?? "f32"} cache has no scales`);
  };
  const store = (n: number, e: string) =>
    h ? `${t(n, "f16")}(clamp(${e}, ${t(n, "f32")}(-65504.0), ${t(n, "f32")}(65504.0)))` : `(${e})`;
  return {
    enable: h ? "enable f16;\n" : "",
    q8: false,
    vec: (n) => t(n, h ? "f16" : "f32"),
    load: (n, arr, idx) => read(n, `${arr}[${idx}]`),
    load1: (arr, idx) => read(1, `${arr}[${idx}]`),
    loadUnscaled: (n, arr, idx) => read(n, `${arr}[${idx}]`),
    rowScale: noScales,
    scaleOf: noScales,
    store,
    storeScale: () => "",
    round: (n, e) => h ? `${t(n, "f32")}(${store(n, e)})` : `(${e})`,
  };
}

/** Round half to even, as WGSL's round. */
function roundEven(x: number): number {
  const r = Math.round(x);
  return r - x === 0.5 && r % 2 !== 0 ? r - 1 : r;
}

/**
 * The q8 cache bytes of `values` ([rows, width], width % 4 == 0), as the kernels write them (f32 arithmetic:
 * 1 / s and each product rounded to f32; the GPU's division may differ in the last bit, so a value can land
 * one step off where v / s sits on a half).
 */
export function kvQ8Encode(values: Float32Array, width: number): Uint32Array {
  if (width % 4 !== 0) throw new RangeError(`a q8 cache row must be a multiple of 4 wide, got ${width}`);
  const rows = values.length / width;
  const words = new Uint32Array(rows * (width / 4 + 1));
  const scales = new Float32Array(words.buffer, rows * width);
  const bytes = new Int8Array(words.buffer, 0, rows * width);
  for (let r = 0; r < rows; r++) {
    let mx = 0;
    for (let i = 0; i < width; i++) mx = Math.max(mx, Math.abs(values[r * width + i]));
    mx = Math.fround(mx);
    scales[r] = Math.fround(mx / 127);
    const inv = mx > 0 ? Math.fround(127 / mx) : 0;
    for (let i = 0; i < width; i++) {
      bytes[r * width + i] = Math.max(
        -127,
        Math.min(127, roundEven(Math.fround(values[r * width + i] * inv))),
      );
    }
  }
  return words;
}

/** The values a q8 cache's bytes hold ([rows, width]). */
export function kvQ8Decode(words: Uint32Array, width: number): Float32Array {
  const rows = words.length / (width / 4 + 1);
  const scales = new Float32Array(words.buffer, words.byteOffset + rows * width, rows);
  const bytes = new Int8Array(words.buffer, words.byteOffset, rows * width);
  const out = new Float32Array(rows * width);
  for (let i = 0; i < out.length; i++) out[i] = bytes[i] * scales[Math.floor(i / width)];
  return out;
}
