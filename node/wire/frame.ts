// The frame: the unit every swactor stream carries (layout in docs/WIRE.md).
//
//   offset 0  magic   2 bytes  "SW" (0x53 0x57)
//          2  version u8       PROTOCOL_VERSION
//          3  kind    u8       FrameKind
//          4  length  u32 BE   payload bytes that follow
//          8  payload
//
// The header is checked as soon as its 8 bytes arrive, so an oversized or foreign frame is refused before
// any of its payload is buffered.
import { WireError } from "./errors.ts";

export const MAGIC0 = 0x53;
export const MAGIC1 = 0x57;
/** Bumped on any incompatible change to frames or messages; peers of another version are refused. */
export const PROTOCOL_VERSION = 2;
export const HEADER_BYTES = 8;

/** Largest application message on the "data" channel (activations, weights). */
export const DATA_MAX_BYTES = 64 * 1024 * 1024;
/** Largest application message on the "control" channel (membership, registry, small calls). */
export const CONTROL_MAX_BYTES = 1024 * 1024;
/** Largest payload of any handshake frame (every kind but MESSAGE). */
export const HANDSHAKE_MAX_BYTES = 1024;

export const FrameKind = {
  /** First frame of every stream the dialer opens: which channel the stream carries. */
  STREAM: 1,
  /** Dialer → acceptor: the dialer's nonce. */
  HELLO: 2,
  /** Acceptor → dialer: the acceptor's nonce and its proof of the secret. */
  CHALLENGE: 3,
  /** Dialer → acceptor: the dialer's proof of the secret. */
  PROOF: 4,
  /** Acceptor → dialer: both proofs checked; application messages may flow. */
  WELCOME: 5,
  /** Either side, before closing: why the connection is refused. */
  REFUSE: 6,
  /** One application message (opaque bytes handed to Transport.send). */
  MESSAGE: 7,
  /** Acceptor → dialer, after WELCOME: where and how to open the TLS data path (or that there is none). */
  TLS_OFFER: 8,
  /** Dialer → acceptor, after TLS_OFFER: which path the data channel takes (TLS or the iroh stream). */
  PATH: 9,
  /** Dialer → acceptor, first frame on a TLS connection: the offer's token and a proof of the secret. */
  TLS_HELLO: 10,
} as const;
export type FrameKind = typeof FrameKind[keyof typeof FrameKind];

const KNOWN_KINDS = new Set<number>(Object.values(FrameKind));

export interface Frame {
  kind: FrameKind;
  payload: Uint8Array;
}

/** The payload limit for a frame kind, given the limit for application messages on this stream. */
export function payloadLimit(kind: FrameKind, messageMax: number): number {
  return kind === FrameKind.MESSAGE ? messageMax : HANDSHAKE_MAX_BYTES;
}

/** Encodes one frame. Throws RangeError when the payload exceeds what a frame can declare. */
export function encodeFrame(kind: FrameKind, payload: Uint8Array): Uint8Array {
  if (payload.length > 0xffffffff) {
    throw new RangeError(`frame payload of ${payload.length} bytes exceeds u32`);
  }
  const out = new Uint8Array(HEADER_BYTES + payload.length);
  out[0] = MAGIC0;
  out[1] = MAGIC1;
  out[2] = PROTOCOL_VERSION;
  out[3] = kind;
  new DataView(out.buffer).setUint32(4, payload.length);
  out.set(payload, HEADER_BYTES);
  return out;
}

/** Checks a header; returns the payload length it declares. Throws WireError. */
export function checkHeader(bytes: Uint8Array, offset: number, messageMax: number): number {
  if (bytes[offset] !== MAGIC0 || bytes[offset + 1] !== MAGIC1) {
    throw new WireError("bad_magic", `expected "SW", got 0x${hex(bytes[offset])}${hex(bytes[offset + 1])}`);
  }
  const version = bytes[offset + 2];
  if (version !== PROTOCOL_VERSION) {
    throw new WireError(
      "bad_version",
      `peer speaks protocol ${version}, this node speaks ${PROTOCOL_VERSION}`,
    );
  }
  const kind = bytes[offset + 3];
  if (!KNOWN_KINDS.has(kind)) throw new WireError("unknown_kind", `frame kind ${kind}`);
  const length = ((bytes[offset + 4] << 24) >>> 0) + (bytes[offset + 5] << 16) + (bytes[offset + 6] << 8) +
    bytes[offset + 7];
  const limit = payloadLimit(kind as FrameKind, messageMax);
  if (length > limit) {
    throw new WireError("oversized", `kind ${kind} declares ${length} bytes, limit ${limit}`);
  }
  return length;
}

/** Decodes exactly one whole frame (no more, no less). Throws WireError. */
export function decodeFrame(bytes: Uint8Array, opts: { messageMax?: number } = {}): Frame {
  if (bytes.length < HEADER_BYTES) throw new WireError("truncated", `${bytes.length} bytes, header needs 8`);
  const length = checkHeader(bytes, 0, opts.messageMax ?? DATA_MAX_BYTES);
  if (bytes.length < HEADER_BYTES + length) {
    throw new WireError(
      "truncated",
      `payload declares ${length} bytes, ${bytes.length - HEADER_BYTES} present`,
    );
  }
  if (bytes.length > HEADER_BYTES + length) {
    throw new WireError("malformed", `${bytes.length - HEADER_BYTES - length} bytes after the frame`);
  }
  return { kind: bytes[3] as FrameKind, payload: bytes.slice(HEADER_BYTES) };
}

function hex(n: number | undefined): string {
  return (n ?? 0).toString(16).padStart(2, "0");
}
