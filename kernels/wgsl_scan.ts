// A WGSL module cut into tokens and its module-scope declarations: what kernels/persistent.ts needs to take
// several kernels' modules apart and put them into one (renaming each one's names, moving its bindings, turning
// its entry point into a function). Not a parser: it reads only the shape of top-level items (attributes, the
// keyword, the name, and the span up to the closing `;` or `}`) and leaves expressions as tokens. Written here
// because no npm library parses WGSL (naga and tint are Rust and C++; the WGSL grammars on npm are for
// highlighting).

export type TokenKind = "id" | "num" | "punct" | "space";

export interface Token {
  kind: TokenKind;
  text: string;
}

const NUMBER =
  /^(?:0[xX][0-9a-fA-F]+(?:\.[0-9a-fA-F]*)?(?:[pP][+-]?[0-9]+)?[iuhf]?|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?[iuhf]?)/;
const IDENT = /^[A-Za-z_][A-Za-z0-9_]*/;

/** Tokens of `src`; comments become spaces, so emitting the tokens' texts gives the module without them. */
export function scanWgsl(src: string): Token[] {
  const out: Token[] = [];
  let i = 0;
  while (i < src.length) {
    const c = src[i];
    if (/\s/.test(c)) {
      let j = i + 1;
      while (j < src.length && /\s/.test(src[j])) j++;
      out.push({ kind: "space", text: src.slice(i, j) });
      i = j;
    } else if (src.startsWith("//", i)) {
      let j = src.indexOf("\n", i);
      if (j < 0) j = src.length;
      out.push({ kind: "space", text: " " });
      i = j;
    } else if (src.startsWith("/*", i)) {
      let depth = 1, j = i + 2;
      while (j < src.length && depth > 0) {
        if (src.startsWith("/*", j)) depth++, j += 2;
        else if (src.startsWith("*/", j)) depth--, j += 2;
        else j++;
      }
      if (depth > 0) throw new Error("WGSL: a block comment is not closed");
      out.push({ kind: "space", text: " " });
      i = j;
    } else {
      const rest = src.slice(i, i + 64);
      const id = IDENT.exec(rest);
      const num = id ? null : NUMBER.exec(rest);
      const text = id?.[0] ?? num?.[0] ?? c;
      out.push({ kind: id ? "id" : num ? "num" : "punct", text });
      i += text.length;
    }
  }
  return out;
}

export type DeclKind =
  | "directive"
  | "struct"
  | "var"
  | "const"
  | "override"
  | "alias"
  | "fn"
  | "const_assert";

/** A module-scope item: tokens [start, end) of the module's, its attributes included. */
export interface Decl {
  kind: DeclKind;
  /** The declared name ("" for directives and const_assert). */
  name: string;
  /** Attribute names to their argument text (`@binding(3)` -> binding: "3", `@compute` -> compute: ""). */
  attrs: Map<string, string>;
  start: number;
  end: number;
  /** Where the item's keyword is (after the attributes). */
  keyword: number;
  /** var: the template text (`storage, read_write`), "" without one. */
  template?: string;
  /** var: the declared type's text, spaces removed. */
  type?: string;
}

/** Index of the next non-space token at or after i (tokens.length when none). */
export function nextSig(tokens: readonly Token[], i: number): number {
  while (i < tokens.length && tokens[i].kind === "space") i++;
  return i;
}

/** Index of the previous non-space token before i (-1 when none). */
export function prevSig(tokens: readonly Token[], i: number): number {
  i--;
  while (i >= 0 && tokens[i].kind === "space") i--;
  return i;
}

const OPEN: Record<string, string> = { "(": ")", "[": "]", "{": "}" };

/** Index of the bracket closing the one at `open` ((, [ or {). */
export function closing(tokens: readonly Token[], open: number): number {
  const o = tokens[open].text, c = OPEN[o];
  let depth = 0;
  for (let i = open; i < tokens.length; i++) {
    if (tokens[i].text === o) depth++;
    else if (tokens[i].text === c && --depth === 0) return i;
  }
  throw new Error(`WGSL: an unclosed '${o}'`);
}

