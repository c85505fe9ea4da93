// Fakes for the OpenAI server's tests: a character tokenizer (id = char code + 10, BOS 1, EOS 2), a
// generator that continues any prompt with a fixed text (then EOS) and honours maxTokens, eos and the abort
// signal like PipelineClient.generate, and services over them.
import { KvBudget } from "../../../node/api/kv_budget.ts";
import type { ServedModel, ServingServices } from "../../../node/serving/mod.ts";
import type { GenerateOutcome, RequestOptions, TokenEvent } from "../../../node/stage/mod.ts";
import type { TextTokenizer } from "../../../models/tokenizer.ts";
import { chatTemplate, type TemplateEngine } from "../../../models/chat_template.ts";

export const BOS = 1;
export const EOS = 2;
export const EOT = 3;

export const charTokenizer: TextTokenizer = {
  source: "chars",
  encode(text, opts = {}) {
    const ids: number[] = [];
    // "<eot>" is a special token, as a template writes it.
    for (const part of text.split(/(<eot>|<bos>)/)) {
      if (part === "<eot>") ids.push(EOT);
      else if (part === "<bos>") ids.push(BOS);
      else for (const ch of part) ids.push(ch.codePointAt(0)! + 10);
    }
    return opts.special === false ? ids : [BOS, ...ids];
  },
  decode: (ids) => ids.filter((t) => t >= 10).map((t) => String.fromCodePoint(t - 10)).join(""),
};

/** A template engine for `<bos>{role}: {content}<eot>` turns; refuses a conversation that starts with the assistant. */
export const turnsEngine: TemplateEngine = () => (ctx) => {
  const messages = ctx.messages as { role: string; content: string }[];
  if (messages[0]?.role === "assistant") {
    (ctx.raise_exception as (m: string) => never)("the user speaks first");
  }
  return String(ctx.bos_token) + messages.map((m) => `${m.role}: ${m.content}<eot>`).join("") +
    (ctx.add_generation_prompt ? "assistant: " : "");
};

export interface FakeGen {
  services: ServingServices;
  /** Prompts the generator was given, and the options. */
  calls: { prompt: number[]; opts: RequestOptions }[];
  /** Aborts seen (the signal's reasons). */
  aborted: unknown[];
  /** Requests generating now. */
  active(): number;
  setReady(r: boolean): void;
}

function event(index: number, token: number): TokenEvent {
  return {
    index,
    token,
    atMs: 5 + index,
    timings: { computeMs: [0.5, 0.25], wireMs: [0.125, index === 0 ? null : 0.0625], bytes: [16, 8] },
    trace: [],
  };
}

/**
 * `reply` is what the model "says" (then EOS); `gapMs` a pause between tokens (0: all at once);
 * `hold` keeps each request open after its tokens until aborted (for cancellation and queue tests).
 */
export function fakeServices(
  o: {
    reply?: string;
    gapMs?: number;
    hold?: boolean;
    chat?: boolean;
    budget?: number;
    tokenizer?: boolean;
  } = {},
): FakeGen {
  const reply = o.reply ?? "Hello world. The end";
  const calls: FakeGen["calls"] = [];
  const aborted: unknown[] = [];
  let active = 0;
  let ready = true;
  const model: ServedModel = {
    id: "tiny",
    dir: "/models/tiny",
    created: 1_700_000_000,
    tokenizer: o.tokenizer === false ? null : charTokenizer,
    chat: o.chat === false ? null : chatTemplate("(turns)", {
      source: "test",
      bosToken: "<bos>",
      eosToken: "",
      engine: () => Promise.resolve(turnsEngine),
    }),
    eos: [EOS],
    vocab: 70000,
  };
  const generate = (prompt: number[], opts: RequestOptions): Promise<GenerateOutcome> => {
    calls.push({ prompt, opts });
    active++;
    return new Promise((resolve, reject) => {
      const script = [...charTokenizer.encode(reply, { special: false }), EOS];
      const tokens: number[] = [];
      const events: TokenEvent[] = [];
      let done = false;
      const end = (f: () => void) => {
        if (done) return;
        done = true;
        active--;
        f();
      };
      opts.signal?.addEventListener("abort", () => {
        aborted.push(opts.signal!.reason);
        end(() => reject(opts.signal!.reason));
      }, { once: true });
      const step = (i: number) => {
        if (done) return;
        const token = script[i];
        const e = event(i, token);
        tokens.push(token);
        events.push(e);
        opts.onToken?.(e);
        if (done) return; // aborted by onToken (a stop string)
        const stop = (opts.eos ?? []).includes(token)
          ? "eos"
          : tokens.length >= (opts.maxTokens ?? 64)
          ? "max_tokens"
          : null;
        if (stop) {
          if (o.hold) return;
          return end(() =>
            resolve({ tokens, stopReason: stop, events, firstTokenMs: 5, tokS: 100, wire: "f16" })
          );
        }
        if (o.gapMs) setTimeout(() => step(i + 1), o.gapMs);
        else step(i + 1);
      };
      if (o.gapMs) setTimeout(() => step(0), o.gapMs);
      else queueMicrotask(() => step(0));
    });
  };
  const budget = new KvBudget(() => o.budget ?? 4096);
  const services: ServingServices = {
    model,
    ready: () => (ready ? { ready: true } : { ready: false, why: "the model is loading" }),
    generate,
    budget,
    cluster: () =>
      Promise.resolve({
        self: "node-a",
        members: [
          {
            id: "node-a",
            state: "alive",
            roles: ["leader", "stage-0"],
            adapter: "llvmpipe",
            gpuMemoryBytes: 2 ** 30,
          },
          { id: "node-b", state: "alive", roles: ["stage-1"], adapter: "llvmpipe" },
          { id: "node-c", state: "dead", roles: [] },
        ],
        plan: {
          stages: [{ index: 0, node: "node-a", layers: [0, 2] }, {
            index: 1,
            node: "node-b",
            layers: [2, 4],
          }],
        },
        stages: [
          {
            index: 0,
            planVersion: 1,
            node: "node-a",
            layers: [0, 2],
            active,
            kvBytes: active * 4096,
            weightBytes: 100,
          },
          {
            index: 1,
            planVersion: 1,
            node: "node-b",
            layers: [2, 4],
            active,
            kvBytes: active * 4096,
            weightBytes: 100,
          },
        ],
      }),
  };
  return { services, calls, aborted, active: () => active, setReady: (r) => (ready = r) };
}

/** Reads an SSE body into its `data:` payloads (strings), in order. */
export async function sseData(body: ReadableStream<Uint8Array>): Promise<string[]> {
  const text = await new Response(body).text();
  return text.split("\n\n").filter((b) => b.trim()).map((b) =>
    b.split("\n").filter((l) => l.startsWith("data: ")).map((l) => l.slice(6)).join("\n")
  );
}
