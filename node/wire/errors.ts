// The one error the wire decoder throws. Callers (the transport's stream readers) catch it, log it and close
// the offending connection; it never escapes to crash the node.

/** Why a frame or payload was rejected. */
export type WireErrorCode =
  | "bad_magic" // the first bytes are not a swactor frame
  | "bad_version" // a swactor frame of a protocol version we do not speak
  | "unknown_kind" // a frame kind this version does not define
  | "oversized" // a declared length above the limit for that frame kind or channel
  | "truncated" // fewer bytes than the header or a length field promised
  | "malformed"; // a payload that does not parse as its kind (bad field, trailing bytes, bad UTF-8)

/** A frame or message that does not follow docs/WIRE.md. */
export class WireError extends Error {
  override name = "WireError";
  constructor(readonly code: WireErrorCode, message: string) {
    super(`${code}: ${message}`);
  }
}
