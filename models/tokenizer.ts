// Text <-> token ids. A model's own tokenizer.json (+ tokenizer_config.json) goes through
// @huggingface/tokenizers; Kimi K2's tiktoken.model through tiktoken (models/tiktoken.ts); a
// Llama-3-vocabulary model without either (the built-in demo model) uses the
// Llama 3 vocabulary that llama3-tokenizer-js carries. Both give the same ids (tests check this on
// llama3-tiny's tokenizer-cases.json). Models with neither are token-ids-only.
import { join } from "node:path";
import { Tokenizer } from "@huggingface/tokenizers";
import type { ModelConfig } from "./config.ts";
import { readJsonFile } from "./config.ts";
import { CheckpointError } from "./errors.ts";
import { loadTiktokenTokenizer } from "./tiktoken.ts";

export interface TextTokenizer {
  /**
   * Token ids of `text`, with BOS added as transformers adds it for this model; `{special: false}` adds
   * none (text a chat template rendered, which writes its own BOS), as `add_special_tokens=False` does.
   */
  encode(text: string, opts?: { special?: boolean }): number[];
  /** Text of `ids`, special tokens (BOS, EOS, ...) left out, no whitespace clean-up. */
  decode(ids: number[]): string;
  /** Where the vocabulary came from, for logs: a tokenizer.json path or the built-in Llama 3. */
  readonly source: string;
}

/** The size of the Llama 3 vocabulary (128000 BPE tokens + 256 special tokens), as config.json gives it. */
export const LLAMA3_VOCAB_SIZE = 128256;
const LLAMA3_FIRST_SPECIAL = 128000;
/** The BOS id of the built-in Llama 3 tokenizer (`<|begin_of_text|>`). */
export const LLAMA3_BOS_TOKEN_ID = 128000;

async function exists(path: string): Promise<boolean> {
  try {
    await Deno.stat(path);
    return true;
  } catch (e) {
    if (e instanceof Deno.errors.NotFound) return false;
    throw e;
  }
}

/**
 * The tokenizer for a model: `dir/tokenizer.json` when present, else Kimi's `dir/tiktoken.model`
 * (models/tiktoken.ts), else the built-in Llama 3 tokenizer when the model has the Llama 3 vocabulary
 * (vocab_size 128256), else null (token ids only).
 * `dir` null means "no files to look at" (the config alone decides).
 */
export async function loadTokenizer(dir: string | null, config: ModelConfig): Promise<TextTokenizer | null> {
  if (dir !== null && await exists(join(dir, "tokenizer.json"))) return await loadHfTokenizer(dir, config);
  if (dir !== null && await exists(join(dir, "tiktoken.model"))) {
    const kimi = await loadTiktokenTokenizer(dir);
    if (kimi) return kimi;
  }
  if (config.vocabSize === LLAMA3_VOCAB_SIZE) return await loadLlama3Tokenizer();
  return null;
}

/** The token string of a tokenizer_config special token, which is a string or {content: string}. */
function tokenString(v: unknown): string | null {
  if (typeof v === "string") return v;
  if (typeof v === "object" && v !== null && typeof (v as { content?: unknown }).content === "string") {
    return (v as { content: string }).content;
  }
  return null;
}

