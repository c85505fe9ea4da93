// V1 placement, outer loop: which nodes form the pipeline and in what order. Exact (every ordered subset)
// up to `exactLimit` candidate nodes; beyond that, greedy nearest-neighbour chains from several starts
// refined by local search (drop, replace, insert, swap, reverse a segment) until no move improves or the
// evaluation budget is spent. Each candidate order is scored by the optimal split (split_dp.ts).
import type { CompiledProblem } from "./compiled.ts";
import { type ExpertMode, type Split, SplitSolver } from "./split_dp.ts";

export interface OrderSearchOptions {
  /** Largest candidate count searched exhaustively. Default 6 (1,956 orders). */
  exactLimit?: number;
  /** Most orders the heuristic evaluates. Default 60,000. */
  budget?: number;
  /** Node indices that must be in the pipeline (pinned layers). Default none. */
  required?: number[];
  /** When set, only this order is evaluated. */
  fixedOrder?: number[];
  /** Default "local". */
  mode?: ExpertMode;
}

export interface OrderResult {
  order: number[];
  split: Split;
  evals: number;
  exact: boolean;
}

/** The best pipeline (node order + split) over `candidates` (node indices), or undefined if none fits. */
export function searchOrder(
  p: CompiledProblem,
  candidates: number[],
  opts: OrderSearchOptions = {},
): OrderResult | undefined {
  const solver = new SplitSolver(p, opts.mode ?? "local");
  const required = opts.required ?? [];
  if (opts.fixedOrder) {
    const split = solver.solve(opts.fixedOrder);
    return split && { order: opts.fixedOrder, split, evals: solver.evals, exact: true };
  }
  const exact = candidates.length <= (opts.exactLimit ?? 6);
  const found = exact
    ? exhaustive(solver, candidates, required)
    : heuristic(solver, candidates, required, opts.budget ?? 60_000);
  if (!found) return undefined;
  const split = solver.solve(found)!;
  return { order: found, split, evals: solver.evals, exact };
}

function exhaustive(solver: SplitSolver, candidates: number[], required: number[]): number[] | undefined {
  let best: number[] | undefined, bestV = Infinity;
  const maxLen = Math.min(candidates.length, solver.p.layers);
  const used = new Array<boolean>(candidates.length).fill(false);
  const cur: number[] = [];
  const visit = () => {
    if (cur.length > 0 && required.every((r) => cur.includes(r))) {
      const v = solver.latency(cur);
      if (v < bestV) {
        bestV = v;
        best = cur.slice();
      }
    }
    if (cur.length === maxLen) return;
    for (let i = 0; i < candidates.length; i++) {
      if (used[i]) continue;
      used[i] = true;
      cur.push(candidates[i]);
      visit();
      cur.pop();
      used[i] = false;
    }
  };
  visit();
  return best;
}

function heuristic(
  solver: SplitSolver,
  candidates: number[],
  required: number[],
  budget: number,
): number[] | undefined {
  const p = solver.p, N = p.nodes;
  const mem = solver.mode === "local" ? p.memAll : p.memDense;
  const need = mem[p.layers] + p.embedMem + p.headMem;
  const byMem = candidates.slice().sort((a, b) => p.memAvail[b] - p.memAvail[a]);
  // Cost of going a -> b: the hop plus b's own fixed overhead (each extra stage pays it once).
  const step = (a: number, b: number) => p.hop[a * N + b] + p.overhead[b];
  const starts: number[][] = [];
  for (const s of byMem.slice(0, 12)) {
    const chain = [s];
    const left = new Set(candidates.filter((c) => c !== s));
    let have = p.memAvail[s];
    for (const r of required) if (left.delete(r)) chain.push(r), have += p.memAvail[r];
    while (left.size && chain.length < p.layers && (have < need || solver.latency(chain) === Infinity)) {
      const last = chain[chain.length - 1];
      let pick = -1, pickV = Infinity;
      for (const c of left) {
        // Nearest neighbour, with memory as the tie-breaker (fewer stages).
        const v = step(last, c) - p.memAvail[c] * 1e-15;
        if (v < pickV) pickV = v, pick = c;
      }
      left.delete(pick);
      chain.push(pick);
      have += p.memAvail[pick];
    }
    starts.push(chain);
  }
  let best: number[] | undefined, bestV = Infinity;
  const scored = starts.map((c) => ({ c, v: solver.latency(c) })).sort((a, b) => a.v - b.v);
  for (const { c, v } of scored.slice(0, 3)) {
    if (v === Infinity) continue;
    const [o, ov] = localSearch(solver, c, v, candidates, required, budget / 3);
    if (ov < bestV) bestV = ov, best = o;
  }
  return best;
}

function localSearch(
  solver: SplitSolver,
  start: number[],
  startV: number,
  candidates: number[],
  required: number[],
  budget: number,
): [number[], number] {
  let cur = start.slice(), curV = startV;
  const limit = solver.evals + budget;
  const tryMove = (next: number[]) => {
    if (solver.evals >= limit) return false;
    const v = solver.latency(next);
    if (v < curV - 1e-12) {
      cur = next;
      curV = v;
      return true;
    }
    return false;
  };
  let improved = true;
  while (improved && solver.evals < limit) {
    improved = false;
    const unused = candidates.filter((c) => !cur.includes(c));
    const m = cur.length;
    moves: {
      for (let i = 0; i < m; i++) {
        if (m > 1 && !required.includes(cur[i]) && tryMove(cur.filter((_, j) => j !== i))) break moves;
      }
      for (let i = 0; i < m; i++) {
        if (required.includes(cur[i])) continue;
        for (const u of unused) if (tryMove(cur.map((x, j) => j === i ? u : x))) break moves;
      }
      for (let i = 0; i < m; i++) {
        for (let j = i + 1; j < m; j++) {
          const s = cur.slice();
          [s[i], s[j]] = [s[j], s[i]];
          if (tryMove(s)) break moves;
          if (
            j > i + 1 && tryMove([...cur.slice(0, i), ...cur.slice(i, j + 1).reverse(), ...cur.slice(j + 1)])
          ) break moves;
        }
      }
      for (const u of unused) {
        for (let i = 0; i <= m; i++) if (tryMove([...cur.slice(0, i), u, ...cur.slice(i)])) break moves;
      }
      continue;
    }
    improved = true;
  }
  return [cur, curV];
}
