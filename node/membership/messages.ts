// Every membership message, its encoding and its strict decoder. A packet is
//   0x4d ('M') | version (1) | repeated { u32 big-endian length | UTF-8 JSON message }
// The first message is the packet's purpose (ping, ack, ...), the rest are piggybacked broadcasts. Each
// message is JSON with short keys: easy to read in a capture, and small next to the transport's frame
// cost. The decoder never throws: a bad packet or a bad message inside one is dropped and counted.
import type { PeerId } from "../transport/transport.ts";
import type { Member, MemberState, NodeDescriptor, NodeMeasurement } from "./state.ts";

/** First byte of every membership packet, so a demultiplexer can route it (see isMembershipPacket). */
export const MAGIC = 0x4d;
/** Bumped on any incompatible change; packets of another version are dropped. */
export const PROTOCOL_VERSION = 1;
/** Limits applied by the decoder (the transport enforces the overall message size). */
export const LIMITS = { idChars: 256, strChars: 1024, addrs: 32, members: 100_000, userBytes: 1 << 20 };

export type PingMsg = { t: "ping"; seq: number; target: PeerId };
export type PingReqMsg = { t: "pingReq"; seq: number; target: PeerId; addrs: string[]; nack: boolean };
export type AckMsg = { t: "ack"; seq: number };
export type NackMsg = { t: "nack"; seq: number };
export type AliveMsg = { t: "alive"; id: PeerId; inc: number; addrs: string[]; meta: NodeDescriptor };
export type SuspectMsg = { t: "suspect"; id: PeerId; inc: number; from: PeerId };
export type DeadMsg = { t: "dead"; id: PeerId; inc: number; from: PeerId };
export type LeaveMsg = { t: "leave"; id: PeerId; inc: number };
/** Full state: sent periodically and on join; `reply` marks the answer (which is not answered again). */
export type PushPullMsg = {
  t: "pushPull";
  join: boolean;
  reply: boolean;
  members: Omit<Member, "since">[];
  /** Delegate states by delegate name (e.g. "registry"), base64. */
  user: Record<string, string>;
};
/** A delegate's broadcast (e.g. one registry entry), base64 payload. */
export type UserMsg = { t: "user"; ch: string; data: string };

export type Message =
  | PingMsg
  | PingReqMsg
  | AckMsg
  | NackMsg
  | AliveMsg
  | SuspectMsg
  | DeadMsg
  | LeaveMsg
  | PushPullMsg
  | UserMsg;

const enc = new TextEncoder();
const dec = new TextDecoder("utf-8", { fatal: true });

/** Encodes one message (the unit the broadcast queue stores and packs). */
export function encodeMessage(m: Message): Uint8Array {
  return enc.encode(JSON.stringify(m));
}

/** Packs already-encoded messages into one packet. */
export function packPacket(parts: Uint8Array[]): Uint8Array {
  let size = 2;
  for (const p of parts) size += 4 + p.length;
  const out = new Uint8Array(size);
  const view = new DataView(out.buffer);
  out[0] = MAGIC;
  out[1] = PROTOCOL_VERSION;
  let o = 2;
  for (const p of parts) {
    view.setUint32(o, p.length);
    out.set(p, o + 4);
    o += 4 + p.length;
  }
  return out;
}

/** Bytes a message adds to a packet. */
export const framedSize = (encoded: Uint8Array): number => 4 + encoded.length;
/** Bytes of a packet's header. */
export const PACKET_HEADER_BYTES = 2;

/** True when `bytes` looks like a membership packet (magic byte), for routing among protocols. */
export function isMembershipPacket(bytes: Uint8Array): boolean {
  return bytes.length >= 2 && bytes[0] === MAGIC;
}

/** Result of decoding a packet: the valid messages, and how many parts were malformed. */
export interface Decoded {
  messages: Message[];
  malformed: number;
}

