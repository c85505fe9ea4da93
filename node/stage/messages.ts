// Every message of the pipeline protocol, carried as actor message bodies (stage-{i} and the clients'
// actors). Layout: type u8 · header length u32 BE · header (JSON) · payload (raw bytes: token ids u32,
// activations f16 or f32, logits f32, all little-endian). Each message names its request and step, so a
// receiver can drop duplicates (rung 4 retries sends).
import type { Sampling } from "./backend.ts";

export const MsgType = {
  START: 1,
  FORWARD: 2,
  TOKEN: 3,
  LOGITS: 4,
  RELEASE: 5,
  ERROR: 6,
  STATS: 7,
  VERIFY: 8,
  VERDICT: 9,
  CANCEL: 10,
} as const;

/** Activations on the wire: 16-bit by default. */
export type WireDtype = "f16" | "f32";

/** What the client asks for, carried by START and by every stage's first FORWARD of a request. */
export interface OpenParams {
  /** Positions the sequence holds (prompt + max tokens). */
  maxSeq: number;
  sampling: Sampling;
  /**
   * "generate": sample up to maxTokens; "logits": teacher-forced logits of the prompt; "speculate": the
   * prefill's token goes to the client only, which then sends VERIFY steps (docs/SPECULATIVE.md).
   */
  mode: "generate" | "logits" | "speculate";
  maxTokens: number;
  /** Prompt length. */
  prompt: number;
  eos: number[];
  /** Actor name of the requester (gets TOKEN / LOGITS / ERROR). */
  client: string;
  /** Node id of the requester: stages release its requests when it dies. */
  clientNode: string;
  wire: WireDtype;
  /**
   * The Plan version of the chain the request runs on (a fence: a stage serving another version refuses
   * the request, so a stage that comes back from a hang with an old Plan cannot touch a resumed request).
   * Absent: any version (older clients).
   */
  version?: number;
  /**
   * A resumed request (docs/RECOVERY.md): positions from here on (the tokens generated before the loss) are
   * rebuilt one per step, the shape of the decode steps that made them, after the original prompt's chunks,
   * so that every stage's KV cache and the next logits are bitwise the uninterrupted run's (a sampled token
   * near a boundary of the sampler's CDF would otherwise flip with prefill's different rounding).
   */
  replayFrom?: number;
}

/** One stage's part of a step: when the message arrived, compute time, when the next one left, its size. */
import type { TraceNote } from "./trace_events.ts";

export interface HopTrace {
  /** Stage index. */
  s: number;
  /** Arrival, ms since the epoch (performance.timeOrigin + now). */
  in: number;
  /** Compute, ms (including the readback). */
  c: number;
  /** Departure of the output, ms since the epoch. */
  out: number;
  /** Bytes sent to the next hop. */
  b: number;
  /** Stage 0 only, on decode steps: wire time of the token's way back from the last stage, ms. */
  r?: number;
  /**
   * How long the step waited at this stage between `in` (the message's arrival) and the start of its
   * compute, behind the request's earlier steps (prefill chunks), ms; absent when it did not wait.
   */
  w?: number;
  /**
   * Expert parallelism: this stage's fan-out in the step (layer -> node -> [bytes, ms, experts, at, host ms,
   * calls]: the round trips, `at` the first call's start (ms since the epoch), the host's own compute within
   * them, and how many; the last three absent from older nodes).
   */
  x?: Record<string, Record<string, [number, number, number[], number?, number?, number?]>>;
  /**
   * The fan-out's parts per MoE layer in the step (layer -> [fan-outs, readback ms of the routing and the
   * activations, ms until the last reply, combine ms]).
   */
  xp?: Record<string, [number, number, number, number]>;
  /**
   * The router's picks per MoE layer in the step (layer -> [expert, count, expert, count, ...]): what
   * `generate --routing-out` sums into the counts `plan --routing` reads.
   */
  xc?: Record<string, number[]>;
  /** More events for the trace (recoveries, speculation, ...): node/stage/trace_events.ts, addTraceNote. */
  n?: TraceNote[];
}

export interface VerifyStep {
  chunk: number;
  tokens: number[];
}

