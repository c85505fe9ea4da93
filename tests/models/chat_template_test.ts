// Chat templates: where a checkpoint's template is read from, what it is rendered with, the end-of-turn
// text, the errors; with @huggingface/jinja (when installed) llama3-tiny's Llama-3 template renders as
// transformers renders it, and the tokenizer reads the special tokens it writes without adding a BOS.
import assert from "node:assert/strict";
import { join } from "node:path";
import {
  chatTemplate,
  jinjaEngine,
  loadChatTemplate,
  type TemplateEngine,
  TemplateEngineMissingError,
  TemplateRenderError,
} from "../../models/chat_template.ts";
import { CheckpointError } from "../../models/errors.ts";
import { loadTokenizer } from "../../models/tokenizer.ts";
import { Checkpoint } from "../../models/checkpoint.ts";
import { fixtureDir } from "../fixtures.ts";
import { needs } from "../support/needs.ts";

const tiny = fixtureDir("llama3-tiny", { needs: "tokenizer.json" });
const hasJinja = await jinjaEngine().then(() => true, () => false);

/** An engine that records the source and context, and renders `[bos]role:content|...[gen]`. */
function recordingEngine() {
  const seen: { source: string; ctx: Record<string, unknown> }[] = [];
  const engine: TemplateEngine = (source) => (ctx) => {
    seen.push({ source, ctx });
    const ms = ctx.messages as { role: string; content: string }[];
    if (ms.some((m) => m.content === "boom")) (ctx.raise_exception as (m: string) => never)("no booms");
    if (ms.some((m) => m.content === "crash")) throw new Error("undefined is not iterable");
    return `${ctx.bos_token}${ms.map((m) => `${m.role}:${m.content}<|end|>\n`).join("")}${
      ctx.add_generation_prompt ? "assistant:" : ""
    }`;
  };
  return { seen, engine: () => Promise.resolve(engine) };
}

async function folder(files: Record<string, string>): Promise<string> {
  const dir = await Deno.makeTempDir();
  for (const [name, text] of Object.entries(files)) await Deno.writeTextFile(join(dir, name), text);
  return dir;
}

Deno.test("chat template: tokenizer_config.json's chat_template, rendered with the special tokens", async () => {
  const dir = await folder({
    "tokenizer_config.json": JSON.stringify({
      chat_template: "SRC",
      bos_token: "<s>",
      eos_token: { content: "</s>" },
    }),
  });
  const e = recordingEngine();
  const t = (await loadChatTemplate(dir, { engine: e.engine }))!;
  assert.match(t.source, /tokenizer_config\.json \(chat_template\)$/);
  assert.equal(await t.render([{ role: "user", content: "hi" }]), "<s>user:hi<|end|>\nassistant:");
  assert.equal(e.seen[0].source, "SRC");
  assert.equal(e.seen[0].ctx.eos_token, "</s>");
  assert.equal(e.seen[0].ctx.add_generation_prompt, true);
  assert.equal(
    await t.render([{ role: "user", content: "hi" }], { addGenerationPrompt: false }),
    "<s>user:hi<|end|>\n",
  );
  assert.equal(await t.endOfTurn(), "<|end|>", "what follows an assistant turn's content, up to whitespace");
});

Deno.test("chat template: chat_template.jinja wins; a list of named templates gives the default; none is null", async () => {
  const e = recordingEngine();
  const a = await folder({
    "chat_template.jinja": "FROM FILE",
    "tokenizer_config.json": JSON.stringify({ chat_template: "FROM CONFIG" }),
  });
  await (await loadChatTemplate(a, { engine: e.engine }))!.render([{ role: "user", content: "x" }]);
  assert.equal(e.seen.at(-1)!.source, "FROM FILE");
  const b = await folder({
    "tokenizer_config.json": JSON.stringify({
      chat_template: [{ name: "tool_use", template: "TOOLS" }, { name: "default", template: "DEFAULT" }],
    }),
  });
  await (await loadChatTemplate(b, { engine: e.engine }))!.render([{ role: "user", content: "x" }]);
  assert.equal(e.seen.at(-1)!.source, "DEFAULT");
  assert.equal(await loadChatTemplate(await folder({ "tokenizer_config.json": "{}" })), null);
  assert.equal(await loadChatTemplate(await folder({})), null);
});

Deno.test("chat template: bad files are CheckpointErrors; refused messages are TemplateRenderErrors", async () => {
  await assert.rejects(loadChatTemplate(await folder({ "tokenizer_config.json": "{" })), CheckpointError);
  await assert.rejects(
    loadChatTemplate(await folder({ "tokenizer_config.json": JSON.stringify({ chat_template: 42 }) })),
    /chat_template must be a string or a list/,
  );
  const t = chatTemplate("x", { source: "t", bosToken: "", eosToken: "", engine: recordingEngine().engine });
  await assert.rejects(t.render([{ role: "user", content: "boom" }]), (e) => {
    assert.ok(e instanceof TemplateRenderError);
    assert.match(e.message, /refused the messages: no booms/);
    return true;
  });
  await assert.rejects(t.render([{ role: "user", content: "crash" }]), (e) => {
    assert.ok(e instanceof TemplateRenderError);
    assert.match(e.message, /failed on these messages: undefined is not iterable/);
    return true;
  });
});

Deno.test("chat template: without an engine, loading works and rendering names the missing package", async () => {
  const missing = () => Promise.reject(new TemplateEngineMissingError("needs @huggingface/jinja"));
  const dir = await folder({ "tokenizer_config.json": JSON.stringify({ chat_template: "x" }) });
  const t = (await loadChatTemplate(dir, { engine: missing }))!;
  await assert.rejects(t.render([{ role: "user", content: "x" }]), TemplateEngineMissingError);
  await assert.rejects(t.endOfTurn(), TemplateEngineMissingError);
});

// What transformers (Python jinja2 3.1) renders for these messages with add_generation_prompt=True.
const LLAMA3_RENDERED = "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>" +
  "<|start_header_id|>user<|end_header_id|>\n\nHello!<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n";

Deno.test({
  ...needs("chat template: llama3-tiny's template with @huggingface/jinja, as transformers renders it", {
    "../shared/fixtures/llama3-tiny": tiny,
    "the npm package @huggingface/jinja": hasJinja,
  }),
  async fn() {
    const t = (await loadChatTemplate(tiny!))!;
    const text = await t.render([{ role: "system", content: "Be brief." }, {
      role: "user",
      content: " Hello! ",
    }]);
    assert.equal(text, LLAMA3_RENDERED);
    assert.equal(await t.endOfTurn(), "<|eot_id|>");
  },
});

Deno.test({
  ...needs("tokenizer: text a template rendered is read with its special tokens and no second BOS", {
    "../shared/fixtures/llama3-tiny": tiny,
  }),
  async fn() {
    const ckpt = await Checkpoint.open(tiny!);
    const tok = (await loadTokenizer(tiny!, ckpt.config))!;
    const ids = tok.encode(LLAMA3_RENDERED, { special: false });
    assert.equal(ids[0], 128000);
    assert.equal(ids.filter((i) => i === 128000).length, 1, "one BOS: the template's");
    assert.equal(ids.filter((i) => i === 128009).length, 2, "<|eot_id|> after each turn, as one token");
    assert.equal(ids.filter((i) => i === 128006).length, 3, "<|start_header_id|> per header");
    assert.deepEqual(tok.encode("<|eot_id|>", { special: false }), [128009]);
    assert.equal(tok.encode("Hello")[0], 128000, "plain encode still adds BOS");
  },
});
