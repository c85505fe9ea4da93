// The wire protocol: frames, limits, every message, and the typed error the decoders throw.
export { WireError, type WireErrorCode } from "./errors.ts";
export { Reader, Writer } from "./codec.ts";
export {
  checkHeader,
  CONTROL_MAX_BYTES,
  DATA_MAX_BYTES,
  decodeFrame,
  encodeFrame,
  type Frame,
  FrameKind,
  HANDSHAKE_MAX_BYTES,
  HEADER_BYTES,
  PROTOCOL_VERSION,
} from "./frame.ts";
export { FrameDecoder } from "./frame_decoder.ts";
export * from "./messages.ts";
