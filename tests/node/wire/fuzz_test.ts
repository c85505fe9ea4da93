// Fuzz: thousands of random and mutated frames and payloads (seeded, so a failure reproduces). Every input
// must either decode or throw WireError; nothing else may escape, and nothing may hang.
import assert from "node:assert/strict";
import {
  type ActorMessage,
  decodeActorMessage,
  decodeChallenge,
  decodeFrame,
  decodeHello,
  decodePath,
  decodeProof,
  decodeRefuse,
  decodeStream,
  decodeTlsHello,
  decodeTlsOffer,
  encodeActorMessage,
  encodeFrame,
  encodeTlsHello,
  encodeTlsOffer,
  FrameDecoder,
  FrameKind,
  WireError,
} from "../../../node/wire/mod.ts";
import { seededRandom } from "../../../node/random.ts";
import { createIrohTransport } from "../../../node/transport/iroh.ts";
import { certificatePem, FAST_SERVER_NAME } from "../../../node/transport/cert.ts";
import { newSecret } from "../../../node/ticket.ts";

const rand = seededRandom(0x5eed);
const int = (n: number) => Math.floor(rand() * n);
const bytes = (n: number) => Uint8Array.from({ length: n }, () => int(256));
const kinds = Object.values(FrameKind);

const payloadDecoders = [
  decodeStream,
  decodeHello,
  decodeChallenge,
  decodeProof,
  decodeRefuse,
  decodeActorMessage,
  decodeTlsOffer,
  decodePath,
  decodeTlsHello,
];

/** Runs f; passes if it returns or throws WireError; fails on any other exception. */
function mustNotCrash(f: () => unknown, input: Uint8Array): void {
  try {
    f();
  } catch (e) {
    if (!(e instanceof WireError)) {
      throw new Error(
        `non-WireError ${e} on input [${Array.from(input.slice(0, 32))}...] (${input.length} bytes)`,
      );
    }
  }
}

function randomActorMessage(): ActorMessage {
  const requestId = int(2 ** 31) * 1000 + int(1000);
  const to = `stage-${int(100)}`;
  switch (int(5)) {
    case 0:
      return { type: "send", to, body: bytes(int(100)) };
    case 1:
      return { type: "call", requestId, to, timeoutMs: int(60000), body: bytes(int(100)) };
    case 2:
      return { type: "reply", requestId, body: bytes(int(100)) };
    case 3:
      return { type: "error", requestId, code: (1 + int(3)) as 1 | 2 | 3, message: "boom ✓" };
    default:
      return { type: "cancel", requestId };
  }
}

function validFrame(): Uint8Array {
  const kind = kinds[int(kinds.length)];
  const payload = kind === FrameKind.MESSAGE ? encodeActorMessage(randomActorMessage()) : bytes(int(64));
  return encodeFrame(kind, payload);
}

function mutate(input: Uint8Array): Uint8Array {
  const out = input.slice();
  switch (int(5)) {
    case 0: // flip a few bits
      for (let i = 0, n = 1 + int(4); i < n && out.length; i++) out[int(out.length)] ^= 1 << int(8);
      return out;
    case 1: // truncate
      return out.slice(0, int(out.length));
    case 2: // append garbage
      return Uint8Array.from([...out, ...bytes(1 + int(16))]);
    case 3: // rewrite the length field with something large or random
      if (out.length >= 8) new DataView(out.buffer).setUint32(4, int(2) ? 0xffffffff : int(1 << 28));
      return out;
    default: // overwrite one header byte
      if (out.length) out[int(Math.min(8, out.length))] = int(256);
      return out;
  }
}

Deno.test("fuzz: random bytes never crash the frame and payload decoders", () => {
  for (let i = 0; i < 2000; i++) {
    const input = bytes(int(80));
    mustNotCrash(() => decodeFrame(input), input);
    mustNotCrash(() => new FrameDecoder().push(input), input);
    for (const d of payloadDecoders) mustNotCrash(() => d(input), input);
  }
});

Deno.test("fuzz: mutated valid frames are decoded or rejected with WireError", () => {
  let rejected = 0;
  for (let i = 0; i < 3000; i++) {
    const input = mutate(validFrame());
    try {
      const frame = decodeFrame(input);
      if (frame.kind === FrameKind.MESSAGE) mustNotCrash(() => decodeActorMessage(frame.payload), input);
    } catch (e) {
      if (!(e instanceof WireError)) throw e;
      rejected++;
    }
    const dec = new FrameDecoder({ messageMax: 1 << 20 });
    mustNotCrash(() => {
      dec.push(input);
      dec.finish();
    }, input);
  }
  assert.ok(rejected > 1000, `only ${rejected} of 3000 mutations were rejected`);
});

Deno.test("fuzz: mutated actor messages are decoded or rejected with WireError", () => {
  for (let i = 0; i < 2000; i++) {
    const input = mutate(encodeActorMessage(randomActorMessage()));
    mustNotCrash(() => decodeActorMessage(input), input);
  }
});

