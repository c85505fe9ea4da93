// Serves the control API on a local address; "127.0.0.1:0" picks a free port, "[::1]:0" one on IPv6.
import type { Hono } from "hono";

export interface ApiServer {
  /** "host:port" actually bound. */
  addr: string;
  close(): Promise<void>;
}

export function serveApi(app: Hono, listen = "127.0.0.1:0"): ApiServer {
  const i = listen.lastIndexOf(":");
  const hostname = i > 0 ? listen.slice(0, i).replace(/^\[(.*)\]$/, "$1") : "127.0.0.1";
  const port = Number(listen.slice(i + 1));
  if (!Number.isInteger(port) || port < 0 || port > 65535) {
    throw new TypeError(`serveApi expects HOST:PORT, got "${listen}"`);
  }
  const server = Deno.serve({ hostname, port, onListen: () => {} }, app.fetch);
  const a = server.addr as Deno.NetAddr;
  const host = a.hostname.includes(":") ? `[${a.hostname}]` : a.hostname;
  return { addr: `${host}:${a.port}`, close: () => server.shutdown() };
}
