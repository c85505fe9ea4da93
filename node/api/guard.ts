// Who may call the control API. It listens on loopback, but a web page in the user's browser can reach
// loopback too: a cross-site form POST to /down (no CORS preflight for text/plain), or a DNS name rebound to
// 127.0.0.1 so that the page counts as same-origin. So, before any route:
//   - Host must be an IP address or localhost (a rebound DNS name is refused);
//   - an Origin header, which browsers send and the CLI does not, must be this API's own origin;
//   - any method but GET/HEAD (the routes that act: /down, /generate) needs the node's bearer token,
//     which only the state file (owner-only, node/state_file.ts) and the node's own process hold.
import type { MiddlewareHandler } from "hono";

export interface ApiGuard {
  /** The token that POST routes need, as `Authorization: Bearer <token>`. */
  token: string;
}

/** A fresh token: 32 random bytes, base64url. */
export function newApiToken(): string {
  const b = crypto.getRandomValues(new Uint8Array(32));
  return btoa(String.fromCharCode(...b)).replaceAll("+", "-").replaceAll("/", "_").replace(/=+$/, "");
}

const IP_HOST = /^(\d{1,3}(\.\d{1,3}){3}|\[[0-9a-fA-F:.]+\]|localhost)$/;

export function guard(g: ApiGuard): MiddlewareHandler {
  const want = `Bearer ${g.token}`;
  return async (c, next) => {
    const url = new URL(c.req.url);
    if (!IP_HOST.test(url.hostname)) {
      return c.json({ error: `refused: Host "${url.host}" is not an IP address or localhost` }, 403);
    }
    const origin = c.req.header("origin");
    if (origin !== undefined && origin !== url.origin) {
      return c.json({ error: `refused: a request from another origin (${origin.slice(0, 100)})` }, 403);
    }
    if (c.req.method !== "GET" && c.req.method !== "HEAD") {
      const auth = c.req.header("authorization");
      if (auth === undefined) {
        return c.json({
          error: "this route needs the node's token (Authorization: Bearer ...); the swactor commands on " +
            "the node's machine read it from its state file",
        }, 401);
      }
      if (!sameString(auth, want)) return c.json({ error: "wrong token" }, 403);
    }
    await next();
  };
}

/** String equality in time that depends on the length only (the token is a secret). */
function sameString(a: string, b: string): boolean {
  if (a.length !== b.length) return false;
  let diff = 0;
  for (let i = 0; i < a.length; i++) diff |= a.charCodeAt(i) ^ b.charCodeAt(i);
  return diff === 0;
}
