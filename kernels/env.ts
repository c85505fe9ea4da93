// A bad SWACTOR_* environment variable is bad input, not a bug: main.ts exits 2 with its message, which
// names the variable, what it got and what it takes.

export class EnvError extends Error {
  override name = "EnvError";
}
