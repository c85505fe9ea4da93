import assert from "node:assert/strict";
import { join } from "node:path";
import { parseModelConfig } from "../../models/family.ts";
import {
  loadLlama3Tokenizer,
  loadTokenizer,
  StreamDecoder,
  type TextTokenizer,
} from "../../models/tokenizer.ts";
import { fixtureDir } from "../fixtures.ts";
import { needs } from "../support/needs.ts";

interface Case {
  text: string;
  ids: number[];
}
const CASES: Case[] = JSON.parse(
  await Deno.readTextFile(
    join(fixtureDir("llama3-tiny", { needs: "tokenizer-cases.json" })!, "tokenizer-cases.json"),
  ),
).cases;

const LLAMA3_CONFIG = parseModelConfig({
  model_type: "llama",
  vocab_size: 128256,
  hidden_size: 64,
  intermediate_size: 192,
  num_hidden_layers: 1,
  num_attention_heads: 4,
  bos_token_id: 128000,
  eos_token_id: [128001, 128008, 128009],
}, "llama3 test config");

const MICRO_CONFIG = { ...LLAMA3_CONFIG, vocabSize: 512 };

/** Pushes ids one by one, checking that no piece carries a broken character. */
function stream(tok: TextTokenizer, ids: number[]): string[] {
  const dec = new StreamDecoder(tok);
  const pieces = ids.map((id) => dec.push(id));
  pieces.push(dec.flush());
  for (const p of pieces) assert.ok(!p.includes("\uFFFD"), `piece ${JSON.stringify(p)} splits a character`);
  return pieces;
}

Deno.test("built-in Llama 3 tokenizer: every tokenizer-case, BOS included; decode skips BOS/EOS", async () => {
  const tok = await loadTokenizer(null, LLAMA3_CONFIG);
  assert.ok(tok);
  assert.match(tok.source, /built-in Llama 3/);
  for (const c of CASES) {
    assert.deepEqual(tok.encode(c.text), c.ids, c.text);
    assert.equal(tok.decode(c.ids), c.text);
  }
  assert.equal(tok.decode([128000, 9906, 4435, 128009, 128001]), "Hello World");
});

const TOKENIZER_DIR = fixtureDir("llama3-tiny", { needs: "tokenizer.json" });

Deno.test(
  needs("tokenizer.json via @huggingface/tokenizers gives the same ids as the built-in one", {
    "../shared/fixtures/llama3-tiny/tokenizer.json": TOKENIZER_DIR,
  }),
  async () => {
    const dir = TOKENIZER_DIR!;
    const hf = await loadTokenizer(dir, LLAMA3_CONFIG);
    const builtIn = await loadLlama3Tokenizer();
    assert.ok(hf);
    assert.equal(hf.source, join(dir, "tokenizer.json"));
    for (const c of CASES) {
      assert.deepEqual(hf.encode(c.text), c.ids, c.text);
      assert.deepEqual(builtIn.encode(c.text), c.ids, c.text);
      assert.equal(hf.decode(c.ids), c.text);
      assert.equal(stream(hf, c.ids).join(""), c.text, `streamed: ${c.text}`);
    }
    // Special-token text is recognised the same way by both.
    const special = "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>";
    assert.deepEqual(hf.encode(special), builtIn.encode(special));
    assert.equal(hf.decode([128000, 9906, 128009]), "Hello");
    // Ids past the vocabulary (a model whose head is wider than its tokenizer) decode to nothing.
    assert.equal(hf.decode([9906, 130000]), "Hello");
  },
);

Deno.test(
  needs("add_bos_token in tokenizer_config.json overrides what the post-processor does", {
    "../shared/fixtures/llama3-tiny/tokenizer.json": TOKENIZER_DIR,
  }),
  async () => {
    const src = TOKENIZER_DIR!;
    const dir = await Deno.makeTempDir();
    try {
      await Deno.copyFile(join(src, "tokenizer.json"), join(dir, "tokenizer.json"));
      const tc = JSON.parse(await Deno.readTextFile(join(src, "tokenizer_config.json")));
      await Deno.writeTextFile(
        join(dir, "tokenizer_config.json"),
        JSON.stringify({ ...tc, add_bos_token: false }),
      );
      const tok = (await loadTokenizer(dir, LLAMA3_CONFIG))!;
      assert.deepEqual(tok.encode("Hello World"), [9906, 4435]);
      // A BOS written in the text itself stays.
      assert.deepEqual(tok.encode("<|begin_of_text|>Hello"), [128000, 9906]);
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  },
);

Deno.test("no tokenizer.json and not the Llama 3 vocabulary: token ids only (null)", async () => {
  assert.equal(await loadTokenizer(fixtureDir("llama-micro")!, MICRO_CONFIG), null);
  assert.equal(await loadTokenizer(null, MICRO_CONFIG), null);
});

Deno.test("StreamDecoder never splits a character across byte-level tokens (real vocabulary)", async () => {
  const tok = await loadLlama3Tokenizer();
  for (const text of ["emojis 🦙🚀 and ümlauts — dashes", "日本語のテキストと中文字符", "a👩‍👩‍👧b"]) {
    const ids = tok.encode(text);
    const pieces = stream(tok, ids);
    assert.equal(pieces.join(""), text);
  }
  // " 🦙" is 3 tokens in Llama 3 ([11410, 99, 247]): nothing comes out until the last one.
  const dec = new StreamDecoder(tok);
  assert.deepEqual([11410, 99, 247].map((id) => dec.push(id)), ["", "", " 🦙"]);
});

Deno.test("StreamDecoder on a byte tokenizer: every split point of multi-byte text; flush gives the rest", () => {
  // One token per byte: the worst case for splitting.
  const bytes: TextTokenizer = {
    source: "bytes",
    encode: (t) => [...new TextEncoder().encode(t)],
    decode: (ids) => new TextDecoder().decode(Uint8Array.from(ids)),
  };
  const text = "x€😀y中";
  const pieces = stream(bytes, bytes.encode(text));
  assert.equal(pieces.join(""), text);
  assert.deepEqual(pieces.filter((p) => p !== ""), ["x", "€", "😀", "y", "中"]);
  // A generation that stops mid-character: flush returns the replacement character, once.
  const dec = new StreamDecoder(bytes);
  assert.equal(dec.push(0x61), "a");
  assert.equal(dec.push(0xf0), "");
  assert.equal(dec.push(0x9f), "");
  assert.equal(dec.flush(), "\uFFFD");
  assert.equal(dec.flush(), "");
  // A stray continuation byte followed by text is emitted once the text arrives.
  assert.equal(dec.push(0x80), "");
  assert.equal(dec.push(0x62), "\uFFFDb");
});
