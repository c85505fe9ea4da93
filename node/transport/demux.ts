// Routes each incoming application message to its service by its first byte (wire/messages.ts Service),
// so membership and the actor runtime share one transport and its single handler.
import type { Channel, PeerAddr, Transport } from "./transport.ts";

export type Handler = (from: PeerAddr, msg: Uint8Array, channel: Channel) => void;

export interface DemuxStats {
  /** Messages whose first byte names no service. */
  unrouted: number;
}

/** Installs the router as `transport`'s handler; `routes` maps a first byte to its service. */
export function demux(transport: Transport, routes: Map<number, Handler>): DemuxStats {
  const stats: DemuxStats = { unrouted: 0 };
  transport.onMessage((from, msg, channel) => {
    const h = msg.length > 0 ? routes.get(msg[0]) : undefined;
    if (h) h(from, msg, channel);
    else stats.unrouted++;
  });
  return stats;
}