async function loadHfTokenizer(dir: string, config: ModelConfig): Promise<TextTokenizer> {
  const path = join(dir, "tokenizer.json");
  const json = await readJsonFile(path);
  const configPath = join(dir, "tokenizer_config.json");
  const tc = (await exists(configPath) ? await readJsonFile(configPath) : {}) as Record<string, unknown>;
  let tok: Tokenizer;
  try {
    tok = new Tokenizer(json as object, tc);
  } catch (e) {
    throw new CheckpointError(`${path}: cannot build a tokenizer from it (${(e as Error).message})`);
  }
  const bosString = tokenString(tc.bos_token);
  const bosId = (bosString !== null ? tok.token_to_id(bosString) : undefined) ?? config.bosTokenId;
  // tokenizer.json's post-processor adds BOS for most models; an explicit add_bos_token in
  // tokenizer_config.json overrides it, as transformers' Llama tokenizers do.
  const addBos = typeof tc.add_bos_token === "boolean" ? tc.add_bos_token : null;
  const vocabSize = tok.get_vocab(true).size;
  return {
    source: path,
    encode(text: string, opts = {}): number[] {
      if (opts.special === false) return tok.encode(text, { add_special_tokens: false }).ids;
      const ids = tok.encode(text).ids;
      if (bosId === null || addBos === null) return ids;
      if (addBos && ids[0] !== bosId) return [bosId, ...ids];
      if (!addBos && ids[0] === bosId) {
        // Drop the BOS the post-processor added, not one written in the text itself.
        const plain = tok.encode(text, { add_special_tokens: false }).ids;
        if (plain[0] !== bosId || ids.length > plain.length) return ids.slice(1);
      }
      return ids;
    },
    decode(ids: number[]): string {
      const known = ids.filter((id) => Number.isInteger(id) && id >= 0 && id < vocabSize);
      if (known.length === 0) return ""; // the library throws on an empty list
      return tok.decode(known, { skip_special_tokens: true, clean_up_tokenization_spaces: false });
    },
  };
}

interface Llama3Js {
  encode(text: string, opts: { bos: boolean; eos: boolean }): number[];
  decode(ids: number[]): string;
}

let llama3: Promise<Llama3Js> | null = null;

/** The built-in Llama 3 tokenizer (imported on first use: its bundled vocabulary is 13 MB of JS). */
export function loadLlama3Tokenizer(): Promise<TextTokenizer> {
  llama3 ??= import("llama3-tokenizer-js").then((m) => m.default as Llama3Js);
  return llama3.then((tok) => ({
    source: "built-in Llama 3 tokenizer (llama3-tokenizer-js)",
    encode: (text: string, opts = {}) => tok.encode(text, { bos: opts.special !== false, eos: false }),
    // Special tokens have no byte form in llama3-tokenizer-js, so they are dropped before decoding.
    decode: (ids: number[]) =>
      tok.decode(ids.filter((id) => Number.isInteger(id) && id >= 0 && id < LLAMA3_FIRST_SPECIAL)),
  }));
}

/**
 * Turns a stream of token ids into a stream of text that never splits a multi-byte character.
 * Byte-level tokens can end in the middle of a UTF-8 sequence (an emoji is often 2-4 tokens); the
 * decoded tail then ends in U+FFFD and is held back until the character completes. Each push decodes
 * a short window (the last emitted token(s) plus the pending ones) rather than the whole output, and
 * takes the difference, so decoders that treat a sequence's first token specially stay correct.
 */
export class StreamDecoder {
  private ids: number[] = [];
  /** ids[prefix..read) were emitted last time and give context; ids[read..] are pending. */
  private prefix = 0;
  private read = 0;

  constructor(private readonly tok: TextTokenizer) {}

  /** Adds one token; returns the text it completed (often "", while a character is incomplete). */
  push(id: number): string {
    this.ids.push(id);
    const before = this.tok.decode(this.ids.slice(this.prefix, this.read));
    const after = this.tok.decode(this.ids.slice(this.prefix));
    if (after.length <= before.length || after.endsWith("\uFFFD")) return "";
    return this.advance(after.slice(before.length));
  }

  /** Returns whatever is still held back (an incomplete character decodes as U+FFFD), and resets. */
  flush(): string {
    const before = this.tok.decode(this.ids.slice(this.prefix, this.read));
    const after = this.tok.decode(this.ids.slice(this.prefix));
    this.ids = [];
    this.prefix = this.read = 0;
    return after.length > before.length ? after.slice(before.length) : "";
  }

  private advance(text: string): string {
    // Keep only the window the next push needs, so a long generation costs O(1) per token.
    this.ids = this.ids.slice(this.read);
    this.prefix = 0;
    this.read = this.ids.length;
    return text;
  }
}
