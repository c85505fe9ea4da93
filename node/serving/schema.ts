// A small declarative schema checker for JSON request bodies: each schema parses an unknown value into a
// typed one or throws a SchemaError that names the offending field by its path (`messages[2].content`),
// which the OpenAI error body carries as `param`. Written here because no schema library (zod, valibot,
// ...) is installed offline and the project adds no dependency for ~150 lines (docs/SERVING.md says so);
// its surface follows zod's (object / array / union / optional) so one could replace it call for call.

/** A value that does not match its schema; `param` is the path of the field ("" for the body itself). */
export class SchemaError extends Error {
  override name = "SchemaError";
  constructor(message: string, readonly param: string) {
    super(message);
  }
}

export interface Schema<T> {
  /** Parses `v` found at `path`; SchemaError otherwise. */
  parse(v: unknown, path?: string): T;
  /** What the schema expects, in words, for error messages ("a string", "an integer in [1, 4]"). */
  readonly expects: string;
  /** Whether an absent field is allowed (optional()). */
  readonly optional?: boolean;
}

export type Infer<S> = S extends Schema<infer T> ? T : never;

function show(v: unknown): string {
  if (v === undefined) return "nothing";
  const text = JSON.stringify(v) ?? String(v);
  return text.length > 40 ? text.slice(0, 40) + "..." : text;
}

function fail(expects: string, v: unknown, path: string): never {
  throw new SchemaError(`${path || "the body"} must be ${expects}, got ${show(v)}`, path);
}

function schema<T>(expects: string, check: (v: unknown, path: string) => T): Schema<T> {
  return { expects, parse: (v, path = "") => check(v, path) };
}

export function string(opts: { minLength?: number; maxLength?: number } = {}): Schema<string> {
  const { minLength = 0, maxLength = Infinity } = opts;
  const expects = minLength > 0 ? "a non-empty string" : "a string";
  return schema(expects, (v, path) => {
    if (typeof v !== "string" || v.length < minLength) fail(expects, v, path);
    if (v.length > maxLength) {
      fail(`a string of at most ${maxLength} characters`, `${v.length} characters`, path);
    }
    return v;
  });
}

export function number(opts: { min?: number; max?: number; minExclusive?: boolean } = {}): Schema<number> {
  const { min = -Infinity, max = Infinity, minExclusive = false } = opts;
  const expects = `a number in ${minExclusive ? "(" : "["}${min}, ${max}]`;
  return schema(expects, (v, path) => {
    if (typeof v !== "number" || !Number.isFinite(v) || v > max || (minExclusive ? v <= min : v < min)) {
      fail(expects, v, path);
    }
    return v;
  });
}

export function integer(opts: { min?: number; max?: number } = {}): Schema<number> {
  const { min = Number.MIN_SAFE_INTEGER, max = Number.MAX_SAFE_INTEGER } = opts;
  const expects = `an integer in [${min}, ${max}]`;
  return schema(expects, (v, path) => {
    if (typeof v !== "number" || !Number.isSafeInteger(v) || v < min || v > max) fail(expects, v, path);
    return v;
  });
}

export function boolean(): Schema<boolean> {
  return schema("true or false", (v, path) => typeof v === "boolean" ? v : fail("true or false", v, path));
}

export function literal<const T extends string>(...values: T[]): Schema<T> {
  const expects = values.length === 1
    ? JSON.stringify(values[0])
    : `one of ${values.map((x) => JSON.stringify(x)).join(", ")}`;
  return schema(expects, (v, path) => (values as unknown[]).includes(v) ? v as T : fail(expects, v, path));
}

export function array<T>(item: Schema<T>, opts: { min?: number; max?: number } = {}): Schema<T[]> {
  const { min = 0, max = Infinity } = opts;
  const size = min > 0 && max < Infinity
    ? ` with ${min} to ${max} items`
    : min > 0
    ? ` with at least ${min} item${min > 1 ? "s" : ""}`
    : max < Infinity
    ? ` with at most ${max} items`
    : "";
  const expects = `an array${size} of ${item.expects}`;
  return schema(expects, (v, path) => {
    if (!Array.isArray(v)) fail(expects, v, path);
    if (v.length < min || v.length > max) fail(expects, `${v.length} items`, path);
    return v.map((x, i) => item.parse(x, `${path}[${i}]`));
  });
}

/** The first alternative that parses; when none does, an error listing what each expects. */
export function union<S extends Schema<unknown>[]>(...options: S): Schema<Infer<S[number]>> {
  const expects = options.map((o) => o.expects).join(", or ");
  return schema(expects, (v, path) => {
    for (const o of options) {
      try {
        return o.parse(v, path) as Infer<S[number]>;
      } catch (e) {
        if (!(e instanceof SchemaError)) throw e;
      }
    }
    return fail(expects, v, path);
  });
}

/** An absent field (undefined) is allowed; so is null when `nullable` (both read as undefined). */
export function optional<T>(s: Schema<T>, opts: { nullable?: boolean } = {}): Schema<T | undefined> {
  return {
    expects: s.expects,
    optional: true,
    parse: (v, path = "") => v === undefined || (opts.nullable && v === null) ? undefined : s.parse(v, path),
  };
}

type Shape = Record<string, Schema<unknown>>;
type ObjectOf<S extends Shape> =
  & { [K in keyof S as S[K]["optional"] extends true ? never : K]: Infer<S[K]> }
  & { [K in keyof S as S[K]["optional"] extends true ? K : never]?: Infer<S[K]> };

/**
 * A JSON object with these fields. `unknown`: "refuse" (default) throws on a field the shape does not
 * name; "ignore" drops it; a function decides per field (it may throw a SchemaError itself).
 */
export function object<S extends Shape>(
  shape: S,
  opts: { unknown?: "refuse" | "ignore" | ((key: string, value: unknown, path: string) => void) } = {},
): Schema<ObjectOf<S>> {
  const unknown = opts.unknown ?? "refuse";
  return schema("a JSON object", (v, path) => {
    if (typeof v !== "object" || v === null || Array.isArray(v)) fail("a JSON object", v, path);
    const obj = v as Record<string, unknown>;
    const at = (k: string) => (path ? `${path}.${k}` : k);
    const out: Record<string, unknown> = {};
    for (const [k, s] of Object.entries(shape)) {
      if (!(k in obj) && !s.optional) throw new SchemaError(`${at(k)} is required (${s.expects})`, at(k));
      const parsed = s.parse(obj[k], at(k));
      if (parsed !== undefined) out[k] = parsed;
    }
    for (const k of Object.keys(obj)) {
      if (k in shape) continue;
      if (unknown === "refuse") {
        throw new SchemaError(`unknown field ${at(k).slice(0, 60)}`, at(k).slice(0, 60));
      }
      if (typeof unknown === "function") unknown(k, obj[k], at(k));
    }
    return out as ObjectOf<S>;
  });
}