export type PipeMessage =
  | { type: "start"; id: string; open: OpenParams; prompt: Uint32Array }
  | {
    type: "forward";
    id: string;
    /** The request's step counter (prefill chunks and decode steps alike), from 0. */
    step: number;
    pos0: number;
    T: number;
    /** The last chunk of this step (the head samples after it). */
    last: boolean;
    /** Present on step 0 only. */
    open?: OpenParams;
    /** A verification step: its chunk number and its token ids (the last committed one, then the drafts). */
    verify?: VerifyStep;
    /** A cancelled verification step passed on uncomputed (no hidden state), to keep the step order. */
    void?: true;
    dtype: WireDtype;
    trace: HopTrace[];
    hidden: Uint8Array;
  }
  | {
    type: "token";
    id: string;
    step: number;
    /** Position of the token. */
    pos: number;
    token: number;
    done?: "eos" | "max_tokens";
    trace: HopTrace[];
    /** The first token only: the traces of the prefill chunks before the last one (the last is `trace`). */
    prefill?: HopTrace[][];
  }
  | {
    type: "logits";
    id: string;
    step: number;
    pos0: number;
    T: number;
    done: boolean;
    trace: HopTrace[];
    data: Uint8Array;
  }
  | {
    type: "verify";
    id: string;
    /** The request's verification chunk counter, from 0 (duplicates are dropped by it). */
    chunk: number;
    /** Position of tokens[0]. */
    pos0: number;
    /** The last committed token (or, pipelined, the drafter's guess of it), then the drafts. */
    tokens: Uint32Array;
  }
  | {
    type: "verdict";
    id: string;
    chunk: number;
    pos0: number;
    /** Drafts kept (a prefix of tokens[1..]). */
    accepted: number;
    /** The kept drafts, then the target's next token; empty when stale. */
    tokens: number[];
    /**
     * The chunk did not start where the sequence stands (an earlier chunk in flight was cut short): it was
     * computed, then dropped.
     */
    stale?: boolean;
    trace: HopTrace[];
  }
  | {
    type: "cancel";
    id: string;
    /** Verification chunks numbered below this that a stage has not run yet are void: skip them. */
    before: number;
  }
  | { type: "release"; id: string; reason: string }
  | {
    type: "error";
    id: string;
    stage: number;
    message: string;
    /** The stage refused the request because it serves another Plan version (see OpenParams.version). */
    stale?: boolean;
  }
  | { type: "stats" };

const enc = new TextEncoder();
const dec = new TextDecoder();
const TYPE_BY_NAME: Record<PipeMessage["type"], number> = {
  start: MsgType.START,
  forward: MsgType.FORWARD,
  token: MsgType.TOKEN,
  logits: MsgType.LOGITS,
  release: MsgType.RELEASE,
  error: MsgType.ERROR,
  stats: MsgType.STATS,
  verify: MsgType.VERIFY,
  verdict: MsgType.VERDICT,
  cancel: MsgType.CANCEL,
};
const NAME_BY_TYPE = Object.fromEntries(Object.entries(TYPE_BY_NAME).map(([k, v]) => [v, k]));

export function encodePipe(m: PipeMessage): Uint8Array {
  let payload: Uint8Array = new Uint8Array(0);
  const { type: _, ...rest } = m as Record<string, unknown>;
  if (m.type === "start") {
    payload = new Uint8Array(m.prompt.buffer, m.prompt.byteOffset, m.prompt.byteLength);
    delete rest.prompt;
  } else if (m.type === "verify") {
    payload = new Uint8Array(m.tokens.buffer, m.tokens.byteOffset, m.tokens.byteLength);
    delete rest.tokens;
  } else if (m.type === "forward") {
    payload = m.hidden;
    delete rest.hidden;
  } else if (m.type === "logits") {
    payload = m.data;
    delete rest.data;
  }
  const header = enc.encode(JSON.stringify(rest));
  const out = new Uint8Array(5 + header.length + payload.length);
  out[0] = TYPE_BY_NAME[m.type];
  new DataView(out.buffer).setUint32(1, header.length);
  out.set(header, 5);
  out.set(payload, 5 + header.length);
  return out;
}

/** Decodes a pipeline message; TypeError on anything else. */
export function decodePipe(bytes: Uint8Array): PipeMessage {
  if (bytes.length < 5) throw new TypeError(`pipeline message of ${bytes.length} bytes is truncated`);
  const type = NAME_BY_TYPE[bytes[0]];
  if (!type) throw new TypeError(`unknown pipeline message type ${bytes[0]}`);
  const n = new DataView(bytes.buffer, bytes.byteOffset).getUint32(1);
  if (5 + n > bytes.length) throw new TypeError("pipeline message header is truncated");
  const header = JSON.parse(dec.decode(bytes.subarray(5, 5 + n)));
  if (typeof header !== "object" || header === null) {
    throw new TypeError("pipeline message header is not an object");
  }
  // Copy the payload so typed views over it are aligned.
  const payload = bytes.slice(5 + n);
  const m = { type, ...header } as Record<string, unknown>;
  if (type === "start" || type === "verify") {
    if (payload.length % 4 !== 0) throw new TypeError(`${type} message: token ids must be u32`);
    m[type === "start" ? "prompt" : "tokens"] = new Uint32Array(payload.buffer, 0, payload.length / 4);
  } else if (type === "forward") m.hidden = payload;
  else if (type === "logits") m.data = payload;
  if (type !== "stats" && typeof m.id !== "string") throw new TypeError(`${type} message without request id`);
  return m as PipeMessage;
}

/** Milliseconds since the epoch with sub-millisecond resolution (comparable across local processes). */
export function wallMs(): number {
  return performance.timeOrigin + performance.now();
}
