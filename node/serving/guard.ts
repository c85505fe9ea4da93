// Who may call the OpenAI server. As for the control API (node/api/guard.ts), a web page in the user's
// browser can reach a loopback server, so:
//   - on a loopback address the Host must be an IP address or localhost (a DNS name rebound to 127.0.0.1
//     is refused);
//   - an Origin header (browsers send it, API clients do not) must be the server's own origin: the
//     dashboard may call it, other sites may not;
//   - with an API key (`up --api-key`, required on a non-loopback address unless `--insecure`), every
//     route but the dashboard's page itself needs `Authorization: Bearer <key>`; the page passes the key
//     it is given in its URL fragment (#key=...), which browsers never send to the server.
import type { MiddlewareHandler } from "hono";
import { ApiError } from "./errors.ts";

export interface ServingGuard {
  /** The key clients must send as a bearer token; none: open (loopback, or --insecure). */
  apiKey?: string;
  /** Whether the server listens on a loopback address (then Host must be an IP or localhost). */
  loopback: boolean;
}

const IP_HOST = /^(\d{1,3}(\.\d{1,3}){3}|\[[0-9a-fA-F:.]+\]|localhost)$/;
/** Routes served without the key: the dashboard's page (it holds no data; its data comes from /events). */
const OPEN_PATHS = new Set(["/", "/favicon.ico"]);

export function servingGuard(g: ServingGuard): MiddlewareHandler {
  const want = g.apiKey === undefined ? undefined : `Bearer ${g.apiKey}`;
  return async (c, next) => {
    const url = new URL(c.req.url);
    if (g.loopback && !IP_HOST.test(url.hostname)) {
      throw new ApiError(403, `refused: Host "${url.host.slice(0, 100)}" is not an IP address or localhost`, {
        code: "forbidden_host",
      });
    }
    const origin = c.req.header("origin");
    if (origin !== undefined && origin !== url.origin) {
      throw new ApiError(403, `refused: a request from another origin (${origin.slice(0, 100)})`, {
        code: "forbidden_origin",
      });
    }
    if (want !== undefined && !OPEN_PATHS.has(url.pathname)) {
      const auth = c.req.header("authorization");
      if (auth === undefined) {
        throw new ApiError(
          401,
          "You didn't provide an API key. This server needs one in the Authorization header (Authorization: Bearer KEY).",
          { code: "missing_api_key" },
        );
      }
      if (!sameString(auth, want)) {
        throw new ApiError(401, "Incorrect API key provided.", { code: "invalid_api_key" });
      }
    }
    await next();
  };
}

/** String equality in time that depends on the length only (the key is a secret). */
function sameString(a: string, b: string): boolean {
  if (a.length !== b.length) return false;
  let diff = 0;
  for (let i = 0; i < a.length; i++) diff |= a.charCodeAt(i) ^ b.charCodeAt(i);
  return diff === 0;
}
