// The planner language's surface syntax, shared by model graphs, clusters and constraints:
//
//   doc   := stmt*
//   stmt  := WORD '=' value                      a property
//          | WORD value* ('{' stmt* '}')?        a statement, optionally with a body
//   value := NUMBER UNIT? | NUMBER '..' NUMBER | STRING | WORD | '[' value (',' value)* ']'
//
// Statements end at a newline, a ';' or a '}'. '#' starts a comment. This file turns text into that
// generic tree; planner/lang/read.ts gives the tree its meaning. Every node carries its line:column.
// A word right after a number is its unit only when it is a known unit (`24 GiB`, but `layer 3 expert`).
import { isUnit } from "../units.ts";

/** A syntax or meaning error in planner-language text, pointing at line:column (both 1-based). */
export class LangError extends TypeError {
  override name = "LangError";
  constructor(readonly file: string, readonly line: number, readonly col: number, readonly detail: string) {
    super(`${file}:${line}:${col}: ${detail}`);
  }
}

export interface Pos {
  line: number;
  col: number;
}

export type Value =
  | { type: "number"; value: number; unit?: string; pos: Pos }
  | { type: "range"; start: number; end: number; pos: Pos }
  | { type: "string"; value: string; pos: Pos }
  | { type: "word"; value: string; pos: Pos }
  | { type: "list"; items: Value[]; pos: Pos };

export interface Stmt {
  key: string;
  pos: Pos;
  /** Set for `key = value`. */
  prop?: Value;
  args: Value[];
  body?: Stmt[];
}

type TokKind = "word" | "number" | "string" | "punct" | "newline" | "eof";
interface Tok {
  kind: TokKind;
  text: string;
  pos: Pos;
}

const WORD_START = /[A-Za-z_]/;
const WORD_CHAR = /[A-Za-z0-9_./-]/;

function lex(text: string, file: string): Tok[] {
  const toks: Tok[] = [];
  let i = 0, line = 1, col = 1;
  const at = (): Pos => ({ line, col });
  const advance = (n: number) => {
    i += n;
    col += n;
  };
  while (i < text.length) {
    const c = text[i];
    if (c === "\n") {
      toks.push({ kind: "newline", text: "\n", pos: at() });
      i++;
      line++;
      col = 1;
    } else if (c === " " || c === "\t" || c === "\r") advance(1);
    else if (c === "#") { while (i < text.length && text[i] !== "\n") advance(1); }
    else if (c === '"') {
      const pos = at();
      let j = i + 1, s = "";
      while (j < text.length && text[j] !== '"' && text[j] !== "\n") {
        if (text[j] === "\\" && j + 1 < text.length) j++;
        s += text[j++];
      }
      if (text[j] !== '"') throw new LangError(file, pos.line, pos.col, "unterminated string");
      toks.push({ kind: "string", text: s, pos });
      advance(j + 1 - i);
    } else if (/[0-9]/.test(c) || (c === "-" && /[0-9]/.test(text[i + 1] ?? ""))) {
      const m = /^-?[0-9][0-9_]*(\.[0-9][0-9_]*)?([eE][+-]?[0-9]+)?/.exec(text.slice(i))!;
      toks.push({ kind: "number", text: m[0].replaceAll("_", ""), pos: at() });
      advance(m[0].length);
    } else if (WORD_START.test(c)) {
      let j = i + 1;
      while (j < text.length && WORD_CHAR.test(text[j]) && text.slice(j, j + 2) !== "..") j++;
      toks.push({ kind: "word", text: text.slice(i, j), pos: at() });
      advance(j - i);
    } else if (text.startsWith("..", i)) {
      toks.push({ kind: "punct", text: "..", pos: at() });
      advance(2);
    } else if ("{}[]=,;".includes(c)) {
      toks.push({ kind: "punct", text: c, pos: at() });
      advance(1);
    } else throw new LangError(file, line, col, `unexpected character ${JSON.stringify(c)}`);
  }
  toks.push({ kind: "eof", text: "end of file", pos: at() });
  return toks;
}

/** Parses text into the generic statement tree; throws LangError at the first problem. */
export function parseSyntax(text: string, file = "<input>"): Stmt[] {
  const toks = lex(text, file);
  let k = 0;
  const peek = () => toks[k];
  const fail = (t: Tok, msg: string): never => {
    throw new LangError(file, t.pos.line, t.pos.col, msg);
  };
  const describe = (t: Tok) => t.kind === "newline" ? "end of line" : JSON.stringify(t.text);
  const isPunct = (t: Tok, p: string) => t.kind === "punct" && t.text === p;
  const skipNewlines = () => {
    while (peek().kind === "newline" || isPunct(peek(), ";")) k++;
  };

  function value(): Value {
    const t = toks[k++];
    if (t.kind === "number") {
      const n = Number(t.text);
      if (isPunct(peek(), "..")) {
        k++;
        const e = toks[k++];
        if (e.kind !== "number") fail(e, `expected a number after "..", got ${describe(e)}`);
        if (!Number.isInteger(n) || !Number.isInteger(Number(e.text))) {
          fail(t, "a range needs integer bounds");
        }
        return { type: "range", start: n, end: Number(e.text), pos: t.pos };
      }
      if (peek().kind === "word" && isUnit(peek().text)) {
        return { type: "number", value: n, unit: toks[k++].text, pos: t.pos };
      }
      return { type: "number", value: n, pos: t.pos };
    }
    if (t.kind === "string") return { type: "string", value: t.text, pos: t.pos };
    if (t.kind === "word") return { type: "word", value: t.text, pos: t.pos };
    if (isPunct(t, "[")) {
      const items: Value[] = [];
      while (peek().kind === "newline") k++;
      if (!isPunct(peek(), "]")) {
        for (;;) {
          items.push(value());
          while (peek().kind === "newline") k++;
          if (isPunct(peek(), "]")) break;
          if (!isPunct(peek(), ",")) fail(peek(), `expected "," or "]" in a list, got ${describe(peek())}`);
          k++;
          while (peek().kind === "newline") k++;
        }
      }
      k++;
      return { type: "list", items, pos: t.pos };
    }
    return fail(t, `expected a value, got ${describe(t)}`);
  }

  function block(top: boolean): Stmt[] {
    const out: Stmt[] = [];
    for (;;) {
      skipNewlines();
      const t = peek();
      if (t.kind === "eof") {
        if (!top) fail(t, 'expected "}" before the end of the file');
        return out;
      }
      if (isPunct(t, "}")) {
        if (top) fail(t, 'unexpected "}"');
        return out;
      }
      if (t.kind !== "word") fail(t, `expected a statement (a word), got ${describe(t)}`);
      k++;
      const stmt: Stmt = { key: t.text, pos: t.pos, args: [] };
      if (isPunct(peek(), "=")) {
        k++;
        stmt.prop = value();
      } else {
        while (
          peek().kind === "number" || peek().kind === "string" || peek().kind === "word" ||
          isPunct(peek(), "[")
        ) {
          stmt.args.push(value());
        }
        if (isPunct(peek(), "{")) {
          k++;
          stmt.body = block(false);
          k++; // the "}"
        }
      }
      const end = peek();
      if (stmt.prop?.type === "number" && stmt.prop.unit === undefined && end.kind === "word") {
        fail(end, `unknown unit "${end.text}"`);
      }
      if (!(end.kind === "newline" || end.kind === "eof" || isPunct(end, ";") || isPunct(end, "}"))) {
        fail(end, `expected the end of the statement, got ${describe(end)}`);
      }
      out.push(stmt);
    }
  }
  return block(true);
}
