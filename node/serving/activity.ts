// What the server has served: the Prometheus families of /metrics that requests feed (requests, tokens in
// and out, time to first token, time per output token, compute per stage, wire time per hop), the recent
// requests with their per-token breakdown for the dashboard, and the live tokens/s.
import type { TokenEvent } from "../stage/mod.ts";
import { Counter, Gauge, Histogram, LATENCY_BUCKETS_S, MetricsRegistry } from "./prometheus.ts";

/** One finished request, as the dashboard shows it. */
export interface RequestRecord {
  id: string;
  route: "chat" | "completion";
  /** Unix ms when it started running. */
  startedAt: number;
  promptTokens: number;
  completionTokens: number;
  /** "stop", "length", "cancelled" (the client went away) or "error". */
  finish: string;
  firstTokenMs: number | null;
  tokS: number;
  /** Per token (the first RECENT_TOKENS): compute ms per stage and wire ms per hop. */
  tokens: { computeMs: number[]; wireMs: (number | null)[] }[];
}

const RECENT_REQUESTS = 20;
const RECENT_TOKENS = 64;
/** The window of the live tokens/s, ms. */
const RATE_WINDOW_MS = 5000;

export class Activity {
  readonly registry = new MetricsRegistry();
  readonly requests = this.registry.add(
    new Counter("swactor_requests_total", "OpenAI API requests answered, by route and HTTP status."),
  );
  readonly promptTokens = this.registry.add(
    new Counter("swactor_prompt_tokens_total", "Prompt tokens of the requests that ran."),
  );
  readonly generationTokens = this.registry.add(
    new Counter("swactor_generation_tokens_total", "Tokens generated (sent to clients)."),
  );
  readonly ttft = this.registry.add(
    new Histogram(
      "swactor_time_to_first_token_seconds",
      "From a request's start on the chain to its first token.",
      LATENCY_BUCKETS_S,
    ),
  );
  readonly tpot = this.registry.add(
    new Histogram(
      "swactor_time_per_output_token_seconds",
      "Time between consecutive tokens of a request as the client receives them (tokens read back in one batch arrive together).",
      LATENCY_BUCKETS_S,
    ),
  );
  readonly duration = this.registry.add(
    new Histogram(
      "swactor_request_duration_seconds",
      "From a request's start on the chain to its end.",
      LATENCY_BUCKETS_S,
    ),
  );
  readonly stageCompute = this.registry.add(
    new Histogram(
      "swactor_stage_compute_seconds",
      "Compute per stage per token step (readback included).",
      LATENCY_BUCKETS_S,
    ),
  );
  readonly hopWire = this.registry.add(
    new Histogram(
      "swactor_hop_wire_seconds",
      "Time on the wire per hop per token (stage i to i+1; the last hop carries the token back to stage 0).",
      LATENCY_BUCKETS_S,
    ),
  );
  /** Gauges read from the cluster at scrape time (set by the app's /metrics route). */
  readonly gauges = {
    ready: this.registry.add(new Gauge("swactor_model_ready", "1 when the chain serves the model, else 0.")),
    running: this.registry.add(new Gauge("swactor_requests_running", "OpenAI API requests generating now.")),
    waiting: this.registry.add(
      new Gauge("swactor_requests_waiting", "OpenAI API requests waiting in the queue."),
    ),
    members: this.registry.add(
      new Gauge("swactor_members", "Cluster members by state, as the leader sees them."),
    ),
    stageActive: this.registry.add(
      new Gauge("swactor_stage_active_requests", "Requests holding a KV cache on each stage."),
    ),
    stageKv: this.registry.add(new Gauge("swactor_stage_kv_bytes", "KV cache bytes held on each stage.")),
    stageWeights: this.registry.add(
      new Gauge("swactor_stage_weight_bytes", "Weight bytes each stage holds."),
    ),
    stageSpare: this.registry.add(
      new Gauge(
        "swactor_stage_spare_bytes",
        "GPU bytes of released requests' sequences each stage keeps for reuse.",
      ),
    ),
    stageReused: this.registry.add(
      new Gauge(
        "swactor_stage_reused_sequences",
        "Requests that took a released request's sequence (programs built) on each stage since it loaded.",
      ),
    ),
    kvHeld: this.registry.add(
      new Gauge(
        "swactor_kv_budget_positions",
        "The leader's KV budget in positions: held by requests, and in all.",
      ),
    ),
  };

  #recent: RequestRecord[] = [];
  /** Times (performance.now) of recent tokens, for the live rate. */
  #tokenTimes: number[] = [];
  #next = 1;

  /** A request starts running: returns what it reports its tokens and its end to. */
  start(route: RequestRecord["route"], promptTokens: number) {
    const record: RequestRecord = {
      id: `r${this.#next++}`,
      route,
      startedAt: Date.now(),
      promptTokens,
      completionTokens: 0,
      finish: "running",
      firstTokenMs: null,
      tokS: 0,
      tokens: [],
    };
    this.promptTokens.inc({}, promptTokens);
    let lastAt: number | undefined;
    let firstAt: number | undefined;
    return {
      record,
      token: (e: TokenEvent) => {
        this.generationTokens.inc();
        this.#tokenTimes.push(performance.now());
        record.completionTokens++;
        if (lastAt === undefined) {
          this.ttft.observe(e.atMs / 1000);
          record.firstTokenMs = Math.round(e.atMs * 10) / 10;
          firstAt = e.atMs;
        } else this.tpot.observe((e.atMs - lastAt) / 1000);
        lastAt = e.atMs;
        e.timings.computeMs.forEach((ms, stage) => this.stageCompute.observe(ms / 1000, { stage }));
        const n = e.timings.wireMs.length;
        e.timings.wireMs.forEach((ms, k) => {
          if (ms !== null) this.hopWire.observe(Math.max(0, ms) / 1000, { hop: `${k}->${(k + 1) % n}` });
        });
        if (record.tokens.length < RECENT_TOKENS) {
          record.tokens.push({ computeMs: e.timings.computeMs, wireMs: e.timings.wireMs });
        }
      },
      end: (finish: string, durationMs: number) => {
        record.finish = finish;
        const span = (lastAt ?? 0) - (firstAt ?? 0);
        record.tokS = record.completionTokens > 1 && span > 0
          ? Math.round(((record.completionTokens - 1) / span) * 1000 * 10) / 10
          : 0;
        this.duration.observe(durationMs / 1000);
        this.#recent.unshift(record);
        this.#recent.length = Math.min(this.#recent.length, RECENT_REQUESTS);
      },
    };
  }

  /** The latest finished requests, newest first. */
  recent(): RequestRecord[] {
    return this.#recent;
  }

  /** Tokens per second sent to clients over the last few seconds. */
  tokS(): number {
    const now = performance.now();
    while (this.#tokenTimes.length && this.#tokenTimes[0] < now - RATE_WINDOW_MS) this.#tokenTimes.shift();
    return Math.round((this.#tokenTimes.length / (RATE_WINDOW_MS / 1000)) * 10) / 10;
  }
}
