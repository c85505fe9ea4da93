// Kimi K2's tokenizer. Its checkpoints ship no tokenizer.json: `tiktoken.model` holds tiktoken's BPE ranks
// (a base64 token and its rank a line), and Moonshot's tokenization_kimi.py, which transformers runs as remote
// code (`tokenizer_class: "TikTokenTokenizer"`), adds the pre-tokenizer pattern and the special tokens: ids
// n .. n + 257 after the n ranked tokens, named by tokenizer_config.json's added_tokens_decoder, else
// `<|reserved_token_{id}|>`. Its encode takes special-token text as those tokens and adds no BOS (the chat
// template writes what it needs). The `tiktoken` package is tiktoken's own Rust core as WASM, so the pattern is
// used as written (its `&&` class intersections are the Rust regex syntax) and the merges are tiktoken's.
import { join } from "node:path";
import type { Tiktoken } from "tiktoken";
import { readJsonFile } from "./config.ts";
import { CheckpointError } from "./errors.ts";
import type { TextTokenizer } from "./tokenizer.ts";

/** tokenization_kimi.py's `pat_str`. */
export const KIMI_PATTERN = [
  String.raw`[\p{Han}]+`,
  String
    .raw`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?`,
  String
    .raw`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?`,
  String.raw`\p{N}{1,3}`,
  String.raw` ?[^\s\p{L}\p{N}]+[\r\n]*`,
  String.raw`\s*[\r\n]+`,
  String.raw`\s+(?!\S)`,
  String.raw`\s+`,
].join("|");

/** Special tokens after the ranked ones (tokenization_kimi.py: num_reserved_special_tokens + 2). */
export const KIMI_SPECIAL_TOKENS = 256 + 2;

/** The tokenizer class whose tiktoken.model this reads (tokenizer_config.json's `tokenizer_class`). */
export const KIMI_TOKENIZER_CLASS = "TikTokenTokenizer";

// tokenization_kimi.py encodes at most 400,000 characters at a time, each cut where a run of whitespace or
// of anything else passes 25,000 characters (tiktoken's recursion limit): the cuts change the ids, so they are
// made the same way here.
const MAX_CHARS = 400_000;
const MAX_RUN = 25_000;

function* pieces(text: string): Generator<string> {
  const chars = [...text]; // code points, as Python indexes a str
  for (let c = 0; c < chars.length; c += MAX_CHARS) {
    const s = chars.slice(c, c + MAX_CHARS);
    let start = 0, run = 0, space = s.length > 0 && /\s/u.test(s[0]);
    for (let i = 0; i < s.length; i++) {
      const now = /\s/u.test(s[i]);
      if (now !== space) {
        run = 1;
        space = now;
      } else if (++run > MAX_RUN) {
        yield s.slice(start, i).join("");
        start = i;
        run = 1;
      }
    }
    yield s.slice(start).join("");
  }
}

/**
 * The tokenizer of `dir/tiktoken.model` when tokenizer_config.json names Kimi's class, else null (token ids
 * only: another tiktoken tokenizer's pattern and special tokens live in code we do not have).
 */
export async function loadTiktokenTokenizer(dir: string): Promise<TextTokenizer | null> {
  const path = join(dir, "tiktoken.model");
  const tc = (await readJsonFile(join(dir, "tokenizer_config.json"), { optional: true }) ?? {}) as Record<
    string,
    unknown
  >;
  if (tc.tokenizer_class !== KIMI_TOKENIZER_CLASS) return null;
  const ranks = await Deno.readTextFile(path);
  const lines = ranks.split("\n").filter((l) => l.trim() !== "");
  lines.forEach((line, i) => {
    const [token, rank, extra] = line.trim().split(/\s+/);
    if (extra !== undefined || !/^[A-Za-z0-9+/]*={0,2}$/.test(token) || !/^\d+$/.test(rank ?? "")) {
      throw new CheckpointError(
        `${path}: line ${i + 1} is not "<base64 token> <rank>": ${line.slice(0, 60)}`,
      );
    }
  });
  const base = lines.length;
  const named = (tc.added_tokens_decoder ?? {}) as Record<string, { content?: unknown }>;
  const special: Record<string, number> = {};
  for (let id = base; id < base + KIMI_SPECIAL_TOKENS; id++) {
    const content = named[String(id)]?.content;
    special[typeof content === "string" ? content : `<|reserved_token_${id}|>`] = id;
  }
  // Imported on first use: the WASM module is 1 MB that other models need not load.
  const { Tiktoken: Encoding } = await import("tiktoken");
  let tok: Tiktoken;
  try {
    tok = new Encoding(lines.join("\n"), special, KIMI_PATTERN);
  } catch (e) {
    throw new CheckpointError(`${path}: cannot build a tokenizer from it (${(e as Error).message})`);
  }
  const utf8 = new TextDecoder();
  return {
    source: `${path} (tiktoken, Kimi's pattern)`,
    encode(text: string): number[] {
      const ids: number[] = [];
      for (const p of pieces(text)) ids.push(...tok.encode(p, "all"));
      return ids;
    },
    decode(ids: number[]): string {
      const plain = ids.filter((id) => Number.isInteger(id) && id >= 0 && id < base);
      return utf8.decode(tok.decode(new Uint32Array(plain)));
    },
  };
}
