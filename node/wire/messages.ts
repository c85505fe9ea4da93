// Every message swactor puts on the wire, in one place (docs/WIRE.md explains each):
// - handshake payloads (carried in STREAM/HELLO/CHALLENGE/PROOF/WELCOME/REFUSE frames, see frame.ts), and
//   the TLS data path's (TLS_OFFER, PATH, TLS_HELLO);
// - the service tag that opens every application MESSAGE and routes it to membership, registry or actors;
// - the actor runtime's messages (send, call, reply, error, cancel).
// Membership and registry payloads follow their service tag; their layouts are declared by their codecs
// (node/membership/, node/registry/) and listed in docs/WIRE.md.
import { WireError } from "./errors.ts";
import { Reader, Writer } from "./codec.ts";
import type { Channel } from "../transport/transport.ts";

export const NONCE_BYTES = 32;
export const PROOF_BYTES = 32;
/** A random id per process run, so a peer can tell a restart (new boot) from a second connection. */
export const BOOT_BYTES = 8;
/** Longest actor name, in UTF-8 bytes. */
export const MAX_NAME_BYTES = 256;

// ---- handshake -------------------------------------------------------------------------------------------

const CHANNEL_CODES: Record<Channel, number> = { control: 0, data: 1 };

export function encodeStream(channel: Channel): Uint8Array {
  return new Writer().u8(CHANNEL_CODES[channel]).finish();
}

export function decodeStream(payload: Uint8Array): Channel {
  const r = new Reader(payload, "STREAM");
  const code = r.u8("channel");
  r.end();
  if (code === 0) return "control";
  if (code === 1) return "data";
  throw new WireError("malformed", `STREAM: unknown channel ${code}`);
}

export function encodeHello(m: { nonce: Uint8Array; boot: Uint8Array }): Uint8Array {
  return new Writer().raw(fixed(m.nonce, NONCE_BYTES, "nonce")).raw(fixed(m.boot, BOOT_BYTES, "boot"))
    .finish();
}

export function decodeHello(payload: Uint8Array): { nonce: Uint8Array; boot: Uint8Array } {
  const r = new Reader(payload, "HELLO");
  const nonce = r.raw(NONCE_BYTES, "nonce");
  const boot = r.raw(BOOT_BYTES, "boot");
  r.end();
  return { nonce, boot };
}

export function encodeChallenge(m: { nonce: Uint8Array; boot: Uint8Array; proof: Uint8Array }): Uint8Array {
  return new Writer().raw(fixed(m.nonce, NONCE_BYTES, "nonce")).raw(fixed(m.boot, BOOT_BYTES, "boot"))
    .raw(fixed(m.proof, PROOF_BYTES, "proof")).finish();
}

export function decodeChallenge(
  payload: Uint8Array,
): { nonce: Uint8Array; boot: Uint8Array; proof: Uint8Array } {
  const r = new Reader(payload, "CHALLENGE");
  const nonce = r.raw(NONCE_BYTES, "nonce");
  const boot = r.raw(BOOT_BYTES, "boot");
  const proof = r.raw(PROOF_BYTES, "proof");
  r.end();
  return { nonce, boot, proof };
}

export function encodeProof(proof: Uint8Array): Uint8Array {
  return new Writer().raw(fixed(proof, PROOF_BYTES, "proof")).finish();
}

export function decodeProof(payload: Uint8Array): { proof: Uint8Array } {
  const r = new Reader(payload, "PROOF");
  const proof = r.raw(PROOF_BYTES, "proof");
  r.end();
  return { proof };
}

export function encodeRefuse(reason: string): Uint8Array {
  return new Writer().str(reason.slice(0, 200)).finish();
}

export function decodeRefuse(payload: Uint8Array): { reason: string } {
  const r = new Reader(payload, "REFUSE");
  const reason = r.str("reason", 1000);
  r.end();
  return { reason };
}

// ---- the TLS data path (node/transport/tls_path.ts) --------------------------------------------------------

