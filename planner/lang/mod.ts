// The planner language: one small textual language for model graphs, clusters and constraints.
export { LangError, parseSyntax } from "./syntax.ts";
export type { Pos, Stmt, Value } from "./syntax.ts";
export { type Document, parseCluster, parseDocument, parseModel } from "./read.ts";
export { printCluster, printModel } from "./print.ts";
