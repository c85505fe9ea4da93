import assert from "node:assert/strict";
import {
  CONTROL_MAX_BYTES,
  decodeFrame,
  encodeFrame,
  FrameDecoder,
  FrameKind,
  HANDSHAKE_MAX_BYTES,
  PROTOCOL_VERSION,
  WireError,
} from "../../../node/wire/mod.ts";

function code(f: () => unknown): string {
  try {
    f();
  } catch (e) {
    if (e instanceof WireError) return e.code;
    throw e;
  }
  return "ok";
}

Deno.test("a frame round-trips and its header is 8 bytes", () => {
  const f = encodeFrame(FrameKind.MESSAGE, new Uint8Array([1, 2, 3]));
  assert.deepEqual(Array.from(f), [0x53, 0x57, PROTOCOL_VERSION, 7, 0, 0, 0, 3, 1, 2, 3]);
  assert.deepEqual(decodeFrame(f), { kind: FrameKind.MESSAGE, payload: new Uint8Array([1, 2, 3]) });
});

Deno.test("each kind of bad frame is rejected with its own code", () => {
  const good = encodeFrame(FrameKind.MESSAGE, new Uint8Array(10));
  const withByte = (i: number, v: number) => {
    const b = good.slice();
    b[i] = v;
    return b;
  };
  assert.deepEqual(code(() => decodeFrame(withByte(0, 0x47))), "bad_magic");
  assert.deepEqual(code(() => decodeFrame(withByte(2, PROTOCOL_VERSION + 1))), "bad_version");
  assert.deepEqual(code(() => decodeFrame(withByte(3, 99))), "unknown_kind");
  assert.deepEqual(code(() => decodeFrame(good.slice(0, 5))), "truncated");
  assert.deepEqual(code(() => decodeFrame(good.slice(0, 12))), "truncated");
  assert.deepEqual(code(() => decodeFrame(new Uint8Array([...good, 0]))), "malformed");
});

Deno.test("oversized frames are refused from the header alone, per kind and channel limit", () => {
  const header = (kind: number, len: number) => {
    const b = new Uint8Array(8);
    b.set([0x53, 0x57, PROTOCOL_VERSION, kind]);
    new DataView(b.buffer).setUint32(4, len);
    return b;
  };
  const dec = new FrameDecoder({ messageMax: CONTROL_MAX_BYTES });
  assert.deepEqual(code(() => dec.push(header(FrameKind.MESSAGE, CONTROL_MAX_BYTES + 1))), "oversized");
  // the decoder stays failed: the connection is to be closed
  assert.deepEqual(code(() => dec.push(new Uint8Array(0))), "oversized");
  assert.deepEqual(
    code(() => new FrameDecoder().push(header(FrameKind.HELLO, HANDSHAKE_MAX_BYTES + 1))),
    "oversized",
  );
  assert.deepEqual(
    new FrameDecoder({ messageMax: CONTROL_MAX_BYTES }).push(header(FrameKind.MESSAGE, 100)),
    [],
  );
});

Deno.test("a stream that ends inside a frame is truncated", () => {
  const dec = new FrameDecoder();
  dec.push(encodeFrame(FrameKind.MESSAGE, new Uint8Array(100)).subarray(0, 50));
  assert.throws(() => dec.finish(), WireError);
});

Deno.test("the decoder accepts Array<number> chunks and large frames spanning many chunks", () => {
  const payload = Uint8Array.from({ length: 300_000 }, (_, i) => i % 251);
  const frame = encodeFrame(FrameKind.MESSAGE, payload);
  const dec = new FrameDecoder();
  const out = [];
  for (let i = 0; i < frame.length; i += 65536) {
    out.push(...dec.push(Array.from(frame.subarray(i, i + 65536))));
  }
  assert.deepEqual(out.length, 1);
  assert.deepEqual(out[0].payload, payload);
});