/** Longest certificate a TLS_OFFER carries (an Ed25519 one is ~280 bytes). */
export const MAX_CERT_BYTES = 512;
/** Most addresses a TLS_OFFER lists, and the longest ("[v6]:port" fits). */
export const MAX_OFFER_ADDRS = 8;
export const MAX_ADDR_BYTES = 64;

/** Where the acceptor's TLS listener is, the certificate to pin, and the one-time token that admits its use. */
export interface TlsOffer {
  token: Uint8Array;
  cert: Uint8Array;
  /** "ip:port" of the listener, in the acceptor's order of preference. */
  addrs: string[];
}

/** TLS_OFFER payload; `null` (an empty payload) says the acceptor offers no TLS path. */
export function encodeTlsOffer(offer: TlsOffer | null): Uint8Array {
  if (!offer) return new Uint8Array(0);
  if (offer.cert.length === 0 || offer.cert.length > MAX_CERT_BYTES) {
    throw new RangeError(`certificate must be 1..${MAX_CERT_BYTES} bytes, got ${offer.cert.length}`);
  }
  if (offer.addrs.length > MAX_OFFER_ADDRS) {
    throw new RangeError(`a TLS offer lists at most ${MAX_OFFER_ADDRS} addresses, got ${offer.addrs.length}`);
  }
  const w = new Writer().raw(fixed(offer.token, NONCE_BYTES, "token")).bytes(offer.cert).u8(
    offer.addrs.length,
  );
  for (const a of offer.addrs) {
    if (new TextEncoder().encode(a).length > MAX_ADDR_BYTES) throw new RangeError(`address too long: ${a}`);
    w.str(a);
  }
  return w.finish();
}

export function decodeTlsOffer(payload: Uint8Array): TlsOffer | null {
  if (payload.length === 0) return null;
  const r = new Reader(payload, "TLS_OFFER");
  const token = r.raw(NONCE_BYTES, "token");
  const cert = r.bytes("cert");
  if (cert.length === 0 || cert.length > MAX_CERT_BYTES) {
    throw new WireError("malformed", `TLS_OFFER: certificate of ${cert.length} bytes`);
  }
  const n = r.u8("address count");
  if (n > MAX_OFFER_ADDRS) throw new WireError("malformed", `TLS_OFFER: ${n} addresses`);
  const addrs: string[] = [];
  for (let i = 0; i < n; i++) addrs.push(r.str("address", MAX_ADDR_BYTES));
  r.end();
  return { token, cert, addrs };
}

/** Which path a link's data channel takes; the dialer decides and says so in PATH. */
export type DataPath = "iroh" | "tls";

export function encodePath(path: DataPath): Uint8Array {
  return new Writer().u8(path === "tls" ? 1 : 0).finish();
}

export function decodePath(payload: Uint8Array): DataPath {
  const r = new Reader(payload, "PATH");
  const code = r.u8("path");
  r.end();
  if (code === 0) return "iroh";
  if (code === 1) return "tls";
  throw new WireError("malformed", `PATH: unknown path ${code}`);
}

export function encodeTlsHello(m: { token: Uint8Array; nonce: Uint8Array; proof: Uint8Array }): Uint8Array {
  return new Writer().raw(fixed(m.token, NONCE_BYTES, "token")).raw(fixed(m.nonce, NONCE_BYTES, "nonce"))
    .raw(fixed(m.proof, PROOF_BYTES, "proof")).finish();
}

export function decodeTlsHello(
  payload: Uint8Array,
): { token: Uint8Array; nonce: Uint8Array; proof: Uint8Array } {
  const r = new Reader(payload, "TLS_HELLO");
  const token = r.raw(NONCE_BYTES, "token");
  const nonce = r.raw(NONCE_BYTES, "nonce");
  const proof = r.raw(PROOF_BYTES, "proof");
  r.end();
  return { token, nonce, proof };
}

// ---- services --------------------------------------------------------------------------------------------