/** Index of the `>` closing a template list whose `<` is at `open`, by angle depth (no comparisons occur). */
function closingAngle(tokens: readonly Token[], open: number): number {
  let depth = 0;
  for (let i = open; i < tokens.length; i++) {
    if (tokens[i].text === "<") depth++;
    else if (tokens[i].text === ">" && --depth === 0) return i;
  }
  throw new Error("WGSL: an unclosed template list");
}

const text = (tokens: readonly Token[], a: number, b: number) =>
  tokens.slice(a, b).map((t) => t.text).join("");

/** The module's top-level items, in order. Throws naming what it does not recognise. */
export function moduleDecls(tokens: readonly Token[]): Decl[] {
  const decls: Decl[] = [];
  let i = nextSig(tokens, 0);
  while (i < tokens.length) {
    const start = i;
    const attrs = new Map<string, string>();
    while (tokens[i]?.text === "@") {
      const name = nextSig(tokens, i + 1);
      let after = nextSig(tokens, name + 1);
      let arg = "";
      if (tokens[after]?.text === "(") {
        const end = closing(tokens, after);
        arg = text(tokens, after + 1, end).trim();
        after = nextSig(tokens, end + 1);
      }
      attrs.set(tokens[name].text, arg);
      i = after;
    }
    const keyword = i, kw = tokens[i]?.text;
    const semicolonEnd = (from: number) => {
      let j = from;
      while (j < tokens.length && tokens[j].text !== ";") {
        j = OPEN[tokens[j].text] ? closing(tokens, j) + 1 : j + 1;
      }
      if (j >= tokens.length) throw new Error(`WGSL: '${kw}' at module scope has no closing ';'`);
      return j + 1;
    };
    let d: Decl;
    if (kw === "enable" || kw === "requires" || kw === "diagnostic") {
      d = { kind: "directive", name: "", attrs, start, keyword, end: semicolonEnd(i) };
    } else if (kw === "struct") {
      const name = nextSig(tokens, i + 1);
      const open = nextSig(tokens, name + 1);
      let end = closing(tokens, open) + 1;
      const semi = nextSig(tokens, end);
      if (tokens[semi]?.text === ";") end = semi + 1;
      d = { kind: "struct", name: tokens[name].text, attrs, start, keyword, end };
    } else if (kw === "fn") {
      const name = nextSig(tokens, i + 1);
      let j = nextSig(tokens, name + 1);
      while (tokens[j] && tokens[j].text !== "{") j = OPEN[tokens[j].text] ? closing(tokens, j) + 1 : j + 1;
      if (!tokens[j]) throw new Error(`WGSL: fn ${tokens[name].text} has no body`);
      d = { kind: "fn", name: tokens[name].text, attrs, start, keyword, end: closing(tokens, j) + 1 };
    } else if (kw === "var") {
      let j = nextSig(tokens, i + 1), template = "";
      if (tokens[j].text === "<") {
        const end = closingAngle(tokens, j);
        template = text(tokens, j + 1, end).replace(/\s+/g, "");
        j = nextSig(tokens, end + 1);
      }
      const name = tokens[j].text;
      const end = semicolonEnd(j);
      let type = "";
      const colon = nextSig(tokens, j + 1);
      if (tokens[colon].text === ":") {
        let k = colon + 1;
        while (k < end - 1 && tokens[k].text !== "=") {
          k = tokens[k].text === "<" ? closingAngle(tokens, k) + 1 : k + 1;
        }
        type = text(tokens, colon + 1, k).replace(/\s+/g, "");
      }
      d = { kind: "var", name, attrs, start, keyword, end, template, type };
    } else if (kw === "const" || kw === "override" || kw === "alias") {
      const name = nextSig(tokens, i + 1);
      d = { kind: kw, name: tokens[name].text, attrs, start, keyword, end: semicolonEnd(name) };
    } else if (kw === "const_assert") {
      d = { kind: "const_assert", name: "", attrs, start, keyword, end: semicolonEnd(i) };
    } else if (kw === ";") {
      i = nextSig(tokens, i + 1);
      continue;
    } else {
      throw new Error(`WGSL: unexpected '${kw}' at module scope`);
    }
    decls.push(d);
    i = nextSig(tokens, d.end);
  }
  return decls;
}
