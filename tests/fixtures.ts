// Where test fixtures are: small ones are copied into tests/fixtures/ (always there, also in CI);
// big ones (llama3-tiny's 16 MB weights and 6 MB tokenizer.json, the sharded kimi-k2-tiny) are read
// from ../shared/fixtures beside the repository when present. Tests that need those look them up at module
// load and are ignored otherwise, the reason in their name (needs() in tests/support/needs.ts).
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { existsSync } from "node:fs";

const REPO_ROOT = fileURLToPath(new URL("..", import.meta.url));

/** The folders searched, in order. */
export const FIXTURE_ROOTS = [
  // A folder of regenerated fixtures (e.g. on the GPU machine, which has no ../shared), searched first.
  ...(Deno.env.get("SWACTOR_FIXTURES") ? [Deno.env.get("SWACTOR_FIXTURES")!] : []),
  join(REPO_ROOT, "tests", "fixtures"),
  join(REPO_ROOT, "..", "shared", "fixtures"),
];

/**
 * The first `<root>/<name>` folder that holds the file `needs` (default "config.json"), or null.
 * For example `fixtureDir("llama3-tiny", { needs: "tokenizer.json" })`.
 */
export function fixtureDir(name: string, opts: { needs?: string } = {}): string | null {
  const needs = opts.needs ?? "config.json";
  for (const root of FIXTURE_ROOTS) {
    const dir = join(root, name);
    if (existsSync(join(dir, needs))) return dir;
  }
  return null;
}

/**
 * Logs why a test is skipped; returns true so that `if (skip(...)) return;` reads naturally.
 * @deprecated A test that returns early is reported as passed. Use `ignore` with needs()
 * (tests/support/needs.ts). Still called from tests/models/ until those are converted.
 */
export function skipped(test: string, why: string): true {
  console.log(`skipped: ${test}: ${why}`);
  return true;
}
