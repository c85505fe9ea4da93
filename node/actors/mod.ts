// The actor runtime: named actors with mailboxes, send and call by name across nodes.
export { type ActorContext, type Behavior } from "./actor.ts";
export {
  type ActorRef,
  ActorSystem,
  type ActorSystemOptions,
  type CallOptions,
  type PeerBook,
  type Registrar,
  type Resolver,
} from "./system.ts";
export { ActorFailedError, ActorNotFoundError, CallTimeoutError, PeerUnreachableError } from "./errors.ts";
