// Kimi K2's tokenizer (tiktoken.model + tokenization_kimi.py's pattern and special tokens) on a small vocabulary
// written here: the 256 bytes and a few merges, as tiktoken's BPE ranks.
import assert from "node:assert/strict";
import { join } from "node:path";
import { parseModelConfig } from "../../models/family.ts";
import { loadTokenizer } from "../../models/tokenizer.ts";
import { KIMI_SPECIAL_TOKENS } from "../../models/tiktoken.ts";

const MERGES = ["He", "ll", "Hell", "Hello", " w", "or", " wor", "ld", " world", "\u4e16\u754c", "12"];
const BASE = 256 + MERGES.length; // the first special id
const utf8 = new TextEncoder();
const b64 = (bytes: Uint8Array) => btoa(String.fromCharCode(...bytes));

const CONFIG = parseModelConfig({
  model_type: "llama",
  vocab_size: BASE + KIMI_SPECIAL_TOKENS,
  hidden_size: 64,
  intermediate_size: 128,
  num_hidden_layers: 1,
  num_attention_heads: 4,
}, "test config");

async function kimiDir(tokenizerClass = "TikTokenTokenizer"): Promise<string> {
  const dir = await Deno.makeTempDir();
  const lines = [
    ...Array.from({ length: 256 }, (_, b) => `${b64(new Uint8Array([b]))} ${b}`),
    ...MERGES.map((m, i) => `${b64(utf8.encode(m))} ${256 + i}`),
  ];
  await Deno.writeTextFile(join(dir, "tiktoken.model"), lines.join("\n") + "\n");
  await Deno.writeTextFile(
    join(dir, "tokenizer_config.json"),
    JSON.stringify({
      tokenizer_class: tokenizerClass,
      auto_map: { AutoTokenizer: ["tokenization_kimi.TikTokenTokenizer", null] },
      added_tokens_decoder: {
        [BASE]: { content: "[BOS]", special: true },
        [BASE + 1]: { content: "[EOS]", special: true },
        [BASE + 4]: { content: "<|im_end|>", special: true },
      },
    }),
  );
  return dir;
}

Deno.test("kimi tiktoken: the pattern's pieces, BPE merges, special-token text, no BOS, and back", async () => {
  const dir = await kimiDir();
  try {
    const tok = (await loadTokenizer(dir, CONFIG))!;
    assert.match(tok.source, /tiktoken\.model/);
    const ids = tok.encode("Hello world \u4e16\u754c 12345<|im_end|>");
    // "Hello" and " world" merge whole; a space before a Han run or digits is a piece of its own; the Han run
    // is one (one merge); digits go in threes ("123" then "45": the "12" merge applies inside the first); the
    // special token's text is its id.
    assert.deepEqual(ids, [259, 264, 32, 265, 32, 266, 51, 52, 53, BASE + 4]);
    assert.deepEqual(tok.encode("Hello", { special: false }), [259], "no BOS either way");
    assert.equal(tok.decode(ids), "Hello world \u4e16\u754c 12345", "special tokens left out");
    assert.equal(tok.decode([259, BASE + 7, 70000]), "Hello", "reserved and unknown ids left out");
    // A letter run never merges across into a Han run: "a" then "\u4e16\u754c".
    assert.deepEqual(tok.encode("a\u4e16\u754c"), [97, 265]);
    // Reserved special tokens are named <|reserved_token_{id}|>.
    assert.deepEqual(tok.encode(`x<|reserved_token_${BASE + 9}|>`), [120, BASE + 9]);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("kimi tiktoken: another tokenizer class is token ids only; a garbled line names itself", async () => {
  const other = await kimiDir("SomeOtherTokenizer");
  const garbled = await kimiDir();
  try {
    assert.equal(await loadTokenizer(other, CONFIG), null);
    await Deno.writeTextFile(join(garbled, "tiktoken.model"), "SGVsbG8= 0\nnot base64! 1\n");
    await assert.rejects(() => loadTokenizer(garbled, CONFIG), /tiktoken\.model: line 2 is not/);
  } finally {
    await Deno.remove(other, { recursive: true });
    await Deno.remove(garbled, { recursive: true });
  }
});
