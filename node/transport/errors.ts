// The error callers handle when a peer cannot be reached.

/** A peer could not be reached, refused us, or died while a request was outstanding. */
export class PeerUnreachableError extends Error {
  override name = "PeerUnreachableError";
}
