import assert from "node:assert/strict";
import { readPath } from "../../../node/transport/iroh_handshake.ts";
import { FrameReader } from "../../../node/transport/frame_reader.ts";
import { encodeFrame, encodePath, FrameKind, HANDSHAKE_MAX_BYTES } from "../../../node/wire/mod.ts";

Deno.test("readPath: a control message over 1 KB right behind PATH, in the same read, is not refused", async () => {
  // What the acceptor saw in the 12-node lab: the dialer's PATH and its first gossip message (1.3 KB) in
  // one chunk, decoded while the reader still had the handshake's 1 KB limit ("oversized: kind 7").
  const message = new Uint8Array(1300).fill(7);
  const chunk = new Uint8Array([
    ...encodeFrame(FrameKind.PATH, encodePath("iroh")),
    ...encodeFrame(FrameKind.MESSAGE, message),
  ]);
  let sent = false;
  const reader = new FrameReader(() => {
    if (sent) return Promise.resolve(null);
    sent = true;
    return Promise.resolve(chunk);
  }, HANDSHAKE_MAX_BYTES);
  assert.equal(await readPath(reader), "iroh");
  const next = await reader.next();
  assert.equal(next?.kind, FrameKind.MESSAGE);
  assert.deepEqual(next?.payload, message);
});
