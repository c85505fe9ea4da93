// V1 placement core: the optimal contiguous split of the layers over a fixed order of nodes, by dynamic
// programming. f[i][j] = least latency for layers [0, j) on the first i+1 nodes of the order, node i
// ending at layer j. Every node of the order gets at least one layer. Objective: per-token decode
// latency (sum of stage times + hops + the sampled token's return hop), which for one stream without
// microbatching is 1 / throughput, so minimizing one maximizes the other (docs/PLANNER.md).
import type { CompiledProblem } from "./compiled.ts";

/** Which weights a stage holds: all of its layers' experts ("local"), or none ("dense": experts placed apart). */
export type ExpertMode = "local" | "dense";

export interface Split {
  /** Predicted seconds per token under the compiled cost model. */
  latency: number;
  /** Stage i covers layers [cuts[i], cuts[i + 1]); cuts[0] = 0, cuts[m] = layers. */
  cuts: number[];
}

/** Seconds stage `n` takes per token for layers [k, j), or Infinity when it does not fit or breaks a pin. */
export function stageTime(
  p: CompiledProblem,
  n: number,
  k: number,
  j: number,
  first: boolean,
  last: boolean,
  mode: ExpertMode,
): number {
  const mem = mode === "local" ? p.memAll : p.memDense;
  let m = mem[j] - mem[k];
  if (first) m += p.embedMem;
  if (last) m += p.headMem - (first ? p.tiedSaving : 0);
  if (m > p.memAvail[n]) return Infinity;
  if (!pinsOk(p, n, k, j)) return Infinity;
  const read = mode === "local" ? p.readAll : p.readDense;
  const fl = mode === "local" ? p.flopsAll : p.flopsDense;
  let bytes = read[j] - read[k], flops = fl[j] - fl[k];
  if (first) bytes += p.embedRead;
  if (last) {
    bytes += p.headRead;
    flops += p.headFlops;
  }
  const bw = p.cacheBytes[n] > 0 && bytes <= p.cacheBytes[n] ? p.cacheBw[n] : p.memBw[n];
  return p.overhead[n] + (j - k) * p.layerOverhead[n] + Math.max(bytes / bw, flops / p.flops[n]);
}

/** Node n may own [k, j) when every pinned layer inside is pinned to n and all of n's pins are inside. */
function pinsOk(p: CompiledProblem, n: number, k: number, j: number): boolean {
  const pinnedInside = p.pinPrefix[j] - p.pinPrefix[k];
  const mine = p.pinCount[n];
  if (mine === 0) return pinnedInside === 0;
  return pinnedInside === mine && p.pinMin[n] >= k && p.pinMax[n] < j;
}

/** Reusable scratch space, so that evaluating many orders allocates nothing. */
export class SplitSolver {
  #f: Float64Array;
  #g: Float64Array;
  #parent: Int32Array;
  /** Number of orders evaluated so far. */
  evals = 0;

  constructor(readonly p: CompiledProblem, readonly mode: ExpertMode = "local") {
    this.#f = new Float64Array(p.layers + 1);
    this.#g = new Float64Array(p.layers + 1);
    this.#parent = new Int32Array(Math.max(1, p.nodes) * (p.layers + 1));
  }

  /** The least latency of `order` (node indices), or Infinity when no split fits. */
  latency(order: ArrayLike<number>): number {
    return this.#run(order, false)?.latency ?? Infinity;
  }

  /** The best split of `order`, or undefined when no split fits. */
  solve(order: ArrayLike<number>): Split | undefined {
    return this.#run(order, true);
  }

  #run(order: ArrayLike<number>, withCuts: boolean): Split | undefined {
    this.evals++;
    const p = this.p, L = p.layers, m = order.length;
    if (m === 0 || m > L) return undefined;
    let f = this.#f, g = this.#g;
    const parent = this.#parent;
    f.fill(Infinity);
    const o0 = order[0];
    for (let j = 1; j <= L; j++) {
      if (m === 1 && j !== L) continue;
      const t = stageTime(p, o0, 0, j, true, m === 1, this.mode);
      if (t === Infinity && !this.#mayGrow(o0, 0, j)) break;
      f[j] = t;
    }
    for (let i = 1; i < m; i++) {
      g.fill(Infinity);
      const n = order[i], last = i === m - 1;
      const hop = p.hop[order[i - 1] * p.nodes + n];
      for (let k = i; k < L; k++) {
        const base = f[k];
        if (base === Infinity) continue;
        for (let j = last ? L : k + 1; j <= L; j++) {
          const t = stageTime(p, n, k, j, false, last, this.mode);
          if (t === Infinity) {
            if (!this.#mayGrow(n, k, j)) break;
            continue;
          }
          const v = base + hop + t;
          if (v < g[j]) {
            g[j] = v;
            if (withCuts) parent[i * (L + 1) + j] = k;
          }
        }
      }
      [f, g] = [g, f];
    }
    this.#f = f;
    this.#g = g;
    const best = f[L];
    if (best === Infinity) return undefined;
    const latency = best + (m > 1 ? p.ret[order[m - 1] * p.nodes + o0] : 0);
    if (!withCuts) return { latency, cuts: [] };
    const cuts = new Array<number>(m + 1);
    cuts[m] = L;
    for (let i = m - 1, j = L; i > 0; i--) {
      j = parent[i * (L + 1) + j];
      cuts[i] = j;
    }
    cuts[0] = 0;
    return { latency, cuts };
  }

  /** Whether a longer range [k, j+1..) could still become valid: only pins (not memory) can unblock it. */
  #mayGrow(n: number, k: number, j: number): boolean {
    const mem = this.mode === "local" ? this.p.memAll : this.p.memDense;
    return mem[j] - mem[k] <= this.p.memAvail[n];
  }
}
