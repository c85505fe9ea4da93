// `--relay n0|URL|none` (up, join): how a node is found and reached by peers behind NAT.
//   n0    n0's public relays and discovery (iroh's "n0" preset): needs the internet;
//   URL   an iroh relay server of one's own (http:// or https://), no discovery;
//   none  direct addresses only (the default for `up`; `join` defaults to the ticket's relay).
// A relay that cannot be reached is reported once; the node works on direct addresses meanwhile.
import { UsageError } from "./command.ts";

/** The transport options a --relay value stands for; `relay` is what a ticket carries ("n0" or the URL). */
export interface RelayChoice {
  preset: "minimal" | "n0";
  relayUrl?: string;
  relay?: string;
}

export const RELAY_HELP =
  `  --relay n0|URL|none  relays for peers behind NAT: n0's public relays and discovery, an iroh relay
                       server of your own, or none (direct addresses only); see docs/DEPLOY.md`;

/** Parses --relay; `fallback` applies when the flag is absent. UsageError (exit 2) on anything else. */
export function parseRelay(value: string | undefined, fallback = "none"): RelayChoice {
  const v = value ?? fallback;
  if (v === "none") return { preset: "minimal" };
  if (v === "n0") return { preset: "n0", relay: "n0" };
  let url: URL | undefined;
  try {
    url = new URL(v);
  } catch { /* below */ }
  if (!url || (url.protocol !== "http:" && url.protocol !== "https:") || !url.hostname) {
    throw new UsageError(`--relay must be n0, none, or an http(s) URL of an iroh relay server, got "${v}"`);
  }
  return { preset: "minimal", relayUrl: url.href, relay: url.href };
}
