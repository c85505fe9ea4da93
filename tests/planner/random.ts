// Helpers for the planner's property tests; the seeded generator is the project's own (node/random.ts), so
// that failures reproduce.
export { seededRandom as rng } from "../../node/random.ts";

export function pick<T>(r: () => number, xs: T[]): T {
  return xs[Math.floor(r() * xs.length)];
}

export function int(r: () => number, lo: number, hi: number): number {
  return lo + Math.floor(r() * (hi - lo + 1));
}