/** Decodes a packet. Never throws: structural errors drop the rest of the packet; bad messages are skipped. */
export function decodePacket(bytes: Uint8Array): Decoded {
  const out: Decoded = { messages: [], malformed: 0 };
  if (
    !(bytes instanceof Uint8Array) || bytes.length < 2 || bytes[0] !== MAGIC || bytes[1] !== PROTOCOL_VERSION
  ) {
    out.malformed++;
    return out;
  }
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  let o = 2;
  while (o < bytes.length) {
    if (o + 4 > bytes.length) {
      out.malformed++;
      break;
    }
    const len = view.getUint32(o);
    if (o + 4 + len > bytes.length) {
      out.malformed++;
      break;
    }
    const m = decodeMessage(bytes.subarray(o + 4, o + 4 + len));
    if (m) out.messages.push(m);
    else out.malformed++;
    o += 4 + len;
  }
  return out;
}

/** Decodes and validates one message; undefined when it is not exactly a valid message. */
export function decodeMessage(bytes: Uint8Array): Message | undefined {
  let v: unknown;
  try {
    v = JSON.parse(dec.decode(bytes));
  } catch {
    return undefined;
  }
  return validateMessage(v);
}

type Obj = Record<string, unknown>;
const isObj = (v: unknown): v is Obj => typeof v === "object" && v !== null && !Array.isArray(v);
const isNat = (v: unknown): v is number => typeof v === "number" && Number.isSafeInteger(v) && v >= 0;
const isStr = (v: unknown, max = LIMITS.strChars): v is string => typeof v === "string" && v.length <= max;
const isId = (v: unknown): v is string => isStr(v, LIMITS.idChars) && v.length > 0;
const isAddrs = (v: unknown): v is string[] =>
  Array.isArray(v) && v.length <= LIMITS.addrs && v.every((a) => isStr(a, LIMITS.idChars));
const STATES: readonly MemberState[] = ["alive", "suspect", "dead", "left"];

/** Validates a node descriptor; returns a clean copy (unknown fields dropped) or undefined. */
export function validateDescriptor(v: unknown): NodeDescriptor | undefined {
  if (!isObj(v)) return undefined;
  const { name, version, adapter, gpuMemoryBytes, addrs } = v;
  if (!isStr(name) || !isStr(version) || !isStr(adapter) || !isNat(gpuMemoryBytes) || !isAddrs(addrs)) {
    return undefined;
  }
  const d: NodeDescriptor = { name, version, adapter, gpuMemoryBytes, addrs: [...addrs] };
  if (isNat(v.pid) && v.pid > 0) d.pid = v.pid;
  if (v.measuring === true) d.measuring = true;
  if (v.measured !== undefined) {
    const m = validateMeasurement(v.measured);
    if (!m) return undefined;
    d.measured = m;
  }
  return d;
}

const isMs = (v: unknown): v is number => typeof v === "number" && Number.isFinite(v) && v >= 0 && v < 1e7;
const BOUNDS: readonly NodeMeasurement["memoryBound"][] = ["device", "cap", "host", "time", "none"];

/** [K, GB/s] pairs, K ascending, rates positive; a clean copy or undefined. */
function validateWidths(v: unknown): [number, number][] | undefined {
  if (!Array.isArray(v) || v.length > 16) return undefined;
  const out: [number, number][] = [];
  for (const p of v) {
    if (!Array.isArray(p) || p.length !== 2 || !isNat(p[0]) || p[0] === 0) return undefined;
    if (typeof p[1] !== "number" || !(p[1] > 0) || !Number.isFinite(p[1])) return undefined;
    if (out.length && p[0] <= out[out.length - 1][0]) return undefined;
    out.push([p[0], p[1]]);
  }
  return out;
}

