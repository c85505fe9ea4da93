// The command-line flags that describe a link, shared by the relay CLI and the measurement scripts.
import { numberFlag } from "../../cli/command.ts";
import type { LinkSpec } from "./link.ts";

/** parseArgs option definitions for a link. */
export const linkFlagOptions = {
  "delay-ms": { type: "string" },
  "jitter-ms": { type: "string" },
  "loss": { type: "string" },
  "rate-mbit": { type: "string" },
  "burst-bytes": { type: "string" },
  "queue-bytes": { type: "string" },
  "reorder": { type: "boolean" },
  "seed": { type: "string" },
} as const;

export const linkFlagUsage = `  --delay-ms MS       one-way delay per direction (default 0)
  --jitter-ms MS      uniform jitter +-MS around the delay (default 0); no reordering unless --reorder
  --reorder           let jitter reorder datagrams
  --loss P            random loss probability per datagram, 0..1 (default 0)
  --rate-mbit R       rate cap per direction, megabit/s (default: none)
  --burst-bytes B     token-bucket depth (default 3000)
  --queue-bytes B     bottleneck queue before tail drop (default max(64 KiB, 50 ms at the rate))
  --seed N            seed of the loss and jitter draws (default 1)`;

type LinkFlagValues = { [K in keyof typeof linkFlagOptions]?: string | boolean };

/** Turns parsed flag values into a LinkSpec; throws UsageError on bad values. */
export function linkSpecFromFlags(v: LinkFlagValues): LinkSpec {
  const num = (name: keyof typeof linkFlagOptions, opts: { max?: number; integer?: boolean } = {}) => {
    const raw = v[name];
    return raw === undefined ? undefined : numberFlag(String(raw), name, { min: 0, fallback: 0, ...opts });
  };
  const rateMbit = num("rate-mbit");
  return {
    delayMs: num("delay-ms"),
    jitterMs: num("jitter-ms"),
    loss: num("loss", { max: 1 }),
    rateBytesPerSec: rateMbit === undefined ? undefined : rateMbit * 1e6 / 8,
    burstBytes: num("burst-bytes"),
    queueBytes: num("queue-bytes"),
    reorder: v.reorder === true,
    seed: num("seed", { integer: true }),
  };
}
