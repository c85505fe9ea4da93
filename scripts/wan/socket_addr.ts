// "host:port" strings, the form iroh prints and accepts for direct addresses ("[::1]:port" for IPv6).

/** A parsed "host:port"; `host` has no brackets. */
export interface SocketAddr {
  host: string;
  port: number;
  family: "udp4" | "udp6";
}

/** Parses "127.0.0.1:9000" or "[::1]:9000"; throws TypeError saying what was expected. */
export function parseSocketAddr(text: string): SocketAddr {
  const i = typeof text === "string" ? text.lastIndexOf(":") : -1;
  const port = i < 0 ? NaN : Number(text.slice(i + 1));
  let host = i < 0 ? "" : text.slice(0, i);
  if (host.startsWith("[") && host.endsWith("]")) host = host.slice(1, -1);
  if (host === "" || !Number.isInteger(port) || port < 0 || port > 65535 || text.slice(i + 1) === "") {
    throw new TypeError(`expected an address "host:port" (e.g. 127.0.0.1:9000 or [::1]:9000), got "${text}"`);
  }
  return { host, port, family: host.includes(":") ? "udp6" : "udp4" };
}

/** The inverse of `parseSocketAddr`. */
export function formatSocketAddr(host: string, port: number): string {
  return host.includes(":") ? `[${host}]:${port}` : `${host}:${port}`;
}

/** True for 127.0.0.0/8 and ::1. */
export function isLoopback(host: string): boolean {
  return host.startsWith("127.") || host === "::1" || host === "localhost";
}
