// The transport interface that membership (SWIM), the registry and the actor runtime run over.
// Two implementations: node/transport/iroh.ts (real QUIC between processes) and
// node/transport/memory.ts (an in-process network with loss, delay and partitions, for deterministic tests).

/** A node's identity: its iroh endpoint id (public key) as a string. Stable across restarts of the node's key. */
export type PeerId = string;

/** Where to reach a peer: its id plus the direct socket addresses ("ip:port") it listens on. */
export interface PeerAddr {
  id: PeerId;
  /** Direct addresses; may be empty when a relay or discovery finds the peer. */
  addrs: string[];
  /** The relay URL the peer is reachable through, where known (a ticket carries the leader's). */
  relay?: string;
}

/** Which stream a message travels on; membership traffic never waits behind bulk activations. */
export type Channel = "control" | "data";

/**
 * Guarantees:
 * - `send` is best-effort and never throws for an unreachable peer: it resolves `false` when the message
 *   could not be handed to a live connection (peer unknown, dial failed, connection lost, refused).
 *   It resolves `true` once the bytes are queued on an open, authenticated connection.
 * - Messages from one sender on one channel arrive in order (one ordered stream per peer and channel);
 *   nothing arrives twice; a message arrives whole or not at all.
 * - A message larger than `maxMessageBytes` is rejected with a RangeError, before anything is sent.
 * - Only peers that proved they hold the cluster secret are delivered to handlers (see docs/WIRE.md).
 */
export interface Transport {
  /** This node's own address. */
  readonly self: PeerAddr;
  /** The largest message `send` accepts, in bytes. */
  readonly maxMessageBytes: number;
  /** Sends one message to `to`. */
  send(to: PeerAddr, msg: Uint8Array, channel?: Channel): Promise<boolean>;
  /** Registers the single handler for incoming messages (a later call replaces it). */
  onMessage(handler: (from: PeerAddr, msg: Uint8Array, channel: Channel) => void): void;
  /**
   * Optional: reaches `to` now (dial and handshake where there are any), throwing PeerUnreachableError
   * saying why when it cannot, where `send` would only resolve false. A node's join calls it on its first
   * seed, so a bad ticket fails at once; without it, a join to an unreachable seed finds no members.
   */
  connect?(to: PeerAddr): Promise<void>;
  /**
   * Optional: from now on `send` goes only over links already open (or being dialled), and dials no new
   * one. A leaving node calls it once it has told its peers: they drop their links to it as the news
   * arrives, and its last gossip should not dial them again as it closes (they would log the half-made
   * connection).
   */
  quiesce?(): void;
  /** Drops the cached connection to a peer (e.g. once membership declares it dead). */
  forget(peer: PeerId): void;
  /**
   * Optional: how data to `peer` travels while a link is open: "tls" (the direct TLS path, hundreds of MB/s)
   * or "iroh" (the fallback, a few MB/s: docs/WIRE.md); undefined where there is no link or no such choice.
   */
  dataPath?(peer: PeerId): "tls" | "iroh" | undefined;
  /** Closes every connection and stops accepting; pending sends resolve false. */
  close(opts?: CloseOptions): Promise<void>;
}

export interface CloseOptions {
  /**
   * The process exits right after: close() need not wait for what only frees this process's own resources
   * (iroh's close waits ~3 s for a connect given up at its dial timeout, with no peer on the other end).
   * Not for a process that goes on: native work left running past its caller can outlive the isolate.
   */
  exiting?: boolean;
}