Deno.test("fuzz: valid frame streams split at random points decode to the same frames", () => {
  for (let round = 0; round < 200; round++) {
    const frames = Array.from({ length: 1 + int(10) }, () => validFrame());
    const stream = Uint8Array.from(frames.flatMap((f) => Array.from(f)));
    const dec = new FrameDecoder();
    const got: Uint8Array[] = [];
    for (let pos = 0; pos < stream.length;) {
      const n = 1 + int(40);
      for (const f of dec.push(stream.subarray(pos, pos + n))) got.push(encodeFrame(f.kind, f.payload));
      pos += n;
    }
    dec.finish();
    assert.deepEqual(got, frames);
  }
});

Deno.test("fuzz: streams with large frames (filled in place) split anywhere decode to the same frames", () => {
  for (let round = 0; round < 40; round++) {
    const sizes = Array.from({ length: 1 + int(6) }, () => [10, 65535, 65536, 65537, 200_000][int(5)]);
    const frames = sizes.map((n) => encodeFrame(FrameKind.MESSAGE, bytes(n)));
    const stream = new Uint8Array(frames.reduce((n, f) => n + f.length, 0));
    let o = 0;
    for (const f of frames) {
      stream.set(f, o);
      o += f.length;
    }
    const dec = new FrameDecoder();
    const got: Uint8Array[] = [];
    const plain = round % 4 === 0; // the iroh binding hands out plain arrays
    for (let pos = 0; pos < stream.length;) {
      const n = [1, 7, 8, 9, 4096, 65536, 70_000][int(7)];
      const chunk = stream.subarray(pos, pos + n);
      for (const f of dec.push(plain ? Array.from(chunk) : chunk)) got.push(encodeFrame(f.kind, f.payload));
      pos += n;
    }
    dec.finish();
    assert.deepEqual(got, frames);
  }
  const cut = new FrameDecoder();
  cut.push(encodeFrame(FrameKind.MESSAGE, bytes(100_000)).subarray(0, 70_000));
  assert.throws(() => cut.finish(), WireError, "a stream that ends inside a large frame is truncated");
});

Deno.test("fuzz: actor messages round-trip", () => {
  for (let i = 0; i < 1000; i++) {
    const m = randomActorMessage();
    assert.deepEqual(decodeActorMessage(encodeActorMessage(m)), m);
  }
});

Deno.test("fuzz: TLS path payloads round-trip, and mutated ones decode or throw WireError", () => {
  for (let i = 0; i < 500; i++) {
    const offer = {
      token: bytes(32),
      cert: bytes(1 + int(512)),
      addrs: Array.from({ length: int(9) }, () => `10.${int(256)}.${int(256)}.${int(256)}:${int(65536)}`),
    };
    assert.deepEqual(decodeTlsOffer(encodeTlsOffer(offer)), offer);
    const hello = { token: bytes(32), nonce: bytes(32), proof: bytes(32) };
    assert.deepEqual(decodeTlsHello(encodeTlsHello(hello)), hello);
    for (const input of [mutate(encodeTlsOffer(offer)), mutate(encodeTlsHello(hello))]) {
      mustNotCrash(() => decodeTlsOffer(input), input);
      mustNotCrash(() => decodeTlsHello(input), input);
      mustNotCrash(() => decodePath(input), input);
    }
  }
});

Deno.test("fuzz: the TLS listener refuses random and mutated first frames, delivers nothing, keeps serving", async () => {
  const secret = newSecret();
  const warnings: string[] = [];
  const a = await createIrohTransport({ secret, log: () => {} });
  const b = await createIrohTransport({ secret, log: (level, m) => level === "warn" && warnings.push(m) });
  let delivered = 0;
  b.onMessage(() => delivered++);
  const [host, port] = b.tls!.addr.split(":");
  const caCerts = [certificatePem(b.tls!.cert.der)];
  try {
    const inputs = Array.from({ length: 60 }, (_, i) => {
      const hello = encodeFrame(
        FrameKind.TLS_HELLO,
        encodeTlsHello({
          token: bytes(32),
          nonce: bytes(32),
          proof: bytes(32),
        }),
      );
      return i % 3 === 0 ? bytes(1 + int(200)) : i % 3 === 1 ? mutate(hello) : mutate(validFrame());
    });
    for (const input of inputs) {
      const tcp = await Deno.connect({ hostname: host, port: Number(port) });
      const tls = await Deno.startTls(tcp, { hostname: FAST_SERVER_NAME, caCerts });
      await tls.write(input);
      // A complete frame is refused at once; a partial one when the handshake timer runs out: either way
      // the listener closes the connection (its read ends) without admitting it.
      tls.closeWrite().catch(() => {});
      const buf = new Uint8Array(4096);
      while ((await tls.read(buf).catch(() => null)) !== null) { /* drain the REFUSE */ }
      tls.close();
    }
    assert.equal(delivered, 0);
    assert.ok(warnings.length >= inputs.length, `${warnings.length} refusals logged for ${inputs.length}`);
    // The listener still admits a real peer afterwards, on the TLS path.
    assert.ok(await a.send(b.self, new TextEncoder().encode("Areal"), "data"));
    while (delivered === 0) await new Promise((r) => setTimeout(r, 10));
    assert.equal(a.dataPath(b.self.id), "tls");
  } finally {
    await Promise.all([a.close(), b.close()]);
  }
});
