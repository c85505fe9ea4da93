// A checkpoint's chat template: the Jinja program in `chat_template.jinja`, or `chat_template` in
// tokenizer_config.json (a string, or a list of named templates of which "default" is used), rendered the
// way transformers' apply_chat_template does: with `messages`, `bos_token`, `eos_token`,
// `add_generation_prompt` and `raise_exception`. The text it renders is tokenized without adding BOS (the
// template writes it). The end-of-turn text (Llama 3's <|eot_id|>, ChatML's <|im_end|>) is found by
// rendering an assistant turn and reading what the template writes right after its content.
//
// Rendering is done by a TemplateEngine: by default @huggingface/jinja, loaded on first use; a checkpoint
// still loads without it, and only rendering then fails with TemplateEngineMissingError.
import { join } from "node:path";
import { CheckpointError } from "./errors.ts";

export interface ChatMessage {
  role: string;
  content: string;
}

/** Compiles a template's source; the result renders it for a context. */
export type TemplateEngine = (source: string) => (context: Record<string, unknown>) => string;

/** The package that renders chat templates (Hugging Face's Jinja for chat templates, as transformers.js uses). */
export const JINJA_PACKAGE = "@huggingface/jinja";

/** No template engine is installed. */
export class TemplateEngineMissingError extends Error {
  override name = "TemplateEngineMissingError";
}

/** The template refused the messages (raise_exception, or an error inside it): the request is at fault. */
export class TemplateRenderError extends Error {
  override name = "TemplateRenderError";
}

let jinja: Promise<TemplateEngine> | undefined;

/** @huggingface/jinja's Template as a TemplateEngine; TemplateEngineMissingError when it is not installed. */
export function jinjaEngine(): Promise<TemplateEngine> {
  jinja ??= (async () => {
    // A variable specifier: the module graph (and `deno check`) does not need the package to be there.
    const spec = JINJA_PACKAGE;
    let mod: { Template: new (source: string) => { render(ctx: Record<string, unknown>): string } };
    try {
      mod = await import(spec);
    } catch (e) {
      throw new TemplateEngineMissingError(
        `rendering chat templates needs the npm package ${JINJA_PACKAGE}, which is not installed ` +
          `(${(e as Error).message.split("\n")[0]})`,
      );
    }
    return (source: string) => {
      const t = new mod.Template(source);
      // raise_exception is the library's own global (declaring it again is an error); what it throws is
      // the template refusing the messages, as is any other error the template raises on them.
      return ({ raise_exception: refuse, ...ctx }) => {
        try {
          return t.render(ctx);
        } catch (e) {
          if (typeof refuse === "function") refuse((e as Error).message);
          throw e;
        }
      };
    };
  })();
  jinja.catch(() => (jinja = undefined)); // try again next time (it may be installed meanwhile)
  return jinja;
}

export interface ChatTemplate {
  /** Where the template came from. */
  readonly source: string;
  /**
   * The prompt text for `messages` (then tokenized without adding BOS). TemplateRenderError when the
   * template refuses them; TemplateEngineMissingError when no engine is installed.
   */
  render(messages: ChatMessage[], opts?: { addGenerationPrompt?: boolean }): Promise<string>;
  /** The text the template ends an assistant turn with (e.g. "<|eot_id|>"), or "" when it writes none. */
  endOfTurn(): Promise<string>;
}

/** The token string of a tokenizer_config special token, which is a string or {content: string}. */
function tokenString(v: unknown): string {
  if (typeof v === "string") return v;
  const c = (v as { content?: unknown } | null)?.content;
  return typeof c === "string" ? c : "";
}

async function readText(path: string): Promise<string | undefined> {
  try {
    return await Deno.readTextFile(path);
  } catch (e) {
    if (e instanceof Deno.errors.NotFound) return undefined;
    throw e;
  }
}

/**
 * The chat template of the checkpoint in `dir`, or null when it has none. `engine` defaults to
 * @huggingface/jinja (loaded when first rendering). CheckpointError when tokenizer_config.json is not JSON
 * or its chat_template is neither a string nor a list of {name, template}.
 */
export async function loadChatTemplate(
  dir: string,
  opts: { engine?: () => Promise<TemplateEngine> } = {},
): Promise<ChatTemplate | null> {
  const configPath = join(dir, "tokenizer_config.json");
  const configText = await readText(configPath);
  let config: Record<string, unknown> = {};
  if (configText !== undefined) {
    try {
      config = JSON.parse(configText);
    } catch (e) {
      throw new CheckpointError(`${configPath} is not JSON: ${(e as Error).message}`);
    }
  }
  const jinjaPath = join(dir, "chat_template.jinja");
  let source = await readText(jinjaPath);
  let from = jinjaPath;
  if (source === undefined) {
    const t = config.chat_template;
    from = `${configPath} (chat_template)`;
    if (t === undefined || t === null) return null;
    if (typeof t === "string") source = t;
    else if (Array.isArray(t)) {
      const named = t.find((x) => x?.name === "default") ?? t[0];
      if (typeof named?.template !== "string") {
        throw new CheckpointError(`${configPath}: chat_template is a list without a {name, template} entry`);
      }
      source = named.template;
    } else throw new CheckpointError(`${configPath}: chat_template must be a string or a list of templates`);
  }
  return chatTemplate(source!, {
    source: from,
    bosToken: tokenString(config.bos_token),
    eosToken: tokenString(config.eos_token),
    engine: opts.engine ?? jinjaEngine,
  });
}

/** A template from its source (loadChatTemplate reads it from a checkpoint). */
export function chatTemplate(
  text: string,
  o: { source: string; bosToken: string; eosToken: string; engine: () => Promise<TemplateEngine> },
): ChatTemplate {
  let compiled: Promise<(ctx: Record<string, unknown>) => string> | undefined;
  const compile = () => {
    compiled ??= o.engine().then((engine) => {
      try {
        return engine(text);
      } catch (e) {
        throw new CheckpointError(`${o.source}: the chat template does not parse: ${(e as Error).message}`);
      }
    });
    compiled.catch(() => (compiled = undefined));
    return compiled;
  };
  const render = async (messages: ChatMessage[], addGenerationPrompt: boolean) => {
    const run = await compile();
    try {
      return run({
        messages,
        bos_token: o.bosToken,
        eos_token: o.eosToken,
        add_generation_prompt: addGenerationPrompt,
        raise_exception: (message: string) => {
          throw new TemplateRenderError(`the chat template refused the messages: ${message}`);
        },
      });
    } catch (e) {
      if (e instanceof TemplateRenderError) throw e;
      throw new TemplateRenderError(`the chat template failed on these messages: ${(e as Error).message}`);
    }
  };
  let endOfTurn: Promise<string> | undefined;
  return {
    source: o.source,
    render: (messages, opts = {}) => render(messages, opts.addGenerationPrompt ?? true),
    endOfTurn() {
      endOfTurn ??= (async () => {
        const mark = "\u0091swactor-end-of-turn-probe\u0092";
        let text: string;
        try {
          text = await render([{ role: "user", content: "hi" }, { role: "assistant", content: mark }], false);
        } catch (e) {
          if (e instanceof TemplateEngineMissingError) throw e;
          return ""; // a template that refuses this conversation has no end of turn we can find
        }
        const i = text.lastIndexOf(mark);
        return i < 0 ? "" : text.slice(i + mark.length).replace(/^\s+/, "").split(/\s/)[0];
      })();
      endOfTurn.catch(() => (endOfTurn = undefined));
      return endOfTurn;
    },
  };
}