/**
 * First byte of every application message: which service it belongs to (node/transport/demux.ts routes on
 * it). Membership packets (which also carry the registry's gossip) begin with membership's own magic "M";
 * actor messages with "A".
 */
export const Service = {
  MEMBERSHIP: 0x4d,
  ACTORS: 0x41,
} as const;
export type Service = typeof Service[keyof typeof Service];

// ---- actors ----------------------------------------------------------------------------------------------

/** Why a call failed at the remote end. */
export const ActorErrorCode = {
  /** No actor of that name on the node the caller resolved (it stopped, moved or never existed). */
  NOT_FOUND: 1,
  /** The actor's handler threw. */
  FAILED: 2,
  /** The actor stopped before it handled the call. */
  STOPPED: 3,
} as const;
export type ActorErrorCode = typeof ActorErrorCode[keyof typeof ActorErrorCode];

export type ActorMessage =
  | { type: "send"; to: string; body: Uint8Array }
  | { type: "call"; requestId: number; to: string; timeoutMs: number; body: Uint8Array }
  | { type: "reply"; requestId: number; body: Uint8Array }
  | { type: "error"; requestId: number; code: ActorErrorCode; message: string }
  | { type: "cancel"; requestId: number };

const ACTOR_TYPES = { send: 1, call: 2, reply: 3, error: 4, cancel: 5 } as const;

export function encodeActorMessage(m: ActorMessage): Uint8Array {
  const w = new Writer().u8(Service.ACTORS).u8(ACTOR_TYPES[m.type]);
  switch (m.type) {
    case "send":
      return w.str(checkName(m.to)).bytes(m.body).finish();
    case "call":
      return w.u64(m.requestId).str(checkName(m.to)).u32(m.timeoutMs).bytes(m.body).finish();
    case "reply":
      return w.u64(m.requestId).bytes(m.body).finish();
    case "error":
      return w.u64(m.requestId).u8(m.code).str(m.message.slice(0, 1000)).finish();
    case "cancel":
      return w.u64(m.requestId).finish();
  }
}

export function decodeActorMessage(payload: Uint8Array): ActorMessage {
  const r = new Reader(payload, "actor message");
  const service = r.u8("service");
  if (service !== Service.ACTORS) throw new WireError("malformed", `actor message: service byte ${service}`);
  const type = r.u8("type");
  let m: ActorMessage;
  switch (type) {
    case 1:
      m = { type: "send", to: r.str("to", MAX_NAME_BYTES), body: r.bytes("body") };
      break;
    case 2:
      m = {
        type: "call",
        requestId: r.u64("request_id"),
        to: r.str("to", MAX_NAME_BYTES),
        timeoutMs: r.u32("timeout_ms"),
        body: r.bytes("body"),
      };
      break;
    case 3:
      m = { type: "reply", requestId: r.u64("request_id"), body: r.bytes("body") };
      break;
    case 4: {
      const requestId = r.u64("request_id");
      const code = r.u8("code");
      if (code < 1 || code > 3) throw new WireError("malformed", `actor error: unknown code ${code}`);
      m = { type: "error", requestId, code: code as ActorErrorCode, message: r.str("message", 4000) };
      break;
    }
    case 5:
      m = { type: "cancel", requestId: r.u64("request_id") };
      break;
    default:
      throw new WireError("malformed", `actor message: unknown type ${type}`);
  }
  r.end();
  return m;
}

function checkName(name: string): string {
  const n = new TextEncoder().encode(name).length;
  if (n === 0 || n > MAX_NAME_BYTES) {
    throw new RangeError(`actor name must be 1..${MAX_NAME_BYTES} UTF-8 bytes, got ${n}`);
  }
  return name;
}

function fixed(bytes: Uint8Array, n: number, what: string): Uint8Array {
  if (bytes.length !== n) throw new RangeError(`${what} must be ${n} bytes, got ${bytes.length}`);
  return bytes;
}
