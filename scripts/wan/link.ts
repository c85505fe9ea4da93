// The model of one direction of an emulated WAN link, as a pure state machine over a caller-supplied
// clock: it decides for each datagram whether it is lost and, if not, when it reaches the far end.
// Nothing here touches sockets or timers, so tests drive it with a fake clock.
//
// Stages, in the order a datagram meets them (like a real path: a bottleneck router, then the wire):
//   1. random loss, independent per datagram, from a seeded PRNG;
//   2. a rate cap: a token bucket (rate, burst) in front of a FIFO queue of `queueBytes`; a datagram that
//      would find more than `queueBytes` waiting ahead of it is tail-dropped, as a router's queue does;
//   3. propagation: `delayMs` plus uniform jitter in [-jitterMs, +jitterMs]; unless `reorder` is set, a
//      datagram never arrives before the one sent ahead of it (a FIFO link, unlike netem's default).

import { deriveSeed, seededRandom } from "./seeded_random.ts";

/** How one direction of a link behaves. Every field is optional; the defaults give a perfect link. */
export interface LinkSpec {
  /** One-way propagation delay, ms. Default 0. */
  delayMs?: number;
  /** Each datagram's delay is `delayMs` + uniform(-jitterMs, +jitterMs), never below 0. Default 0. */
  jitterMs?: number;
  /** Let jitter reorder datagrams. Default false: arrival order equals send order. */
  reorder?: boolean;
  /** Probability in [0, 1] that a datagram is dropped, independently of the others. Default 0. */
  loss?: number;
  /** Bottleneck rate, bytes per second. Default Infinity (no cap). */
  rateBytesPerSec?: number;
  /** Token-bucket depth: bytes that may leave back to back after the link was idle. Default 3000. */
  burstBytes?: number;
  /** Bytes that may wait for the rate cap before tail drop. Default max(64 KiB, 50 ms at the rate). */
  queueBytes?: number;
  /** Seed of the loss and jitter draws. Default 1. */
  seed?: number;
}

/** The state of one link direction. Create with `createLink`; advance only through `admit` and `retuneLink`. */
export interface LinkState {
  readonly kind: "link";
  spec: Readonly<Required<LinkSpec>>;
  /** Uniform [0, 1) draws for loss and jitter. */
  readonly random: () => number;
  /** Theoretical arrival time of the token bucket (GCRA), ms on the caller's clock. */
  tat: number;
  /** Arrival time of the last delivered datagram, ms; keeps the link FIFO when `reorder` is false. */
  lastArrival: number;
  /** Datagrams dropped by random loss. */
  lostPackets: number;
  /** Datagrams dropped because the bottleneck queue was full. */
  queueDrops: number;
}

/** What happens to one datagram: it arrives at `deliverAt` (ms), or it is dropped and why. */
export type Admission = { dropped: null; deliverAt: number } | { dropped: "loss" | "queue" };

/** Options of `createLink`. */
export interface CreateLinkOptions {
  /** Mixed into the seed so that links built from one spec draw independent patterns. Default 0. */
  stream?: number;
}

const DEFAULT_BURST_BYTES = 3000;
const MIN_QUEUE_BYTES = 64 * 1024;
const DEFAULT_QUEUE_MS = 50;

/** Checks a spec and fills in the defaults; throws RangeError/TypeError naming the bad field. */
export function normalizeLink(spec: LinkSpec = {}): Required<LinkSpec> {
  const nonNegative = (name: string, v: number | undefined, def: number, allowInf = false): number => {
    if (v === undefined) return def;
    if (typeof v !== "number" || Number.isNaN(v) || v < 0 || (!allowInf && !Number.isFinite(v))) {
      throw new RangeError(`link ${name} must be a ${allowInf ? "" : "finite "}number >= 0, got ${v}`);
    }
    return v;
  };
  const rate = nonNegative("rateBytesPerSec", spec.rateBytesPerSec, Infinity, true);
  if (rate === 0) {
    throw new RangeError("link rateBytesPerSec must be > 0 (omit it or use Infinity for no cap)");
  }
  const loss = nonNegative("loss", spec.loss, 0);
  if (loss > 1) throw new RangeError(`link loss must be a probability in [0, 1], got ${loss}`);
  const seed = spec.seed ?? 1;
  if (!Number.isInteger(seed)) throw new TypeError(`link seed must be an integer, got ${seed}`);
  const defaultQueue = Number.isFinite(rate)
    ? Math.max(MIN_QUEUE_BYTES, Math.round(rate * DEFAULT_QUEUE_MS / 1000))
    : MIN_QUEUE_BYTES;
  return {
    delayMs: nonNegative("delayMs", spec.delayMs, 0),
    jitterMs: nonNegative("jitterMs", spec.jitterMs, 0),
    reorder: spec.reorder ?? false,
    loss,
    rateBytesPerSec: rate,
    burstBytes: nonNegative("burstBytes", spec.burstBytes, DEFAULT_BURST_BYTES),
    queueBytes: nonNegative("queueBytes", spec.queueBytes, defaultQueue),
    seed,
  };
}

/** A fresh link direction, idle since time -Infinity. */
export function createLink(spec: LinkSpec = {}, options: CreateLinkOptions = {}): LinkState {
  const full = normalizeLink(spec);
  return {
    kind: "link",
    spec: full,
    random: seededRandom(deriveSeed(full.seed, options.stream ?? 0)),
    tat: -Infinity,
    lastArrival: -Infinity,
    lostPackets: 0,
    queueDrops: 0,
  };
}

/**
 * Changes a live link's behaviour from now on (e.g. a benchmark that sweeps the delay on one set of
 * connections). The queue, FIFO and counter state carry over, and so does the random stream: the new spec's
 * `seed` is ignored. Datagrams already admitted keep their delivery times; with `reorder` false, a lower
 * delay takes effect once those have arrived.
 */
export function retuneLink(link: LinkState, spec: LinkSpec): void {
  link.spec = normalizeLink(spec);
}

/** Decides the fate of a datagram of `bytes` bytes that enters the link at `nowMs`, updating `link`. */
export function admit(link: LinkState, nowMs: number, bytes: number): Admission {
  const s = link.spec;
  // Draw the loss coin for every datagram, even at loss 0, so the jitter draws do not depend on loss.
  const coin = link.random();
  if (coin < s.loss) {
    link.lostPackets++;
    return { dropped: "loss" };
  }
  let departAt = nowMs;
  if (Number.isFinite(s.rateBytesPerSec)) {
    // GCRA form of a token bucket: tat is when the bucket would be full again had nothing else been sent.
    const perByteMs = 1000 / s.rateBytesPerSec;
    const tat = Math.max(link.tat, nowMs) + bytes * perByteMs;
    departAt = Math.max(nowMs, tat - s.burstBytes * perByteMs);
    // Time spent waiting times the rate is the backlog ahead of this datagram.
    if ((departAt - nowMs) / perByteMs > s.queueBytes) {
      link.queueDrops++;
      return { dropped: "queue" };
    }
    link.tat = tat;
  }
  const jitter = s.jitterMs > 0 ? (link.random() * 2 - 1) * s.jitterMs : 0;
  let arrival = departAt + Math.max(0, s.delayMs + jitter);
  if (!s.reorder) arrival = Math.max(arrival, link.lastArrival);
  link.lastArrival = Math.max(link.lastArrival, arrival);
  return { dropped: null, deliverAt: arrival };
}
