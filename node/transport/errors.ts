// The errors callers handle: a peer cannot be reached; the endpoint cannot bind the address asked for.

/** A peer could not be reached, refused us, or died while a request was outstanding. */
export class PeerUnreachableError extends Error {
  override name = "PeerUnreachableError";
}

/** The endpoint could not bind the address it was given (not on this machine, in use, not permitted). */
export class BindError extends Error {
  override name = "BindError";
}