/** Validates a node's self-measurement; a clean copy or undefined. */
export function validateMeasurement(v: unknown): NodeMeasurement | undefined {
  if (!isObj(v)) return undefined;
  const { at, memoryBytes, memoryCapBytes, memoryBound, readGbps, readWeights, timestamps } = v;
  const { dispatchMs, readbackMs, encodeLayerMs, tookMs } = v;
  if (!isNat(at) || !isNat(memoryBytes) || !isNat(memoryCapBytes)) return undefined;
  if (!BOUNDS.includes(memoryBound as NodeMeasurement["memoryBound"])) return undefined;
  if (readWeights !== "f16" && readWeights !== "f32") return undefined;
  if (typeof timestamps !== "boolean") return undefined;
  if (![dispatchMs, readbackMs, encodeLayerMs, tookMs].every(isMs)) return undefined;
  const widths = validateWidths(readGbps), cached = validateWidths(v.cachedGbps);
  if (!widths || !cached || !isNat(v.cacheBytes)) return undefined;
  return {
    at,
    memoryBytes,
    memoryCapBytes,
    memoryBound: memoryBound as NodeMeasurement["memoryBound"],
    readGbps: widths,
    cachedGbps: cached,
    cacheBytes: v.cacheBytes,
    readWeights,
    timestamps,
    dispatchMs: dispatchMs as number,
    readbackMs: readbackMs as number,
    encodeLayerMs: encodeLayerMs as number,
    tookMs: tookMs as number,
  };
}

function validateMember(v: unknown): Omit<Member, "since"> | undefined {
  if (!isObj(v)) return undefined;
  const meta = validateDescriptor(v.meta);
  if (!meta || !isId(v.id) || !isAddrs(v.addrs) || !isNat(v.incarnation)) return undefined;
  if (!STATES.includes(v.state as MemberState)) return undefined;
  return { id: v.id, addrs: [...v.addrs], incarnation: v.incarnation, state: v.state as MemberState, meta };
}

function validateMessage(v: unknown): Message | undefined {
  if (!isObj(v)) return undefined;
  switch (v.t) {
    case "ping":
      return isNat(v.seq) && isId(v.target) ? { t: "ping", seq: v.seq, target: v.target } : undefined;
    case "pingReq":
      return isNat(v.seq) && isId(v.target) && isAddrs(v.addrs) && typeof v.nack === "boolean"
        ? { t: "pingReq", seq: v.seq, target: v.target, addrs: [...v.addrs], nack: v.nack }
        : undefined;
    case "ack":
    case "nack":
      return isNat(v.seq) ? { t: v.t, seq: v.seq } : undefined;
    case "alive": {
      const meta = validateDescriptor(v.meta);
      return meta && isId(v.id) && isNat(v.inc) && isAddrs(v.addrs)
        ? { t: "alive", id: v.id, inc: v.inc, addrs: [...v.addrs], meta }
        : undefined;
    }
    case "suspect":
    case "dead":
      return isId(v.id) && isNat(v.inc) && isId(v.from)
        ? { t: v.t, id: v.id, inc: v.inc, from: v.from }
        : undefined;
    case "leave":
      return isId(v.id) && isNat(v.inc) ? { t: "leave", id: v.id, inc: v.inc } : undefined;
    case "pushPull": {
      if (typeof v.join !== "boolean" || typeof v.reply !== "boolean") return undefined;
      if (!Array.isArray(v.members) || v.members.length > LIMITS.members || !isObj(v.user)) return undefined;
      const members: Omit<Member, "since">[] = [];
      for (const raw of v.members) {
        const m = validateMember(raw);
        if (!m) return undefined;
        members.push(m);
      }
      const user: Record<string, string> = {};
      for (const [k, s] of Object.entries(v.user)) {
        if (!isStr(k, LIMITS.idChars) || !isStr(s, LIMITS.userBytes * 2)) return undefined;
        user[k] = s;
      }
      return { t: "pushPull", join: v.join, reply: v.reply, members, user };
    }
    case "user":
      return isStr(v.ch, LIMITS.idChars) && isStr(v.data, LIMITS.userBytes * 2)
        ? { t: "user", ch: v.ch, data: v.data }
        : undefined;
    default:
      return undefined;
  }
}

/** Bytes to base64 (delegate payloads inside JSON). */
export function toBase64(bytes: Uint8Array): string {
  let s = "";
  for (let i = 0; i < bytes.length; i += 0x8000) {
    s += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  }
  return btoa(s);
}

/** base64 to bytes; undefined on invalid input. */
export function fromBase64(s: string): Uint8Array | undefined {
  try {
    const bin = atob(s);
    const out = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
    return out;
  } catch {
    return undefined;
  }
}
