// Errors that callers of send/call handle. PeerUnreachableError lives with the transport.
export { PeerUnreachableError } from "../transport/errors.ts";

/** No actor of that name: the registry does not know it, or the node it names has no such actor. */
export class ActorNotFoundError extends Error {
  override name = "ActorNotFoundError";
}

/** The actor's handler threw while handling a call (the message is the remote error's). */
export class ActorFailedError extends Error {
  override name = "ActorFailedError";
}

/** A call got no reply within its timeout. */
export class CallTimeoutError extends Error {
  override name = "CallTimeoutError";
}
