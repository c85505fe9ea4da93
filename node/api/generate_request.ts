// The body of `POST /generate`, checked field by field before anything is reserved or sent: one
// declarative check per field, unknown fields refused, every error naming the field and what was expected.
import type { Sampling, WireDtype } from "../stage/mod.ts";

export interface GenerateRequest {
  /** The prompt's token ids: at least one, each below the vocabulary size (2^32 when unknown). */
  tokens: number[];
  /** Tokens to generate, >= 1 (default 64). */
  maxTokens: number;
  /** Default greedy: temperature 0, topP 1, seed 0. */
  sampling: Sampling;
  /** Token ids that end the generation (default none). */
  eos: number[];
  /** Activations between stages; absent: the chain's (`up --wire`, default f16). */
  wire?: WireDtype;
  /**
   * Speculative decoding with the node's drafter (docs/SPECULATIVE.md): drafts per chunk, or "auto";
   * absent: plain decoding.
   */
  speculate?: number | "auto";
  /** With speculate: chunks in flight (with auto, the most; default the node's). */
  speculateDepth?: number;
  /** With speculate: the drafter the client expects ("ngram" or a folder); the node refuses another. */
  draft?: string;
}

/** What the request is checked against. */
export interface RequestLimits {
  /** Token ids must be below this (the model's vocabulary; 2^32, the wire's limit, when unknown). */
  vocab: number;
}

/** A field of the body that is not as expected: the route answers 400 with the message. */
export class BadRequestError extends Error {
  override name = "BadRequestError";
}

const FIELDS = new Set([
  "tokens",
  "maxTokens",
  "sampling",
  "eos",
  "wire",
  "speculate",
  "speculateDepth",
  "draft",
]);
const SAMPLING_FIELDS = new Set(["temperature", "topP", "seed"]);
const U32 = 2 ** 32;

/** Checks a parsed JSON body; BadRequestError naming the first field that is wrong. */
export function parseGenerateRequest(body: unknown, limits: RequestLimits): GenerateRequest {
  const obj = object(body, "the body");
  unknownFields(obj, FIELDS, "");
  const tokenId = (where: string) => (v: unknown) => integer(v, where, 0, Math.min(limits.vocab, U32) - 1);
  if (!Array.isArray(obj.tokens) || obj.tokens.length === 0) {
    throw new BadRequestError("tokens must be a non-empty array of token ids");
  }
  const tokens = obj.tokens.map((t, i) => tokenId(`tokens[${i}]`)(t));
  const maxTokens = obj.maxTokens === undefined ? 64 : integer(obj.maxTokens, "maxTokens", 1, U32 - 1);
  let sampling: Sampling = { temperature: 0, topP: 1, seed: 0 };
  if (obj.sampling !== undefined) {
    const s = object(obj.sampling, "sampling");
    unknownFields(s, SAMPLING_FIELDS, "sampling.");
    sampling = {
      temperature: s.temperature === undefined ? 0 : number(s.temperature, "sampling.temperature", 0, 100),
      topP: s.topP === undefined ? 1 : number(s.topP, "sampling.topP", Number.MIN_VALUE, 1),
      seed: s.seed === undefined ? 0 : integer(s.seed, "sampling.seed", 0, U32 - 1),
    };
  }
  let eos: number[] = [];
  if (obj.eos !== undefined) {
    if (!Array.isArray(obj.eos)) throw new BadRequestError("eos must be an array of token ids");
    eos = obj.eos.map((t, i) => tokenId(`eos[${i}]`)(t));
  }
  const wire = obj.wire;
  if (wire !== undefined && wire !== "f16" && wire !== "f32") {
    throw new BadRequestError(`wire must be "f16" or "f32", got ${JSON.stringify(wire).slice(0, 40)}`);
  }
  const spec: Pick<GenerateRequest, "speculate" | "speculateDepth" | "draft"> = {};
  if (obj.speculate !== undefined) {
    spec.speculate = obj.speculate === "auto" ? "auto" : integer(obj.speculate, "speculate", 1, 16);
  }
  if (obj.speculateDepth !== undefined) {
    spec.speculateDepth = integer(obj.speculateDepth, "speculateDepth", 1, 16);
  }
  if (obj.draft !== undefined) {
    if (typeof obj.draft !== "string" || obj.draft === "") {
      throw new BadRequestError("draft must be a string");
    }
    spec.draft = obj.draft;
  }
  if (spec.speculate === undefined && (spec.speculateDepth !== undefined || spec.draft !== undefined)) {
    throw new BadRequestError("speculateDepth and draft need speculate");
  }
  return { tokens, maxTokens, sampling, eos, ...(wire !== undefined ? { wire } : {}), ...spec };
}

function object(v: unknown, what: string): Record<string, unknown> {
  if (typeof v !== "object" || v === null || Array.isArray(v)) {
    throw new BadRequestError(`${what} must be a JSON object, got ${v === null ? "null" : typeof v}`);
  }
  return v as Record<string, unknown>;
}

function unknownFields(obj: Record<string, unknown>, known: Set<string>, prefix: string): void {
  const extra = Object.keys(obj).find((k) => !known.has(k));
  if (extra !== undefined) {
    throw new BadRequestError(
      `unknown field ${prefix}${extra.slice(0, 40)} (known: ${[...known].map((k) => prefix + k).join(", ")})`,
    );
  }
}

function number(v: unknown, what: string, min: number, max: number): number {
  if (typeof v !== "number" || !Number.isFinite(v) || v < min || v > max) {
    throw new BadRequestError(
      `${what} must be a number in [${min === Number.MIN_VALUE ? "0 (excluded)" : min}, ${max}], got ${
        String(v).slice(0, 40)
      }`,
    );
  }
  return v;
}

function integer(v: unknown, what: string, min: number, max: number): number {
  if (typeof v !== "number" || !Number.isInteger(v) || v < min || v > max) {
    throw new BadRequestError(
      `${what} must be an integer in [${min}, ${max}], got ${JSON.stringify(v)?.slice(0, 40)}`,
    );
  }
  return v;
}
